"""Muster's coscheduling PodGroups in the hands of the real coscheduling plugin: scheduler-plugins'
kube-scheduler (built from the module proxy, `e2e.node.schedulers`) runs beside the cluster as the
second scheduler the shipped mpi-coscheduling policy names, for namespace team-b. MPIJobs are
created the way the MPI operator creates them (`jobs.submit`).

- A gang that does not fit binds nothing, and starts whole when capacity appears.
- A gang that cannot complete waits out the `scheduleTimeoutSeconds` Muster wrote, then lets go
  of the node capacity its waiting pods held: another pod gets it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from jobs import delete_jobs, ensure_namespace, mpijob, submit
from neighbours import blocker, bound, free_millicpu

from e2e.node import schedulers
from e2e.probes import eventually
from webhook import keys
from webhook.kube import COSCHEDULING_PODGROUPS, EVENTS, PODS, ApiError, KubeApi

pytestmark = pytest.mark.neighbour("coscheduling")

NS = "team-b"  # policy mpi-coscheduling


def _job(name: str, millicores: int, **scheduling: Any) -> dict[str, Any]:
    """An MPIJob of 3 workers and a launcher (a gang of 4), each pod asking `millicores` and
    no GPU (the node's GPUs are handed out by Muster's binder only)."""
    job = mpijob(name, NS, workers=3, **scheduling)
    for spec in job["spec"]["mpiReplicaSpecs"].values():
        for c in spec["template"]["spec"]["containers"]:
            c["resources"] = {"requests": {"cpu": f"{millicores}m", "memory": "32Mi"}}
    return job


async def _gang(kube: KubeApi, name: str) -> list[dict[str, Any]]:
    found = await kube.list(PODS, namespace=NS,
                            label_selector=f"{keys.COSCHEDULING_GROUP_LABEL}={name}")
    return list(found["items"])


async def _refused(kube: KubeApi, pod: str) -> list[str]:
    """The messages of the scheduler's FailedScheduling Events on `pod`."""
    found = await kube.list(EVENTS, namespace=NS, field_selector=(
        f"involvedObject.name={pod},reason=FailedScheduling"))
    return [e.get("message", "") for e in found["items"]]


async def _remove(kube: KubeApi, *pods: str) -> None:
    for pod in pods:
        try:
            await kube.delete(PODS, pod, NS)
        except ApiError as exc:
            if not exc.not_found:
                raise


async def test_a_gang_that_does_not_fit_binds_nothing_then_starts_whole(
        kube: KubeApi, coscheduling: schedulers.Neighbour) -> None:
    await ensure_namespace(kube, NS)
    each = 150
    # room for 3 of the gang's 4 pods
    await kube.create(PODS, blocker("cosched-hog", await free_millicpu(kube) - 3 * each),
                      namespace=NS)
    try:
        await eventually(lambda: _bound_pod(kube, "cosched-hog"), within=60,
                         what="the hog pod bound by the default scheduler")
        await submit(kube, _job("gang-hold", each))
        group = await kube.get(COSCHEDULING_PODGROUPS, "gang-hold", namespace=NS)
        assert group["spec"]["minMember"] == 4

        async def all_refused() -> bool:
            pods = await _gang(kube, "gang-hold")
            return len(pods) == 4 and all([await _refused(kube, p["metadata"]["name"])
                                           for p in pods])
        await eventually(all_refused, within=90,
                         what="the coscheduling scheduler to refuse each of the gang's 4 pods")
        pods = await _gang(kube, "gang-hold")
        assert {p["spec"]["schedulerName"] for p in pods} == {schedulers.COSCHEDULING_NAME}
        for _ in range(10):  # three would fit: still, not one is bound
            assert bound(await _gang(kube, "gang-hold")) == []
            await asyncio.sleep(0.5)
        assert coscheduling.alive() is None

        await _remove(kube, "cosched-hog")

        async def whole() -> bool:
            return len(bound(await _gang(kube, "gang-hold"))) == 4
        await eventually(whole, within=120, what="the whole gang bound once the hog is gone")
    finally:
        await _remove(kube, "cosched-hog")
        await delete_jobs(kube, NS, ["gang-hold"])


async def _bound_pod(kube: KubeApi, name: str) -> bool:
    return bool((await kube.get(PODS, name, namespace=NS))["spec"].get("nodeName"))


async def test_a_gang_that_cannot_complete_times_out_and_releases_what_it_held(
        kube: KubeApi, coscheduling: schedulers.Neighbour) -> None:
    await ensure_namespace(kube, NS)
    each = (await free_millicpu(kube) - 50) // 3  # the 3 workers hold nearly all of the CPU
    job = _job("gang-timeout", each, scheduleTimeoutSeconds=15)
    # the launcher is pinned to a node that is not there: the gang can never complete
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    launcher["nodeSelector"] = {"kubernetes.io/hostname": "no-such-node"}
    launcher["containers"][0]["resources"]["requests"]["cpu"] = "10m"
    rival = blocker("cosched-rival", each)
    rival["spec"]["schedulerName"] = schedulers.COSCHEDULING_NAME
    try:
        await submit(kube, job)
        group = await kube.get(COSCHEDULING_PODGROUPS, "gang-timeout", namespace=NS)
        assert group["spec"]["scheduleTimeoutSeconds"] == 15

        def waiting() -> bool:  # the workers passed Filter and hold their node in Permit
            return len({line.split("gang-timeout-worker-")[1][:1]
                        for line in coscheduling.tail(400).splitlines()
                        if "Pod is waiting to be scheduled to node" in line
                        and "gang-timeout-worker-" in line}) == 3
        await eventually(waiting, within=60, what="the 3 workers waiting in Permit")
        await kube.create(PODS, rival, namespace=NS)
        refused = await eventually(lambda: _refused(kube, "cosched-rival"), within=10,
                                   what="the rival refused while the workers hold the CPU")
        assert "Insufficient cpu" in refused[0]

        async def timed_out() -> list[str]:
            return [m for p in await _gang(kube, "gang-timeout")
                    for m in await _refused(kube, p["metadata"]["name"])
                    if "timeout after waiting 15s at plugin Coscheduling" in m]
        await eventually(timed_out, within=60, what="the gang's Permit wait to time out at 15 s")
        await eventually(lambda: _bound_pod(kube, "cosched-rival"), within=90,
                         what="the rival bound on the CPU the timed-out gang let go")
        assert bound(await _gang(kube, "gang-timeout")) == []
    finally:
        await _remove(kube, "cosched-rival")
        await delete_jobs(kube, NS, ["gang-timeout"])
