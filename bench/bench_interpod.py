"""What required inter-pod affinity and topology spread cost one binder planning cycle on a
large cluster.

Run: .venv/bin/python bench/bench_interpod.py [--nodes 4096] [--reps 50]

A fat tree of DGX-1 V100 nodes at about 60 % occupancy, as bench/bench_topology.py's latency
rows, every node in one zone; 4,000 pods already on nodes, 200 of them databases (`app=db`)
whose podAntiAffinity keeps training pods (`app=train`, every namespace) off their node. One
pending gang of 1 / 16 / 64 / 256 whole-node workers that prefers one leaf, planned two ways
in the same run (`planner.plan_gangs`, with the placement function, FitCache and the
snapshot's `Neighbours` the controller gives it):
- baseline: no term anywhere (the databases carry none), so the cycle reads no other pod;
- terms: the databases' anti-affinity, and the workers' affinity to each other by zone.
Printed: p50 / p99 wall ms of each, their ratio, and how many workers each put on a database's
node. The run fails when a gang is not placed whole, or when, with the terms, a worker lands on
a database's node.

Then topology spread: a gang of 1 / 16 / 64 whole-node workers without a network level, planned
without a constraint (baseline) and with a DoNotSchedule one by leaf (maxSkew 1, the job's own
pods), which the engine's packing breaks, so that its members are placed one at a time. Printed
likewise, with the leaves each used; the run fails when the spread gang does not use a leaf per
worker.

Then preferred node affinity: a quarter of the nodes, at random, labelled `example.com/pool:
on-demand`; a gang of 1 / 16 / 64 whole-node workers that prefers one leaf, planned without a
preference (baseline) and with preferred node affinity for that pool (weight 50), which the
binder weighs after the network (`webhook.binder.prefer`: the engine asked again on the
preferred nodes). Printed likewise, with how many workers each put on the pool's nodes; the run
fails when the preference puts fewer there than the baseline, or the lone worker off them.
And the same with the workers kept one per leaf (DoNotSchedule spread), so that they are placed
one at a time, each by its preference, in both variants.
"""

from __future__ import annotations

import argparse
import functools
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_topology import gang_pods, next_cycle, occupied, pct
from bench.topology_sim import fat_tree
from webhook import keys
from webhook.binder.allocation import Allocation
from webhook.binder.fit import FitCache
from webhook.binder.gangs import assemble
from webhook.binder.heap import HeapFreezer
from webhook.binder.interpod import Neighbours
from webhook.binder.nodes import NodeInfo
from webhook.binder.planner import PlaceFn, Plan, PlanConfig, plan_gangs
from webhook.binder.pods import (
    PodInfo,
    Preferences,
    Requirement,
    SpreadTerm,
    Term,
    parse_pod,
)
from webhook.binder.queue import GangQueue
from webhook.topology.gpu_choice import TableCache
from webhook.topology.groups import NodeGroups
from webhook.topology.hierarchy import place_gang
from webhook.topology.model import NodeState
from webhook.topology.network import Levels

ZONE = "topology.kubernetes.io/zone"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
#: the databases keep training pods of every namespace off their node
KEEP_OFF = {"podAntiAffinity": {REQUIRED: [
    {"labelSelector": {"matchLabels": {"app": "train"}}, "namespaceSelector": {},
     "topologyKey": "kubernetes.io/hostname"}]}}
#: the workers share a zone
TOGETHER = {"podAffinity": {REQUIRED: [
    {"labelSelector": {"matchLabels": {"job": "big"}}, "topologyKey": ZONE}]}}


def placed_pods(names: list[str], count: int, dbs: int, rng: random.Random, terms: bool
                ) -> list[PodInfo]:
    """`count` CPU pods on random nodes; the first `dbs` are databases."""
    out = []
    for i in range(count):
        db = i < dbs
        spec: dict[str, Any] = {
            "nodeName": rng.choice(names),
            "containers": [{"name": "c", "image": "x:1",
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
        if db and terms:
            spec["affinity"] = KEEP_OFF
        out.append(parse_pod({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{'db' if db else 'web'}-{i}", "namespace": "svc",
                         "uid": f"s{i}", "resourceVersion": "1",
                         "labels": {"app": "db" if db else "web"}},
            "spec": spec, "status": {"phase": "Running"}}))
    return out


def main() -> int:
    with HeapFreezer() as freezer:  # as the binder's service, between cycles (next_cycle)
        return measure(freezer)


def measure(freezer: HeapFreezer) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    spec = fat_tree(args.nodes)
    nodes, states = occupied(spec, args.seed, {ZONE: "z1"})
    config = PlanConfig(keys.DEFAULT_BINDER_SCHEDULER_NAME, levels=Levels(spec.levels))
    tables = TableCache()
    place = functools.partial(place_gang, tables=tables)
    fit = FitCache()
    placed = {terms: placed_pods(list(nodes), 4000, 200, random.Random(args.seed), terms)
              for terms in (False, True)}
    db_nodes = {p.node_name or "" for p in placed[True][:200]}
    print(f"== inter-pod affinity: one binder planning cycle at {args.nodes} nodes, "
          f"4,000 pods placed (200 databases), ms")
    for size in (1, 16, 64, 256):
        row = {}
        beside = {}
        for terms in (False, True):
            pods = gang_pods(size, spec.leaf_label, labels={"app": "train", "job": "big"},
                             affinity=TOGETHER if terms else None)
            gangs = assemble(pods, config.scheduler_name, None)
            holders = [p for p in placed[terms] if p.pod_affinity is not None]
            groups = NodeGroups()  # kept across cycles, as the controller keeps them
            times = []
            used: set[str] = set()
            gc.collect()
            gc.freeze()  # the cluster's objects, made once, are no garbage to scan each cycle
            fresh = dict(states)
            for _ in range(args.reps + 1):
                # as the controller gives it: the FitCache's label index, the pods read anew
                nb = Neighbours(placed[terms], holders, nodes, fit.labels(nodes))
                t0 = time.perf_counter()
                plan = plan_gangs(gangs, Allocation({}), fresh, nodes,
                                  config=config, queue=GangQueue(), fit=fit, place=place,
                                  now=1e9, neighbours=nb, groups=groups)
                times.append((time.perf_counter() - t0) * 1e3)
                fresh = next_cycle(states, fresh, groups, tables, freezer)
                if len(plan.places) != 1 or len(plan.places[0].assignments) != size:
                    print(f"  {size} pods, terms={terms}: not placed whole: "
                          f"{[w.reason for w in plan.waits]}")
                    return 1
                used = {a.node for _, a in plan.places[0].assignments}
            gc.unfreeze()
            times = times[1:]  # the first builds the FitCache's network: once
            if terms and used & db_nodes:
                print(f"  {size} pods: a worker on a database's node: {sorted(used & db_nodes)}")
                return 1
            row[terms] = (statistics.median(times), pct(times, 99))
            beside[terms] = len(used & db_nodes)
        (b50, b99), (t50, t99) = row[False], row[True]
        print(f"  {size:3} pods x 8 GPUs: baseline p50 {b50:6.2f} p99 {b99:6.2f}  "
              f"terms p50 {t50:6.2f} p99 {t99:6.2f}  ratio p50 {t50 / b50:.2f} "
              f"p99 {t99 / b99:.2f}  workers on a database's node {beside[False]} / "
              f"{beside[True]}")
    cluster = _Cluster(nodes, states, config, place, fit, tables, freezer)
    return spread_rows(args.reps, spec.leaf_label, cluster) or \
        preferred_rows(args.reps, args.seed, spec.leaf_label, cluster) or \
        preferred_rows(args.reps, args.seed, spec.leaf_label, cluster, apart=True)


def _cycles(pods: list[PodInfo], nodes: Mapping[str, NodeInfo], states: dict[str, NodeState],
            reps: int, *, config: PlanConfig, place: PlaceFn, fit: FitCache,
            tables: TableCache, freezer: HeapFreezer) -> tuple[list[float], Plan] | str:
    """The gang's planning cycle `reps` times, as the binder runs it (no pod placed before it
    but the cluster's occupancy): the wall ms of each but the first (which groups the nodes and
    builds the FitCache's network, once) and the last plan; or why it was not placed whole."""
    gangs = assemble(pods, config.scheduler_name, None)
    groups = NodeGroups()  # kept across cycles, as the controller keeps them
    times = []
    gc.collect()
    gc.freeze()  # the cluster's objects, made once, are no garbage to scan each cycle
    fresh = dict(states)
    try:
        for _ in range(reps + 1):
            nb = Neighbours((), (), nodes, fit.labels(nodes))
            t0 = time.perf_counter()
            plan = plan_gangs(gangs, Allocation({}), fresh, nodes, config=config,
                              queue=GangQueue(), fit=fit, place=place, now=1e9,
                              neighbours=nb, groups=groups)
            times.append((time.perf_counter() - t0) * 1e3)
            fresh = next_cycle(states, fresh, groups, tables, freezer)
            if len(plan.places) != 1 or len(plan.places[0].assignments) != len(pods):
                return f"not placed whole: {[w.reason for w in plan.waits]}"
    finally:
        gc.unfreeze()
    return times[1:], plan


@dataclass(frozen=True, slots=True)
class _Cluster:
    """What every cycle of a row reads: the nodes, their states, and the binder's parts."""

    nodes: Mapping[str, NodeInfo]
    states: dict[str, NodeState]
    config: PlanConfig
    place: PlaceFn
    fit: FitCache
    tables: TableCache
    freezer: HeapFreezer


def _pair(c: _Cluster, reps: int, pods_of: Callable[[bool], list[PodInfo]],
          counted: Callable[[Plan], int]) -> tuple[dict[bool, tuple[float, float]],
                                                  dict[bool, int]] | str:
    """The gang without (False) and with (True) what a row measures: p50 and p99 ms of each,
    and what `counted` reads of its last plan; or why one was not placed whole."""
    row, count = {}, {}
    for variant in (False, True):
        timed = _cycles(pods_of(variant), c.nodes, c.states, reps, config=c.config,
                        place=c.place, fit=c.fit, tables=c.tables, freezer=c.freezer)
        if isinstance(timed, str):
            return f"{variant}: {timed}"
        times, plan = timed
        row[variant] = (statistics.median(times), pct(times, 99))
        count[variant] = counted(plan)
    return row, count


def _line(size: int, name: str, row: dict[bool, tuple[float, float]], what: str,
          count: dict[bool, int]) -> str:
    (b50, b99), (t50, t99) = row[False], row[True]
    return (f"  {size:3} pods x 8 GPUs: baseline p50 {b50:6.2f} p99 {b99:6.2f}  "
            f"{name} p50 {t50:6.2f} p99 {t99:6.2f}  ratio p50 {t50 / b50:.2f} "
            f"p99 {t99 / b99:.2f}  {what} {count[False]} / {count[True]}")


def spread_rows(reps: int, leaf: str, c: _Cluster) -> int:
    print(f"== topology spread (DoNotSchedule by {leaf}, maxSkew 1): one planning cycle, ms")
    term = SpreadTerm(1, leaf, (("In", "job", frozenset({"big"})),))
    for size in (1, 16, 64):
        def pods_of(spread: bool, size: int = size) -> list[PodInfo]:
            pods = gang_pods(size, None, labels={"job": "big"})
            return [replace(p, spread=(term,)) for p in pods] if spread else pods

        def leaves(plan: Plan) -> int:
            return len({c.nodes[a.node].labels[leaf] for _, a in plan.places[0].assignments})
        got = _pair(c, reps, pods_of, leaves)
        if isinstance(got, str):
            print(f"  {size} pods, spread={got}")
            return 1
        row, used = got
        if used[True] != size:
            print(f"  {size} pods: spread over {used[True]} leaves, not one each")
            return 1
        print(_line(size, "spread", row, "leaves used", used))
    return 0


POOL = "example.com/pool"


def preferred_rows(reps: int, seed: int, leaf: str, c: _Cluster, apart: bool = False) -> int:
    """`apart`: the workers kept one per leaf (DoNotSchedule spread), so placed one at a time,
    in both variants."""
    pool = set(random.Random(seed).sample(sorted(c.nodes), len(c.nodes) // 4))
    pooled = {n: replace(info, labels={**info.labels, POOL: "on-demand"}) if n in pool
              else info for n, info in c.nodes.items()}
    c = replace(c, nodes=pooled, fit=FitCache())
    prefs = Preferences(nodes=((50, Term((Requirement(POOL, "In", ("on-demand",)),))),))
    term = SpreadTerm(1, leaf, (("In", "job", frozenset({"big"})),))
    print(f"== preferred node affinity (a quarter of the nodes, weight 50)"
          f"{', the workers one per leaf' if apart else ''}: one planning cycle, ms")
    for size in (1, 16, 64):
        def pods_of(prefer: bool, size: int = size) -> list[PodInfo]:
            pods = gang_pods(size, None, labels={"job": "big"}) if apart else \
                gang_pods(size, leaf)
            return [replace(p, preferences=prefs if prefer else None,
                            spread=(term,) if apart else ()) for p in pods]

        def on_pool(plan: Plan) -> int:
            return sum(a.node in pool for _, a in plan.places[0].assignments)
        got = _pair(c, reps, pods_of, on_pool)
        if isinstance(got, str):
            print(f"  {size} pods, prefer={got}")
            return 1
        row, placed = got
        if placed[True] < placed[False] or (size == 1 and placed[True] != 1):
            print(f"  {size} pods: {placed[True]} on the preferred nodes, "
                  f"{placed[False]} without the preference")
            return 1
        print(_line(size, "preferred", row, "workers on the preferred nodes", placed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
