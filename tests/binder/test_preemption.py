"""The preemption planner: the fewest, cheapest whole lower-priority gangs whose eviction lets
a gang be placed with its topology request, tested through the binder's planning cycle."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from binder_objects import BLOCK, RACK, job, pod, racked_nodes

from webhook import keys
from webhook.binder.allocation import Allocation
from webhook.binder.assignment import build_assignment, encode_assignment
from webhook.binder.evict import preempted_message
from webhook.binder.fit import FitCache
from webhook.binder.gangs import Gang, assemble
from webhook.binder.nodes import NodeInfo, parse_node
from webhook.binder.planner import Plan, PlanConfig, plan_gangs
from webhook.binder.pods import parse_pod
from webhook.binder.preemption import (
    Preemption,
    Running,
    plan_preemption,
    preempter,
    victim_problem,
)
from webhook.binder.queue import GangQueue
from webhook.binder.reserve import Reservation
from webhook.topology.builtin import builtin
from webhook.topology.hierarchy import place_gang
from webhook.topology.network import Levels

CFG = PlanConfig(scheduler_name=keys.DEFAULT_BINDER_SCHEDULER_NAME,
                 levels=Levels((BLOCK, RACK), (("block", BLOCK), ("rack", RACK))))
NOW = 1795237200.0
TOPO = builtin("dgx1-v100")


def topo(level: str, mode: str = "required") -> str:
    return json.dumps({"v": 1, "mode": "preferred", "network": {"level": level, "mode": mode}})


#: when every running gang's pod was created: before any started (its time in the queue is no
#: work lost, so only when it started counts)
SUBMITTED = "2026-11-20T12:00:00Z"


def running(name: str, node_name: str, gpus: Sequence[int], *, priority: int = 0,
            started: str = "2026-11-21T04:00:00Z", created: str = SUBMITTED
            ) -> list[dict[str, Any]]:
    """A one-pod gang bound to `node_name`, holding `gpus` there, running since `started`
    (status.startTime; "": the kubelet has not started it)."""
    a = build_assignment(node_name, TOPO, tuple(gpus), [("main", len(gpus))])
    return [pod(f"{name}-0", gang=name, gpus=len(gpus), node_name=node_name,
                assignment=encode_assignment(a), priority=priority, created=created,
                phase="Running", started=started)]


def cluster(pods: list[dict[str, Any]]) -> tuple[dict[str, Gang], dict[str, NodeInfo], Any]:
    infos = [parse_pod(p) for p in pods]
    nodes = {n["metadata"]["name"]: parse_node(n) for n in racked_nodes()}
    states = {name: Allocation.from_pods(infos).node_state(n) for name, n in nodes.items()}
    return assemble(infos, CFG.scheduler_name, None), nodes, states


def decide(pods: list[dict[str, Any]], preemptor: str, *, protected: Sequence[str] = (),
           admitted: Sequence[str] = ()) -> Preemption | None:
    gangs, nodes, states = cluster(pods)
    others = [Running(g, evictable=g.name not in protected, kueue_admitted=g.name in admitted)
              for k, g in gangs.items() if k != f"team-a/{preemptor}"]
    return plan_preemption(gangs[f"team-a/{preemptor}"], others, nodes, states, config=CFG,
                           place=place_gang, now=NOW)


def full(priority: int = 0, young: str = "") -> list[dict[str, Any]]:
    """Every node of `racked_nodes` held whole by its own one-pod gang; the gangs in rack
    `young` started last (the least work lost)."""
    return [p for n in racked_nodes() for name in [n["metadata"]["name"]]
            for p in running(f"low-{name}", name, range(8), priority=priority,
                             started="2026-11-21T04:30:00Z" if young and
                             name.startswith(young) else "2026-11-21T04:00:00Z")]


def high(**kw: Any) -> list[dict[str, Any]]:
    return job("high", workers=2, gpus=8, priority=1000, topology=topo(RACK),
               created="2026-11-21T05:00:00Z", **kw)


def victims(p: Preemption | None) -> set[str]:
    assert p is not None
    return {v.gang.name for v in p.victims}


def test_a_required_rack_gang_evicts_exactly_one_racks_gangs_the_youngest() -> None:
    p = decide([*full(young="b0-r1"), *high()], "high")
    assert victims(p) == {"low-b0-r1-n0", "low-b0-r1-n1"}
    assert p is not None and p.domain == f"{BLOCK}=b0, {RACK}=r1" and p.gpus == 16
    assert {a.node for _, a in p.place.assignments if a.containers} == {"b0-r1-n0", "b0-r1-n1"}


def rack_since(rack: str, started: str, created: str = SUBMITTED) -> list[dict[str, Any]]:
    """`full()`, but the gangs of `rack` created at `created` and running since `started`."""
    return [p for p in full() if not p["spec"]["nodeName"].startswith(rack)] + [
        p for i in range(2)
        for p in running(f"low-{rack}-n{i}", f"{rack}-n{i}", range(8), started=started,
                         created=created)]


def test_the_work_a_victim_loses_counts_from_when_it_started_not_from_its_creation() -> None:
    # b0-r0's gangs were created at 04:40 and started at once; b0-r1's queued since the day
    # before and started at 04:55: they lose the least work (their time in the queue is none)
    pods = [p for p in rack_since("b0-r1", "2026-11-21T04:55:00Z")
            if not p["spec"]["nodeName"].startswith("b0-r0")]
    pods += [p for i in range(2) for p in running(
        f"low-b0-r0-n{i}", f"b0-r0-n{i}", range(8), started="2026-11-21T04:41:00Z",
        created="2026-11-21T04:40:00Z")]
    assert victims(decide([*pods, *high()], "high")) == {"low-b0-r1-n0", "low-b0-r1-n1"}


def test_a_gang_with_a_member_the_kubelet_has_not_started_has_lost_no_work() -> None:
    # b1-r1: one gang over both nodes, one member started at 04:00 and one not yet (no
    # status.startTime): it has done no work; b0-r1's gangs started at 04:55
    pods = [p for p in rack_since("b0-r1", "2026-11-21T04:55:00Z")
            if not p["spec"]["nodeName"].startswith("b1-r1")]
    for i, started in enumerate(("2026-11-21T04:00:00Z", "")):
        a = build_assignment(f"b1-r1-n{i}", TOPO, tuple(range(8)), [("main", 8)])
        pods.append(pod(f"pair-{i}", gang="pair", min_member=2, gpus=8, node_name=f"b1-r1-n{i}",
                        assignment=encode_assignment(a), priority=0, created=SUBMITTED,
                        phase="Running", started=started))
    assert victims(decide([*pods, *high()], "high")) == {"pair"}


def checkpointed(pods: list[dict[str, Any]], rack: str, at: str) -> list[dict[str, Any]]:
    """`pods`, those on the nodes of `rack` saying their job last saved its state `at`."""
    for p in pods:
        if p["spec"].get("nodeName", "").startswith(rack):
            p["metadata"]["annotations"][keys.ANN_LAST_CHECKPOINT] = at
    return pods


def test_a_gang_that_checkpointed_lately_loses_only_the_work_since_and_goes_first() -> None:
    # b0-r1's gangs started at 04:30 and never said they saved anything (30 minutes lost each);
    # b1-r0's started at 04:00 and checkpointed at 04:50 (10 minutes each): they go
    pods = checkpointed(full(young="b0-r1"), "b1-r0", "2026-11-21T04:50:00Z")
    p = decide([*pods, *high()], "high")
    assert victims(p) == {"low-b1-r0-n0", "low-b1-r0-n1"}
    assert p is not None
    told = preempted_message(p.victims[0].gang, p.victims[0].gang, "")
    assert told.endswith(f"its job's last checkpoint ({keys.ANN_LAST_CHECKPOINT}) was at "
                         "2026-11-21T04:50:00Z")


def test_a_gangs_word_on_its_checkpoint_can_only_lower_its_own_price() -> None:
    # before its start (a checkpoint of an earlier run): the work counts from its start, and
    # b0-r1, the younger, goes as without it
    before = checkpointed(full(young="b0-r1"), "b1-r0", "2026-11-21T03:00:00Z")
    assert victims(decide([*before, *high()], "high")) == {"low-b0-r1-n0", "low-b0-r1-n1"}
    # unreadable (no zone, or not a time): not read, and never a problem that would hold a
    # gang back (a worker restarted beside members that carry it is placed as ever)
    for bad in ("2026-11-21T04:59:00", "just now", ""):
        pods = checkpointed(full(young="b0-r1"), "b1-r0", bad)
        assert victims(decide([*pods, *high()], "high")) == {"low-b0-r1-n0", "low-b0-r1-n1"}
        info = parse_pod(next(p for p in pods if p["spec"]["nodeName"] == "b1-r0-n0"))
        assert info.checkpointed == 0 and info.problems == ()
    # to come: no work to lose, so the gang that says so goes first, and only it
    later = checkpointed(full(young="b0-r1"), "b1-r0-n1", "2026-11-21T06:00:00Z")
    assert victims(decide([*later, *high(), *job(
        "solo", workers=1, gpus=8, priority=1000, created="2026-11-21T05:00:00Z")], "solo")
    ) == {"low-b1-r0-n1"}


def test_the_victims_event_names_the_checkpoint_its_price_counted_from() -> None:
    """And only that: a gang whose member has not started has done no work (its price is 0),
    so it resumes from no checkpoint that this eviction made it give up work since."""
    def pair(second_started: str) -> Any:
        pods = [p for p in full(young="b0-r1") if not p["spec"]["nodeName"].startswith("b1-r1")]
        for i, started in enumerate(("2026-11-21T04:00:00Z", second_started)):
            a = build_assignment(f"b1-r1-n{i}", TOPO, tuple(range(8)), [("main", 8)])
            pods.append(pod(f"pair-{i}", gang="pair", min_member=2, gpus=8,
                            node_name=f"b1-r1-n{i}", assignment=encode_assignment(a),
                            priority=0, created=SUBMITTED, phase="Running", started=started))
        pods[-2]["metadata"]["annotations"][keys.ANN_LAST_CHECKPOINT] = "2026-11-21T04:58:00Z"
        p = decide([*pods, *high()], "high")
        assert p is not None and victims(p) == {"pair"}
        return preempted_message(p.victims[0].gang, p.victims[0].gang, "")
    assert pair("2026-11-21T04:00:00Z").endswith("was at 2026-11-21T04:58:00Z")
    assert keys.ANN_LAST_CHECKPOINT not in pair("")


def test_any_member_of_a_gang_may_say_when_the_gang_checkpointed() -> None:
    # one gang over both nodes of b1-r1, started at 04:00; its second member says 04:58
    pods = [p for p in full(young="b0-r1") if not p["spec"]["nodeName"].startswith("b1-r1")]
    for i in range(2):
        a = build_assignment(f"b1-r1-n{i}", TOPO, tuple(range(8)), [("main", 8)])
        pods.append(pod(f"pair-{i}", gang="pair", min_member=2, gpus=8, node_name=f"b1-r1-n{i}",
                        assignment=encode_assignment(a), priority=0, created=SUBMITTED,
                        phase="Running", started="2026-11-21T04:00:00Z"))
    pods[-1]["metadata"]["annotations"][keys.ANN_LAST_CHECKPOINT] = "2026-11-21T04:58:00Z"
    assert victims(decide([*pods, *high()], "high")) == {"pair"}


def test_no_victim_is_tried_without_when_too_few_gpus_would_be_left(monkeypatch: Any) -> None:
    # the rack's two gangs each free one of the two nodes the gang needs: one trial, where
    # the minimising pass would try each one's absence
    trials = []

    def counted(*args: Any, **kw: Any) -> Any:
        trials.append(1)
        return place_gang(*args, **kw)
    gangs, nodes, states = cluster([*full(young="b0-r1"), *high()])
    others = [Running(g) for k, g in gangs.items() if k != "team-a/high"]
    p = plan_preemption(gangs["team-a/high"], others, nodes, states, config=CFG,
                        place=counted, now=NOW)
    assert victims(p) == {"low-b0-r1-n0", "low-b0-r1-n1"} and len(trials) == 1


def test_a_pdb_protected_gang_is_never_chosen_another_rack_is() -> None:
    p = decide([*full(young="b0-r1"), *high()], "high", protected=["low-b0-r1-n1"])
    chosen = victims(p)
    assert "low-b0-r1-n1" not in chosen and len(chosen) == 2
    assert len({name.rsplit("-", 1)[0] for name in chosen}) == 1  # one rack, whole


def test_only_what_is_missing_is_evicted() -> None:
    pods = [p for p in full(young="b0-r1") if p["spec"]["nodeName"] != "b0-r1-n0"]
    assert victims(decide([*pods, *high()], "high")) == {"low-b0-r1-n1"}


def test_equal_or_higher_priority_kueue_admitted_and_foreign_gangs_are_never_victims() -> None:
    assert decide([*full(priority=1000), *high()], "high") is None
    everyone = [n["metadata"]["name"] for n in racked_nodes()]
    assert decide([*full(), *high()], "high", admitted=[f"low-{n}" for n in everyone]) is None
    gangs, _, _ = cluster([*full(), *high()])
    foreign = Gang("team-a/x", "team-a", "x", members=[
        parse_pod(pod("x", gpus=8, node_name="b0-r0-n0", scheduler="default-scheduler"))])
    assert victim_problem(gangs["team-a/high"], Running(foreign), CFG.scheduler_name) == \
        "some of its pods are another scheduler's"


def test_never_preempts_for_a_gang_that_could_not_fit_anyway() -> None:
    big = job("big", workers=3, gpus=8, priority=1000, topology=topo(RACK))  # a rack has 2
    assert decide([*full(), *big], "big") is None


def test_a_partly_free_rack_is_cheaper_than_a_full_one() -> None:
    pods = [p for p in full() if p["spec"]["nodeName"] != "b1-r0-n1"]
    assert victims(decide([*pods, *high()], "high")) == {"low-b1-r0-n0"}


def test_scattered_gpus_are_freed_only_where_no_level_is_asked() -> None:
    loose = job("loose", workers=2, gpus=8, priority=1000, topology=None)
    pods = [p for p in full() if p["spec"]["nodeName"] not in ("b0-r0-n0",)]
    assert len(victims(decide([*pods, *loose], "loose"))) == 1


def test_no_running_gangs_no_preemption() -> None:
    gangs, nodes, states = cluster([*full(), *high()])
    assert plan_preemption(gangs["team-a/high"], [], nodes, states, config=CFG,
                           place=place_gang, now=NOW) is None


def cycle(pods: list[dict[str, Any]], *, default: str = "Never", inflight: tuple[str, ...] = (),
          reserved: Mapping[str, Reservation] | None = None,
          budgets: Sequence[dict[str, Any]] = ()) -> Plan:
    """One planning cycle, with the preemption planner, as the binder runs it (the gangs of
    the pods `budgets` a PodDisruptionBudget protects)."""
    infos = [parse_pod(p) for p in pods]
    nodes = {n["metadata"]["name"]: parse_node(n) for n in racked_nodes()}
    config = replace(CFG, preemption=default)
    protected = {p["metadata"]["annotations"].get(keys.ANN_GANG_NAME) for p in budgets}
    running = [Running(g, evictable=g.name not in protected)
               for g in assemble(infos, CFG.scheduler_name, None).values()
               if all(p.node_name for p in g.members)]
    fit = FitCache()
    alloc = Allocation.from_pods(infos)
    return plan_gangs(assemble(infos, CFG.scheduler_name, None), alloc,
                      {n: alloc.node_state(x) for n, x in nodes.items()}, nodes, config=config,
                      queue=GangQueue(), fit=fit, place=place_gang, now=NOW, inflight=inflight,
                      preempt=preempter(lambda: running, nodes, config=config,
                                        place=place_gang, now=NOW, fit=fit),
                      reserved=reserved)


def said(pods: list[dict[str, Any]], key: str, value: Any) -> list[dict[str, Any]]:
    for p in pods:
        if key == "preemptionPolicy":
            p["spec"][key] = value
        else:
            p["metadata"]["annotations"][key] = value
    return pods


def test_the_policy_the_binders_default_and_the_priority_class_decide_who_preempts() -> None:
    assert not cycle([*full(), *high()]).preempts  # the default: Never
    assert len(cycle([*full(), *high()], default="LowerPriority").preempts) == 1
    asks = said(high(), keys.ANN_GANG_PREEMPTION, "LowerPriority")
    assert len(cycle([*full(), *asks]).preempts) == 1
    refuses = said(high(), keys.ANN_GANG_PREEMPTION, "Never")
    assert not cycle([*full(), *refuses], default="LowerPriority").preempts
    # the PriorityClass's preemptionPolicy Never: no annotation overrides it
    never = said(said(high(), keys.ANN_GANG_PREEMPTION, "LowerPriority"), "preemptionPolicy",
                 "Never")
    assert not cycle([*full(), *never], default="LowerPriority").preempts


def wait_of(plan: Plan, key: str) -> str:
    return next(w.reason for w in plan.waits if w.gang.key == key)


def test_a_gang_that_may_preempt_and_does_not_says_why_in_its_wait() -> None:
    """"Why is my job pending while gangs of lower priority run?": the wait says how many
    running gangs it could have evicted, and why the others may not go."""
    preempts = said(high(), keys.ANN_GANG_PREEMPTION, "LowerPriority")
    # every running gang of its priority or more, or protected
    kept = [*full(priority=1000)[:-2], *full()[-2:]]
    protected = cycle([*kept, *preempts], budgets=kept[-2:])
    assert not protected.preempts
    assert wait_of(protected, "team-a/high").endswith(
        "; it preempts nothing: no running gang may be evicted for it (6 of priority 1000 or "
        "more, 2 that a PodDisruptionBudget protects now)")
    # some may go, but no set of them makes room for a gang a rack cannot hold
    big = said(job("big", workers=3, gpus=8, priority=1000, topology=topo(RACK)),
               keys.ANN_GANG_PREEMPTION, "LowerPriority")
    mixed = [*full(priority=1000)[:4], *full()[4:]]
    assert wait_of(cycle([*mixed, *big]), "team-a/big").endswith(
        "; it preempts nothing: no set of the 4 running gang(s) of lower priority that may be "
        "evicted lets it be placed (of the others, 4 of priority 1000 or more)")
    # a gang that may not preempt says nothing of it
    assert "preempts nothing" not in wait_of(cycle([*full(priority=1000), *high()]),
                                             "team-a/high")


def test_a_preemption_reserves_what_the_gang_will_use_from_the_gangs_after_it() -> None:
    small = job("small", workers=1, gpus=8, priority=10, topology=None,
                created="2026-11-21T05:30:00Z")
    preempts = said(high(), keys.ANN_GANG_PREEMPTION, "LowerPriority")
    first = cycle([*full(young="b0-r1"), *preempts, *small])
    [pe] = first.preempts
    assert {v.name for v in pe.victims} == {"low-b0-r1-n0", "low-b0-r1-n1"}
    assert "waiting for the gangs of lower priority (team-a/low-b0-r1-n0" in next(
        w.reason for w in first.waits if w.gang.key == "team-a/high")
    assert not first.places  # small may not preempt (the default): nothing was free
    # the victims are gone, the preemptor's evictions still being written (in flight): the
    # rack they freed is held for it, so small waits
    left = [p for p in full(young="b0-r1") if not p["metadata"]["name"].startswith("low-b0-r1")]
    held = {"team-a/high": pe.reservation}
    assert not cycle([*left, *high(), *small], inflight=("team-a/high",),
                     reserved=held).places
    free = cycle([*left, *high(), *small], inflight=("team-a/high",))
    assert {p.gang.name for p in free.places} == {"small"}  # (without the reservation)
    # the preemptor's own turn: placed on what its victims freed, the rest still held
    placed = cycle([*left, *high(), *small], reserved=held)
    assert [p.gang.name for p in placed.places] == ["high"]


def test_two_preemptors_of_one_cycle_never_share_a_victim() -> None:
    one = said(high(), keys.ANN_GANG_PREEMPTION, "LowerPriority")
    two = said(job("other", workers=2, gpus=8, priority=900, topology=topo(RACK),
                   created="2026-11-21T05:00:00Z"), keys.ANN_GANG_PREEMPTION, "LowerPriority")
    first, second = cycle([*full(young="b0-r1"), *one, *two]).preempts
    assert first.gang.name == "high" and second.gang.name == "other"
    assert not {v.key for v in first.victims} & {v.key for v in second.victims}
    assert len({v.name.rsplit("-", 1)[0] for v in second.victims}) == 1  # a rack of its own


def gang_per_node(young_since: str) -> list[dict[str, Any]]:
    """A whole-node gang `low-<node>` on every node, running since 04:00, but the two in
    different racks (b0-r0-n0, b1-r1-n1) since `young_since`."""
    return [p for n in racked_nodes() for name in [n["metadata"]["name"]]
            for p in running(f"low-{name}", name, range(8),
                             started=young_since if name in ("b0-r0-n0", "b1-r1-n1")
                             else "2026-11-21T04:00:00Z")]


def test_a_gang_that_prefers_a_rack_gets_one_freed_though_scattered_gangs_cost_less() -> None:
    pods = gang_per_node("2026-11-21T04:30:00Z")
    prefers = job("high", workers=2, gpus=8, priority=1000, topology=topo(RACK, "preferred"),
                  created="2026-11-21T05:00:00Z")
    p = decide([*pods, *prefers], "high")
    assert p is not None and p.domain  # a rack, not the two youngest gangs apart
    assert len({v.gang.name.rsplit("-", 1)[0] for v in p.victims}) == 1
    loose = job("high", workers=2, gpus=8, priority=1000, topology=None,
                created="2026-11-21T05:00:00Z")
    assert victims(decide([*pods, *loose], "high")) == {"low-b0-r0-n0", "low-b1-r1-n1"}


def small(name: str, node_name: str, gpus: Sequence[int], started: str) -> list[dict[str, Any]]:
    return running(name, node_name, gpus, started=started)


OLD, VERY_OLD = "2026-11-21T00:00:00Z", "2026-11-20T20:00:00Z"


def test_a_victim_with_no_pod_where_the_gang_goes_is_dropped_without_a_trial(
        monkeypatch: Any) -> None:
    # b0-r1: n0 half held by the youngest gang (it frees no whole pod), n1 by one older gang;
    # one trial only, so the minimising pass cannot drop the young one
    monkeypatch.setattr("webhook.binder.preemption.MAX_TRIALS", 1)
    pods = [p for p in full(young="b0-r1") if not p["metadata"]["name"].startswith("low-b0-r1")]
    pods += [*small("young", "b0-r1-n0", range(4), "2026-11-21T04:55:00Z"),
             *small("old", "b0-r1-n0", range(4, 8), VERY_OLD),
             *small("mid", "b0-r1-n1", range(8), "2026-11-21T04:30:00Z")]
    one = job("one", workers=1, gpus=8, priority=1000, topology=topo(RACK),
              created="2026-11-21T05:00:00Z")
    assert victims(decide([*pods, *one], "one")) == {"mid"}


def test_a_domains_room_is_counted_in_whole_pods(monkeypatch: Any) -> None:
    # b0-r0 has 8 free GPUs, 4 on each node: no 8-GPU pod; young 2-GPU gangs there look
    # cheapest by GPU count but free a node only with an old one; b0-r1 frees a node by
    # evicting one gang of an hour. Counted in pods, b0-r1 is tried first (one trial here)
    monkeypatch.setattr("webhook.binder.preemption.MAX_TRIALS", 1)
    pods = [p for n in racked_nodes() if n["metadata"]["name"].startswith("b1")
            for p in running(f"low-{n['metadata']['name']}", n["metadata"]["name"], range(8),
                             started=VERY_OLD)]
    for i in range(2):
        pods += [*small(f"young{i}", f"b0-r0-n{i}", range(2), "2026-11-21T04:50:00Z"),
                 *small(f"old{i}", f"b0-r0-n{i}", range(2, 4), OLD)]
    pods += [*small("hour", "b0-r1-n0", range(8), "2026-11-21T04:00:00Z"),
             *small("older", "b0-r1-n1", range(8), VERY_OLD)]
    one = job("one", workers=1, gpus=8, priority=1000, topology=topo(RACK),
              created="2026-11-21T05:00:00Z")
    assert victims(decide([*pods, *one], "one")) == {"hour"}


def test_one_young_whole_gang_goes_before_many_older_small_ones() -> None:
    # b0-r0-n0: eight 1-GPU gangs of an hour (8 GPU-hours); b0-r0-n1: one 8-GPU gang of half
    # an hour (4 GPU-hours), though each small gang alone loses less
    pods = [p for p in full() if not p["spec"]["nodeName"].startswith("b0-r0")]
    pods += [p for i in range(8) for p in small(f"s{i}", "b0-r0-n0", [i], "2026-11-21T04:00:00Z")]
    pods += small("whole", "b0-r0-n1", range(8), "2026-11-21T04:30:00Z")
    loose = job("loose", workers=1, gpus=8, priority=1000, topology=None,
                created="2026-11-21T05:00:00Z")
    assert victims(decide([*pods, *loose], "loose")) == {"whole"}


def test_a_preferred_rack_gives_way_when_scattered_gangs_lose_much_less_work() -> None:
    # the two youngest gangs, in two racks, ran 5 minutes; every rack's ran an hour: 12x the
    # work lost (the rack is worth 2x); a required rack still gets one freed
    pods = gang_per_node("2026-11-21T04:55:00Z")
    prefers = job("high", workers=2, gpus=8, priority=1000, topology=topo(RACK, "preferred"),
                  created="2026-11-21T05:00:00Z")
    p = decide([*pods, *prefers], "high")
    assert p is not None and p.domain == ""
    assert victims(p) == {"low-b0-r0-n0", "low-b1-r1-n1"}
    requires = job("high", workers=2, gpus=8, priority=1000, topology=topo(RACK),
                   created="2026-11-21T05:00:00Z")
    required = decide([*pods, *requires], "high")
    assert required is not None and required.domain
