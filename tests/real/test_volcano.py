"""Muster's Volcano PodGroups in the hands of the real Volcano (v1.10.0, built from the module
proxy, `e2e.node.schedulers`): its scheduler, controller-manager and admission webhooks run
beside the cluster as its Helm chart configures them (the `volcano` fixture), for namespace team-a
(the shipped mpi-volcano policy). MPIJobs are created the way the MPI operator creates them
(`jobs.submit`); their pods ask for CPU only (the node's GPUs are handed out by Muster's binder).

- A gang that does not fit binds nothing, and starts whole when capacity appears.
- Volcano's webhooks admit Muster's PodGroup and pods (its pod webhook refuses a pod whose
  PodGroup is missing), and its PodGroup controller makes no second PodGroup for them (it does
  for a pod without Muster's gang).
- The capacity plugin holds a gang whose `minResources` exceed its queue's capability, and
  starts it when the capability is raised.
- A job naming a closed or a missing queue runs in the policy's fallback queue.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from jobs import delete_jobs, ensure_namespace, mpijob, submit
from neighbours import blocker, bound, free_millicpu

from e2e.node import schedulers
from e2e.probes import eventually, pods_of
from webhook import keys
from webhook.kube import (
    EVENTS,
    PODS,
    VOLCANO_PODGROUPS,
    VOLCANO_QUEUES,
    ApiError,
    KubeApi,
    Resource,
)

pytestmark = pytest.mark.neighbour("volcano")

NS = "team-a"  # policy mpi-volcano
COMMANDS = Resource("bus.volcano.sh", "v1alpha1", "commands", True, "Command")


def _job(name: str, millicores: int, workers: int = 3, queue: str | None = None
         ) -> dict[str, Any]:
    """An MPIJob of `workers` workers and a launcher, each pod asking `millicores` and no GPU;
    `queue` is its Volcano queue annotation (the reference job names queue research)."""
    job = mpijob(name, NS, workers=workers)
    if queue:
        job["metadata"]["annotations"][keys.VOLCANO_QUEUE_ANNOTATION] = queue
    for spec in job["spec"]["mpiReplicaSpecs"].values():
        for c in spec["template"]["spec"]["containers"]:
            c["resources"] = {"requests": {"cpu": f"{millicores}m", "memory": "32Mi"}}
    return job


async def _group(kube: KubeApi, name: str) -> dict[str, Any]:
    return await kube.get(VOLCANO_PODGROUPS, name, namespace=NS)


def _condition(group: dict[str, Any], kind: str) -> str | None:
    """The message of the PodGroup's condition `kind` that Volcano's scheduler wrote."""
    for c in group.get("status", {}).get("conditions") or []:
        if c["type"] == kind and c["status"] == "True":
            return str(c.get("message") or c.get("reason") or kind)
    return None


async def _events(kube: KubeApi, name: str, kind: str) -> list[str]:
    found = await kube.list(EVENTS, namespace=NS, field_selector=(
        f"involvedObject.name={name},involvedObject.kind={kind}"))
    return [e.get("message", "") for e in found["items"]]


async def _whole(kube: KubeApi, name: str, members: int) -> bool:
    pods = await pods_of(kube, NS, name)
    return len(pods) == members and len(bound(pods)) == members


async def _remove(kube: KubeApi, *pods: str) -> None:
    for pod in pods:
        try:
            await kube.delete(PODS, pod, NS)
        except ApiError as exc:
            if not exc.not_found:
                raise


async def _bound_pod(kube: KubeApi, name: str) -> bool:
    return bool((await kube.get(PODS, name, namespace=NS))["spec"].get("nodeName"))


async def test_a_gang_that_does_not_fit_binds_nothing_then_starts_whole(
        kube: KubeApi, volcano: dict[str, schedulers.Neighbour]) -> None:
    await ensure_namespace(kube, NS)
    each = 150
    # room for 3 of the gang's 4 pods
    await kube.create(PODS, blocker("volcano-hog", await free_millicpu(kube) - 3 * each),
                      namespace=NS)
    try:
        await eventually(lambda: _bound_pod(kube, "volcano-hog"), within=60,
                         what="the hog pod bound by the default scheduler")
        await submit(kube, _job("vc-hold", each))
        group = await _group(kube, "vc-hold")
        assert group["spec"]["minMember"] == 4
        assert group["spec"]["minResources"]["cpu"] == f"{4 * each}m"

        async def refused() -> str | None:
            if len(await pods_of(kube, NS, "vc-hold")) < 4:
                return None
            return _condition(await _group(kube, "vc-hold"), "Unschedulable")
        message = await eventually(refused, within=90,
                                   what="Volcano to find the gang of 4 unschedulable")
        assert "tasks in gang unschedulable" in message
        pods = await pods_of(kube, NS, "vc-hold")
        assert {p["spec"]["schedulerName"] for p in pods} == {"volcano"}
        for _ in range(10):  # three would fit: still, not one is bound
            assert bound(await pods_of(kube, NS, "vc-hold")) == []
            await asyncio.sleep(0.5)
        assert all(v.alive() is None for v in volcano.values())

        await _remove(kube, "volcano-hog")
        await eventually(lambda: _whole(kube, "vc-hold", 4), within=120,
                         what="the whole gang bound once the hog is gone")
        await eventually(lambda: _phase(kube, "vc-hold", "Running"), within=60,
                         what="Volcano to mark the PodGroup Running")
    finally:
        await _remove(kube, "volcano-hog")
        await delete_jobs(kube, NS, ["vc-hold"])


async def _phase(kube: KubeApi, name: str, phase: str) -> bool:
    return bool((await _group(kube, name)).get("status", {}).get("phase") == phase)


async def test_volcanos_webhooks_admit_musters_podgroup_and_its_controller_adds_none(
        kube: KubeApi, volcano: dict[str, schedulers.Neighbour]) -> None:
    await ensure_namespace(kube, NS)
    # Volcano's pod webhook is live: a pod naming a PodGroup that does not exist is refused
    orphan = blocker("vc-orphan", 10)
    orphan["spec"]["schedulerName"] = "volcano"
    orphan["metadata"]["annotations"] = {keys.VOLCANO_GROUP_ANNOTATION: "no-such-group"}
    with pytest.raises(ApiError) as refused:
        await kube.create(PODS, orphan, namespace=NS)
    assert "validatepod.volcano.sh" in refused.value.message
    assert "failed to get PodGroup" in refused.value.message
    # a pod without Muster's gang: Volcano's PodGroup controller makes it one of its own
    plain = blocker("vc-plain", 10)
    plain["spec"]["schedulerName"] = "volcano"
    try:
        made = await kube.create(PODS, plain, namespace=NS)
        own = f"podgroup-{made['metadata']['uid']}"
        await eventually(lambda: _exists(kube, own), within=60,
                         what="Volcano's controller to make the plain pod's PodGroup")

        await submit(kube, _job("vc-admit", 10, workers=2))
        await eventually(lambda: _whole(kube, "vc-admit", 3), within=120,
                         what="the gang admitted and bound by Volcano")
        # its PodGroup webhook was called for Muster's PodGroup, and let it in
        log = volcano["webhook-manager"].log.read_text(errors="replace")
        assert "Mutating CREATE podgroup vc-admit." in log
        pods = await pods_of(kube, NS, "vc-admit")
        assert {p["metadata"]["annotations"][keys.VOLCANO_GROUP_ANNOTATION]
                for p in pods} == {"vc-admit"}
        await asyncio.sleep(3)  # the controller's workers have seen every pod by now
        groups = (await kube.list(VOLCANO_PODGROUPS, namespace=NS))["items"]
        uids = {p["metadata"]["uid"] for p in pods} | {
            o["uid"] for p in pods for o in p["metadata"].get("ownerReferences") or []}
        theirs = [g["metadata"]["name"] for g in groups
                  if g["metadata"]["name"].removeprefix("podgroup-") in uids]
        assert theirs == []
        assert [g for g in groups if g["metadata"]["name"] == "vc-admit"]
    finally:
        await _remove(kube, "vc-plain")
        await delete_jobs(kube, NS, ["vc-admit"])


async def _exists(kube: KubeApi, group: str) -> bool:
    try:
        await _group(kube, group)
    except ApiError as exc:
        if exc.not_found:
            return False
        raise
    return True


async def _queue(kube: KubeApi, name: str, capability: dict[str, str] | None = None) -> None:
    """A Queue made through Volcano's webhooks, once its controller has opened it."""
    spec: dict[str, Any] = {"weight": 1}
    if capability:
        spec["capability"] = capability
    await kube.create(VOLCANO_QUEUES, {"apiVersion": VOLCANO_QUEUES.api_version,
                                       "kind": "Queue", "metadata": {"name": name},
                                       "spec": spec})
    await eventually(lambda: _queue_is(kube, name, "Open"), within=60,
                     what=f"Volcano's controller to open queue {name}")


async def _queue_is(kube: KubeApi, name: str, state: str) -> bool:
    return bool((await kube.get(VOLCANO_QUEUES, name)).get("status", {}).get("state") == state)


async def test_the_capacity_plugin_holds_a_gang_over_its_queues_capability(
        kube: KubeApi, volcano: dict[str, schedulers.Neighbour]) -> None:
    await ensure_namespace(kube, NS)
    await _queue(kube, "vc-capped", {"cpu": "300m"})
    try:
        await submit(kube, _job("vc-capped", 100, queue="vc-capped"))  # minResources 400m
        group = await _group(kube, "vc-capped")
        assert group["spec"]["queue"] == "vc-capped"
        assert group["spec"]["minResources"]["cpu"] == "400m"

        async def over() -> bool:
            refused = [m for m in await _events(kube, "vc-capped", "PodGroup")
                       if "queue resource quota insufficient" in m]
            # the scheduler sends the Event and writes the status apart: either may land first
            phase = (await _group(kube, "vc-capped")).get("status", {}).get("phase")
            return bool(refused) and phase == "Pending"
        await eventually(over, within=90,
                         what="the capacity plugin to refuse the gang and leave it Pending")
        assert bound(await pods_of(kube, NS, "vc-capped")) == []

        await kube.patch(VOLCANO_QUEUES, "vc-capped", {"spec": {"capability": {"cpu": "1"}}})
        await eventually(lambda: _whole(kube, "vc-capped", 4), within=120,
                         what="the gang bound once the queue's capability is raised")
    finally:
        await delete_jobs(kube, NS, ["vc-capped"])


async def test_closed_and_missing_queues_fall_back_and_run(
        kube: KubeApi, volcano: dict[str, schedulers.Neighbour]) -> None:
    await ensure_namespace(kube, NS)
    await _queue(kube, "vc-closed")
    queue = await kube.get(VOLCANO_QUEUES, "vc-closed")
    # closed the way `vcctl queue operate --action close` does: a Command for its controller
    await kube.create(COMMANDS, {
        "apiVersion": COMMANDS.api_version, "kind": "Command",
        "metadata": {"generateName": "close-vc-closed-"}, "action": "CloseQueue",
        "target": {"apiVersion": VOLCANO_QUEUES.api_version, "kind": "Queue",
                   "name": "vc-closed", "uid": queue["metadata"]["uid"], "controller": True}},
        namespace="default")
    await eventually(lambda: _queue_is(kube, "vc-closed", "Closed"), within=60,
                     what="Volcano's controller to close queue vc-closed")
    try:
        for name, queue_name in (("vc-closedq", "vc-closed"), ("vc-missingq", "vc-missing")):
            await submit(kube, _job(name, 10, workers=1, queue=queue_name))
            assert (await _group(kube, name))["spec"]["queue"] == "default"

        async def both() -> bool:
            return all([await _whole(kube, n, 2) for n in ("vc-closedq", "vc-missingq")])
        await eventually(both, within=120, what="both jobs bound in the fallback queue")
    finally:
        await delete_jobs(kube, NS, ["vc-closedq", "vc-missingq"])
