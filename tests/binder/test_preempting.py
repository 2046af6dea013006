"""Preemption end to end against the emulator: a high-priority gang that asks for a rack
evicts one rack's low-priority gangs whole through the Eviction API (a gang its
PodDisruptionBudget protects is never chosen), is bound whole in that rack, and both sides get
their Events; one whose policy says Never waits."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from binder_objects import BLOCK, RACK, budget, job, pod, racked_nodes
from binder_run import serving

from e2e.probes import eventually
from webhook import keys
from webhook.binder import preempting
from webhook.binder.assignment import build_assignment, encode_assignment
from webhook.binder.controller import Binder, BinderConfig
from webhook.binder.evict import PREEMPTED, PREEMPTING
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi
from webhook.kube.api import PODS
from webhook.topology.builtin import builtin
from webhook.topology.network import Levels

LEVELS = Levels((BLOCK, RACK), (("block", BLOCK), ("rack", RACK)))
TOPO = json.dumps({"v": 1, "mode": "preferred", "network": {"level": RACK, "mode": "required"}})


def low(node_name: str) -> dict[str, Any]:
    """A running one-pod gang holding all 8 GPUs of `node_name`."""
    a = build_assignment(node_name, builtin("dgx1-v100"), tuple(range(8)), [("main", 8)])
    p = pod(f"low-{node_name}", gang=f"low-{node_name}", gpus=8, node_name=node_name,
            assignment=encode_assignment(a), priority=0, phase="Running",
            labels={"app": f"low-{node_name}"})
    return p


def high(preemption: str | None) -> list[dict[str, Any]]:
    pods = job("high", workers=2, gpus=8, priority=1000, topology=TOPO)
    for p in pods:
        if preemption is not None:
            p["metadata"]["annotations"][keys.ANN_GANG_PREEMPTION] = preemption
    return pods


def events(api: ApiServerEmulator, reason: str) -> list[dict[str, Any]]:
    return [e for e in api.objects("events", "team-a") if e["reason"] == reason]


def names(api: ApiServerEmulator) -> set[str]:
    return {p["metadata"]["name"] for p in api.objects("pods", "team-a")}


async def test_one_racks_gangs_are_evicted_whole_and_the_high_gang_bound_there(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    nodes = racked_nodes()
    for n in nodes:
        apiserver.seed(n)
        apiserver.seed(low(n["metadata"]["name"]))
    # every rack but b1/r0 has a gang its budget protects: only b1/r0 may go
    for n in ("b0-r0-n0", "b0-r1-n1", "b1-r1-n0"):
        apiserver.seed(budget(f"low-{n}", 0))
    b = Binder(kube, BinderConfig(backoff_initial=0.05, backoff_max=0.2, network_levels=LEVELS,
                                  preemption="Never"))
    async with serving(b):
        for p in high("LowerPriority"):
            await kube.create(PODS, p)
        bound = await eventually(lambda: {p["spec"].get("nodeName") for p in
                                          apiserver.objects("pods", "team-a")
                                          if p["metadata"]["name"].startswith("high-worker")}
                                 == {"b1-r0-n0", "b1-r0-n1"}, within=10)
        assert bound
        assert not {"low-b1-r0-n0", "low-b1-r0-n1"} & names(apiserver)
        assert len([n for n in names(apiserver) if n.startswith("low-")]) == 6
        victims = {e["involvedObject"]["name"]: e["message"] for e in events(apiserver,
                                                                              PREEMPTED)}
        assert set(victims) == {"low-b1-r0-n0", "low-b1-r0-n1"}
        assert victims["low-b1-r0-n0"].startswith(
            "preempted by gang team-a/high of priority 1000: gang team-a/low-b1-r0-n0")
        told = {e["involvedObject"]["name"] for e in events(apiserver, PREEMPTING)}
        assert told == {"high-worker-0", "high-worker-1", "high-launcher"}
        assert b.metrics.preempted_gangs._value.get() == 2
        assert not b.preemptions.reserved


async def test_a_gang_whose_policy_says_never_waits_and_evicts_nothing(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    for n in racked_nodes():
        apiserver.seed(n)
        apiserver.seed(low(n["metadata"]["name"]))
    b = Binder(kube, BinderConfig(backoff_initial=0.05, backoff_max=0.2, network_levels=LEVELS,
                                  preemption="LowerPriority"))
    async with serving(b):
        for p in high("Never"):
            await kube.create(PODS, p)
        await eventually(lambda: [e for e in apiserver.objects("events", "team-a")
                                  if e["reason"] == "FailedScheduling"], within=10)
        assert len([n for n in names(apiserver) if n.startswith("low-")]) == 8
        assert not events(apiserver, PREEMPTED)


async def test_a_refused_eviction_leaves_that_gang_whole_and_another_rack_goes(
        apiserver: ApiServerEmulator, kube: KubeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget changed after the binder read it (here: the binder does not read it): the
    API's 429 is the last word; the preemptor plans again without that gang."""
    for n in racked_nodes():
        apiserver.seed(n)
        apiserver.seed(low(n["metadata"]["name"]))
    apiserver.seed(budget("low-b0-r0-n0", 0))  # b0/r0 is the first rack by name
    monkeypatch.setattr(preempting, "forbidding", lambda *_: None)
    b = Binder(kube, BinderConfig(backoff_initial=0.05, backoff_max=0.2, network_levels=LEVELS,
                                  preemption="LowerPriority"))
    async with serving(b):
        for p in high(None):
            await kube.create(PODS, p)
        await eventually(lambda: len([p for p in apiserver.objects("pods", "team-a")
                                      if p["metadata"]["name"].startswith("high-worker")
                                      and p["spec"].get("nodeName")]) == 2, within=10)
        assert "low-b0-r0-n0" in names(apiserver)  # its budget held
        assert "low-b0-r0-n1" in names(apiserver)  # nothing after the refusal was evicted
        assert b.metrics.preemptions.labels("refused")._value.get() == 1
        assert b.metrics.preempted_gangs._value.get() == 2


async def test_a_coscheduling_gang_is_told_on_its_podgroup_too(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    nodes = racked_nodes()
    for n in nodes:
        apiserver.seed(n)
        name = n["metadata"]["name"]
        if not name.startswith("b1-r0"):
            apiserver.seed(low(name))
            apiserver.seed(budget(f"low-{name}", 0))
    for i, name in enumerate(("b1-r0-n0", "b1-r0-n1")):  # one coscheduling gang holds b1/r0
        member = low(name)
        member["metadata"]["name"] = f"pg-{i}"
        del member["metadata"]["annotations"][keys.ANN_GANG_NAME]
        del member["metadata"]["annotations"][keys.ANN_GANG_MIN_MEMBER]
        member["metadata"]["labels"][keys.COSCHEDULING_GROUP_LABEL] = "pg"
        apiserver.seed(member)
    apiserver.seed({"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                    "metadata": {"name": "pg", "namespace": "team-a"},
                    "spec": {"minMember": 2}})
    b = Binder(kube, BinderConfig(backoff_initial=0.05, backoff_max=0.2, network_levels=LEVELS,
                                  preemption="LowerPriority"))
    async with serving(b):
        for p in high(None):
            await kube.create(PODS, p)
        told = await eventually(lambda: [e for e in events(apiserver, PREEMPTED)
                                         if e["involvedObject"]["kind"] == "PodGroup"],
                                within=10)
        assert [e["involvedObject"]["name"] for e in told] == ["pg"]
        assert told[0]["message"].startswith("preempted by gang team-a/high of priority 1000: "
                                             "gang team-a/pg (priority 0)")
        assert {e["involvedObject"]["name"] for e in events(apiserver, PREEMPTED)} == {
            "pg-0", "pg-1", "pg"}


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


async def test_a_checkpoint_said_after_a_decision_prices_the_next_one(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    """The binder keeps its victim candidates from cycle to cycle: a job that says it saved its
    state after one preemption is priced by that in the next. b0-r0's gangs are the youngest
    and go for the first high gang; then b1-r1's, the oldest, say they saved a minute ago, and
    go for the second (b0-r1's, the next youngest, would have without it)."""
    now = time.time()
    ages = {"b0-r0": 600, "b0-r1": 1200}
    for n in racked_nodes():
        name = n["metadata"]["name"]
        apiserver.seed(n)
        p = low(name)
        p["status"]["startTime"] = _stamp(now - ages.get(name[:5], 3600))
        apiserver.seed(p)
    b = Binder(kube, BinderConfig(backoff_initial=0.05, backoff_max=0.2, network_levels=LEVELS,
                                  preemption="LowerPriority"))

    def bound_to(gang: str) -> set[str]:
        return {p["spec"].get("nodeName", "") for p in apiserver.objects("pods", "team-a")
                if p["metadata"]["name"].startswith(f"{gang}-worker")}

    async with serving(b):
        for p in high(None):
            await kube.create(PODS, p)
        await eventually(lambda: bound_to("high") == {"b0-r0-n0", "b0-r0-n1"}, within=10)
        for i in range(2):
            await kube.patch(PODS, f"low-b1-r1-n{i}", {"metadata": {"annotations": {
                keys.ANN_LAST_CHECKPOINT: _stamp(time.time() - 60)}}}, "team-a")
        for p in job("again", workers=2, gpus=8, priority=1000, topology=TOPO):
            await kube.create(PODS, p)
        await eventually(lambda: bound_to("again") == {"b1-r1-n0", "b1-r1-n1"}, within=10)
        assert {"low-b0-r1-n0", "low-b0-r1-n1"} <= names(apiserver)
        told = {e["involvedObject"]["name"]: e["message"] for e in events(apiserver, PREEMPTED)}
        assert f"its job's last checkpoint ({keys.ANN_LAST_CHECKPOINT}) was at" in \
            told["low-b1-r1-n0"]
