"""Plain `nvidia.com/gpu: N` requests served through DRA on the real kubelet (Kubernetes 1.37,
DRA-backed extended resources, KEP-5004): users change nothing.

The module upgrades the release to `agent.gpuServing: dra` (the agent is the DRA driver only, so
the node's allocatable nvidia.com/gpu drops to 0 once its device plugin is gone), and back to the
session's values after, waiting for the device plugin's 8 GPUs to be allocatable again. The
chart's DeviceClass gpu.muster.io names `extendedResourceName: nvidia.com/gpu`; pods here carry
no claim, only `limits: {nvidia.com/gpu: 1}`. kube-scheduler (default scheduler) and the binder
(a topology MPIJob) each make the pod its special claim, allocate it from the agent's slice and
name it in `status.extendedResourceClaimStatus`; the kubelet admits the pod by that mapping and
asks the agent to prepare the claim, and each container prints the NVIDIA_VISIBLE_DEVICES it got.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from jobs import PRINT_GPUS, delete_jobs, ensure_namespace, mpijob, submit
from real_helpers import agent_dra_state, kubectl, release_values, upgrade_release

from e2e.node import image
from e2e.node.cluster import NODE_NAME, NodeCluster
from e2e.probes import eventually, pods_of
from webhook import keys
from webhook.agent.dra.claims import cdi_file_name
from webhook.agent.dra.slices import slice_name
from webhook.kube import NODES, PODS, KubeApi
from webhook.kube.api import RESOURCE_CLAIMS, RESOURCE_SLICES, ApiError
from webhook.policy import operators

#: kube-scheduler's pods (the default scheduler: a namespace without the topology label)
PLAIN_NS = "dra-plain"
#: the binder's gangs (the topology label: the webhook hands its jobs to muster-binder)
GANG_NS = "dra-plain-gang"
#: DRA-backed extended resources are beta and on from this minor (DRAExtendedResource)
FIRST_MINOR = 37


#: the node's (allocatable, capacity) nvidia.com/gpu
NodeGpus = tuple[str | None, str | None]


def _node_gpus(cluster: NodeCluster) -> NodeGpus:
    """The node's (allocatable, capacity) nvidia.com/gpu as its kubelet reports them."""
    out = kubectl(cluster, "get", "node", NODE_NAME, "-o", "json")
    status = json.loads(out.stdout)["status"]
    return (status.get("allocatable", {}).get(keys.GPU_RESOURCE),
            status.get("capacity", {}).get(keys.GPU_RESOURCE))


def _wait_node_gpus(cluster: NodeCluster, done: Callable[[NodeGpus], bool], what: str,
                    within: float = 420) -> float:
    """Seconds until `done((allocatable, capacity))` holds; prints what the kubelet reported."""
    started = time.monotonic()
    seen = _node_gpus(cluster)
    while not done(seen):
        if time.monotonic() - started > within:
            raise AssertionError(f"{what}: the node still reports (allocatable, capacity) "
                                 f"{seen} after {within:.0f} s")
        time.sleep(0.5)
        seen = _node_gpus(cluster)
    took = time.monotonic() - started
    print(f"{what} in {took:.1f} s: (allocatable, capacity) nvidia.com/gpu = {seen}")
    return took


def _slice_devices(cluster: NodeCluster) -> int | None:
    """The devices of the agent's ResourceSlice (None: there is none)."""
    out = kubectl(cluster, "get", "resourceslice", slice_name(NODE_NAME), "-o", "json",
                  check=False)
    if out.returncode != 0:
        return None
    return len(json.loads(out.stdout)["spec"]["devices"])


def _wait_slice(cluster: NodeCluster, within: float = 180) -> None:
    """Until the agent publishes its slice of 8 GPUs (each discovery round checks it, so a
    slice that is gone comes back within a round, 60 s by default)."""
    started = time.monotonic()
    while (devices := _slice_devices(cluster)) != 8:
        if time.monotonic() - started > within:
            raise AssertionError(f"the agent's ResourceSlice {slice_name(NODE_NAME)} has "
                                 f"{devices} devices after {within:.0f} s, not 8")
        time.sleep(0.5)
    print(f"the agent's ResourceSlice of 8 GPUs in {time.monotonic() - started:.1f} s")


@pytest.fixture(scope="module")
def dra_only_release(node_cluster: NodeCluster) -> Iterator[None]:
    """The release serving GPUs through DRA only, until the module ends; then the device plugin
    back and its 8 GPUs allocatable again, so later modules find the node as they expect."""
    minor = int(node_cluster.version.lstrip("v").split(".")[1])
    if minor < FIRST_MINOR:
        pytest.skip(f"Kubernetes {node_cluster.version} has no DRA-backed extended resources "
                    f"(1.{FIRST_MINOR}+)")
    session = release_values(node_cluster)
    values = copy.deepcopy(session)
    values["agent"] = {**values["agent"], "gpuServing": "dra"}
    try:
        with node_cluster.netns():
            # the node as the session leaves it (an earlier module's release flips end there):
            # else "0 after the upgrade" below would hold before the upgrade did anything
            _wait_node_gpus(node_cluster, lambda s: s[0] == "8",
                            "the device plugin's 8 GPUs allocatable before the upgrade")
            started = time.monotonic()
            upgrade_release(node_cluster, values, "values-dra-only.yaml")
            print(f"helm upgrade to gpuServing=dra: {time.monotonic() - started:.1f} s")
            # the kubelet keeps a departed device plugin's resource, its devices unhealthy, for
            # a grace period; kube-scheduler and the binder serve through DRA where it is 0
            _wait_node_gpus(node_cluster, lambda s: s[0] in (None, "0"),
                            "allocatable nvidia.com/gpu 0 or gone after the upgrade")
            _wait_slice(node_cluster)
        yield
    finally:
        with node_cluster.netns():
            started = time.monotonic()
            upgrade_release(node_cluster, session, "values-session.yaml")
            print(f"helm upgrade back to the session's values: "
                  f"{time.monotonic() - started:.1f} s")
            _wait_node_gpus(node_cluster, lambda s: s[0] == "8",
                            "the device plugin's 8 GPUs allocatable again")


@pytest.fixture
async def dra(dra_only_release: None, kube: KubeApi) -> AsyncIterator[KubeApi]:
    """The two namespaces; their pods are gone after (the test's own cleanup may fail)."""
    await ensure_namespace(kube, PLAIN_NS)
    await ensure_namespace(kube, GANG_NS, {
        keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED})
    yield kube
    for ns in (PLAIN_NS, GANG_NS):
        for pod in (await kube.list(PODS, namespace=ns))["items"]:
            try:
                await kube.delete(PODS, pod["metadata"]["name"], ns)
            except ApiError as exc:
                if not exc.not_found:
                    raise


def _plain_pod(name: str) -> dict[str, Any]:
    """A pod as users write it: no claim, one GPU by the extended resource."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": PLAIN_NS},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                "name": "main", "image": f"{image.IMAGE_REPOSITORY}:{image.IMAGE_TAG}",
                "imagePullPolicy": "Never", "command": ["python", "-c", PRINT_GPUS],
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                              "limits": {keys.GPU_RESOURCE: 1}}}]}}


async def _running(kube: KubeApi, ns: str, names: list[str], within: float = 240
                   ) -> list[dict[str, Any]]:
    async def running() -> list[dict[str, Any]] | None:
        pods = [p for p in (await kube.list(PODS, namespace=ns))["items"]
                if p["metadata"]["name"] in names]
        ok = len(pods) == len(names) and all(p["status"].get("phase") == "Running"
                                             for p in pods)
        return pods if ok else None
    pods: list[dict[str, Any]] = await eventually(
        running, within=within, interval=0.2, what=f"{len(names)} pods of {ns} Running")
    return pods


async def _printed(cluster: NodeCluster, ns: str, name: str) -> list[str] | None:
    out = await asyncio.to_thread(kubectl, cluster, "logs", "-n", ns, name, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("GPUS="):
            return [u for u in line.removeprefix("GPUS=").split(",") if u]
    return None


async def _slice_uuids(kube: KubeApi) -> dict[str, str]:
    """Device name -> GPU UUID, as the agent's ResourceSlice publishes them."""
    live = await kube.get(RESOURCE_SLICES, slice_name(NODE_NAME))
    return {d["name"]: d["attributes"]["uuid"]["string"] for d in live["spec"]["devices"]}


async def _own_claims_gpus(kube: KubeApi, cluster: NodeCluster, pods: list[dict[str, Any]],
                           scheduler: str) -> dict[str, list[str]]:
    """Each pod's special claim as kube-scheduler makes it (the pod its controller, the
    annotation, its container mapped to the claim's request, allocated from the agent's slice,
    reserved for the pod), and its container printing exactly the claim's GPUs; pod name ->
    those GPUs."""
    uuids = await _slice_uuids(kube)
    out = {}
    for pod in pods:
        meta, ns = pod["metadata"], pod["metadata"]["namespace"]
        assert pod["spec"]["schedulerName"] == scheduler, meta["name"]
        assert not pod["spec"].get("resourceClaims"), meta["name"]  # as the user wrote it
        assert keys.ANN_GPU_ASSIGNMENT not in (meta.get("annotations") or {}), meta["name"]
        status = pod["status"]["extendedResourceClaimStatus"]
        [mapping] = status["requestMappings"]
        [gpu_container] = [c["name"] for c in pod["spec"]["containers"]
                           if keys.GPU_RESOURCE in c["resources"].get("limits", {})]
        assert (mapping["containerName"], mapping["resourceName"]) == (gpu_container,
                                                                       keys.GPU_RESOURCE)
        claim = await kube.get(RESOURCE_CLAIMS, status["resourceClaimName"], ns)
        cmeta = claim["metadata"]
        assert cmeta["name"].startswith(f"{meta['name']}-extended-resources-")
        assert cmeta["annotations"][keys.EXTENDED_CLAIM_ANNOTATION] == "true"
        [owner] = cmeta["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner.get("controller")) == (
            "Pod", meta["name"], meta["uid"], True)
        [request] = claim["spec"]["devices"]["requests"]
        assert request["name"] == mapping["requestName"]
        assert request["exactly"]["deviceClassName"] == keys.DRA_DRIVER
        assert [r["uid"] for r in claim["status"]["reservedFor"]] == [meta["uid"]]
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [(r["request"], r["driver"], r["pool"]) for r in results] == [
            (mapping["requestName"], keys.DRA_DRIVER, NODE_NAME)]
        out[meta["name"]] = [uuids[r["device"]] for r in results]

    async def printed() -> dict[str, list[str] | None] | None:
        seen = {p["metadata"]["name"]: await _printed(cluster, p["metadata"]["namespace"],
                                                      p["metadata"]["name"]) for p in pods}
        return seen if all(g is not None for g in seen.values()) else None
    seen = await eventually(printed, within=60, interval=0.5, what="every container's GPUS line")
    for name, gpus in out.items():
        assert seen[name] == gpus, (name, seen[name], gpus)  # per pod: exactly its claim's GPU
    return out


async def _released(kube: KubeApi, cluster: NodeCluster) -> None:
    """No claim left in the namespaces (the garbage collector followed the pods), and the agent
    unprepared them all: an empty checkpoint and no CDI spec."""
    async def no_claims() -> bool:
        left = [c for ns in (PLAIN_NS, GANG_NS)
                for c in (await kube.list(RESOURCE_CLAIMS, namespace=ns))["items"]]
        return not left
    await eventually(no_claims, within=120, interval=0.5,
                     what="the special claims deleted with their pods")

    async def unprepared() -> bool:
        checkpoint, files = await asyncio.to_thread(agent_dra_state, cluster)
        return not checkpoint["claims"] and not files
    await eventually(unprepared, within=60, interval=0.5,
                     what="NodeUnprepareResources to empty the checkpoint and remove the specs")


async def _prepared_exactly(kube: KubeApi, cluster: NodeCluster,
                            pods: list[dict[str, Any]]) -> None:
    """The agent's checkpoint and CDI specs are those of the pods' special claims, no other."""
    claims = [await kube.get(RESOURCE_CLAIMS,
                             p["status"]["extendedResourceClaimStatus"]["resourceClaimName"],
                             p["metadata"]["namespace"]) for p in pods]
    uids = {c["metadata"]["uid"] for c in claims}
    checkpoint, files = await asyncio.to_thread(agent_dra_state, cluster)
    assert set(checkpoint["claims"]) == uids
    assert sorted(files) == sorted(cdi_file_name(u) for u in uids)


async def _delete_plain(kube: KubeApi, names: list[str]) -> None:
    await asyncio.gather(*(kube.delete(PODS, n, PLAIN_NS) for n in names))

    async def gone() -> bool:
        return not (await kube.list(PODS, namespace=PLAIN_NS))["items"]
    await eventually(gone, within=120, what=f"the pods of {PLAIN_NS} deleted")


async def _gang_workers(kube: KubeApi, name: str, count: int) -> list[dict[str, Any]]:
    async def running() -> list[dict[str, Any]] | None:
        pods = await pods_of(kube, GANG_NS, name)
        workers = [p for p in pods
                   if p["metadata"]["labels"][operators.JOB_ROLE_LABEL] == "worker"]
        ok = len(pods) == count + 1 and all(p["status"].get("phase") == "Running"
                                            for p in pods)
        return workers if ok else None
    workers: list[dict[str, Any]] = await eventually(
        running, within=300, interval=0.2, what=f"{name}'s {count + 1} pods Running")
    return workers


async def test_the_node_serves_gpus_by_its_slice_only(dra: KubeApi) -> None:
    """What both schedulers decide by: no allocatable nvidia.com/gpu, the agent's slice of 8,
    and the shipped DeviceClass mapping nvidia.com/gpu to it."""
    node = await dra.get(NODES, NODE_NAME)
    assert node["status"]["allocatable"].get(keys.GPU_RESOURCE, "0") == "0"
    devices = (await dra.get(RESOURCE_SLICES, slice_name(NODE_NAME)))["spec"]["devices"]
    assert len(devices) == 8
    classes = (await dra.request("GET", "/apis/resource.k8s.io/v1/deviceclasses"))["items"]
    assert [c["metadata"]["name"] for c in classes
            if c["spec"].get("extendedResourceName") == keys.GPU_RESOURCE] == [keys.DRA_DRIVER]


async def test_kube_scheduler_serves_plain_requests_through_special_claims(
        dra: KubeApi, node_cluster: NodeCluster) -> None:
    names = [f"plain-{i}" for i in range(4)]
    await asyncio.gather(*(dra.create(PODS, _plain_pod(n), namespace=PLAIN_NS) for n in names))
    last_create = time.monotonic()
    pods = await _running(dra, PLAIN_NS, names)
    print(f"4 x 1-GPU plain pods, kube-scheduler through DRA: last create -> all Running in "
          f"{time.monotonic() - last_create:.1f} s")
    claimed = await _own_claims_gpus(dra, node_cluster, pods, "default-scheduler")
    every = [u for gpus in claimed.values() for u in gpus]
    assert len(every) == len(set(every)) == 4
    await _prepared_exactly(dra, node_cluster, pods)

    await _delete_plain(dra, names)
    await _released(dra, node_cluster)


async def test_the_binder_serves_a_plain_gang_through_special_claims(
        dra: KubeApi, node_cluster: NodeCluster) -> None:
    """A topology MPIJob of 4 x 1 GPU, placed whole by the binder: it makes and allocates each
    worker's special claim and names it in the worker's status before the Binding."""
    await submit(dra, mpijob("plain-gang", GANG_NS), concurrently=True)
    last_create = time.monotonic()
    try:
        workers = await _gang_workers(dra, "plain-gang", 4)
        print(f"4 x 1-GPU plain gang, the binder through DRA: last create -> all Running in "
              f"{time.monotonic() - last_create:.1f} s")
        claimed = await _own_claims_gpus(dra, node_cluster, workers,
                                         keys.DEFAULT_BINDER_SCHEDULER_NAME)
        every = [u for gpus in claimed.values() for u in gpus]
        assert len(every) == len(set(every)) == 4
        await _prepared_exactly(dra, node_cluster, workers)
    finally:
        await delete_jobs(dra, GANG_NS, ["plain-gang"])
    await _released(dra, node_cluster)


async def test_both_schedulers_share_the_node_without_a_gpu_twice(
        dra: KubeApi, node_cluster: NodeCluster) -> None:
    """kube-scheduler's 4 plain pods hold half the node by their claims; the binder's 4-worker
    gang then gets the other half, each container its own claim's GPU."""
    names = [f"shared-{i}" for i in range(4)]
    await asyncio.gather(*(dra.create(PODS, _plain_pod(n), namespace=PLAIN_NS) for n in names))
    plain = await _running(dra, PLAIN_NS, names)
    await submit(dra, mpijob("half-node", GANG_NS), concurrently=True)
    try:
        workers = await _gang_workers(dra, "half-node", 4)
        by_scheduler = await _own_claims_gpus(dra, node_cluster, plain, "default-scheduler")
        by_binder = await _own_claims_gpus(dra, node_cluster, workers,
                                           keys.DEFAULT_BINDER_SCHEDULER_NAME)
        every = [u for gpus in (*by_scheduler.values(), *by_binder.values()) for u in gpus]
        assert sorted(every) == sorted((await _slice_uuids(dra)).values())  # each GPU once
        await _prepared_exactly(dra, node_cluster, plain + workers)
    finally:
        await delete_jobs(dra, GANG_NS, ["half-node"])
    await _delete_plain(dra, names)
    await _released(dra, node_cluster)
