"""GPUs through the real kubelet: the agent (fake NVML, a DGX-1 V100) registers its device plugin,
the binder pod places a topology MPIJob whole, and each container sees exactly the GPUs the binder
wrote on its own pod."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from jobs import delete_jobs, ensure_namespace, mpijob, submit
from real_helpers import assigned_indices, assigned_uuids, kubectl, pod_ready, with_api

from e2e.cluster import NAMESPACE
from e2e.node.cluster import NODE_NAME, NodeCluster
from e2e.probes import eventually, pods_of
from webhook import keys
from webhook.kube import NODES, PODS, KubeApi
from webhook.policy import operators
from webhook.topology import builtin, set_score

DGX1 = builtin("dgx1-v100")
NS, JOBS = "gpu-team", ["first", "second"]


@pytest.fixture(scope="module", autouse=True)
def _jobs_deleted_after(node_cluster: NodeCluster) -> Iterator[None]:
    """The module's two jobs hold all of the node's GPUs, and its second test reuses them;
    after it, they go, so that a later module finds the GPUs free."""
    yield
    with node_cluster.netns():
        with_api(node_cluster, lambda kube: delete_jobs(kube, NS, JOBS))


async def _printed_gpus(cluster: NodeCluster, pod: dict[str, Any]) -> list[str] | None:
    """What the container printed of NVIDIA_VISIBLE_DEVICES, from its log via the kubelet."""
    out = await asyncio.to_thread(kubectl, cluster, "logs", "-n", pod["metadata"]["namespace"],
                                  pod["metadata"]["name"], check=False)
    for line in out.stdout.splitlines():
        if line.startswith("GPUS="):
            return [u for u in line.removeprefix("GPUS=").split(",") if u]
    return None


async def _running_job(kube: KubeApi, ns: str, name: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = []

    async def running() -> bool:
        nonlocal pods
        pods = await pods_of(kube, ns, name)
        return len(pods) == 5 and all(p["status"].get("phase") == "Running" for p in pods)
    # generous: on a loaded 2-core machine the GPU gate admits one pod at a time
    await eventually(running, within=300, what=f"{name}'s 5 pods bound and running")
    return pods


async def test_device_plugin_registers_with_the_kubelet(kube: KubeApi) -> None:
    async def eight() -> bool:
        node = await kube.get(NODES, NODE_NAME)
        return bool(node["status"].get("capacity", {}).get(keys.GPU_RESOURCE) == "8")
    await eventually(eight, within=60, what="the kubelet to report 8 nvidia.com/gpu")
    node = await kube.get(NODES, NODE_NAME)
    assert node["status"]["allocatable"][keys.GPU_RESOURCE] == "8"
    assert keys.ANN_NODE_TOPOLOGY in node["metadata"]["annotations"]  # the agent published it

    async def recorded() -> bool:
        """The node records its live agent pod, which is Ready once the kubelet took its plugin:
        what the binder waits for before it places GPU pods there."""
        node = await kube.get(NODES, NODE_NAME)
        pods = (await kube.list(PODS, namespace=NAMESPACE,
                                label_selector="app.kubernetes.io/component=agent"))["items"]
        return any(node["metadata"]["annotations"].get(keys.ANN_GPU_AGENT) == keys.gpu_agent(
            NAMESPACE, p["metadata"]["name"], p["metadata"]["uid"]) and pod_ready(p)
            for p in pods if not p["metadata"].get("deletionTimestamp"))
    await eventually(recorded, within=60, what="the node to record its Ready agent pod")


async def _run_two_jobs(kube: KubeApi, cluster: NodeCluster
                        ) -> list[tuple[dict[str, Any], list[str] | None]]:
    """Two topology MPIJobs of 4 x 1 GPU (the whole node), each bound whole by the binder pod
    and started by the kubelet: every worker with what its container printed."""
    ns = await ensure_namespace(kube, NS, {
        keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED})
    out = []
    for name in JOBS:
        if not await pods_of(kube, ns, name):
            await submit(kube, mpijob(name, ns))
        pods = await _running_job(kube, ns, name)
        assert all(p["spec"]["nodeName"] == NODE_NAME for p in pods)
        workers = [p for p in pods if p["metadata"]["labels"][operators.JOB_ROLE_LABEL] == "worker"]
        chosen = sorted(i for p in workers for i in assigned_indices(p))
        assert len(chosen) == 4
        if name == "first":  # an empty node: the best 4-GPU NVLink set
            best = max(set_score(DGX1, c).allreduce_gbps
                       for c in itertools.combinations(range(DGX1.size), 4))
            assert set_score(DGX1, chosen).allreduce_gbps == best
        out += [(p, await _printed_gpus(cluster, p)) for p in workers]
    return out


async def test_jobs_run_on_the_gpus_the_binder_chose_and_no_gpu_twice(
        kube: KubeApi, node_cluster: NodeCluster) -> None:
    workers = await _run_two_jobs(kube, node_cluster)
    written = [u for p, _ in workers for u in assigned_uuids(p)]
    printed = [u for _, gpus in workers for u in gpus or []]
    assert all(gpus is not None and len(gpus) == 1 for _, gpus in workers), workers
    assert len(set(written)) == 8 and len(written) == 8  # the whole node, no GPU twice
    assert sorted(printed) == sorted(written)  # what the kubelet handed out is what was chosen


async def test_each_container_sees_exactly_the_gpus_written_on_its_own_pod(
        kube: KubeApi, node_cluster: NodeCluster) -> None:
    for pod, printed in await _run_two_jobs(kube, node_cluster):
        assert printed == assigned_uuids(pod), pod["metadata"]["name"]  # per pod
