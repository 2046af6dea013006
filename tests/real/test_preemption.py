"""Gang-aware preemption on the real control plane: two racks full of low-priority gangs, one of
them protected by a PodDisruptionBudget; a high-priority gang that asks for one rack arrives.
Exactly the other rack's gang is evicted whole through the real Eviction API, the high gang is
bound whole in that rack, and both sides get their Events. Priorities come from real
PriorityClasses (the API server's Priority admission sets spec.priority); the budget's
disruptionsAllowed is the real disruption controller's.

A binder of its own scheduler name runs in the test against the API server as the chart's
binder service account (impersonated), with the chart's PodDisruptionBudget rule as its extra
grant, so a chart that grants too little (pods/eviction, budgets) fails here. No kubelet runs
the nodes (their pods are bound and stay Pending); a taint only these pods tolerate keeps every
other test's pods off them."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from jobs import ensure_namespace
from real_helpers import (
    binder_as_chart,
    bound_whole,
    chart_binder_grant,
    delete_now,
    fake_node,
    gpu_pod,
    pod_events,
)

from e2e.node.cluster import NodeCluster
from e2e.probes import eventually
from webhook import keys
from webhook.binder.controller import Binder, BinderConfig
from webhook.binder.evict import PREEMPTED, PREEMPTING
from webhook.kube import NODES, PDBS, PODS, KubeApi, Resource
from webhook.topology import builtin
from webhook.topology.network import Levels

SCHEDULER = "muster-preemption"
NS = "preemption"
RACK = "example.com/rack"
TAINT = {"key": "example.com/fake-node", "value": "preemption-test", "effect": "NoSchedule"}
GRANT = "muster-test-preemption"
PRIORITY_CLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", False, "PriorityClass")
LOW, HIGH = "muster-test-preempt-low", "muster-test-preempt-high"


def _pod(name: str, gang: str, priority_class: str, *, app: str, preempts: bool = False
         ) -> dict[str, Any]:
    """A member of `gang` (2 members of 8 GPUs, one rack required), as the webhook annotates
    it; `preempts`: its policy says gang.preemption LowerPriority."""
    p = gpu_pod(name, NS, SCHEDULER, 8, gang=gang, members=2,
                network={"level": RACK, "mode": "required"})
    p["spec"]["priorityClassName"] = priority_class
    p["metadata"]["labels"] = {"app": app}
    if preempts:
        p["metadata"]["annotations"][keys.ANN_GANG_PREEMPTION] = "LowerPriority"
    return p


@pytest.fixture
async def racks(kube: KubeApi, node_cluster: NodeCluster, tmp_path: Path
                ) -> AsyncIterator[Binder]:
    """Two racks of two 8-GPU nodes, the two PriorityClasses, and a binder whose own default
    is never to preempt (the gang's policy says it may); all gone after."""
    nodes = [fake_node(f"pr-r{r}-{i}", builtin("hgx-h100"), {RACK: f"r{r}"}, TAINT)
             for r in range(2) for i in range(2)]
    await ensure_namespace(kube, NS)
    for name, value in ((LOW, 100), (HIGH, 100000)):
        await kube.create(PRIORITY_CLASSES, {"apiVersion": "scheduling.k8s.io/v1",
                                             "kind": "PriorityClass", "metadata": {"name": name},
                                             "value": value})
    config = BinderConfig(scheduler_name=SCHEDULER, backoff_initial=0.2, backoff_max=2.0,
                          event_interval=5, network_levels=Levels((RACK,)),
                          starvation_seconds=3600, preemption="Never")
    grant = chart_binder_grant(tmp_path, "topograph", "policy", GRANT)
    try:
        async with binder_as_chart(kube, node_cluster, config, grant=grant,
                                   objects=[(NODES, n) for n in nodes], ns=NS) as binder:
            yield binder
    finally:
        await delete_now(kube, PDBS.path(NS, "keep-b"))
        for name in (LOW, HIGH):
            await delete_now(kube, PRIORITY_CLASSES.path(None, name))


async def test_one_racks_gang_is_evicted_whole_for_a_high_gang_and_the_budget_holds(
        kube: KubeApi, racks: Binder) -> None:
    for gang in ("low-a", "low-b"):
        for i in range(2):
            await kube.create(PODS, _pod(f"{gang}-{i}", gang, LOW, app=gang), namespace=NS)
        await bound_whole(kube, NS, f"{gang}-", 2)
    pods = {p["metadata"]["name"]: p for p in (await kube.list(PODS, namespace=NS))["items"]}
    assert pods["low-a-0"]["spec"]["priority"] == 100  # the PriorityClass's, by admission
    rack_of = {g: {pods[f"{g}-{i}"]["spec"]["nodeName"][:5] for i in range(2)}
               for g in ("low-a", "low-b")}
    assert len(rack_of["low-a"]) == len(rack_of["low-b"]) == 1 and \
        rack_of["low-a"] != rack_of["low-b"], rack_of
    # no kubelet runs these nodes: write the start a kubelet would (status.startTime), low-a
    # an hour ago, low-b now. low-b, the younger (the least work lost), would go first: its
    # budget forbids it (its pods are never Ready here: the disruption controller allows no
    # disruption)
    now = time.time()
    for gang, since in (("low-a", now - 3600), ("low-b", now)):
        for i in range(2):
            await kube.patch(PODS, f"{gang}-{i}", {"status": {"startTime": _stamp(since)}}, NS,
                             subresource="status")
    await kube.create(PDBS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                             "metadata": {"name": "keep-b", "namespace": NS},
                             "spec": {"minAvailable": 1,
                                      "selector": {"matchLabels": {"app": "low-b"}}}},
                      namespace=NS)
    await eventually(lambda: f"{NS}/keep-b" in racks.preemptions.budgets, within=30,
                     what="the binder's view of the budget")

    for i in range(2):
        await kube.create(PODS, _pod(f"high-{i}", "high", HIGH, app="high", preempts=True),
                          namespace=NS)
    where = await bound_whole(kube, NS, "high-", 2)
    assert {n[:5] for n in where} == rack_of["low-a"], (where, rack_of)
    left = {p["metadata"]["name"] for p in (await kube.list(PODS, namespace=NS))["items"]}
    assert {"low-b-0", "low-b-1"} <= left and not {"low-a-0", "low-a-1"} & left, left

    preempted = await eventually(lambda: _told(kube, PREEMPTED, 2), within=30,
                                 what="GangPreempted Events")
    assert set(preempted) == {"low-a-0", "low-a-1"}
    assert preempted["low-a-0"].startswith(
        f"preempted by gang {NS}/high of priority 100000: gang {NS}/low-a (priority 100)")
    preempting = await eventually(lambda: _told(kube, PREEMPTING, 2), within=30,
                                  what="GangPreempting Events")
    assert set(preempting) == {"high-0", "high-1"}
    assert f"({NS}/low-a; 16 GPUs)" in preempting["high-0"], preempting
    assert racks.metrics.preempted_gangs._value.get() == 1

    # a second high gang finds only low-b in its way, which its budget protects: it preempts
    # nothing, and its pods say why
    for i in range(2):
        await kube.create(PODS, _pod(f"again-{i}", "again", HIGH, app="again", preempts=True),
                          namespace=NS)
    wait = await eventually(lambda: _scheduled_message(kube, "again-0", "preempts nothing"),
                            within=30, what="the second high gang's wait")
    assert "it preempts nothing: no running gang may be evicted for it (" in wait, wait
    assert "1 that a PodDisruptionBudget protects now" in wait, wait
    assert "1 of priority 100000 or more" in wait, wait  # the first high gang
    assert racks.metrics.preempted_gangs._value.get() == 1
    left = {p["metadata"]["name"] for p in (await kube.list(PODS, namespace=NS))["items"]}
    assert {"low-b-0", "low-b-1"} <= left, left


async def _scheduled_message(kube: KubeApi, name: str, words: str) -> str | None:
    """The pod's PodScheduled message, once it holds `words`."""
    pod = await kube.get(PODS, name, namespace=NS)
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == "PodScheduled" and words in c.get("message", ""):
            return str(c["message"])
    return None


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


async def test_the_gang_that_checkpointed_last_goes_when_its_job_says_so(
        kube: KubeApi, racks: Binder) -> None:
    """low-a started an hour ago and its job saved its state a minute ago; low-b started ten
    minutes ago and says nothing: low-a loses the least work and is evicted. The job writes
    muster.io/last-checkpoint-time on its running pods itself (here the cluster's admin, whom
    the chart's annotation guard checks as anyone but the binder: it lets that key through)."""
    for gang in ("low-a", "low-b"):
        for i in range(2):
            await kube.create(PODS, _pod(f"{gang}-{i}", gang, LOW, app=gang), namespace=NS)
        await bound_whole(kube, NS, f"{gang}-", 2)
    now = time.time()
    for gang, since in (("low-a", now - 3600), ("low-b", now - 600)):
        for i in range(2):
            await kube.patch(PODS, f"{gang}-{i}", {"status": {"startTime": _stamp(since)}}, NS,
                             subresource="status")
    await kube.patch(PODS, "low-a-1", {"metadata": {"annotations": {
        keys.ANN_LAST_CHECKPOINT: _stamp(now - 60)}}}, NS)
    rack_of_a = {(await kube.get(PODS, f"low-a-{i}", NS))["spec"]["nodeName"][:5]
                 for i in range(2)}

    for i in range(2):
        await kube.create(PODS, _pod(f"high-{i}", "high", HIGH, app="high", preempts=True),
                          namespace=NS)
    where = await bound_whole(kube, NS, "high-", 2)
    assert {n[:5] for n in where} == rack_of_a, (where, rack_of_a)
    left = {p["metadata"]["name"] for p in (await kube.list(PODS, namespace=NS))["items"]}
    assert {"low-b-0", "low-b-1"} <= left and not {"low-a-0", "low-a-1"} & left, left
    preempted = await eventually(lambda: _told(kube, PREEMPTED, 2), within=30,
                                 what="GangPreempted Events")
    assert f"its job's last checkpoint ({keys.ANN_LAST_CHECKPOINT}) was at " \
        f"{_stamp(now - 60)}" in preempted["low-a-0"], preempted


async def _told(kube: KubeApi, reason: str, count: int) -> dict[str, str] | None:
    found = await pod_events(kube, NS, reason)
    return found if len(found) >= count else None
