"""The binder keeps topologySpreadConstraints with whenUnsatisfiable DoNotSchedule as
kube-scheduler's PodTopologySpread filter does: the pods on nodes and the gang's own members
counted, nodes without the key left out, and nothing bound that breaks one."""

from __future__ import annotations

import json
from typing import Any

from binder_objects import node, pod
from binder_run import planned, where

from webhook import keys
from webhook.binder.fit import FitCache
from webhook.binder.interpod import Neighbours
from webhook.binder.nodes import parse_node
from webhook.binder.planner import Plan, PlanConfig, plan
from webhook.binder.pods import SpreadTerm, parse_pod
from webhook.binder.queue import GangQueue
from webhook.binder.spread import violation
from webhook.topology.hierarchy import place_gang
from webhook.topology.network import Levels

BLOCK, RACK, HOST = "example.com/block", "example.com/rack", "kubernetes.io/hostname"
#: members may span nodes
SPANS = json.dumps({"v": 1, "mode": "preferred"})


def nodes(*, unlabelled: int = 0) -> list[dict[str, Any]]:
    """2 blocks x 2 racks x 2 DGX-1 nodes (rack values repeat across blocks), and `unlabelled`
    nodes with neither label."""
    out = [node(f"b{b}-r{r}-n{i}", labels={HOST: f"b{b}-r{r}-n{i}", BLOCK: f"b{b}",
                                           RACK: f"r{r}"})
           for b in (0, 1) for r in (0, 1) for i in range(2)]
    return out + [node(f"a-bare-{i}", labels={HOST: f"a-bare-{i}"}) for i in range(unlabelled)]


def spread(key: str, skew: int = 1, **more: Any) -> dict[str, Any]:
    """A DoNotSchedule constraint over pods labelled job=j (the gang's own)."""
    return {"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"job": "j"}}, **more}


def gang(n: int, gpus: int, constraints: list[dict[str, Any]] | None = None, *,
         topology: str = SPANS, more: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    spec = {"topologySpreadConstraints": constraints} if constraints else {}
    return [pod(f"j-{i}", gang="j", min_member=n, gpus=gpus, labels={"job": "j"},
                extra_spec={**spec, **(more or {})}, topology=topology) for i in range(n)]


def run(pods: list[dict[str, Any]], objs: list[dict[str, Any]] | None = None) -> Plan:
    return planned(pods, objs or nodes())


def why(p: Plan) -> str:
    assert not p.places, where(p)
    (wait,) = p.waits
    return wait.reason


def test_only_do_not_schedule_constraints_are_read_with_their_match_label_keys() -> None:
    c = spread(RACK, 2, matchLabelKeys=["job", "absent"], minDomains=3,
               nodeAffinityPolicy="Ignore", nodeTaintsPolicy="Honor")
    soft = {**spread(BLOCK), "whenUnsatisfiable": "ScheduleAnyway"}
    (p, *_) = gang(1, 1, [c, soft])
    info = parse_pod(p)
    assert info.spread == (SpreadTerm(2, RACK, (("In", "job", frozenset({"j"})),
                                                ("In", "job", frozenset({"j"}))), 3, False,
                                      True),)
    assert not info.problems
    (bad, *_) = gang(1, 1, [spread(RACK, 0)])
    assert parse_pod(bad).spread == ()
    assert "maxSkew of at least 1" in parse_pod(bad).problems[0]


def test_a_gang_spread_by_hostname_gets_a_node_per_member() -> None:
    # the control: best fit packs four 1-GPU members on one node
    assert len(set(where(run(gang(4, 1))).values())) == 1
    p = run(gang(4, 1, [spread(HOST)]))
    assert len(p.places) == 1 and len(set(where(p).values())) == 4
    # maxSkew 2: two members per node, as long as an empty node stays
    p = run(gang(4, 1, [spread(HOST, 2)]))
    assert sorted(list(where(p).values()).count(n) for n in set(where(p).values())) == [2, 2]
    # placed one at a time, two members of a node still get GPUs of their own
    taken = [(a.node, i) for place in p.places for _, a in place.assignments
             for c in a.containers.values() for i in c.indices]
    assert len(taken) == 4 == len(set(taken))


def test_pods_already_on_nodes_are_counted() -> None:
    # best fit puts a 4-GPU member beside the 4 GPUs a job-j pod holds, unless it counts
    placed = pod("old", gpus=4, node_name="b0-r0-n0", topology=None, labels={"job": "j"},
                 scheduler="default-scheduler")
    assert where(run([placed, *gang(1, 4)])) == {"j-0": "b0-r0-n0"}
    assert where(run([placed, *gang(1, 4, [spread(HOST)])]))["j-0"] != "b0-r0-n0"
    # another namespace's pod, or one being deleted, is not counted
    elsewhere = {**placed, "metadata": {**placed["metadata"], "namespace": "team-b"}}
    assert where(run([elsewhere, *gang(1, 4, [spread(HOST)])])) == {"j-0": "b0-r0-n0"}
    going = {**placed, "metadata": {**placed["metadata"],
                                    "deletionTimestamp": "2026-11-21T05:00:00Z"}}
    assert where(run([going, *gang(1, 4, [spread(HOST)])])) == {"j-0": "b0-r0-n0"}


def test_nodes_without_the_key_are_left_out() -> None:
    objs = nodes(unlabelled=1)
    # the bare node sorts first: the control lands there, the constraint keeps it off
    assert where(run(gang(1, 8), objs)) == {"j-0": "a-bare-0"}
    assert where(run(gang(1, 8, [spread(RACK)]), objs))["j-0"] != "a-bare-0"
    only_bare = [node("a-bare-0", labels={HOST: "a-bare-0"})]
    assert "no node it may use has the labels its topologySpreadConstraints need " \
        f"({RACK})" in why(run(gang(1, 8, [spread(RACK)]), only_bare))


def test_a_gang_whose_engine_choice_breaks_the_spread_is_placed_member_by_member() -> None:
    # 4 x 8 GPUs: the engine alone takes the first four nodes by name, all in block b0
    assert {n[:2] for n in where(run(gang(4, 8))).values()} == {"b0"}
    p = run(gang(4, 8, [spread(BLOCK)]))
    assert sorted(n[:2] for n in where(p).values()) == ["b0", "b0", "b1", "b1"]
    (place,) = p.places
    assert place.placement.nodes_used == 4


def test_min_domains_counts_missing_domains_as_empty() -> None:
    # 2 racks, minDomains 3: the fewest is 0, so each rack takes at most maxSkew (1) member
    assert len(run(gang(2, 8, [spread(RACK, minDomains=2)])).places) == 1
    p = run(gang(3, 8, [spread(RACK, minDomains=3)]))
    assert "topologySpreadConstraint (topologyKey example.com/rack, maxSkew 1) would make a " \
        "skew of 2 there" in why(p)
    assert len(run(gang(2, 8, [spread(RACK, minDomains=3)])).places) == 1


def test_node_affinity_policy_decides_which_domains_count() -> None:
    only_b0 = {"nodeSelector": {BLOCK: "b0"}}
    # Honor: block b1 is no domain of a pod that may not go there, so b0 takes all four
    assert len(run(gang(4, 8, [spread(BLOCK)], more=only_b0)).places) == 1
    # Ignore: b1 is a domain with no pod, so b0 may hold one member more than it (1)
    p = run(gang(4, 8, [spread(BLOCK, nodeAffinityPolicy="Ignore")], more=only_b0))
    assert "would make a skew of 2 there" in why(p)


def test_a_gang_required_in_one_domain_waits_rather_than_break_the_spread() -> None:
    rack = json.dumps({"v": 1, "mode": "preferred",
                       "network": {"level": RACK, "mode": "required"}})
    p = run(gang(2, 8, [spread(BLOCK)], topology=rack),
            [*nodes(), node("spare", labels={HOST: "spare", BLOCK: "b9", RACK: "r9"})])
    # (rack r0 of both blocks fits it whole; a block of its own, b9, is empty)
    assert "topologySpreadConstraint (topologyKey example.com/block, maxSkew 1)" in why(p)


def test_violation_finds_an_order_that_keeps_every_constraint() -> None:
    objs = {n["metadata"]["name"]: parse_node(n) for n in nodes()}
    members = [parse_pod(p) for p in gang(3, 1, [spread(HOST)])]
    nb = Neighbours((), (), objs)
    apart = [(m, f"b0-r{i % 2}-n{i // 2}") for i, m in enumerate(members)]
    assert violation(apart, nb) is None
    two = [(m, "b0-r0-n0" if i < 2 else "b0-r0-n1") for i, m in enumerate(members)]
    assert "would make a skew of 2 there" in (violation(two, nb) or "")
    # with maxSkew 2 the same placement keeps it, in some order
    loose = [parse_pod(p) for p in gang(3, 1, [spread(HOST, 2)])]
    assert violation([(m, n) for m, (_, n) in zip(loose, two, strict=True)], nb) is None


def test_the_gangs_after_one_placed_member_by_member_see_what_it_took_and_no_more() -> None:
    def named(name: str, n: int, gpus: int, constraints: list[dict[str, Any]] | None = None
              ) -> list[dict[str, Any]]:
        spec = {"topologySpreadConstraints": constraints} if constraints else {}
        return [pod(f"{name}-{i}", gang=name, min_member=n, gpus=gpus, labels={"job": "j"},
                    extra_spec=spec, topology=SPANS) for i in range(n)]

    # a: one GPU on each of the 8 nodes, placed member by member; b then takes the other 7
    p = run([*named("a", 8, 1, [spread(HOST)]), *named("b", 8, 7)])
    assert len(p.places) == 2
    taken = [(a.node, i) for place in p.places for _, a in place.assignments
             for c in a.containers.values() for i in c.indices]
    assert len(taken) == 64 == len(set(taken))
    # a 9th member cannot be placed with minDomains 9 on 8 nodes: the gang waits, and b still
    # finds a whole node (what a took on the way was given back to the round's node groups,
    # which the engine's single-node search reads)
    p = run([*named("a", 9, 1, [spread(HOST, minDomains=9)]), *named("b", 1, 8)])
    assert [w.gang.name for w in p.waits] == ["a"]
    assert "one member at a time" in p.waits[0].reason
    assert where(p) == {"b-0": "b0-r0-n0"}


def test_members_placed_one_at_a_time_stay_close_when_the_gang_asks_for_a_network_level() -> None:
    # a node of block b1 with one GPU free draws the first member (best fit); the others follow
    # it into its rack while the rack allows, then into its block
    busy = pod("busy", gpus=7, node_name="b1-r1-n1", topology=None, labels={"app": "x"},
               scheduler="default-scheduler")
    objs = {n["metadata"]["name"]: parse_node(n) for n in nodes()}
    block = json.dumps({"v": 1, "mode": "preferred",
                        "network": {"level": BLOCK, "mode": "preferred"}})
    levels = PlanConfig(scheduler_name=keys.DEFAULT_BINDER_SCHEDULER_NAME,
                        levels=Levels((BLOCK, RACK), (("block", BLOCK),)))

    def placed_in(topology: str) -> list[str]:
        p = plan([parse_pod(x) for x in (busy, *gang(4, 1, [spread(HOST)], topology=topology))],
                 objs, None, config=levels, queue=GangQueue(), fit=FitCache(),
                 place=place_gang, now=1795237200.0)
        return sorted(where(p).values())

    assert placed_in(block) == ["b1-r0-n0", "b1-r0-n1", "b1-r1-n0", "b1-r1-n1"]
    # the level named by its alias, or by its tier (Volcano's: tier 2 of block > rack), is the
    # same level here too
    for name in ("block", "tier:2"):
        assert placed_in(block.replace(BLOCK, name)) == placed_in(block), name
    # without a network level the members go where each is best alone: by name, once b1-r1-n1
    # is full
    assert placed_in(SPANS) == ["b0-r0-n0", "b0-r0-n1", "b0-r1-n0", "b1-r1-n1"]
