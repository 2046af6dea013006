"""Preemption's candidates kept from cycle to cycle: `Snapshot.running_gangs` gives the same
Gang objects while their members and PodGroup are unchanged, and `Preemptions.running` the
same Running (what it holds, read once) while its gang and budget are; each equal to what
assembling every pod afresh gives."""

from __future__ import annotations

from typing import Any

from binder_objects import budget, pod

from webhook import keys
from webhook.binder.evict import Evictor
from webhook.binder.gangs import PodGroupInfo, assemble
from webhook.binder.metrics import Metrics
from webhook.binder.pods import PodInfo, parse_pod
from webhook.binder.preempting import Preemptions
from webhook.binder.snapshot import Snapshot

SCHED = "muster-binder"


def running(name: str, node: str, *, rv: str = "1", group: bool = False) -> PodInfo:
    labels = {"app": name}
    if group:
        labels[keys.COSCHEDULING_GROUP_LABEL] = name
    return parse_pod(pod(f"{name}-0", gang=None if group else name, gpus=8, node_name=node,
                         phase="Running", rv=rv, labels=labels))


def fresh(pods: list[PodInfo], groups: dict[str, PodGroupInfo] | None) -> dict[str, Any]:
    return assemble(pods, SCHED, groups, 60)


def test_the_same_gangs_until_a_member_or_its_podgroup_changes() -> None:
    snap = Snapshot(SCHED)
    a, b, c = running("a", "n1"), running("b", "n2"), running("c", "n3", group=True)
    groups = {"team-a/c": PodGroupInfo(1, 30)}
    for p in (a, b, c):
        snap.put(p)
    first = snap.running_gangs(groups, 60)
    again = snap.running_gangs(groups, 60)
    assert first == fresh([a, b, c], groups)
    assert all(again[k] is first[k] for k in first)

    a2 = running("a", "n1", rv="2")
    snap.put(a2)  # a member changed: its gang is assembled again, the others kept
    groups = {"team-a/c": PodGroupInfo(2, 30)}  # c's PodGroup changed
    now = snap.running_gangs(groups, 60)
    assert now == fresh([a2, b, c], groups)
    assert now["team-a/a"] is not first["team-a/a"] and now["team-a/b"] is first["team-a/b"]
    assert now["team-a/c"] is not first["team-a/c"] and now["team-a/c"].min_member == 2

    snap.put(parse_pod(pod("b-1", gang="b", gpus=8)))  # b has a pending member: not running
    assert set(snap.running_gangs(groups, 60)) == {"team-a/a", "team-a/c"}
    snap.remove("team-a/b-1")
    assert snap.running_gangs(groups, 60)["team-a/b"] == fresh([b], None)["team-a/b"]


def test_the_same_candidates_while_their_gang_and_budget_are() -> None:
    snap = Snapshot(SCHED)
    for p in (running("a", "n1"), running("b", "n2")):
        snap.put(p)
    # (no API: choosing candidates writes nothing)
    pre = Preemptions(Evictor(None, None, Metrics(), lambda _: None, lambda: None), snap)
    first = {r.gang.key: r for r in pre.running(None, 60)}
    assert first["team-a/a"].held.gpus_on == {"n1": 8}
    again = {r.gang.key: r for r in pre.running(None, 60)}
    assert all(again[k] is first[k] for k in first)

    pre.on_pdb("ADDED", budget("a", 0), None)
    now = {r.gang.key: r for r in pre.running(None, 60)}
    assert not now["team-a/a"].evictable and now["team-a/b"] is first["team-a/b"]
    pre.on_pdb("DELETED", budget("a", 0), None)
    assert {r.gang.key: r for r in pre.running(None, 60)}["team-a/a"].evictable
