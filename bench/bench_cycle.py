"""The binder's first planning cycle on a large cluster, in process: `planner.plan_gangs` with the
placement function the controller gives it, for gangs queued at once on DGX-1 V100 nodes that
each publish their own GPU UUIDs (their own Topology objects), as bench/bench_binder.py makes
them (4 x 1-GPU workers and a 0-GPU launcher, single node required).

Run: .venv/bin/python bench/bench_cycle.py [--nodes 16384] [--gangs 200] [--profile 50]

Two cycles on the same states: the engine given the round's node groups (`NodeGroups`, as the
binder runs) and the engine scanning every node (the groups withheld, as before them). Both
must place every gang, on the same nodes and GPUs (the digest); the target is the first
under 3 s at 16,384 nodes.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import functools
import hashlib
import pstats
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_binder import gang_pods, node
from webhook import keys
from webhook.binder.fit import FitCache
from webhook.binder.nodes import NodeInfo, parse_node
from webhook.binder.planner import PlaceFn, Plan, PlanConfig, plan_gangs
from webhook.binder.pods import parse_pod
from webhook.binder.queue import GangQueue
from webhook.binder.snapshot import Snapshot
from webhook.topology import builtin
from webhook.topology.codec import encode
from webhook.topology.gpu_choice import TableCache
from webhook.topology.groups import NodeGroups
from webhook.topology.hierarchy import place_gang
from webhook.topology.model import GangPlacement, GangRequest, NodeState, Unplaceable
from webhook.topology.network import Network

TARGET_S = 3.0


def cluster(count: int) -> dict[str, NodeInfo]:
    t = builtin("dgx1-v100")
    out = {}
    for n in range(count):
        own = dataclasses.replace(t, gpus=tuple(
            dataclasses.replace(g, uuid=f"GPU-{n:05d}-{g.index}") for g in t.gpus))
        info = parse_node(node(f"dgx-{n:05d}", encode(own)))
        out[info.name] = info
    return out


def queued(gangs: int) -> Snapshot:
    snap = Snapshot(keys.DEFAULT_BINDER_SCHEDULER_NAME)
    for g in range(gangs):
        for p in gang_pods(g):
            p["metadata"].update(uid=str(uuid.uuid4()), resourceVersion="1",
                                 creationTimestamp="2026-11-21T05:00:00Z")
            p["status"] = {"phase": "Pending"}
            snap.put(parse_pod(p))
    return snap


def digest(plan: Plan) -> str:
    """Every placed member's node and GPUs, gang by gang."""
    h = hashlib.sha256()
    for p in plan.places:
        for m in p.placement.members:
            h.update(f"{p.gang.key}/{m.key}@{m.node}:{m.gpus};".encode())
    return h.hexdigest()[:16]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=16384)
    ap.add_argument("--gangs", type=int, default=200)
    ap.add_argument("--profile", type=int, metavar="GANGS",
                    help="profile one grouped cycle of this many gangs instead")
    args = ap.parse_args()
    nodes = cluster(args.nodes)
    tables = TableCache()
    for info in nodes.values():
        if info.topology is not None:
            tables.tables(info.topology)
    grouped: PlaceFn = functools.partial(place_gang, tables=tables)  # as webhook.binder.controller

    # PlaceFn's parameter names: a caller may pass them by keyword
    def scanning(nodes: Sequence[NodeState], gang: GangRequest, *, network: Network | None,
                 groups: NodeGroups | None = None) -> GangPlacement | Unplaceable:
        return place_gang(nodes, gang, network=network, tables=tables)

    config = PlanConfig(keys.DEFAULT_BINDER_SCHEDULER_NAME)
    snap = queued(args.profile or args.gangs)

    def cycle(place: PlaceFn) -> tuple[Plan, float, float]:
        """The binder's first cycle, its gangs, node states and eligible sets made afresh: the
        plan, its seconds, and those of `plan_gangs` alone."""
        t0 = time.perf_counter()
        gangs = snap.open_gangs({}, config.podgroup_default_timeout)
        states = snap.node_states(nodes)
        t1 = time.perf_counter()
        plan = plan_gangs(gangs, snap.allocation, states, nodes, config=config,
                          queue=GangQueue(), fit=FitCache(), place=place,
                          now=1e9, neighbours=snap.neighbours(nodes))
        t2 = time.perf_counter()
        return plan, t2 - t0, t2 - t1

    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(cycle, grouped)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        return 0
    ok = True
    runs = {}
    for name, place in (("groups", grouped), ("scan", scanning)):
        plan, seconds, planning = cycle(place)
        runs[name] = digest(plan)
        ok &= len(plan.places) == args.gangs
        if name == "groups":
            ok &= planning < TARGET_S
        print(f"{args.nodes} nodes, {args.gangs} gangs, engine with {name:6}: cycle "
              f"{seconds:7.2f} s, plan_gangs {planning:7.2f} s  placed {len(plan.places)}  "
              f"digest {runs[name]}")
    same = runs["groups"] == runs["scan"]
    ok &= same
    print(f"placements {'identical' if same else 'DIFFER'}; target: plan_gangs with groups < "
          f"{TARGET_S:g} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
