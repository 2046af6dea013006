"""Failure under load on the real node: a webhook pod deleted while 200 pods are created, and the
binder's leader deleted while it binds a topology gang."""

from __future__ import annotations

import asyncio
from typing import Any

from jobs import delete_jobs, ensure_namespace, mpijob, submit
from real_helpers import assigned_indices, wait_webhook_pods, webhook_pods

from e2e.cluster import NAMESPACE
from e2e.node.cluster import NODE_NAME
from e2e.probes import eventually, pods_of
from webhook import keys
from webhook.kube import LEASES, MPIJOBS, PODS, VOLCANO_PODGROUPS, ApiError, KubeApi
from webhook.policy import operators

JOBS_UNDER_LOAD, WORKERS = 10, 20  # 200 pods


async def test_deleting_a_webhook_pod_during_200_creates_loses_no_pod(kube: KubeApi) -> None:
    ns = await ensure_namespace(kube, "team-a")  # policy mpi-volcano: a PodGroup per job
    names = [f"load-{i}" for i in range(JOBS_UNDER_LOAD)]
    pods: list[dict[str, Any]] = []
    for name in names:
        made = await kube.create(MPIJOBS, mpijob(name, ns, workers=WORKERS), namespace=ns)
        pods += operators.mpi_worker_pods(made)
    victim = (await webhook_pods(kube))[0]["metadata"]["name"]
    gate = asyncio.Semaphore(8)  # 8 clients creating at once
    done, failures = 0, []
    underway = asyncio.Event()

    async def create(pod: dict[str, Any]) -> None:
        nonlocal done
        async with gate:
            try:
                await kube.create(PODS, pod, namespace=ns)
            except ApiError as exc:
                failures.append(f"{pod['metadata']['name']}: {exc}")
            done += 1
            if done == 40:
                underway.set()

    async def delete_webhook_pod() -> None:
        await underway.wait()
        await kube.delete(PODS, victim, NAMESPACE)  # graceful, as a drain or rollout does

    try:
        await asyncio.gather(delete_webhook_pod(), *(create(p) for p in pods))
        assert failures == []
        made = [p for name in names for p in await pods_of(kube, ns, name)]
        assert len(made) == JOBS_UNDER_LOAD * WORKERS
        unmutated = [p["metadata"]["name"] for p in made
                     if keys.VOLCANO_GROUP_ANNOTATION not in p["metadata"].get("annotations", {})
                     or p["spec"]["schedulerName"] != "volcano"]
        assert unmutated == []  # none slipped through failurePolicy Ignore
        for name in names:  # exactly one PodGroup per job
            groups = (await kube.list(VOLCANO_PODGROUPS, namespace=ns,
                                      field_selector=f"metadata.name={name}"))["items"]
            assert [g["spec"]["minMember"] for g in groups] == [WORKERS + 1]
        assert victim not in [p["metadata"]["name"] for p in await webhook_pods(kube)]
    finally:
        await delete_jobs(kube, ns, names)

    await wait_webhook_pods(kube, 2, within=120)  # the Deployment replaced the deleted one


async def test_binder_leader_deleted_mid_gang_binds_it_whole_and_no_gpu_twice(
        kube: KubeApi) -> None:
    ns = await ensure_namespace(kube, "gpu-team", {
        keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED})
    names = ["crash-a", "crash-b"]  # 2 x 4 GPUs: the whole node
    lease = await kube.get(LEASES, "muster-binder", namespace=NAMESPACE)
    leader = lease["spec"]["holderIdentity"].rsplit("_", 1)[0]  # hostname_pid; hostname = pod
    seen: list[int] = []
    try:
        for name in names:
            await submit(kube, mpijob(name, ns), concurrently=True)

        async def first_bound() -> bool:
            pods = [p for n in names for p in await pods_of(kube, ns, n)]
            bound = [p for p in pods if p["spec"].get("nodeName") and assigned_indices(p)]
            seen.append(len(bound))
            return bool(bound)
        await eventually(first_bound, within=60, what="a first GPU pod to be bound")
        await kube.delete(PODS, leader, NAMESPACE)  # the leader goes, mid-gang or close to it

        pods: list[dict[str, Any]] = []

        async def all_running() -> bool:
            nonlocal pods
            pods = [p for n in names for p in await pods_of(kube, ns, n)]
            return len(pods) == 10 and all(p["status"].get("phase") == "Running" for p in pods)
        await eventually(all_running, within=180, what="both gangs bound whole and running")
        gpus = [i for p in pods for i in assigned_indices(p)]
        assert sorted(gpus) == list(range(8))  # every GPU once: none assigned twice
        assert {p["spec"]["nodeName"] for p in pods} == {NODE_NAME}
        for name in names:  # each gang whole: 4 workers with one GPU each
            workers = [p for p in pods if p["metadata"]["name"].startswith(f"{name}-worker")]
            assert sorted(len(assigned_indices(p)) for p in workers) == [1, 1, 1, 1]
        after = await kube.get(LEASES, "muster-binder", namespace=NAMESPACE)
        assert after["spec"]["holderIdentity"].rsplit("_", 1)[0] != leader  # another replica
    finally:
        await delete_jobs(kube, ns, names)
