"""GPUs through DRA on the real kubelet: the agent (fake NVML, a DGX-1 V100) as the DRA driver
gpu.muster.io, on the node's containerd 2.x with CDI.

The module upgrades the release to `agent.gpuServing: both` (and rediscovery every few seconds,
for the stale-slice case), and back to the session's values after. Pods take one GPU each
through a ResourceClaimTemplate of the shipped DeviceClass; the stock kube-scheduler allocates
the claims, the kubelet asks the agent to prepare them, and containerd applies the agent's CDI
spec: each container prints the NVIDIA_VISIBLE_DEVICES it was given. The same 8 x 1 GPU then
runs as one MPIJob gang placed by Muster's binder twice: through the device plugin, and with
each worker's GPU through its own claim, which the binder allocates itself.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from jobs import PRINT_GPUS, delete_jobs, ensure_namespace, mpijob, submit
from real_helpers import agent_dra_state, agent_pod, kubectl, release_values, upgrade_release

from e2e.cluster import NAMESPACE
from e2e.node import image
from e2e.node.assets import REPO
from e2e.node.cluster import NODE_NAME, NodeCluster
from e2e.probes import eventually, pods_of
from webhook import keys
from webhook.agent.dra.claims import cdi_file_name
from webhook.agent.dra.slices import slice_name
from webhook.binder import BinderConfig
from webhook.kube import EVENTS, PODS, KubeApi
from webhook.kube.api import RESOURCE_CLAIMS, RESOURCE_SLICES, ApiError, Resource
from webhook.policy import operators

CHART = REPO / "charts" / "muster"
CLAIM_TEMPLATES = Resource("resource.k8s.io", "v1", "resourceclaimtemplates", True,
                           "ResourceClaimTemplate")
NS = "dra-team"
#: a topology namespace: the shipped policy mpi-topology gangs its MPIJobs for the binder
GANG_NS = "dra-gang"
TEMPLATE = "one-gpu"
#: the agent's discovery rounds in this module: a stale slice is put right within one
REDISCOVER_S = 3


@pytest.fixture(scope="module")
def dra_release(node_cluster: NodeCluster) -> Iterator[None]:
    """The release serving GPUs through the device plugin and DRA, until the module ends."""
    session = release_values(node_cluster)
    values = copy.deepcopy(session)
    values["agent"] = {**values["agent"], "gpuServing": "both", "extraArgs": [
        *values["agent"]["extraArgs"], f"--rediscover-seconds={REDISCOVER_S}"]}
    with node_cluster.netns():
        upgrade_release(node_cluster, values, "values-dra.yaml")
    yield
    with node_cluster.netns():
        upgrade_release(node_cluster, session, "values-dra.yaml")


@pytest.fixture
async def dra(dra_release: None, kube: KubeApi) -> AsyncIterator[KubeApi]:
    """The namespace with its one-GPU ResourceClaimTemplate; its pods are gone after."""
    await _claim_template(kube, await ensure_namespace(kube, NS))
    yield kube
    await _delete_pods(kube)


async def _claim_template(kube: KubeApi, ns: str) -> None:
    """The namespace's one-GPU ResourceClaimTemplate, unless an earlier test made it."""
    try:
        await kube.create(CLAIM_TEMPLATES, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": TEMPLATE, "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": keys.DRA_DRIVER,
                                            "count": 1}}]}}}}, namespace=ns)
    except ApiError as exc:
        if not exc.conflict:
            raise


def _pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}],
                     "containers": [{
                         "name": "main", "image": f"{image.IMAGE_REPOSITORY}:{image.IMAGE_TAG}",
                         "imagePullPolicy": "Never", "command": ["python", "-c", PRINT_GPUS],
                         "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                       "claims": [{"name": "gpu"}]}}]}}


async def _create_pods(kube: KubeApi, names: list[str]) -> float:
    """Creates the pods at once; the monotonic time the last create returned."""
    await asyncio.gather(*(kube.create(PODS, _pod(n), namespace=NS) for n in names))
    return time.monotonic()


async def _all_running(kube: KubeApi, names: list[str], within: float = 240
                       ) -> list[dict[str, Any]]:
    async def running() -> list[dict[str, Any]] | None:
        pods = [p for p in (await kube.list(PODS, namespace=NS))["items"]
                if p["metadata"]["name"] in names]
        ok = len(pods) == len(names) and all(p["status"].get("phase") == "Running"
                                             for p in pods)
        return pods if ok else None
    pods: list[dict[str, Any]] = await eventually(
        running, within=within, interval=0.2, what=f"{len(names)} DRA pods Running together")
    return pods


async def _delete_pods(kube: KubeApi) -> None:
    pods = (await kube.list(PODS, namespace=NS))["items"]
    for pod in pods:
        try:
            await kube.delete(PODS, pod["metadata"]["name"], NS)
        except ApiError as exc:
            if not exc.not_found:
                raise

    async def gone() -> bool:
        return not (await kube.list(PODS, namespace=NS))["items"]
    await eventually(gone, within=120, what=f"the pods of {NS} deleted")


async def _slice_uuids(kube: KubeApi) -> dict[str, str]:
    """Device name -> GPU UUID, as the agent's ResourceSlice publishes them."""
    live = await kube.get(RESOURCE_SLICES, slice_name(NODE_NAME))
    return {d["name"]: d["attributes"]["uuid"]["string"] for d in live["spec"]["devices"]}


async def _claim_of(kube: KubeApi, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's one claim, made from the template by the resourceclaim controller."""
    [status] = pod["status"]["resourceClaimStatuses"]
    return await kube.get(RESOURCE_CLAIMS, status["resourceClaimName"],
                          pod["metadata"]["namespace"])


async def _claimed_uuids(kube: KubeApi, pod: dict[str, Any], uuids: dict[str, str]
                         ) -> list[str]:
    """The GPUs the pod's claim was allocated, in allocation order."""
    claim = await _claim_of(kube, pod)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {r["driver"] for r in results} == {keys.DRA_DRIVER}
    assert {r["pool"] for r in results} == {NODE_NAME}
    return [uuids[r["device"]] for r in results]


async def _printed(cluster: NodeCluster, name: str, ns: str) -> list[str] | None:
    out = await asyncio.to_thread(kubectl, cluster, "logs", "-n", ns, name, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("GPUS="):
            return [u for u in line.removeprefix("GPUS=").split(",") if u]
    return None


async def _all_printed(cluster: NodeCluster, names: list[str], ns: str = NS
                       ) -> dict[str, list[str]]:
    async def printed() -> dict[str, list[str]] | None:
        seen = {n: await _printed(cluster, n, ns) for n in names}
        return {n: g for n, g in seen.items() if g is not None} \
            if all(g is not None for g in seen.values()) else None
    found: dict[str, list[str]] = await eventually(
        printed, within=60, interval=0.5, what="every container's GPUS line")
    return found


async def _prepared_exactly_the_claims(kube: KubeApi, cluster: NodeCluster, ns: str = NS
                                       ) -> None:
    """The driver's checkpoint and CDI specs are those of the namespace's claims, no other."""
    checkpoint, files = await asyncio.to_thread(agent_dra_state, cluster)
    uids = {c["metadata"]["uid"] for c in (await kube.list(RESOURCE_CLAIMS, namespace=ns))["items"]}
    assert set(checkpoint["claims"]) == uids
    assert sorted(files) == sorted(cdi_file_name(u) for u in uids)


async def _check_own_gpus(kube: KubeApi, cluster: NodeCluster, pods: list[dict[str, Any]]
                          ) -> dict[str, list[str]]:
    """Each container saw exactly its own claim's GPUs (per pod); pod name -> those GPUs."""
    uuids = await _slice_uuids(kube)
    printed = await _all_printed(cluster, [p["metadata"]["name"] for p in pods],
                                 pods[0]["metadata"]["namespace"])
    claimed = {p["metadata"]["name"]: await _claimed_uuids(kube, p, uuids) for p in pods}
    for name, gpus in claimed.items():
        assert printed[name] == gpus, (name, printed[name], gpus)
    return claimed


async def test_the_kubelet_registers_the_driver_and_the_slice_is_published(
        dra: KubeApi, node_cluster: NodeCluster) -> None:
    async def published() -> dict[str, Any] | None:
        found = (await dra.list(RESOURCE_SLICES,
                                field_selector=f"spec.nodeName={NODE_NAME}"))["items"]
        return found[0] if found else None
    live = await eventually(published, within=60, interval=0.5,
                            what="the agent's ResourceSlice")
    assert live["metadata"]["name"] == slice_name(NODE_NAME)
    assert live["spec"]["driver"] == keys.DRA_DRIVER
    assert live["spec"]["pool"]["name"] == NODE_NAME
    assert sorted(d["name"] for d in live["spec"]["devices"]) == [f"gpu-{i}" for i in range(8)]

    def registered() -> bool:  # the kubelet's NotifyRegistrationStatus(plugin_registered)
        out = kubectl(node_cluster, "logs", "-n", NAMESPACE, agent_pod(node_cluster),
                      check=False)
        return "DRA driver registered with the kubelet" in out.stdout
    await eventually(registered, within=60, interval=0.5,
                     what="the kubelet to register the DRA driver")


async def test_eight_one_gpu_pods_run_together_each_on_its_own_claims_gpu(
        dra: KubeApi, node_cluster: NodeCluster) -> None:
    names = [f"one-gpu-{i}" for i in range(8)]
    last_create = await _create_pods(dra, names)
    pods = await _all_running(dra, names)
    took = time.monotonic() - last_create
    print(f"8 x 1-GPU DRA pods: last create -> all Running in {took:.1f} s")
    claimed = await _check_own_gpus(dra, node_cluster, pods)
    every = [u for gpus in claimed.values() for u in gpus]
    assert sorted(every) == sorted((await _slice_uuids(dra)).values())  # each GPU once

    await _prepared_exactly_the_claims(dra, node_cluster)

    await _delete_pods(dra)
    await _all_unprepared(node_cluster)


async def _all_unprepared(cluster: NodeCluster) -> None:
    async def unprepared() -> bool:
        checkpoint, files = await asyncio.to_thread(agent_dra_state, cluster)
        return not checkpoint["claims"] and not files
    await eventually(unprepared, within=60, interval=0.5,
                     what="NodeUnprepareResources to empty the checkpoint and remove the specs")


async def _run_workers(kube: KubeApi, job: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    """Submits the MPIJob, its workers created at once; (the workers once all Run, seconds
    from the last create to all Running): the device-plugin and DRA gangs are timed alike."""
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    count = job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    await submit(kube, job, concurrently=True)
    last_create = time.monotonic()

    async def running() -> list[dict[str, Any]] | None:
        workers = [p for p in await pods_of(kube, ns, name)
                   if p["metadata"]["labels"][operators.JOB_ROLE_LABEL] == "worker"]
        return workers if len(workers) == count and all(
            p["status"].get("phase") == "Running" for p in workers) else None
    workers: list[dict[str, Any]] = await eventually(
        running, within=300, interval=0.2, what=f"the {count} workers Running")
    return workers, time.monotonic() - last_create


async def test_the_device_plugin_path_for_comparison(
        dra: KubeApi, node_cluster: NodeCluster) -> None:
    """The same 8 x 1 GPU on the same node through the device plugin: a topology MPIJob of 8
    workers, which the binder places whole and its gate lets into the kubelet one GPU pod at a
    time. Timed as the DRA pods are, last create to every worker Running."""
    ns = await ensure_namespace(dra, "dra-compare", {
        keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED})
    try:
        workers, took = await _run_workers(dra, mpijob("eight", ns, workers=8))
        print(f"8 x 1-GPU device-plugin workers: last create -> all Running in {took:.1f} s")
        printed = await _all_printed(node_cluster, [p["metadata"]["name"] for p in workers], ns)
        every = [u for gpus in printed.values() for u in gpus]
        assert len(every) == len(set(every)) == 8
    finally:
        await delete_jobs(dra, ns, ["eight"])


def _claiming_workers(job: dict[str, Any]) -> dict[str, Any]:
    """The MPIJob with each worker's GPU taken through its own claim from the template instead
    of the device plugin's nvidia.com/gpu."""
    spec = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}]
    for c in spec["containers"]:
        del c["resources"]["limits"][keys.GPU_RESOURCE]
        c["resources"]["claims"] = [{"name": "gpu"}]
    return job


async def _binder_scheduled(kube: KubeApi, pod: dict[str, Any], gang: str) -> dict[str, Any]:
    """The binder's Scheduled Event for the pod as a member of `gang` (kube-scheduler's says
    neither its component nor a gang)."""
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]

    async def found() -> dict[str, Any] | None:
        events = (await kube.list(EVENTS, namespace=ns, field_selector=(
            f"reason=Scheduled,involvedObject.name={name}")))["items"]
        return next((e for e in events
                     if e.get("reportingComponent") == BinderConfig().component
                     and e["message"].endswith(f" as part of gang {gang}")), None)
    event: dict[str, Any] = await eventually(found, within=30, interval=0.5,
                                             what=f"the binder's Scheduled Event for {name}")
    return event


async def test_eight_dra_workers_are_one_binder_gang_each_on_its_own_claims_gpu(
        dra: KubeApi, node_cluster: NodeCluster) -> None:
    """The device-plugin comparison's MPIJob with each worker's GPU through its own claim, in a
    topology namespace: the webhook gangs the job for the binder, which allocates the claims
    itself and binds the 8 workers without the one-pod-per-node gate."""
    ns = await ensure_namespace(dra, GANG_NS, {
        keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED})
    await _claim_template(dra, ns)
    try:
        workers, took = await _run_workers(dra, _claiming_workers(mpijob("eight", ns, workers=8)))
        print(f"8 x 1-GPU DRA workers, one binder gang: last create -> all Running in "
              f"{took:.1f} s")
        gangs = {w["metadata"]["annotations"][keys.ANN_GANG_NAME] for w in workers}
        assert len(gangs) == 1, gangs
        gang = f"{ns}/{gangs.pop()}"
        for w in workers:
            name, annotations = w["metadata"]["name"], w["metadata"]["annotations"]
            assert w["spec"]["schedulerName"] == keys.DEFAULT_BINDER_SCHEDULER_NAME
            assert w["spec"]["nodeName"] == NODE_NAME
            assert keys.ANN_GANG_PLACEMENT in annotations, name
            assert keys.ANN_GPU_ASSIGNMENT not in annotations, name  # the claim is the record
            claim = await _claim_of(dra, w)
            assert [(r["resource"], r["name"], r["uid"]) for r in claim["status"]["reservedFor"]
                    ] == [("pods", name, w["metadata"]["uid"])]
            await _binder_scheduled(dra, w, gang)
        claimed = await _check_own_gpus(dra, node_cluster, workers)
        every = [u for gpus in claimed.values() for u in gpus]
        assert sorted(every) == sorted((await _slice_uuids(dra)).values())  # each GPU once
        await _prepared_exactly_the_claims(dra, node_cluster, ns)
    finally:
        await delete_jobs(dra, ns, ["eight"])
    await _all_unprepared(node_cluster)


async def test_a_named_claim_the_binder_allocated_is_let_go_once_its_pod_is_done(
        dra: KubeApi, node_cluster: NodeCluster) -> None:
    """The resourceclaim controller deallocates a claim whose last user is done only if the
    claim carries kube-scheduler's finalizer, which the binder therefore adds before it
    allocates, as kube-scheduler does. Without it a named claim kept its GPU after its pod had
    finished, for good."""
    await dra.create(RESOURCE_CLAIMS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "kept", "namespace": NS},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": keys.DRA_DRIVER, "count": 1}}]}}},
        namespace=NS)
    try:
        pod = _pod("once")
        pod["spec"].update(schedulerName=keys.DEFAULT_BINDER_SCHEDULER_NAME,
                           restartPolicy="Never",
                           resourceClaims=[{"name": "gpu", "resourceClaimName": "kept"}])
        pod["spec"]["containers"][0]["command"] = ["python", "-c", "print('done')"]
        await dra.create(PODS, pod, namespace=NS)

        async def done() -> bool:
            live = await dra.get(PODS, "once", NS)
            return live["status"].get("phase") == "Succeeded"
        await eventually(done, within=120, interval=0.5, what="the pod to run to completion")
        events = (await dra.list(EVENTS, namespace=NS, field_selector=(
            "reason=Scheduled,involvedObject.name=once")))["items"]
        assert [e.get("reportingComponent") for e in events] == [BinderConfig().component]

        async def let_go() -> dict[str, Any] | None:
            claim = await dra.get(RESOURCE_CLAIMS, "kept", NS)
            status = claim.get("status") or {}
            return claim if not status.get("allocation") and not status.get("reservedFor") \
                and keys.CLAIM_FINALIZER not in claim["metadata"].get("finalizers", ()) \
                else None
        await eventually(let_go, within=60, interval=0.5,
                         what="the resourceclaim controller to deallocate the claim")
    finally:
        await _delete_pods(dra)
        await dra.delete(RESOURCE_CLAIMS, "kept", NS)


async def test_claims_prepared_across_an_agent_restart_and_no_gpu_twice(
        dra: KubeApi, node_cluster: NodeCluster) -> None:
    """Four pods run; the agent is killed (no grace) as four more are created, so their claims
    are prepared by the restarted agent, which must know the first four from its checkpoint."""
    first, then = [f"before-{i}" for i in range(4)], [f"after-{i}" for i in range(4)]
    await _create_pods(dra, first)
    await _all_running(dra, first)
    kubectl(node_cluster, "delete", "pod", "-n", NAMESPACE, agent_pod(node_cluster),
            "--grace-period=0", "--force", "--wait=false")
    await _create_pods(dra, then)
    pods = await _all_running(dra, first + then, within=300)
    claimed = await _check_own_gpus(dra, node_cluster, pods)
    every = [u for gpus in claimed.values() for u in gpus]
    assert len(every) == len(set(every)) == 8

    await _prepared_exactly_the_claims(dra, node_cluster)  # the first four kept through it


async def test_a_stale_slice_is_put_right_within_a_few_discoveries(
        dra: KubeApi, node_cluster: NodeCluster) -> None:
    """A device the node no longer has is dropped from the agent's own slice on the next round
    (each round reads it); another slice of the driver on this node goes at the next sweep
    (every 5th round lists the node's slices: SlicePublisher.sweep_every)."""
    name = slice_name(NODE_NAME)
    live = await dra.get(RESOURCE_SLICES, name)
    wanted = live["spec"]["devices"]
    vanished = {**copy.deepcopy(wanted[0]), "name": "gpu-8"}  # a GPU the node no longer has
    vanished["attributes"]["uuid"] = {"string": "GPU-vanished"}
    stale = copy.deepcopy(live)
    stale["spec"]["devices"] = [*wanted, vanished]
    await dra.replace(RESOURCE_SLICES, name, stale)
    old_name = f"{NODE_NAME}-an-earlier-agent"
    await dra.create(RESOURCE_SLICES, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": old_name},
        "spec": {"driver": keys.DRA_DRIVER, "nodeName": NODE_NAME,
                 "pool": {"name": NODE_NAME, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{**vanished, "name": "gpu-9"}]}})

    async def right() -> bool:
        items = (await dra.list(RESOURCE_SLICES,
                                field_selector=f"spec.nodeName={NODE_NAME}"))["items"]
        return [i["metadata"]["name"] for i in items] == [name] and \
            items[0]["spec"]["devices"] == wanted
    await eventually(right, within=REDISCOVER_S * 10, interval=0.5,
                     what="the agent to drop the vanished GPU and the earlier agent's slice")
