"""Gangs on a network topology: Muster against Kueue TAS, KAI and kube-scheduler, side by side in
one trace-driven run; each Muster placement against the exact optimum; placement latency.

The verdict (issue 57), per cluster, on each metric's mean over 8 seeds (`--seeds`): Muster at
least as good as the best baseline on locality (within %, spanned mean and p95), utilisation,
delay (mean, p95), job completion time (mean, p95) and step time (mean, p95); fragmentation at
most that of the gang-aware baselines (Kueue TAS, KAI), kube MostAllocated's printed beside it
(it strands fewer only by splitting small gangs over nodes and slowing them). The optimum
comparison is reported, not judged.

Run: .venv/bin/python bench/bench_topology.py [--quick] [--only sim|optimum|latency]

Clusters, arrivals and placements: bench/topology_sim.py (sources in docs/topology.md, "Bench").
Every placement runs on the same arrivals; a job's run time is its work stretched by its modelled
step time over its ideal one, so a slower placement holds its GPUs longer. The queue is FIFO with
backfill (the first 32 waiting gangs that could fit by count are tried at each event).

Metrics per placement: share of gangs within one domain of the narrowest level that could hold
them on the empty cluster (node, leaf/clique, block); domains of that level spanned (mean, p95);
GPU utilisation (GPU-minutes of work done, at the job's ideal speed, over the GPU-minutes of the
arrival window: a GPU held by a slowed job counts for what it gets done); queueing delay (mean,
p95, minutes); job completion time (finish - submit: the delay plus the run time its
placement's step time gives it; mean, p95, minutes); fragmentation (free GPUs on nodes that
cannot host a whole-node pod, share of free GPUs, mean over arrivals); modelled step time over
the job's ideal (mean, p95). The run fails when a placement placed no gang or a metric is
empty.
"""

from __future__ import annotations

import argparse
import functools
import gc
import heapq
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import results
from bench.topology_sim import (
    Cluster,
    ClusterSpec,
    Job,
    Placement,
    Placer,
    arrivals,
    domains_spanned,
    fat_tree,
    ideal_step,
    kai,
    kube,
    kueue_tas,
    muster,
    narrowest_level,
    nvl72,
    step,
    unusable_share,
)
from webhook import keys
from webhook.binder.allocation import Allocation
from webhook.binder.fit import FitCache
from webhook.binder.gangs import assemble
from webhook.binder.heap import HeapFreezer
from webhook.binder.interpod import Neighbours
from webhook.binder.nodes import NodeInfo, parse_node
from webhook.binder.planner import PlanConfig, plan_gangs
from webhook.binder.pods import PodInfo, parse_pod
from webhook.binder.queue import GangQueue
from webhook.topology import codec
from webhook.topology.gpu_choice import TableCache
from webhook.topology.groups import NodeGroups
from webhook.topology.hierarchy import place_gang
from webhook.topology.model import NodeState
from webhook.topology.network import Levels

WINDOW = 32


def pct(values: Sequence[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


@dataclass
class Result:
    name: str
    placed: int = 0
    within: list[bool] = field(default_factory=list)
    delay: list[float] = field(default_factory=list)
    jct: list[float] = field(default_factory=list)  # finish - submit, minutes
    frag: list[float] = field(default_factory=list)
    slowdown: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    call_ms: list[float] = field(default_factory=list)
    busy: float = 0.0  # GPU-minutes of work at ideal speed within the arrival window
    span: float = 0.0
    gpus: int = 0
    #: per job id: (step, ideal) for the optimum comparison
    steps: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: per job id, in the order placed: the domains it spanned at its narrowest level
    spans: dict[int, int] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        if not self.placed or not self.jct or not self.frag or not self.slowdown:
            raise SystemExit(f"{self.name}: no gang placed or a metric is empty: the run is void")
        return {
            "within %": 100 * sum(self.within) / len(self.within),
            "spanned mean": statistics.fmean(self.spans.values()),
            "spanned p95": pct(list(self.spans.values()), 95),
            "util %": 100 * self.busy / (self.span * self.gpus),
            "delay mean": statistics.fmean(self.delay),
            "delay p95": pct(self.delay, 95),
            "JCT mean": statistics.fmean(self.jct),
            "JCT p95": pct(self.jct, 95),
            "frag %": 100 * statistics.fmean(self.frag),
            "step x mean": statistics.fmean(self.slowdown),
            "step x p95": pct(self.slowdown, 95),
        }


#: metric -> True when higher is better
BETTER_HIGH = {"within %": True, "spanned mean": False, "spanned p95": False, "util %": True,
               "delay mean": False, "delay p95": False, "JCT mean": False, "JCT p95": False,
               "frag %": False, "step x mean": False, "step x p95": False}
#: the baselines Muster's fragmentation is judged against (issue 57): the gang-aware ones.
#: MostAllocated strands fewer only by splitting small gangs over nodes and slowing them, so
#: its figure is printed beside the verdict, not judged against
GANG_AWARE = ("Kueue TAS BestFit", "KAI topology")


def run(spec: ClusterSpec, jobs: list[Job], name: str, placer: Placer, *, tables: TableCache,
        ideal: dict[int, float],
        on_place: Callable[[Cluster, Job], None] | None = None) -> Result:
    c = Cluster(spec)
    r = Result(name, gpus=spec.nodes * spec.gpus_per_node)
    end_window = jobs[-1].arrival
    r.span = end_window
    events: list[tuple[float, int, int]] = [(j.arrival, 1, j.id) for j in jobs]
    heapq.heapify(events)
    by_id = {j.id: j for j in jobs}
    queue: list[Job] = []
    running: dict[int, Placement] = {}
    busy = 0.0  # GPUs held, each weighted by its job's ideal step over its step
    free_total = r.gpus
    last = 0.0
    while events:
        t, kind, jid = heapq.heappop(events)
        if last < end_window:
            r.busy += busy * (min(t, end_window) - last)
        last = t
        if kind == 0:
            for i, g in running.pop(jid):
                c.give(i, g)
            busy -= by_id[jid].gpus * r.steps[jid][1] / r.steps[jid][0]
            free_total += by_id[jid].gpus
        else:
            queue.append(by_id[jid])
            r.frag.append(unusable_share(c))
        tried = 0
        for job in list(queue):
            if tried >= WINDOW:
                break
            if job.gpus > free_total:
                continue
            tried += 1
            t0 = time.perf_counter()
            p = placer(c, job)
            r.call_ms.append((time.perf_counter() - t0) * 1e3)
            if p is None:
                continue
            if sum(len(g) for _, g in p) != job.gpus:
                raise SystemExit(f"{name} placed job {job.id} on {p}: not {job.gpus} GPUs")
            if on_place is not None:
                on_place(c, job)  # before the take: it sees what was free
            for i, g in p:
                c.take(i, g)
            queue.remove(job)
            running[job.id] = p
            free_total -= job.gpus
            s = step(c, p, tables)
            busy += job.gpus * ideal[job.id] / s
            level = narrowest_level(spec, job)
            spanned = domains_spanned(c, p, level)
            r.placed += 1
            r.within.append(spanned == 1)
            r.spans[job.id] = spanned
            r.delay.append(t - job.arrival)
            r.jct.append(t - job.arrival + job.work * s / ideal[job.id])
            r.slowdown.append(s / ideal[job.id])
            r.step_ms.append(s * 1e3)
            r.steps[job.id] = (s, ideal[job.id])
            heapq.heappush(events, (t + job.work * s / ideal[job.id], 0, job.id))
    return r


def placers(seed: int, tables: TableCache) -> dict[str, Placer]:
    return {
        "Muster": muster(tables),
        "Kueue TAS BestFit": kueue_tas,
        "KAI topology": kai,
        "kube LeastAllocated": kube(False, random.Random(seed)),
        "kube MostAllocated": kube(True, random.Random(seed)),
    }


Metrics = dict[str, dict[str, float]]  # placement -> metric -> value


def slowed(r: Result, jobs: Sequence[Job]) -> str:
    """Per gang shape (pods x GPUs each): jobs over their ideal step / jobs placed, and the
    sum over them of step x - 1 (what each shape adds to the step mean times the jobs)."""
    shapes: dict[tuple[int, int], list[float]] = {}
    for j in jobs:
        if j.id in r.steps:
            s, i = r.steps[j.id]
            shapes.setdefault((j.pods, j.pod_gpus), []).append(s / i - 1)
    return ", ".join(f"{p}x{g} {sum(x > 1e-4 for x in xs)}/{len(xs)} +{sum(xs):.2f}"
                     for (p, g), xs in sorted(shapes.items(), key=lambda e: (e[0][0] * e[0][1],
                                                                            e[0][1]))
                     if sum(xs) > 1e-4)


def workload(spec: ClusterSpec, count: int, load: float, seed: int
             ) -> tuple[TableCache, list[Job], dict[int, float]]:
    """The run's choice tables, the seed's arrivals, and each job's ideal step."""
    tables = TableCache()
    jobs = arrivals(spec, count, load, random.Random(seed))
    return tables, jobs, {j.id: ideal_step(spec, j, tables) for j in jobs}


def compare(spec: ClusterSpec, count: int, load: float, seed: int, *,
            show_slowed: bool = False) -> Metrics:
    """Every placement on the same arrivals: the table, and Muster against the best baseline;
    with `show_slowed`, where each placement's slowed jobs are."""
    tables, jobs, ideal = workload(spec, count, load, seed)
    print(f"\n== {spec.name}: {spec.nodes * spec.gpus_per_node} GPUs, {count} jobs, offered "
          f"load {load:.0%}, seed {seed}")
    results = []
    for name, placer in placers(seed, tables).items():
        r = run(spec, jobs, name, placer, tables=tables, ideal=ideal)
        results.append((r, r.metrics()))
    cols = list(BETTER_HIGH)
    print(f"  {'placement':20}" + "".join(f"{c:>13}" for c in cols) + f"{'placed':>8}"
          f"{'call ms':>9}")
    for r, m in results:
        print(f"  {r.name:20}" + "".join(f"{m[c]:13.3f}" for c in cols) + f"{r.placed:8}"
              f"{statistics.fmean(r.call_ms):9.2f}")
    if show_slowed:
        print("  slowed jobs by shape (pods x GPUs: slowed/placed +summed step x - 1):")
        for r, _ in results:
            print(f"    {r.name}: {slowed(r, jobs) or 'none'}")
    metrics = {r.name: m for r, m in results}
    print("  this seed, Muster against the best baseline per metric (fragmentation: the best "
          "gang-aware one):\n    " + "\n    ".join(
        f"{col}: {'ok' if good else 'WORSE'} ({mine:.3f} vs best {best:.3f})"
        for col, good, mine, best in verdicts(metrics)))
    return metrics


def verdicts(metrics: Metrics) -> list[tuple[str, bool, float, float]]:
    """Per metric: is Muster at least as good as the best baseline (for fragmentation, the best
    gang-aware one, `GANG_AWARE`); its figure; that baseline's."""
    out = []
    for col, high in BETTER_HIGH.items():
        mine = metrics["Muster"][col]
        against = GANG_AWARE if col == "frag %" else [n for n in metrics if n != "Muster"]
        others = [metrics[n][col] for n in against if n in metrics]
        best = max(others) if high else min(others)
        out.append((col, mine >= best - 1e-9 if high else mine <= best + 1e-9, mine, best))
    return out


def across_seeds(name: str, runs: list[Metrics]) -> bool:
    """The verdict (issue 57): each metric's mean over the seeds, Muster against the best
    baseline's mean (fragmentation: the best gang-aware one's, with MostAllocated's beside it),
    and on how many seeds Muster was at least as good as that seed's best."""
    means = {p: {c: statistics.fmean(r[p][c] for r in runs) for c in BETTER_HIGH}
             for p in runs[0]}
    wins = dict.fromkeys(BETTER_HIGH, 0)
    for r in runs:
        for col, good, *_ in verdicts(r):
            wins[col] += good
    print(f"\n== {name}: the verdict, mean over {len(runs)} seeds")
    ok = True
    for col, good, mine, best in verdicts(means):
        against = "best gang-aware baseline" if col == "frag %" else "best baseline"
        beside = (f"; MostAllocated {means['kube MostAllocated'][col]:.3f}"
                  if col == "frag %" and "kube MostAllocated" in means else "")
        print(f"  {col}: {'ok' if good else 'WORSE'} ({mine:.3f} vs {against} {best:.3f}"
              f"{beside}); at least as good on {wins[col]} of {len(runs)} seeds")
        ok &= good
    return ok


def packing(spec: ClusterSpec, count: int, load: float, seed: int) -> bool:
    """Where MostAllocated's low fragmentation comes from: Muster, MostAllocated, and
    MostAllocated keeping each gang of up to one node's GPUs on one node (`kube`'s
    `whole_gangs`), on the same arrivals; fragmentation, step x mean, and how many of those
    gangs each split over nodes and slowed. False when MostAllocated split none of them, or
    the whole-gang run split one (it did not measure what it says)."""
    tables, jobs, ideal = workload(spec, count, load, seed)
    small = {j.id for j in jobs if j.pods > 1 and j.gpus <= spec.gpus_per_node}
    rows = {"Muster": muster(tables),
            "kube MostAllocated": kube(True, random.Random(seed)),
            "kube MostAllocated, gang whole": kube(True, random.Random(seed), whole_gangs=True)}
    print(f"\n== packing, {spec.name}, {count} jobs, offered load {load:.0%}, seed {seed}: "
          f"{len(small)} gangs of several pods within one node's GPUs")
    split: dict[str, int] = {}
    for name, placer in rows.items():
        r = run(spec, jobs, name, placer, tables=tables, ideal=ideal)
        m = r.metrics()
        placed = [jid for jid in small if jid in r.spans]  # (their narrowest level: a node)
        split[name] = sum(r.spans[jid] > 1 for jid in placed)
        slow = sum(r.steps[jid][0] > r.steps[jid][1] * (1 + 1e-4) for jid in placed)
        print(f"  {name:32} frag % {m['frag %']:6.3f}  step x mean {m['step x mean']:6.3f}  "
              f"util % {m['util %']:6.3f}  of those gangs: split over nodes {split[name]}, "
              f"slowed {slow}, of {len(placed)}")
    ok = split["kube MostAllocated"] > 0 and split["kube MostAllocated, gang whole"] == 0
    if not ok:
        print("  the run did not do what it measures: MostAllocated split no gang, or a gang "
              "it kept whole was split")
    return ok


def against_optimum(spec: ClusterSpec, count: int, load: float, seed: int) -> tuple[int, int]:
    """Muster's step time against the exact optimum on the same free GPUs, per gang."""
    from bench.topology_optimum import as_placement, optimum  # noqa: PLC0415 (highspy)

    tables, jobs, ideal = workload(spec, count, load, seed)
    optimal: dict[int, float] = {}

    def before(c: Cluster, job: Job) -> None:
        opt = optimum(c, job, tables)
        if opt is not None:
            optimal[job.id] = step(c, as_placement(c, job, opt, tables), tables)

    r = run(spec, jobs, "Muster", muster(tables), tables=tables, ideal=ideal, on_place=before)
    gaps = []
    for jid, (s, _) in r.steps.items():
        gaps.append((s / optimal[jid] - 1, jid))
    if not gaps:
        raise SystemExit("no gang placed against the optimum: the run is void")
    within = sum(g <= 0.02 for g, _ in gaps)
    print(f"\n== against the optimum (HiGHS MILP), {spec.name}: {len(gaps)} gangs placed; "
          f"{within} ({100 * within / len(gaps):.1f} %) within 2 % of the optimal modelled step; "
          f"worst gap {100 * max(gaps)[0]:.1f} %")
    by_id = {j.id: j for j in jobs}
    for g, jid in sorted(gaps, reverse=True)[:5]:
        if g > 0.02:
            j = by_id[jid]
            print(f"    job {jid}: {j.gpus} GPUs in pods of {j.pod_gpus}: {100 * g:.1f} % slower "
                  "than the optimum")
    return within, len(gaps)


def node_object(name: str, labels: dict[str, str], topology: str, gpus: int = 8
                ) -> dict[str, Any]:
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110", keys.GPU_RESOURCE: str(gpus)}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": "1",
                         "labels": {"kubernetes.io/hostname": name, **labels},
                         "annotations": {keys.ANN_NODE_TOPOLOGY: topology}},
            "spec": {}, "status": {"allocatable": alloc, "capacity": dict(alloc)}}


def gang_pods(pods: int, level: str | None, *, labels: dict[str, str] | None = None,
              affinity: dict[str, Any] | None = None,
              pins: Sequence[str] = ()) -> list[PodInfo]:
    """A gang of `pods` 8-GPU workers whose policy prefers one `level` domain (None: no network
    request), as the webhook annotates them; `labels` and `affinity` on each; worker i with a
    nodeSelector for node `pins[i]`, where given (as Kueue's TAS ungates its pods)."""
    network = {"network": {"level": level, "mode": "preferred"}} if level else {}
    topo = json.dumps({"v": 1, "mode": "preferred", "singleNode": False, "minRingGBps": None,
                       **network})
    out = []
    for i in range(pods):
        more: dict[str, Any] = {"affinity": affinity} if affinity else {}
        if pins:
            more["nodeSelector"] = {"kubernetes.io/hostname": pins[i]}
        ann = {keys.ANN_GANG_NAME: "big", keys.ANN_GANG_MIN_MEMBER: str(pods),
               keys.ANN_GPU_TOPOLOGY: topo}
        limits = {"cpu": "4", "memory": "16Gi", keys.GPU_RESOURCE: "8"}
        out.append(parse_pod({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"big-worker-{i}", "namespace": "bench", "uid": f"u{i}",
                         "resourceVersion": "1", "creationTimestamp": "2026-11-21T05:00:00Z",
                         "annotations": ann, "labels": labels or {}},
            "spec": {**more, "schedulerName": keys.DEFAULT_BINDER_SCHEDULER_NAME,
                     "containers": [{"name": "main", "image": "train:1",
                                     "resources": {"limits": limits}}],
                     "tolerations": [{"key": keys.TAINT_GPU_TOPOLOGY, "operator": "Exists",
                                      "effect": "NoSchedule"}]},
            "status": {"phase": "Pending"}}))
    return out


def occupied(spec: ClusterSpec, seed: int, labels: dict[str, str] | None = None
             ) -> tuple[dict[str, NodeInfo], dict[str, NodeState]]:
    """The cluster's nodes as the binder parses their Node objects (with `labels` added to
    each), and what is free on them at about 60 % occupancy: 40 % full, 20 % empty, the rest
    with 1-7 GPUs in use."""
    c = Cluster(spec)
    # each node publishes its own GPU UUIDs (`spec.node_topologies`), as real ones do: the
    # binder holds a Topology object per node, not one shared by identical annotations
    nodes = {name: parse_node(node_object(name, {**c.labels[name], **(labels or {})},
                                          codec.encode(t)))
             for name, t in zip(c.names, spec.node_topologies, strict=True)}
    rng = random.Random(seed)
    states = {}
    for name, info in nodes.items():
        r = rng.random()
        used = 8 if r < 0.4 else 0 if r < 0.6 else rng.randint(1, 7)
        free = frozenset(range(8)) - frozenset(rng.sample(range(8), used))
        states[name] = NodeState(name, info.topology, free, info.cpu_milli,
                                 info.memory_bytes, info.pods, info.nvlink_domain)
    return nodes, states


def next_cycle(states: dict[str, NodeState], used: dict[str, NodeState], groups: NodeGroups,
               tables: TableCache, freezer: HeapFreezer) -> dict[str, NodeState]:
    """Between two cycles, as in the binder: the states of the cycle after one that consumed
    `used` (its copy of `states`): the nodes it took are as before again (its pods finished),
    in new objects, and the groups kept across cycles first take in what it placed (as the
    engine's next read would): the next cycle then regroups each such node once, as the
    binder's cycle after a bind does. The heap is frozen after a slow full collection, as the
    binder's service does between cycles (`webhook.binder.heap`)."""
    groups.bind(tables)
    freezer.settle()
    return {name: s if used[name] is s else replace(s) for name, s in states.items()}


#: the reference workload's table (see `reference`)
_TABLE = {i: i * 7 for i in range(977)}


def reference() -> float:
    """Milliseconds of a fixed pure-Python workload (dict reads and writes; about 1.9 ms between
    cycles on this VM in its fast phase), run between planning cycles to see how fast the
    machine runs then. The shared 2-core VM swings between phases about 1.6x apart, for
    seconds to minutes, every process at once (this workload ran 1.8x slower in the same
    cycles as the 256-pod cycle's slowest), so the rows also give each cycle's time in
    references, which the phases do not move."""
    t0 = time.perf_counter()
    table = dict(_TABLE)
    for i in range(12000):
        table[i % 977] = table.get(i % 991, 0) + i
    return (time.perf_counter() - t0) * 1e3


def in_references(times: Sequence[float], refs: Sequence[float]) -> list[float]:
    """Each of `times` over the mean of the references before and after it (`refs` has one
    more than `times`)."""
    return [t / ((a + b) / 2) for t, a, b in zip(times, refs, refs[1:], strict=False)]


def latency(sizes: tuple[int, ...], reps: int, seed: int) -> bool:
    """p99 of one planning cycle of the binder (`planner.plan_gangs`, with the placement
    function, FitCache and node groups the controller keeps) for one pending gang of up to 256
    whole-node pods on a fat tree at about 60 % occupancy, preferring one leaf and with no
    network level: < 20 ms at 4,096 nodes, < 100 ms at 16,384."""
    targets = {4096: 20.0, 16384: 100.0}
    ok = True
    print("\n== placement latency: one binder planning cycle (planner.plan_gangs), ms, and in "
          "references (`reference`: the machine's speed at the time)")
    with HeapFreezer() as freezer:
        for n in sizes:
            spec = fat_tree(n)
            nodes, states = occupied(spec, seed)
            tables = TableCache()
            place = functools.partial(place_gang, tables=tables)  # as webhook.binder.controller
            config = PlanConfig(keys.DEFAULT_BINDER_SCHEDULER_NAME, levels=Levels(spec.levels))
            fit, groups = FitCache(), NodeGroups()
            gc.collect()
            gc.freeze()  # as the binder's service does once synced
            # the free nodes in the order of their network paths: where a gang's pods are
            # pinned, one each (members whose eligible nodes differ)
            empty = sorted((tuple(nodes[name].labels[lv] for lv in spec.levels), name)
                           for name, st in states.items() if len(st.free_gpus) == 8)
            for level, pinned in ((spec.leaf_label, False), (None, False),
                                  (spec.leaf_label, True)):
                for pods in (1, 16, 64, 256):
                    pins = [name for _, name in empty[:pods]] if pinned else []
                    gangs = assemble(gang_pods(pods, level, pins=pins), config.scheduler_name,
                                     None)
                    times, cpu, refs = [], [], []
                    placed = 0
                    fresh = dict(states)
                    for _ in range(reps + 1):
                        refs.append(reference())
                        t0, c0 = time.perf_counter(), time.process_time()
                        plan = plan_gangs(gangs, Allocation({}), fresh, nodes, config=config,
                                          queue=GangQueue(), fit=fit, place=place, now=1e9,
                                          neighbours=Neighbours((), (), nodes, fit.labels(nodes)),
                                          groups=groups)
                        times.append((time.perf_counter() - t0) * 1e3)
                        cpu.append((time.process_time() - c0) * 1e3)
                        placed += len(plan.places) == 1 and \
                            len(plan.places[0].assignments) == pods
                        fresh = next_cycle(states, fresh, groups, tables, freezer)
                    refs.append(reference())
                    # the first builds the FitCache's network and groups the nodes: once
                    times, cpu, refs = times[1:], cpu[1:], refs[1:]
                    if not placed:
                        raise SystemExit(f"latency: no gang of {pods} pods placed at {n} nodes")
                    p99, cpu99 = pct(times, 99), pct(cpu, 99)
                    refs99 = pct(in_references(times, refs), 99)
                    target = targets.get(n, 100.0)
                    # wall time on a shared machine includes other processes: CPU time is the
                    # check then
                    met = p99 < target or cpu99 < target
                    ok &= met
                    verdict = "ok" if p99 < target else "ok(cpu)" if met else "MISSED"
                    where = "pinned  " if pinned else "leaf    " if level else "no level"
                    print(f"  {n:6} nodes, {where}, {pods:3} pods x 8 GPUs: p50 "
                          f"{statistics.median(times):7.2f}  p99 {p99:7.2f}  cpu p99 {cpu99:7.2f}"
                          f"  target < {target:g}  ratio {min(p99, cpu99) / target:.2f}  "
                          f"{verdict:8} placed {placed}/{reps + 1}  p99 {refs99:5.2f} references"
                          f" (reference p50 {statistics.median(refs):4.2f})")
            gc.unfreeze()
    return ok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer jobs, smaller clusters")
    ap.add_argument("--only", choices=("sim", "optimum", "latency", "packing"),
                    help="packing: with --clusters and --seeds, where MostAllocated's low "
                         "fragmentation comes from (not in a full run)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--seeds", type=int, default=8,
                    help="sim: this many seeds from --seed; the verdict is each metric's mean "
                         "over them (default 8, as issue 57 decides)")
    ap.add_argument("--load", type=float, default=0.9,
                    help="offered share of the GPUs (default 0.9; above 1 the queue grows)")
    ap.add_argument("--clusters", choices=("all", "fat1024", "fat4096", "nvl72"),
                    default="all", help="sim: every cluster, or one alone")
    ap.add_argument("--jobs", type=int, help="sim: arrivals per cluster (default per cluster)")
    ap.add_argument("--slowed", action="store_true",
                    help="sim: also each placement's slowed jobs by gang shape")
    ap.add_argument("--json", type=Path, metavar="FILE",
                    help="sim: also write each cluster's metrics per placement here (the first "
                         "seed's; bench/plots.py reads them)")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    ok = True
    sims: dict[str, Metrics] = {}
    # --quick: smaller stand-ins, and no 4,096-node tree
    named = ({"fat1024": (fat_tree(256), 1500), "nvl72": (nvl72(16), 1500)} if args.quick
             else {"fat1024": (fat_tree(1024), 4000), "fat4096": (fat_tree(4096), 6000),
                   "nvl72": (nvl72(64), 4000)})
    if args.clusters not in (*named, "all"):
        ap.error(f"--quick has no {args.clusters} cluster (it has {', '.join(named)})")
    cases = list(named.values()) if args.clusters == "all" else [named[args.clusters]]
    if args.only in (None, "sim"):
        for spec, count in cases:
            runs = [compare(spec, args.jobs or count, args.load, seed, show_slowed=args.slowed)
                    for seed in range(args.seed, args.seed + args.seeds)]
            sims[spec.name] = runs[0]
            ok &= across_seeds(spec.name, runs)
    if args.only == "packing":
        for spec, count in cases:
            for seed in range(args.seed, args.seed + args.seeds):
                ok &= packing(spec, args.jobs or count, args.load, seed)
    if args.only in (None, "optimum"):
        within, total = 0, 0
        for spec in (ClusterSpec("fat tree, 64 x DGX-1 V100", 64, fat_tree(64).topology, 16, 2,
                                 False, fat_tree(64).fabric), nvl72(4)):
            w, t = against_optimum(spec, 200 if args.quick else 500, 0.9, args.seed)
            within, total = within + w, total + t
        # reported, not judged: the verdict is on what users feel (issue 57), and the best
        # GPU set first is the rule this measures
        print(f"  all: {within}/{total} within 2 %")
    if args.only in (None, "latency"):
        ok &= latency((4096,) if args.quick else (4096, 16384), 20 if args.quick else 100,
                      args.seed)
    print("\nall goals met" if ok else "\nsome goals NOT met (see above)")
    if args.json is not None:
        results.write(args.json, "topology", load0,
                      {"seed": args.seed, "offered_load": args.load, "sim": sims})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
