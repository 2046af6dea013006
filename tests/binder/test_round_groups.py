"""A planning round hands the engine its node groups (webhook.topology.groups), one object kept
current across the round's placements, and plans exactly what it plans without them; the
controller keeps that object across cycles, and plans what groups made each cycle plan."""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from typing import Any

from binder_objects import job, node, pod

from webhook import keys
from webhook.binder.allocation import Allocation
from webhook.binder.assignment import build_assignment, encode_assignment
from webhook.binder.fit import FitCache
from webhook.binder.gangs import assemble
from webhook.binder.nodes import parse_node
from webhook.binder.planner import Plan, PlanConfig, plan, plan_gangs
from webhook.binder.pods import parse_pod
from webhook.binder.queue import GangQueue
from webhook.topology.builtin import builtin
from webhook.topology.gpu_choice import TableCache
from webhook.topology.groups import NodeGroups
from webhook.topology.hierarchy import place_gang
from webhook.topology.model import GangPlacement, GangRequest, NodeState, Unplaceable
from webhook.topology.network import Network

CFG = PlanConfig(scheduler_name=keys.DEFAULT_BINDER_SCHEDULER_NAME)


def _objects(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes of a few kinds and sizes, some running a pod, and jobs of a few shapes."""
    nodes, pods = [], []
    for i in rng.sample(range(40), 16):
        kind = rng.choice(["dgx1-v100", "dgx1-v100", "pcie8-dual-socket", None])
        nodes.append(node(f"n{i:02d}", kind=kind, cpu=rng.choice(["8", "64"])))
        if kind is not None and rng.random() < 0.5:
            taken = tuple(sorted(rng.sample(range(8), rng.choice([1, 3, 4]))))
            a = build_assignment(f"n{i:02d}", builtin(kind), taken, [("main", len(taken))])
            pods.append(pod(f"busy-{i}", gpus=len(taken), node_name=f"n{i:02d}",
                            assignment=encode_assignment(a), phase="Running"))
    for j in range(30):
        pods += job(f"j{j:02d}", workers=rng.choice([1, 2, 4]), gpus=rng.choice([1, 2]),
                    cpu=rng.choice(["1", "4", "30"]), created=f"2026-11-21T05:{j:02d}:00Z")
    return nodes, pods


def test_a_round_places_with_its_groups_as_without_them() -> None:
    tables = TableCache()
    grouped = functools.partial(place_gang, tables=tables)
    handed: list[NodeGroups | None] = []

    def scanning(nodes: Sequence[NodeState], gang: GangRequest, *, network: Network | None,
                 groups: NodeGroups | None = None) -> GangPlacement | Unplaceable:
        handed.append(groups)
        return place_gang(nodes, gang, network=network, tables=tables)

    def run(pods: list[dict[str, Any]], nodes: list[dict[str, Any]], place: Any) -> Plan:
        return plan([parse_pod(p) for p in pods],
                    {n["metadata"]["name"]: parse_node(n) for n in nodes}, None, config=CFG,
                    queue=GangQueue(), fit=FitCache(), place=place, now=1795237200.0)

    placed = 0
    for seed in range(20):
        nodes, pods = _objects(random.Random(seed))
        handed.clear()
        with_groups, without = run(pods, nodes, grouped), run(pods, nodes, scanning)
        assert [(p.gang.key, p.placement) for p in with_groups.places] == \
            [(p.gang.key, p.placement) for p in without.places], seed
        assert [(w.gang.key, w.reason) for w in with_groups.waits] == \
            [(w.gang.key, w.reason) for w in without.waits], seed
        assert handed and handed[0] is not None and all(g is handed[0] for g in handed)
        placed += len(with_groups.places)
    assert placed >= 100  # most rounds place many gangs, one after another


def test_groups_kept_across_cycles_plan_as_groups_made_each_cycle() -> None:
    """Cycle after cycle on the states the cycles before consumed (unchanged nodes keep their
    objects, as the snapshot's do; some nodes freed meanwhile), one NodeGroups kept throughout
    (as the controller keeps it) plans what a fresh one each cycle plans."""
    tables = TableCache()
    place = functools.partial(place_gang, tables=tables)
    placed = 0
    for seed in range(10):
        rng = random.Random(seed)
        nodes, busy = _objects(rng)
        infos = {n["metadata"]["name"]: parse_node(n) for n in nodes}
        allocation = Allocation.from_pods([parse_pod(p) for p in busy if p["spec"].get(
            "nodeName")])
        kept_states = {name: allocation.node_state(n) for name, n in infos.items()}
        fresh_states = dict(kept_states)
        kept, fit = NodeGroups(), FitCache()
        for cycle in range(8):
            pods = [p for j in range(rng.randint(1, 4)) for p in job(
                f"c{cycle}j{j}", workers=rng.choice([1, 2, 4]), gpus=rng.choice([1, 2, 8]),
                cpu=rng.choice(["1", "30"]))]
            gangs = assemble([parse_pod(p) for p in pods], CFG.scheduler_name, None)
            plans = [plan_gangs(gangs, allocation, states, infos, config=CFG, queue=GangQueue(),
                                fit=fit, place=place, now=1795237200.0, groups=groups)
                     for states, groups in ((kept_states, kept), (fresh_states, None))]
            assert [(p.gang.key, p.placement) for p in plans[0].places] == \
                [(p.gang.key, p.placement) for p in plans[1].places], (seed, cycle)
            assert [(w.gang.key, w.reason) for w in plans[0].waits] == \
                [(w.gang.key, w.reason) for w in plans[1].waits], (seed, cycle)
            assert kept_states == fresh_states
            placed += len(plans[0].places)
            for name in rng.sample(sorted(infos), 3):  # pods there finished: freed anew
                kept_states[name] = fresh_states[name] = allocation.node_state(infos[name])
    assert placed >= 100
