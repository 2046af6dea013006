"""A node whose GPU agent is being replaced gets no GPU pod (webhook.binder.agents): the decision
alone, the planner's filter and reasons, and the binder against the API server emulator as the
agent pod named on the Node comes and goes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from binder_objects import job, node, pod
from binder_run import serving

from e2e.probes import eventually
from webhook import keys
from webhook.analyze.gangstate import wait_kind
from webhook.binder.agents import AGENT_WAIT, AgentIndex, AgentPod, agent_wait, parse_agent
from webhook.binder.assignment import encode_assignment
from webhook.binder.controller import Binder, BinderConfig
from webhook.binder.fit import FitCache
from webhook.binder.nodes import NodeInfo, parse_node
from webhook.binder.planner import Plan, PlanConfig, plan
from webhook.binder.pods import PodInfo, parse_pod
from webhook.binder.queue import GangQueue
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi
from webhook.kube.api import NODES, PODS
from webhook.topology.hierarchy import place_gang
from webhook.topology.model import ContainerGpus, GpuAssignment

NS = "muster"
RECORD = keys.gpu_agent(NS, "agent-a", "uid-1")


def agent_pod(name: str = "agent-a", uid: str = "uid-1", *, ready: bool = True,
              deleting: bool = False, node_name: str = "dgx-a") -> dict[str, Any]:
    obj = pod(name, ns=NS, node_name=node_name, scheduler="default-scheduler", phase="Running")
    obj["metadata"]["uid"] = uid
    obj["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2026-11-21T05:00:00Z"
    return obj


def gpu_node(name: str, record: str | None = RECORD) -> dict[str, Any]:
    obj = node(name, labels={keys.LABEL_GPU_ALLOCATION_ACK: "true"})
    if record is not None:
        obj["metadata"]["annotations"][keys.ANN_GPU_AGENT] = record
    return obj


# --- the decision ----------------------------------------------------------------------------

def test_a_record_names_a_pod_by_namespace_name_and_uid() -> None:
    assert parse_agent(RECORD) == AgentPod(NS, "agent-a", "uid-1")
    assert parse_agent(None) is None
    for bad in ("", "agent-a/uid-1", "muster/agent-a/", "Muster/agent-a/u", "a/b/c/d"):
        assert parse_agent(bad) == bad


@pytest.mark.parametrize(("record", "seen", "waits"), [
    (None, None, None),  # an agent that records nothing (before the record): as before
    (RECORD, agent_pod(), None),
    (RECORD, None, "agent pod muster/agent-a is gone and no new agent has registered"),
    (RECORD, agent_pod(uid="uid-2"),  # a pod of the same name made again: not the one recorded
     "agent pod muster/agent-a is gone and no new agent has registered"),
    (RECORD, agent_pod(deleting=True), "agent pod muster/agent-a is being deleted"),
    (RECORD, agent_pod(ready=False), "agent pod muster/agent-a is not Ready"),
    # a Ready agent of another node (a record this node's agent did not write)
    (RECORD, agent_pod(node_name="dgx-b"),
     "agent pod muster/agent-a runs on dgx-b, not on this node"),
    ("muster/agent-a", agent_pod(),
     "its muster.io/gpu-agent annotation names no pod ('muster/agent-a')"),
])
def test_gpu_pods_wait_while_the_recorded_agent_pod_is_not_ready(
        record: str | None, seen: dict[str, Any] | None, waits: str | None) -> None:
    found: PodInfo | None = parse_pod(seen) if seen is not None else None
    assert agent_wait(parse_agent(record), found, "dgx-a") == waits


def test_the_index_finds_the_nodes_that_name_a_pod() -> None:
    index = AgentIndex()
    first, second = AgentPod(NS, "agent-a", "u1"), AgentPod(NS, "agent-b", "u2")
    index.put("n1", first)
    index.put("n2", first)
    assert index.naming("muster/agent-a") == {"n1", "n2"}
    index.put("n1", second)  # a new agent registered on n1
    index.put("n2", "unreadable")
    assert index.naming("muster/agent-a") == frozenset()
    assert index.naming("muster/agent-b") == {"n1"}
    index.put("n1", None)  # the node is gone
    assert index.naming("muster/agent-b") == frozenset()


# --- the planner -----------------------------------------------------------------------------

CFG = PlanConfig(scheduler_name=keys.DEFAULT_BINDER_SCHEDULER_NAME)


def planned(pods: list[dict[str, Any]], nodes: list[NodeInfo]) -> Plan:
    return plan([parse_pod(p) for p in pods], {n.name: n for n in nodes}, None, config=CFG,
                queue=GangQueue(), fit=FitCache(), place=place_gang, now=1795237200.0 + 10)


def restarting(name: str) -> NodeInfo:
    return replace(parse_node(gpu_node(name)), agent_wait="agent pod muster/agent-a is not Ready")


def test_a_node_whose_agent_restarts_gets_no_gpu_pod_but_others_do() -> None:
    result = planned(job("j1", workers=2), [restarting("dgx-a"), parse_node(gpu_node("dgx-b"))])
    [place] = result.places
    assert {a.node for _, a in place.assignments if a.containers} == {"dgx-b"}


def test_a_gang_with_no_node_left_says_the_agent_restarts() -> None:
    result = planned(job("j1", workers=2), [restarting("dgx-a")])
    [wait] = result.waits
    assert not result.places
    assert wait.reason.endswith(f"(1 node(s): {AGENT_WAIT}; node dgx-a: agent pod "
                                "muster/agent-a is not Ready)"), wait.reason
    assert wait_kind(wait.reason) == "agent"


def test_a_gang_that_does_not_fit_names_the_nodes_whose_agent_restarts() -> None:
    # 8 GPUs on one node: dgx-b has them, but its agent restarts; dgx-a has 4 free
    held = GpuAssignment("dgx-a", {"main": ContainerGpus((0, 1, 2, 3), ("a", "b", "c", "d"))})
    busy = pod("busy", gpus=4, node_name="dgx-a", phase="Running",
               assignment=encode_assignment(held))
    result = planned([*job("j1", workers=1, gpus=8), busy],
                     [parse_node(gpu_node("dgx-a")), restarting("dgx-b")])
    [wait] = result.waits
    assert wait.reason.endswith(f" (node dgx-b: {AGENT_WAIT}: agent pod muster/agent-a is not "
                                "Ready)"), wait.reason
    assert wait_kind(wait.reason) == "agent"


def test_pods_without_gpus_still_go_where_the_agent_restarts() -> None:
    result = planned([pod("web", gpus=0)], [restarting("dgx-a")])
    assert [a.node for p in result.places for _, a in p.assignments] == ["dgx-a"]


# --- the binder ------------------------------------------------------------------------------

def seed_agent(apiserver: ApiServerEmulator, *, ready: bool = True) -> None:
    """The node dgx-a and its agent pod, recorded on it (the emulator gives the pod its uid)."""
    apiserver.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    uid = apiserver.seed(agent_pod(ready=ready))["metadata"]["uid"]
    apiserver.seed(gpu_node("dgx-a", keys.gpu_agent(NS, "agent-a", uid)))


def bound(apiserver: ApiServerEmulator) -> list[str]:
    return sorted(p["metadata"]["name"] for p in apiserver.objects("pods", "team-a")
                  if p["spec"].get("nodeName"))


def scheduled_message(apiserver: ApiServerEmulator, name: str) -> str:
    found = apiserver.get("pods", name, "team-a")
    assert found is not None
    return next((str(c.get("message")) for c in found["status"].get("conditions") or ()
                 if c.get("type") == "PodScheduled"), "")


async def test_the_binder_waits_for_the_agent_pod_the_node_names(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    """The node named by an agent pod that is not Ready waits (and says why); once it is Ready
    the gang binds; a new record naming a pod that does not exist stops it again."""
    seed_agent(apiserver, ready=False)
    async with serving(Binder(kube, BinderConfig(allocation_wait_seconds=0.1))):
        await kube.create(PODS, pod("w0", gpus=1))
        await eventually(lambda: AGENT_WAIT in scheduled_message(apiserver, "w0"), within=5,
                         what="the wait's reason")
        assert bound(apiserver) == []
        await kube.patch(PODS, "agent-a", {"status": {"conditions": [
            {"type": "Ready", "status": "True"}]}}, NS, subresource="status")
        await eventually(lambda: bound(apiserver) == ["w0"], within=5, what="w0 bound")

        # the node back from a failure: an agent the kubelet replaced registered meanwhile
        await kube.patch(NODES, "dgx-a", {"metadata": {"annotations": {
            keys.ANN_GPU_AGENT: keys.gpu_agent(NS, "agent-b", "uid-2")}}}, patch_type="merge")
        await kube.create(PODS, pod("w1", gpus=1))
        await eventually(lambda: "agent pod muster/agent-b is gone" in
                         scheduled_message(apiserver, "w1"), within=5, what="w1's reason")
        made = await kube.create(PODS, agent_pod("agent-b"), NS)
        await kube.patch(NODES, "dgx-a", {"metadata": {"annotations": {keys.ANN_GPU_AGENT: (
            keys.gpu_agent(NS, "agent-b", made["metadata"]["uid"]))}}}, patch_type="merge")
        await eventually(lambda: bound(apiserver) == ["w0", "w1"], within=5, what="w1 bound")


async def test_the_binder_places_as_before_where_no_agent_recorded_itself(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    """A node served by an agent from before the record (ack label, no record): an upgrade does
    not stop GPU pods there."""
    apiserver.seed(gpu_node("dgx-a", record=None))
    async with serving(Binder(kube, BinderConfig(allocation_wait_seconds=0.1))):
        await kube.create(PODS, pod("w0", gpus=1))
        await eventually(lambda: bound(apiserver) == ["w0"], within=5, what="w0 bound")


async def test_a_deleted_agent_pod_stops_gpu_pods_on_its_node(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    seed_agent(apiserver)
    async with serving(Binder(kube, BinderConfig(allocation_wait_seconds=0.1))) as binder:
        await eventually(lambda: binder._nodes["dgx-a"].agent_wait is None, within=5)
        await kube.delete(PODS, "agent-a", NS)
        await eventually(lambda: binder._nodes["dgx-a"].agent_wait is not None, within=5,
                         what="the node left out once its agent pod is gone")
        await kube.create(PODS, pod("w0", gpus=1))
        await eventually(lambda: AGENT_WAIT in scheduled_message(apiserver, "w0"), within=5)
        assert bound(apiserver) == []
