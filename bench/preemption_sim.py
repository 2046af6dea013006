"""Who is evicted to place a high-priority gang: the preemption policies that
bench/bench_preemption.py compares (imported by it and by tests/topology/test_preemption_sim.py;
no timing here). The clusters, arrivals and placements are bench/topology_sim.py's.

Each policy is a pure decision on the cluster as it is: given the gang that waits and the
running gangs of lower priority, it names the victims (whole gangs: a gang losing a pod loses
its run) and where the gang goes once they are gone, or None. It leaves the cluster as it found
it. Written from each project's published documentation (docs/topology.md, "Preemption", cites
each; none of their code is used):

- Volcano's preempt action (https://volcano.sh/en/docs/actions/, "Preempt", and its design
  "Preempt Action Support Topology", docs/design/preempt-action-support-topology.md in
  volcano-sh/volcano): pod by pod, node by node; on each node the lower-priority pods are the
  possible victims, lowest priority first, removed until the pod fits; the node that needs the
  fewest victims wins. The action decides per pod and knows nothing of a victim's gang, so a
  gang that loses one pod is lost whole (its job restarts); the preemptor is placed pod by
  pod, with no network level, and the evictions are committed only when the whole gang gets
  a place (a gang job is pipelined whole or not at all).
- KAI's preempt action (https://github.com/kai-scheduler/KAI-Scheduler, docs/priority and
  docs/scheduling-deep-dive, "Workload Priority: Scheduling Within a Queue"; docs/developer/
  action-framework.md, "Scenarios" and "Simulation"): victims are whole lower-priority,
  preemptible workloads of the same queue; scenarios add victims one at a time and each is
  simulated with the scheduler's own allocation (its topology plugin) until the preemptor is
  placed; only victims on the nodes the preemptor then uses are evicted (the others are
  rolled back, "without needlessly interrupting pods"). The order victims are tried in is not
  documented: lowest priority first, then the most recently started (our reading).
- Kueue's classic preemption within a ClusterQueue (https://kueue.sigs.k8s.io/docs/concepts/
  preemption/, "Classic Preemption": candidates of lower priority, lowest priority first, then
  the most recently admitted; qualified greedily until the preemptor fits, then the set
  minimised by walking it in reverse and dropping each target without which it still fits).
  Two fit checks: by quota alone (the gang's GPUs against the free ones nobody holds: Kueue
  without topology-aware scheduling; the admitted gang then holds that quota and its pods are
  placed by Kueue TAS's rules once they fit, so it may wait with its victims gone: the bench
  counts the free GPUs it holds meanwhile as lost), and
  topology-aware (the fit is Kueue TAS's placement on the cluster without the targets,
  https://kueue.sigs.k8s.io/docs/concepts/topology_aware_scheduling/).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from bench.topology_sim import (
    Cluster,
    Job,
    Placement,
    Placer,
    device_plugin,
    kai,
    kube,
    kueue_tas,
)


@dataclass(frozen=True)
class Running:
    """A gang that holds GPUs: its job, priority, where it runs and when it started."""

    job: Job
    priority: int
    placement: Placement
    start: float
    #: minutes it spends starting again before it works (a run after an eviction: images,
    #: the checkpoint, the collectives set up; `--restart`)
    overhead: float = 0.0


#: where the gang goes, and its victims; no placement: the gang holds the GPUs it was admitted
#: to by count (Kueue's quota) and waits for its pods to find room
Decision = tuple[Placement | None, list[Running]]
#: (the cluster, the gang, the lower-priority running gangs, the GPUs nobody holds, the time in
#: minutes) -> decision
Preempt = Callable[[Cluster, Job, Sequence[Running], int, float], Decision | None]
#: the two priorities of the bench's mix
HIGH, LOW = 1000, 0


@contextmanager
def without(c: Cluster, victims: Sequence[Running]) -> Iterator[None]:
    """The cluster as if `victims` were gone, for the time of the block."""
    for v in victims:
        for i, g in v.placement:
            c.give(i, g)
    try:
        yield
    finally:
        for v in victims:
            for i, g in v.placement:
                c.take(i, g)


def saved_minutes(ran: float, every: float) -> float:
    """Minutes of a run of `ran` minutes its last checkpoint holds, for a job that saves its
    state every `every` minutes (0: never)."""
    return ran // every * every if every else 0.0


def saved_work(r: Running, now: float, every: float) -> float:
    """Minutes of work of `r`'s run that its last checkpoint by `now` holds (its restart
    overhead is no work)."""
    return saved_minutes(max(0.0, now - r.start - r.overhead), every)


def candidates(lower: Sequence[Running]) -> list[Running]:
    """Lowest priority first, then the most recently started (Kueue's order; our reading of
    KAI's)."""
    return sorted(lower, key=lambda r: (r.priority, -r.start, r.job.id))


def never(c: Cluster, job: Job, lower: Sequence[Running], free: int,
          now: float) -> Decision | None:
    """No preemption: the gang waits for GPUs to free up."""
    return None


def placed_by(preempt: Preempt, placer: Placer) -> Preempt:
    """`preempt`'s victims, the gang then placed by `placer` on the cluster without them
    (`preempt`'s own place where `placer` finds none): the bench's `--swaps`, which part of a
    policy its figures come from."""

    def decide(c: Cluster, job: Job, lower: Sequence[Running], free: int,
               now: float) -> Decision | None:
        got = preempt(c, job, lower, free, now)
        if got is None or got[0] is None or not got[1]:
            return got  # nothing evicted, or a gang admitted by quota that waits for room
        with without(c, got[1]):
            placement = placer(c, job)
        return (got[0] if placement is None else placement), got[1]

    return decide


# --- Kueue ------------------------------------------------------------------------------------


def kueue(topology_aware: bool) -> Preempt:
    """Kueue's classic preemption within a ClusterQueue, by quota or topology-aware."""

    def fits(c: Cluster, job: Job, targets: Sequence[Running], free: int) -> bool:
        freed = sum(t.job.gpus for t in targets)
        if free + freed < job.gpus:
            return False  # neither fit can hold it: no placement needed to say so
        if not topology_aware:
            return True
        with without(c, targets):
            return kueue_tas(c, job) is not None

    def preempt(c: Cluster, job: Job, lower: Sequence[Running], free: int,
                now: float) -> Decision | None:
        targets: list[Running] = []
        for cand in candidates(lower):
            targets.append(cand)
            if fits(c, job, targets, free):
                break
        else:
            return None
        for t in reversed(list(targets)):  # minimise, the last qualified first
            rest = [x for x in targets if x is not t]
            if fits(c, job, rest, free):
                targets = rest
        with without(c, targets):
            return kueue_tas(c, job), targets

    return preempt


# --- KAI --------------------------------------------------------------------------------------


def kai_preempt(c: Cluster, job: Job, lower: Sequence[Running], free: int,
                now: float) -> Decision | None:
    """KAI's preempt action: victims added one at a time, each scenario simulated with KAI's
    own placement; the victims on the nodes it then uses are evicted."""
    scenario: list[Running] = []
    freed = 0
    for cand in candidates(lower):
        scenario.append(cand)
        freed += cand.job.gpus
        if free + freed < job.gpus:
            continue
        with without(c, scenario):
            placed = kai(c, job)
        if placed is not None:
            used = {i for i, _ in placed}
            return placed, [v for v in scenario if any(i in used for i, _ in v.placement)]
    return None


# --- Volcano ----------------------------------------------------------------------------------


def volcano(c: Cluster, job: Job, lower: Sequence[Running], free: int,
            now: float) -> Decision | None:
    """Volcano's preempt action, pod by pod: each pod on a node with room (the fullest, as the
    binpack plugin scores), else on the node whose lowest-priority pods, evicted first, make
    room with the fewest evictions; an evicted pod takes its whole gang down."""
    on_node: dict[int, list[Running]] = {}
    for r in candidates(lower):
        for n in dict.fromkeys(n for n, _ in r.placement):
            on_node.setdefault(n, []).append(r)
    victims: list[Running] = []
    out: Placement = []
    try:
        for _ in range(job.pods):
            room = _room(c, job.pod_gpus)
            if room is None:
                got = _fewest_victims(c, job.pod_gpus, on_node, {v.job.id for v in victims})
                if got is None:
                    return None
                room, evict = got
                for v in evict:
                    victims.append(v)
                    for n, g in v.placement:
                        c.give(n, g)
            gpus = device_plugin(c.spec.topology, c.free[room], job.pod_gpus)
            c.take(room, gpus)
            out.append((room, gpus))
        return out, victims
    finally:  # the cluster as it was
        for i, g in out:
            c.give(i, g)
        for v in victims:
            for n, g in v.placement:
                c.take(n, g)


def _room(c: Cluster, gpus: int) -> int | None:
    fits = [(len(f), i) for i, f in enumerate(c.free) if len(f) >= gpus]
    return min(fits)[1] if fits else None


def _fewest_victims(c: Cluster, gpus: int, on_node: dict[int, list[Running]],
                    gone: set[int]) -> tuple[int, list[Running]] | None:
    """The node where evicting its lowest-priority pods first frees `gpus` with the fewest
    evictions, and those pods' gangs."""
    best: tuple[int, int, list[Running]] | None = None
    for i, there in on_node.items():
        free = len(c.free[i])
        evict: list[Running] = []
        for r in there:
            if free >= gpus:
                break
            if r.job.id in gone:
                continue
            free += sum(len(g) for n, g in r.placement if n == i)
            evict.append(r)
        if free >= gpus and (best is None or (len(evict), i) < best[:2]):
            best = (len(evict), i, evict)
    return None if best is None else (best[1], best[2])


def baselines(seed: int) -> dict[str, tuple[Preempt, Placer]]:
    """The baselines, by name, each with the placement it schedules with when nobody is
    evicted (Volcano's: pod by pod, the fullest node first, as its binpack plugin scores)."""
    return {
        "Volcano": (volcano, kube(True, random.Random(seed))),
        "KAI": (kai_preempt, kai),
        "Kueue (quota)": (kueue(False), kueue_tas),
        "Kueue TAS": (kueue(True), kueue_tas),
    }
