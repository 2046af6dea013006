"""The planner's rules (gang readiness, order, starvation, recovery) with a simple first-fit
engine, so that these tests are about the binder's rules; tests/binder/test_engine_plan.py runs
the same paths with the real placement engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from binder_objects import job, node, pod

from webhook.binder.assignment import (
    assigned_indices,
    build_assignment,
    encode_assignment,
    encode_record,
)
from webhook.binder.fit import FitCache
from webhook.binder.gangs import PodGroupInfo
from webhook.binder.nodes import parse_node
from webhook.binder.planner import Plan, PlanConfig, plan
from webhook.binder.pods import parse_pod
from webhook.binder.queue import GangQueue
from webhook.topology.builtin import builtin
from webhook.topology.groups import NodeGroups
from webhook.topology.model import (
    GangPlacement,
    GangRequest,
    MemberPlacement,
    NodeState,
    Unplaceable,
)
from webhook.topology.network import Network

CFG = PlanConfig(scheduler_name="muster-binder", starvation_seconds=30)
TOPO = builtin("dgx1-v100")


def first_fit(nodes: Sequence[NodeState], gang: GangRequest, *, network: Network | None = None,
              groups: NodeGroups | None = None) -> GangPlacement | Unplaceable:
    free = {n.name: [sorted(n.free_gpus), n.free_cpu_milli, n.free_pods] for n in nodes}
    need = sum(m.gpus for m in gang.members)
    home = [n for n in nodes if len(n.free_gpus) >= need and all(
        m.eligible_nodes is None or n.name in m.eligible_nodes
        for m in gang.members if m.gpus)][:1] if gang.single_node else nodes
    out = []
    for m in gang.members:
        for n in home if m.gpus else nodes:
            f = free[n.name]
            ok = (m.eligible_nodes is None or n.name in m.eligible_nodes) and \
                len(f[0]) >= m.gpus and f[1] >= m.cpu_milli and f[2] >= 1
            if ok:
                out.append(MemberPlacement(m.key, n.name, tuple(f[0][:m.gpus])))
                f[0], f[1], f[2] = f[0][m.gpus:], f[1] - m.cpu_milli, f[2] - 1
                break
        else:
            return Unplaceable(f"{m.key} does not fit")
    return GangPlacement(tuple(out), len({p.node for p in out}))


def run(pods: list[dict[str, Any]], nodes: list[dict[str, Any]], *, queue: GangQueue | None = None,
        now: float = 1795237200.0 + 10, groups: dict[str, PodGroupInfo] | None = None,
        inflight: tuple[str, ...] = (), generation: int = 0) -> Plan:
    return plan([parse_pod(p) for p in pods], {n["metadata"]["name"]: parse_node(n)
                                               for n in nodes},
                groups, config=CFG, queue=queue or GangQueue(), fit=FitCache(), place=first_fit,
                now=now, inflight=inflight, generation=generation)


def placed(p: Plan) -> dict[str, str]:
    return {pod.name: a.node for place in p.places for pod, a in place.assignments}


def test_nothing_is_placed_before_min_member() -> None:
    pods = job("j1")
    p = run(pods[:4], [node("n1")])
    assert not p.places
    assert p.waits[0].kind == "members" and "4 of minMember 5" in p.waits[0].reason
    p = run(pods, [node("n1")])
    assert len(p.places) == 1 and len(placed(p)) == 5


def test_assignments_follow_the_placement_and_are_not_reused_in_one_cycle() -> None:
    jobs = [pod_ for n in range(5) for pod_ in job(f"j{n}")]
    p = run(jobs, [node("n1"), node("n2")])
    assert len(p.places) == 4
    gpus = [(a.node, i) for place in p.places for _, a in place.assignments
            for c in a.containers.values() for i in c.indices]
    assert len(gpus) == 16 and len(set(gpus)) == 16
    launcher = next(a for place in p.places for pod_, a in place.assignments
                    if pod_.name == "j1-launcher")
    assert launcher.containers == {}
    assert [w.gang.key for w in p.waits] == ["team-a/j4"]
    assert p.waits[0].kind == "unplaceable"


def test_priority_then_age_decide_who_gets_scarce_gpus() -> None:
    old = job("old", workers=8, created="2026-11-21T04:00:00Z")
    new = job("new", workers=8, created="2026-11-21T05:00:00Z")
    assert set(placed(run(new + old, [node("n1")]))) == {p["metadata"]["name"] for p in old}
    vip = job("vip", workers=8, created="2026-11-21T05:00:00Z", priority=1000)
    assert set(placed(run(old + vip, [node("n1")]))) == {p["metadata"]["name"] for p in vip}


def test_a_starving_big_gang_reserves_against_later_small_ones() -> None:
    busy = [pod("busy", gpus=4, node_name="n1",
                assignment=encode_assignment(build_assignment("n1", TOPO, (0, 1, 2, 3),
                                                              [("main", 4)])))]
    big = job("big", workers=8, created="2026-11-21T04:00:00Z")
    small = job("small", workers=2, created="2026-11-21T05:00:00Z")
    queue = GangQueue()
    t0 = 1795237200.0
    p = run(busy + big + small, [node("n1")], queue=queue, now=t0)
    assert "small-worker-0" in placed(p)  # big has not waited long: small backfills
    queue.failed("team-a/big", t0, 0, p.waits[0].reason)
    later = t0 + 31
    p = run(busy + big + small, [node("n1")], queue=queue, now=later)
    assert not p.places
    blocked = next(w for w in p.waits if w.gang.key == "team-a/small")
    assert blocked.kind == "blocked" and blocked.reason.startswith("queued behind gang team-a/big")
    assert next(w for w in p.waits if w.gang.key == "team-a/big").reserves


def test_a_starving_gang_holds_back_its_equals_never_a_gang_of_higher_priority() -> None:
    busy = [pod("busy", gpus=4, node_name="n1",
                assignment=encode_assignment(build_assignment("n1", TOPO, (0, 1, 2, 3),
                                                              [("main", 4)])))]
    big = job("big", workers=8, created="2026-11-21T04:00:00Z")
    vip = job("vip", workers=2, created="2026-11-21T05:00:00Z", priority=100)
    small = job("small", workers=2, created="2026-11-21T05:00:00Z")
    queue = GangQueue()
    t0 = 1795237200.0
    queue.failed("team-a/big", t0, 0, "no room")
    p = run(busy + big + vip + small, [node("n1")], queue=queue, now=t0 + 61)
    assert {pod_.gang_name for pod_, _ in p.places[0].assignments} == {"vip"}
    assert next(w for w in p.waits if w.gang.key == "team-a/small").kind == "blocked"


def test_a_gang_that_can_never_fit_does_not_block_others() -> None:
    huge = job("huge", workers=9, created="2026-11-21T04:00:00Z")  # 9 GPUs on 8-GPU nodes
    small = job("small", workers=2, created="2026-11-21T05:00:00Z")
    queue = GangQueue()
    queue.failed("team-a/huge", 0.0, 0, "too big")
    p = run(huge + small, [node("n1")], queue=queue, now=1795237200.0 + 3600, )
    assert "small-worker-0" in placed(p)
    assert not next(w for w in p.waits if w.gang.key == "team-a/huge").reserves


def test_backoff_skips_until_due_or_cluster_changes() -> None:
    queue = GangQueue(initial=10)
    queue.failed("team-a/j1", 100.0, generation=1, reason="x")
    assert not queue.due("team-a/j1", 105.0, 1)
    assert queue.due("team-a/j1", 105.0, 2)
    assert queue.due("team-a/j1", 110.0, 1)
    assert queue.next_deadline(after=100.0) == 110.0
    assert queue.next_deadline(after=110.0) is None  # already retried: nothing to wake for
    for attempt in range(2000):  # days of retries: the backoff stays at its maximum
        queue.failed("team-a/old", float(attempt), 1, "x")
    assert queue.next_deadline(after=1999.0) == 1999.0 + 60.0
    p = run(job("j1"), [node("n1")], queue=queue, now=105.0, generation=1)
    assert not p.places and p.waits[0].kind == "backoff"


def reserved_job(name: str, node_name: str, gpus: Sequence[int], bound: int = 0,
                 members: int | None = None) -> list[dict[str, Any]]:
    """A job whose members carry assignments (as a binder writes them) and `bound` are bound."""
    out = []
    for i, obj in enumerate(job(name, workers=len(gpus))):
        is_worker = i < len(gpus)
        a = build_assignment(node_name, TOPO, (gpus[i],) if is_worker else (),
                             [("main", 1 if is_worker else 0)])
        obj["metadata"]["annotations"]["muster.io/gpu-assignment"] = encode_assignment(a)
        if i < bound:
            obj["spec"]["nodeName"] = node_name
        out.append(obj)
    return out[:members] if members is not None else out


def test_recovery_binds_a_fully_reserved_consistent_gang() -> None:
    p = run(reserved_job("j1", "n1", [0, 1, 2, 3]), [node("n1")])
    assert [len(f.assignments) for f in p.finishes] == [5] and not p.strips and not p.places


def test_recovery_finishes_a_partially_bound_gang() -> None:
    p = run(reserved_job("j1", "n1", [0, 1, 2, 3], bound=2), [node("n1")])
    assert [len(f.assignments) for f in p.finishes] == [3]


def test_recovery_strips_an_incomplete_reservation() -> None:
    pods = reserved_job("j1", "n1", [0, 1, 2, 3], members=2) + job("j1")[2:]
    p = run(pods, [node("n1")])
    assert not p.finishes and not p.places
    assert [len(s.pods) for s in p.strips] == [2]
    assert "only 2 of minMember 5" in p.strips[0].reason


def test_recovery_strips_reservations_on_vanished_nodes_or_doubled_gpus() -> None:
    p = run(reserved_job("j1", "gone", [0, 1, 2, 3]), [node("n1")])
    assert [len(s.pods) for s in p.strips] == [5] and "no longer exists" in p.strips[0].reason
    # another pod of the binder's took GPU 2 meanwhile (one of another scheduler would hold
    # back a GPU it cannot name: test_an_assignment_counts_only_on_the_binders_own_pods)
    thief = pod("thief", gpus=1, node_name="n1",
                assignment=encode_assignment(build_assignment("n1", TOPO, (2,), [("main", 1)])))
    p = run([thief, *reserved_job("j1", "n1", [0, 1, 2, 3])], [node("n1")])
    assert not p.finishes and "assigned to another pod" in p.strips[0].reason
    p = run([thief, *reserved_job("j1", "n1", [0, 1, 2, 3], bound=1)], [node("n1")])
    assert [len(f.assignments) for f in p.finishes] == [3]  # the doubled one is stripped, not bound
    assert [s.pods[0].name for s in p.strips] == ["j1-worker-2"]


def recorded_job(name: str, slots: Sequence[tuple[str, int]], bound: int
                 ) -> list[dict[str, Any]]:
    """A job placed worker i on slots[i] (node, GPU) and the launcher on the first node, as one
    round of Bindings records it; only the first `bound` members' Bindings went through."""
    pods = job(name, workers=len(slots))
    where = [(n, (g,)) for n, g in slots] + [(slots[0][0], ())]
    record = encode_record(tuple(sorted((p["metadata"]["name"], n, g)
                                        for p, (n, g) in zip(pods, where, strict=True))))
    for obj, (node_name, gpus) in list(zip(pods, where, strict=True))[:bound]:
        a = build_assignment(node_name, TOPO, gpus, [("main", len(gpus))])
        obj["metadata"]["annotations"].update({"muster.io/gpu-assignment": encode_assignment(a),
                                               "muster.io/gang-placement": record})
        obj["spec"]["nodeName"] = node_name
    return pods


def finished(p: Plan) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {pod.name: (a.node, tuple(sorted(assigned_indices(a))))
            for f in p.finishes for pod, a in f.assignments}


def test_recovery_binds_the_unbound_members_where_the_gangs_record_put_them() -> None:
    slots = [("n1", 5), ("n1", 6), ("n2", 0), ("n2", 7)]
    p = run(recorded_job("j1", slots, bound=2), [node("n1"), node("n2")])
    assert finished(p) == {"j1-worker-2": ("n2", (0,)), "j1-worker-3": ("n2", (7,)),
                           "j1-launcher": ("n1", ())}
    assert not p.places and not p.strips and not p.waits


def test_a_restarted_worker_goes_back_to_its_recorded_slot() -> None:
    pods = recorded_job("j1", [("n1", 4), ("n1", 5), ("n1", 6), ("n1", 7)], bound=5)
    restarted = job("j1")[2]  # worker 2 failed; its controller made a new pod of the same name
    restarted["metadata"]["uid"] = "uid-new"
    p = run([*pods[:2], restarted, *pods[3:]], [node("n1")])
    assert finished(p) == {"j1-worker-2": ("n1", (6,))} and not p.places


def test_a_recorded_slot_that_was_taken_is_placed_afresh_and_the_rest_finished() -> None:
    # another pod of the binder's took GPU 2 meanwhile (one of another scheduler would hold
    # back a GPU it cannot name: test_an_assignment_counts_only_on_the_binders_own_pods)
    thief = pod("thief", gpus=1, node_name="n1",
                assignment=encode_assignment(build_assignment("n1", TOPO, (2,), [("main", 1)])))
    pods = recorded_job("j1", [("n1", 0), ("n1", 1), ("n1", 2), ("n1", 3)], bound=1)
    p = run([thief, *pods], [node("n1")])
    assert set(finished(p)) == {"j1-worker-1", "j1-worker-3", "j1-launcher"}
    assert not p.places  # one action per gang and cycle: the taken one's turn is next
    done = {pod_.name: a for f in p.finishes for pod_, a in f.assignments}
    for obj in pods:  # the finished ones are bound now
        if obj["metadata"]["name"] in done:
            obj["spec"]["nodeName"] = "n1"
            obj["metadata"]["annotations"]["muster.io/gpu-assignment"] = encode_assignment(
                done[obj["metadata"]["name"]])
    p = run([thief, *pods], [node("n1")])
    assert not p.finishes and placed(p) == {"j1-worker-2": "n1"}
    [(_, a)] = p.places[0].assignments
    assert assigned_indices(a) & {0, 1, 2, 3} == frozenset()


def test_a_record_on_a_vanished_node_or_an_unbound_pod_reserves_nothing() -> None:
    pods = recorded_job("j1", [("n1", 0), ("gone", 0), ("gone", 1), ("n1", 1)], bound=1)
    p = run(pods, [node("n1")])
    assert set(finished(p)) == {"j1-worker-3", "j1-launcher"}
    pods = recorded_job("j2", [("n1", 0), ("n1", 1), ("n1", 2), ("n1", 3)], bound=1)
    del pods[0]["spec"]["nodeName"]  # a record on a pod that is not bound is not the binder's
    del pods[0]["metadata"]["annotations"]["muster.io/gpu-assignment"]
    p = run(pods, [node("n1")])
    assert not p.finishes and len(placed(p)) == 5


def test_an_assignment_counts_only_on_the_binders_own_pods() -> None:
    """A pod another scheduler bound, annotated with a forged assignment that names every GPU
    of the node and a record naming a gang's pending members, takes nothing: the gang is
    placed on the node's free GPUs, afresh. Its GPUs count as the kubelet counts them: a
    0-GPU pod holds none."""
    everything = encode_assignment(build_assignment("n1", TOPO, tuple(range(8)),
                                                    [("main", 8)]))
    forged = pod("forged", gpus=0, node_name="n1", scheduler="default-scheduler",
                 assignment=everything, gang="j1", min_member=5)
    forged["metadata"]["annotations"]["muster.io/gang-placement"] = encode_record(
        tuple((f"j1-worker-{i}", "n1", (i,)) for i in range(4)))
    p = run([forged, *job("j1")], [node("n1")])
    assert not p.finishes and not p.waits
    assert placed(p) == {f"j1-worker-{i}": "n1" for i in range(4)} | {"j1-launcher": "n1"}
    assert p.allocation.assigned_gpus("n1") == 0


def test_an_unbound_member_being_deleted_is_not_placed_and_a_bound_one_holds_its_gpus() -> None:
    pods = job("j1")
    pods[1]["metadata"]["deletionTimestamp"] = "2026-11-21T05:01:00Z"  # a finalizer holds it
    p = run(pods, [node("n1")])
    assert not p.places and "4 of minMember 5" in p.waits[0].reason
    leaving = pod("leaving", gpus=8, node_name="n1", scheduler="other",
                  assignment=encode_assignment(build_assignment("n1", TOPO, range(8),
                                                                [("main", 8)])))
    leaving["metadata"]["deletionTimestamp"] = "2026-11-21T05:01:00Z"
    p = run([leaving, *job("j2")], [node("n1")])
    assert not p.places and p.waits[0].kind == "unplaceable"


def test_a_job_recreated_while_its_old_pods_terminate_waits_for_its_own_members() -> None:
    old = recorded_job("j1", [("n1", 0), ("n1", 1), ("n1", 2), ("n1", 3)], bound=5)
    for obj in old:  # the job was deleted: its pods terminate within their grace period
        obj["metadata"]["deletionTimestamp"] = "2026-11-21T05:01:00Z"
    new = job("j1")
    for obj in new:
        obj["metadata"]["uid"] += "-new"
    p = run([*old, *new[:2]], [node("n1")])
    assert not p.places and not p.finishes  # the old bound pods are no members of the new gang
    assert "2 of minMember 5" in p.waits[0].reason
    p = run([*old, *new], [node("n1")])
    gpus = {i for place in p.places for _, a in place.assignments for i in assigned_indices(a)}
    assert len(placed(p)) == 5 and not gpus & {0, 1, 2, 3}  # the old pods still hold theirs


def test_inflight_gangs_are_left_alone() -> None:
    p = run(reserved_job("j1", "n1", [0, 1, 2, 3]), [node("n1")], inflight=("team-a/j1",))
    assert not (p.finishes or p.strips or p.places or p.waits)


def test_pod_groups_and_invalid_gangs() -> None:
    labelled = [pod(f"w{i}", gpus=1, labels={"scheduling.x-k8s.io/pod-group": "pg"})
                for i in range(3)]
    p = run(labelled, [node("n1")], groups={})
    assert p.waits[0].kind == "invalid" and "PodGroup team-a/pg not found" in p.waits[0].reason
    p = run(labelled, [node("n1")], groups={"team-a/pg": PodGroupInfo(min_member=4)})
    assert p.waits[0].kind == "members" and p.gangs["team-a/pg"].timeout_seconds == 60
    p = run(labelled, [node("n1")], groups={"team-a/pg": PodGroupInfo(min_member=3)})
    assert len(placed(p)) == 3
    bad = pod("bad", gang="g", gpus=1, topology='{"v": 1, "mode": "never"}')
    p = run([bad], [node("n1")])
    assert p.waits[0].kind == "invalid" and not p.places


def test_no_eligible_node_says_why() -> None:
    p = run(job("j1"), [node("n1", taints=[{"key": "x", "value": "y", "effect": "NoSchedule"}])])
    assert p.waits[0].kind == "unplaceable"
    assert "0/1 nodes are eligible" in p.waits[0].reason and "untolerated taint x" in \
        p.waits[0].reason


def test_timeout_is_reported() -> None:
    pods = job("j1", timeout=30)[:3]
    assert not run(pods, [node("n1")], now=1795237200.0 + 10).waits[0].timed_out
    assert run(pods, [node("n1")], now=1795237200.0 + 31).waits[0].timed_out


def test_a_restarted_member_of_a_single_node_gang_joins_its_node() -> None:
    running = reserved_job("j1", "n2", [0, 1, 2, 3], bound=5)
    del running[1]  # worker 1 died ...
    replacement = job("j1")[1]  # ... and its controller created it again
    p = run([*running, replacement], [node("n1"), node("n2")])
    assert placed(p) == {"j1-worker-1": "n2"}
    gpus = next(a for _, a in p.places[0].assignments).containers["main"].indices
    assert gpus[0] not in (0, 2, 3)


def test_gpu_pods_need_a_readable_topology() -> None:
    broken = node("n2")
    broken["metadata"]["annotations"]["muster.io/gpu-topology"] = "{not json"
    p = run(job("j1"), [node("n1", kind=None, gpus=8), broken])
    assert p.waits[0].kind == "unplaceable"
    assert "1 node(s): no published GPU topology" in p.waits[0].reason
    assert "1 node(s): unreadable GPU topology annotation" in p.waits[0].reason
