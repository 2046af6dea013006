"""One GPU pod in the kubelet's hands per node (webhook.binder.gate): the gate alone, then the
binder against the API server emulator with a node whose agent acknowledges served pods."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from binder_objects import job, node, pod

from e2e.probes import eventually
from webhook import keys
from webhook.binder.assignment import encode_assignment
from webhook.binder.controller import Binder, BinderConfig
from webhook.binder.gate import AllocationGate
from webhook.binder.pods import PodInfo, parse_pod
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi
from webhook.kube.api import NODES, PODS
from webhook.topology.model import ContainerGpus, GpuAssignment


def gpu_pod(name: str, node_name: str | None, *, served: bool = False,
            phase: str = "Pending", scheduler: str = keys.DEFAULT_BINDER_SCHEDULER_NAME
            ) -> PodInfo:
    assignment = encode_assignment(GpuAssignment(node_name or "n1", {
        "main": ContainerGpus((0,), ("GPU-0",))}))
    raw = pod(name, gpus=1, node_name=node_name, assignment=assignment, phase=phase,
              scheduler=scheduler)
    if served:
        raw["metadata"]["annotations"][keys.ANN_GPU_ALLOCATED] = node_name
    return parse_pod(raw)


class Bindings:
    """Records the order in which the gate let Bindings through."""

    def __init__(self) -> None:
        self.done: list[str] = []

    def bind(self, key: str) -> Any:
        async def run() -> None:
            self.done.append(key)
        return run


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_nodes_gpu_pods_go_one_at_a_time_and_other_nodes_do_not_wait() -> None:
    gate, log = AllocationGate(30.0), Bindings()
    tasks = [asyncio.create_task(gate.bind(n, f"team-a/{p}", log.bind(p)))
             for n, p in (("n1", "a"), ("n1", "b"), ("n2", "x"), ("n1", "c"))]
    await settle()
    assert log.done == ["a", "x"] and gate.held("n1") == ["team-a/a"]
    gate.observe(gpu_pod("a", "n1"))  # the Binding seen by the informer: still not served
    await settle()
    assert log.done == ["a", "x"]
    gate.observe(gpu_pod("a", "n1", served=True))  # the agent's acknowledgement
    await settle()
    assert log.done == ["a", "x", "b"]
    gate.observe(gpu_pod("b", "n1", phase="Failed"))  # the kubelet refused it: also done
    await settle()
    assert log.done == ["a", "x", "b", "c"]
    gate.release("team-a/c")  # deleted
    await asyncio.gather(*tasks)
    assert gate.held("n1") == [] and gate.held("n2") == ["team-a/x"]


async def test_an_event_from_before_the_binding_does_not_release_the_hold() -> None:
    gate, log = AllocationGate(30.0), Bindings()
    await gate.bind("n1", "team-a/a", log.bind("a"))
    gate.observe(gpu_pod("a", None))  # the informer is behind: the pod looks unbound
    later = asyncio.create_task(gate.bind("n1", "team-a/b", log.bind("b")))
    await settle()
    assert log.done == ["a"]
    gate.release("team-a/a")
    await later
    assert log.done == ["a", "b"]


async def test_pods_bound_by_a_previous_binder_are_waited_for() -> None:
    gate, log = AllocationGate(30.0), Bindings()
    gate.observe(gpu_pod("old", "n1"))  # bound before this binder started, not served
    gate.observe(gpu_pod("done", "n1", served=True))
    gate.observe(gpu_pod("running", "n1", phase="Running"))
    task = asyncio.create_task(gate.bind("n1", "team-a/new", log.bind("new")))
    await settle()
    assert log.done == [] and gate.held("n1") == ["team-a/old"]
    gate.observe(gpu_pod("old", "n1", served=True))
    await task
    assert log.done == ["new"]


async def test_a_pod_another_scheduler_bound_holds_no_node_whatever_it_carries() -> None:
    """A forged assignment on a pod the binder did not bind makes it no pod the agent waits
    for: it would hold the node for the whole timeout."""
    gate, log = AllocationGate(30.0), Bindings()
    gate.observe(gpu_pod("forged", "n1", scheduler="default-scheduler"))
    await gate.bind("n1", "team-a/new", log.bind("new"))
    assert log.done == ["new"]


async def test_a_pod_never_served_holds_its_node_only_until_the_timeout() -> None:
    timeouts: list[tuple[str, str]] = []
    gate = AllocationGate(0.2, on_timeout=lambda n, p: timeouts.append((n, p)))
    log = Bindings()
    await gate.bind("n1", "team-a/stuck", log.bind("stuck"))
    start = asyncio.get_running_loop().time()
    # a gate that never times out fails here, however slow the machine
    await asyncio.wait_for(gate.bind("n1", "team-a/next", log.bind("next")), 10.0)
    waited = asyncio.get_running_loop().time() - start
    assert log.done == ["stuck", "next"] and waited >= 0.15
    assert timeouts == [("n1", "team-a/stuck")]


async def test_a_failed_binding_releases_the_node() -> None:
    gate, log = AllocationGate(30.0), Bindings()

    async def refused() -> None:
        raise RuntimeError("API said no")
    with contextlib.suppress(RuntimeError):
        await gate.bind("n1", "team-a/a", refused)
    await asyncio.wait_for(gate.bind("n1", "team-a/b", log.bind("b")), 1.0)
    assert log.done == ["b"] and gate.held("n1") == ["team-a/b"]


async def test_a_node_that_stops_acknowledging_holds_nothing() -> None:
    """Its agent's plugin is no longer registered (label gone): no acknowledgement will come, so
    neither the pod bound before nor the binds queued behind it wait out the timeout."""
    acking = {"n1": True}
    gate, log = AllocationGate(30.0, acks=lambda n: acking[n]), Bindings()
    await gate.bind("n1", "team-a/a", log.bind("a"))
    queued = [asyncio.create_task(gate.bind("n1", f"team-a/{p}", log.bind(p))) for p in "bc"]
    await settle()
    assert log.done == ["a"]
    acking["n1"] = False
    gate.release_node("n1")
    await asyncio.wait_for(asyncio.gather(*queued), 1.0)
    assert log.done == ["a", "b", "c"] and gate.held("n1") == []


# --- the binder ------------------------------------------------------------------------------

def bound_workers(apiserver: ApiServerEmulator) -> list[dict[str, Any]]:
    return [p for p in apiserver.objects("pods", "team-a")
            if p["spec"].get("nodeName") and "worker" in p["metadata"]["name"]]


async def test_binder_waits_for_each_acknowledgement_on_a_node_whose_agent_gives_them(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    apiserver.seed(node("dgx-a", labels={keys.LABEL_GPU_ALLOCATION_ACK: "true"}))
    binder = Binder(kube, BinderConfig(allocation_wait_seconds=30.0))
    task = asyncio.create_task(binder.run())
    try:
        for p in job("j1"):
            await kube.create(PODS, p)
        order = []
        for _ in range(4):
            bound = await eventually(lambda: [p for p in bound_workers(apiserver)
                                              if p["metadata"]["name"] not in order])
            await asyncio.sleep(0.3)  # nothing else is bound while this one is not served
            assert len(bound_workers(apiserver)) == len(order) + 1
            name = bound[0]["metadata"]["name"]
            order.append(name)
            # what the node agent does once the kubelet's Allocate served the pod
            await kube.patch(PODS, name, {"metadata": {"annotations": {
                keys.ANN_GPU_ALLOCATED: "dgx-a"}}}, "team-a", patch_type="merge")
        launcher = await kube.get(PODS, "j1-launcher", namespace="team-a")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert sorted(order) == [f"j1-worker-{i}" for i in range(4)]
    assert launcher["spec"]["nodeName"] == "dgx-a"  # no GPUs: never waits


async def test_binder_binds_a_gang_at_once_where_the_agent_gives_no_acknowledgement(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    apiserver.seed(node("dgx-a"))
    binder = Binder(kube, BinderConfig(allocation_wait_seconds=30.0))
    task = asyncio.create_task(binder.run())
    try:
        for p in job("j1"):
            await kube.create(PODS, p)
        await eventually(lambda: len(bound_workers(apiserver)) == 4, within=5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_binder_stops_waiting_when_the_node_stops_acknowledging(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    """The agent removes its label when its device plugin is not registered (no kubelet): the
    binder then binds the rest of the gang at once instead of 30 s per pod."""
    apiserver.seed(node("dgx-a", labels={keys.LABEL_GPU_ALLOCATION_ACK: "true"}))
    binder = Binder(kube, BinderConfig(allocation_wait_seconds=30.0))
    task = asyncio.create_task(binder.run())
    try:
        for p in job("j1"):
            await kube.create(PODS, p)
        await eventually(lambda: len(bound_workers(apiserver)) == 1, within=5)
        await asyncio.sleep(0.3)
        assert len(bound_workers(apiserver)) == 1  # the first one waits for the kubelet
        await kube.patch(NODES, "dgx-a", {"metadata": {"labels": {
            keys.LABEL_GPU_ALLOCATION_ACK: None}}}, patch_type="merge")
        await eventually(lambda: len(bound_workers(apiserver)) == 4, within=5,
                         what="the other workers bound without waiting")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
