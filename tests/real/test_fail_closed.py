"""A namespace labelled fail-closed (the chart's `webhook.failClosedNamespaceLabel`, which the
tier's release sets) on the real API server: its pods go through the webhook's second entry,
and while the webhook is unreachable they are refused, where another namespace's are admitted
unmutated (failurePolicy Ignore). The webhook is made unreachable by scaling it to no pod: taking
its Service off live pods is not enough, since the API server keeps using the connections it
has open to them (it resolves the Service only when it dials)."""

from __future__ import annotations

from typing import Any

from jobs import ensure_namespace
from real_helpers import FAIL_CLOSED_LABEL, scale_webhook

from e2e.node.cluster import NodeCluster
from webhook import keys
from webhook.kube import PODS, ApiError, KubeApi

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


async def test_a_fail_closed_namespace_is_refused_while_the_webhook_is_unreachable(
        kube: KubeApi, node_cluster: NodeCluster) -> None:
    await ensure_namespace(kube, CLOSED_NS, FAIL_CLOSED_LABEL)
    await ensure_namespace(kube, OPEN_NS)
    # reachable: the closed namespace's pods are mutated through the second entry (the webhook
    # strips an assignment only the binder may write)
    made = await _create(kube, CLOSED_NS, _pod({keys.ANN_GPU_ASSIGNMENT: "{}"}))
    assert isinstance(made, dict), made
    assert keys.ANN_GPU_ASSIGNMENT not in (made["metadata"].get("annotations") or {})
    await scale_webhook(kube, node_cluster, 0)
    try:
        refused = await _create(kube, CLOSED_NS)
        assert isinstance(refused, ApiError), refused
        assert 'failed calling webhook "pods-fail-closed.muster.io"' in refused.message, \
            refused.message
        admitted = await _create(kube, OPEN_NS)
        assert isinstance(admitted, dict), admitted  # failing open: admitted unmutated
    finally:
        await scale_webhook(kube, node_cluster, 2)
    made = await _create(kube, CLOSED_NS)
    assert isinstance(made, dict), made
