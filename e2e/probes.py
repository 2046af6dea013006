"""What the end-to-end scenarios of both tiers (e2e/ on the emulator, tests/real on a real node)
share: waiting as a user would, and asking admission what it would do."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from webhook.demo import scenario
from webhook.kube import PODS, VOLCANO_QUEUES, ApiError, KubeApi
from webhook.policy.workload import JOB_NAME_LABEL

#: a policy an admin adds to label one namespace's pods (visible through a dry run)
EXTRA_POLICY = """\
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata:
  name: team-c-labels
spec:
  match:
    namespaces: [team-c]
  labels:
    cost-center: vision
"""


#: the namespace of the rollout scenario (`rollout_policies`)
ROLLOUT_NAMESPACE = "team-e"


def rollout_policies(enforcement: str, marker: str) -> dict[str, str]:
    """Policy files for the chart's values: a coscheduling gang for the MPIJobs of
    ROLLOUT_NAMESPACE in `enforcement` mode, and an enforced policy labelling the namespace's
    pods `rollout=<marker>`. Both load as one set, so a probe that sees the marker
    (`rollout_loaded`) knows the gang policy's mode is the one in force."""
    ns = ROLLOUT_NAMESPACE
    return {
        "rollout-gangs.yaml": (
            "apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\n"
            "metadata: {name: rollout-gangs}\n"
            f"spec:\n  enforcement: {enforcement}\n"
            f"  match: {{namespaces: [{ns}], ownerKinds: [kubeflow.org/MPIJob]}}\n"
            "  gang: {backend: coscheduling, minAvailable: auto}\n"),
        "rollout-marker.yaml": (
            "apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\n"
            "metadata: {name: rollout-marker}\n"
            f"spec:\n  match: {{namespaces: [{ns}]}}\n  labels: {{rollout: {marker}}}\n")}


async def rollout_loaded(kube: KubeApi, marker: str) -> bool:
    """Whether a probe sees the policy set carrying `marker` (with several webhook replicas,
    only the one the API server reached)."""
    return (await probe_labels(kube, ROLLOUT_NAMESPACE)).get("rollout") == marker


async def eventually(check: Callable[[], Any], within: float = 10.0, *,
                     what: str = "the condition", interval: float = 0.05) -> Any:
    """Poll `check` (a function, or a coroutine function) until it returns something truthy,
    and return that, as a user polling with kubectl would; AssertionError naming `what` after
    `within` seconds. The one polling helper of every test tier."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(interval)


async def probe_labels(kube: KubeApi, ns: str) -> dict[str, str]:
    """A server-side dry-run pod create: what admission would do, with nothing stored."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "probe-"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    made = await kube.create(PODS, pod, namespace=ns, dry_run=True)
    return dict(made["metadata"].get("labels") or {})


async def pods_of(kube: KubeApi, ns: str, job: str) -> list[dict[str, Any]]:
    """The pods of one training job, by the Kubeflow operators' job-name label."""
    found = await kube.list(PODS, namespace=ns, label_selector=f"{JOB_NAME_LABEL}={job}")
    return list(found["items"])


async def open_volcano_queues(kube: KubeApi) -> None:
    """The Queues a cluster with Volcano has (no Volcano controller runs in the tests, so the
    test opens them as it would): the ones the shipped policies and the scenarios name."""
    for name in scenario.QUEUES:
        queue = scenario.volcano_queue(name)
        try:
            await kube.create(VOLCANO_QUEUES, queue)
        except ApiError as exc:
            if not exc.conflict:
                raise
        await kube.patch(VOLCANO_QUEUES, name, {"status": queue["status"]},
                         subresource="status")
