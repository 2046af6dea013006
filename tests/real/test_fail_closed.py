"""A namespace labelled fail-closed (the chart's `webhook.failClosedNamespaceLabel`, which the
tier's release sets) on the real API server: its pods go through the webhook's second entry,
and while the webhook is unreachable they are refused, where another namespace's are admitted
unmutated (failurePolicy Ignore). Taking the webhook's Service off its pods makes it
unreachable to the API server, as a dead or partitioned webhook is."""

from __future__ import annotations

from typing import Any

from jobs import ensure_namespace
from real_helpers import ENDPOINTS, FAIL_CLOSED_LABEL

from e2e.cluster import NAMESPACE, RELEASE
from e2e.probes import eventually
from webhook import keys
from webhook.kube import PODS, SERVICES, ApiError, KubeApi

SERVICE = f"{RELEASE}-webhook"
CLOSED_NS, OPEN_NS = "closed-team", "open-team"


def _pod(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "fc-", "annotations": annotations or {}},
            "spec": {"schedulerName": "nobody",
                     "containers": [{"name": "c", "image": "busybox"}]}}


async def _create(kube: KubeApi, ns: str, pod: dict[str, Any] | None = None
                  ) -> dict[str, Any] | ApiError:
    try:
        return await kube.create(PODS, pod or _pod(), namespace=ns, dry_run=True)
    except ApiError as exc:
        return exc


async def _endpoints(kube: KubeApi, count: int) -> bool:
    found = await kube.get(ENDPOINTS, SERVICE, namespace=NAMESPACE)
    return sum(len(s.get("addresses") or ()) for s in found.get("subsets") or ()) == count


async def test_a_fail_closed_namespace_is_refused_while_the_webhook_is_unreachable(
        kube: KubeApi) -> None:
    await ensure_namespace(kube, CLOSED_NS, FAIL_CLOSED_LABEL)
    await ensure_namespace(kube, OPEN_NS)
    # reachable: the closed namespace's pods are mutated through the second entry (the webhook
    # strips an assignment only the binder may write)
    made = await _create(kube, CLOSED_NS, _pod({keys.ANN_GPU_ASSIGNMENT: "{}"}))
    assert isinstance(made, dict), made
    assert keys.ANN_GPU_ASSIGNMENT not in (made["metadata"].get("annotations") or {})
    service = await kube.get(SERVICES, SERVICE, namespace=NAMESPACE)
    selector = service["spec"]["selector"]
    await kube.patch(SERVICES, SERVICE, {"spec": {"selector": {
        **selector, "app.kubernetes.io/component": "nobody"}}}, namespace=NAMESPACE)
    try:
        await eventually(lambda: _endpoints(kube, 0), within=60, interval=0.5,
                         what="the webhook Service without endpoints")
        refused = await _create(kube, CLOSED_NS)
        assert isinstance(refused, ApiError), refused
        assert 'failed calling webhook "pods-fail-closed.muster.io"' in refused.message, \
            refused.message
        admitted = await _create(kube, OPEN_NS)
        assert isinstance(admitted, dict), admitted  # failing open: admitted unmutated
    finally:
        await kube.patch(SERVICES, SERVICE, {"spec": {"selector": selector}},
                         namespace=NAMESPACE)
        await eventually(lambda: _endpoints(kube, 2), within=60, interval=0.5,
                         what="both webhook replicas behind the Service again")
    made = await _create(kube, CLOSED_NS)
    assert isinstance(made, dict), made
