"""The preemption policies bench/bench_preemption.py compares, each on a small cluster whose
answer can be checked by hand, and the bench's run on a tiny configuration."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import pytest

from bench.bench_preemption import Outcome, _Sim, simulate
from bench.preemption_muster import EPOCH, MusterPreemption
from bench.preemption_sim import (
    HIGH,
    LOW,
    Preempt,
    Running,
    kai_preempt,
    kueue,
    never,
    placed_by,
    volcano,
)
from bench.topology_sim import Cluster, ClusterSpec, Job, Placer, fat_tree, kueue_tas, muster, step
from webhook.topology.gpu_choice import TableCache

# 2 blocks x 2 leaves x 2 DGX-1 V100 nodes: nodes 0-1 leaf 0, 2-3 leaf 1 (block 0), 4-7 block 1
SMALL = ClusterSpec("small", 8, fat_tree(8).topology, 2, 2, False, fat_tree(8).fabric)


def job(jid: int, gpus: int, pod: int) -> Job:
    return Job(jid, gpus, pod, 0.0, 60.0)


def run(c: Cluster, jid: int, start: float, *where: tuple[int, tuple[int, ...]]) -> Running:
    """A low-priority gang running on `where` since `start`."""
    for i, g in where:
        c.take(i, g)
    gpus = sum(len(g) for _, g in where)
    return Running(Job(jid, gpus, len(where[0][1]), 0.0, 60.0), LOW, list(where), start)


ALL = tuple(range(8))


def full(c: Cluster) -> list[Running]:
    """Every node full: one whole-node gang each, started in node order (node 7 the newest)."""
    return [run(c, 100 + i, float(i), (i, ALL)) for i in range(8)]


def test_kueue_evicts_the_newest_first_then_drops_those_it_does_not_need() -> None:
    c = Cluster(SMALL)
    lower = full(c)
    before = list(c.free)
    placement, victims = kueue(True)(c, job(1, 16, 8), lower, 0, 10.0) or (None, [])
    # the newest first: nodes 7 and 6 are freed, which is one leaf (3): enough, nothing to drop
    assert sorted(v.job.id for v in victims) == [106, 107]
    assert placement is not None and {i for i, _ in placement} == {6, 7}
    assert c.free == before  # the decision leaves the cluster as it was


def test_a_swap_keeps_the_policys_victims_and_places_the_gang_by_another() -> None:
    c = Cluster(SMALL)
    lower = full(c)
    before = list(c.free)
    seen: list[list[int]] = []

    def backwards(c: Cluster, job: Job) -> list[tuple[int, tuple[int, ...]]] | None:
        free = [i for i in range(8) if len(c.free[i]) == 8]
        seen.append(free)
        return [(i, ALL) for i in reversed(free)][:job.pods] if len(free) >= job.pods else None

    placement, victims = placed_by(kueue(True), backwards)(c, job(1, 16, 8), lower, 0, 10.0) or (
        None, [])
    assert sorted(v.job.id for v in victims) == [106, 107]  # Kueue TAS's victims
    assert seen[-1] == [6, 7]  # the placer saw the cluster without them
    assert placement == [(7, ALL), (6, ALL)]  # and placed the gang
    assert c.free == before
    # where the placer finds no place, the policy's own stands
    placement, victims = placed_by(kueue(True), lambda c, j: None)(
        c, job(1, 16, 8), lower, 0, 10.0) or (None, [])
    assert placement is not None and {i for i, _ in placement} == {6, 7}
    assert c.free == before
    # nothing to evict (the gang fits) or nothing to place (quota): the policy's answer as it is
    assert placed_by(never, backwards)(c, job(1, 16, 8), lower, 0, 10.0) is None

    def admitted(c: Cluster, job: Job, lower: Sequence[Running], free: int,
                 now: float) -> tuple[None, list[Running]]:
        return None, [lower[0]]

    assert placed_by(admitted, backwards)(c, job(1, 16, 8), lower, 0, 10.0) == (None, [lower[0]])


def test_topology_aware_kueue_frees_a_whole_node_and_quota_kueue_only_a_count() -> None:
    c = Cluster(SMALL)
    lower = [run(c, 100 + i, float(i), (i, ALL)) for i in range(6)]
    # nodes 6 and 7 each run two 4-GPU gangs: a (6, started at 6), b (6, at 8), c (7, at 7),
    # d (7, at 9); newest first: d, b, c, a
    a, b = run(c, 1, 6.0, (6, (0, 1, 2, 3))), run(c, 2, 8.0, (6, (4, 5, 6, 7)))
    cc, d = run(c, 3, 7.0, (7, (0, 1, 2, 3))), run(c, 4, 9.0, (7, (4, 5, 6, 7)))
    lower += [a, b, cc, d]
    one_pod = job(9, 8, 8)
    # by quota, d and b make 8 GPUs: evicted, though no node then holds the pod (it waits)
    placement, quota = kueue(False)(c, one_pod, lower, 0, 10.0) or (None, [])
    assert [v.job.id for v in quota] == [4, 2] and placement is None
    # topology-aware: d, b, then c free node 7; minimised, b is dropped
    placement, tas = kueue(True)(c, one_pod, lower, 0, 10.0) or (None, [])
    assert sorted(v.job.id for v in tas) == [3, 4]
    assert placement is not None and placement[0][0] == 7


def test_kai_evicts_only_the_victims_on_the_nodes_it_then_uses() -> None:
    c = Cluster(SMALL)
    # node 7's gang is the newest, but one GPU; node 6's the next, 8 GPUs: a 8-GPU pod needs
    # both tried, and uses node 6 only
    lower = [run(c, 100 + i, float(i), (i, ALL)) for i in range(7)]
    lower.append(run(c, 107, 9.0, (7, (0,))))
    c.take(7, range(1, 8))  # the rest of node 7 held by a high-priority gang
    placement, victims = kai_preempt(c, job(1, 8, 8), lower, 0, 10.0) or (None, [])
    assert placement is not None and [i for i, _ in placement] == [6]
    assert [v.job.id for v in victims] == [106]


def test_volcano_decides_per_pod_and_an_evicted_pod_takes_its_gang_down() -> None:
    c = Cluster(SMALL)
    # one low gang over nodes 0 and 1 (4 GPUs on each); nodes 2-7 run four 2-GPU gangs each
    wide = run(c, 100, 0.0, (0, (0, 1, 2, 3)), (1, (0, 1, 2, 3)))
    lower = [wide] + [run(c, 10 * i + k, 1.0, (i, (2 * k, 2 * k + 1)))
                      for i in range(2, 8) for k in range(4)]
    placement, victims = volcano(c, job(1, 8, 4), lower, 8, 10.0) or (None, [])
    # each pod finds a node with room (node 0's free half, then node 1's): nobody is evicted
    assert victims == [] and placement is not None and sorted(i for i, _ in placement) == [0, 1]
    c.take(0, (4, 5, 6, 7))  # now held by a high-priority gang
    c.take(1, (4, 5, 6, 7))
    before = list(c.free)
    placement, victims = volcano(c, job(1, 8, 4), lower, 0, 10.0) or (None, [])
    # the first pod: node 0 needs one eviction (the wide gang), nodes 2-7 two: node 0, and the
    # wide gang goes whole, so the second pod takes its half on node 1 with no other eviction
    assert [v.job.id for v in victims] == [100]
    assert placement is not None and sorted(i for i, _ in placement) == [0, 1]
    assert c.free == before


def test_no_policy_preempts_for_a_gang_that_still_could_not_fit() -> None:
    c = Cluster(SMALL)
    lower = full(c)[:2]  # only two nodes run low-priority gangs; the rest is held
    for i in range(2, 8):
        c.take(i, ALL)
    for preempt in (kueue(True), kueue(False), kai_preempt, volcano, never):
        assert preempt(c, job(1, 24, 8), lower, 0, 10.0) is None


@functools.cache
def tiny_bench() -> tuple[ClusterSpec, TableCache, list[Job], dict[int, float], dict[int, int]]:
    """The bench's arrivals on a 32-node fat tree, 300 at 200 % (seed 7), made once: the
    cluster, its tables, the jobs, their ideal step times and priorities."""
    from bench.bench_preemption import priorities  # noqa: PLC0415
    from bench.bench_topology import workload  # noqa: PLC0415

    spec = fat_tree(32)
    tables, jobs, ideal = workload(spec, 300, 2.0, 7)
    return spec, tables, jobs, ideal, priorities(jobs, 0.2, 7)


def run_bench(name: str, placer: Callable[[TableCache], Placer], preempt: Preempt
              ) -> tuple[Outcome, list[Job], dict[int, int]]:
    """One policy's run on `tiny_bench`: its outcome, the jobs and their priorities."""
    spec, tables, jobs, ideal, prio = tiny_bench()
    out = simulate(_Sim(spec, prio, ideal, tables, Outcome(name)), jobs, placer(tables), preempt)
    return out, jobs, prio


def test_the_bench_preempts_and_cuts_the_high_priority_delay() -> None:
    none, _, _ = run_bench("none", muster, never)
    tas, jobs, prio = run_bench("tas", lambda _: kueue_tas, kueue(True))
    assert none.evicted == 0 and none.evicted_gpu_hours == none.held_gpu_hours == 0
    assert tas.evicted > 0 and tas.evicted_gpu_hours > 0
    assert tas.held_gpu_hours == 0  # Kueue TAS admits a gang only where it is placed
    high = sum(p == HIGH for p in prio.values())
    assert len(tas.high_delay) == len(tas.high_jct) == high  # every job ran, each once counted
    assert len(tas.low_jct) == len(jobs) - high
    assert tas.metrics()["high delay mean"] < none.metrics()["high delay mean"]


def test_free_gpus_a_gang_admitted_by_quota_holds_are_lost_until_it_runs() -> None:
    sim = _Sim(SMALL, {}, {}, TableCache(warm=False), Outcome("quota"))
    for i in range(8):
        sim.c.take(i, ALL)
    sim.c.give(0, (0, 1, 2, 3))
    sim.tick(10.0)
    assert sim.out.held_gpu_hours == 0  # nothing held: free GPUs are nobody's loss
    sim.held[1] = 8  # a gang admitted by quota for 8 GPUs, 4 of them free so far
    sim.tick(40.0)
    assert sim.out.held_gpu_hours == pytest.approx(4 * 30 / 60)
    sim.c.give(1, ALL)  # 12 free now: the gang holds 8 of them idle
    sim.tick(55.0)
    assert sim.out.held_gpu_hours == pytest.approx(2 + 8 * 15 / 60)


def test_quota_kueue_loses_what_it_evicts_and_what_it_holds_idle() -> None:
    out, _, _ = run_bench("quota", lambda _: kueue_tas, kueue(False))
    m = out.metrics()
    assert out.held_gpu_hours > 0 and out.evicted_gpu_hours > 0
    assert m["GPU-h lost"] == pytest.approx(m["GPU-h evicted"] + m["GPU-h held"])


def test_a_run_where_a_preempting_policy_evicted_nothing_fails() -> None:
    from bench.bench_preemption import compare  # noqa: PLC0415

    with pytest.raises(SystemExit, match="evicted no gang"):
        compare(fat_tree(32), 20, 0.05, 0.2, 7)


def test_the_goals_need_a_tenth_of_the_delay_and_fewer_gpu_hours_lost_at_the_same_delay() -> None:
    from bench.bench_preemption import READ, goals  # noqa: PLC0415

    def row(delay: float, lost: float) -> dict[str, float]:
        return {"high delay p95": delay, "GPU-h lost": lost, "GPU-h evicted": lost,
                "GPU-h held": 0.0}

    rows = {"no preemption": row(20.0, 0.0), "Muster": row(1.0, 100.0),
            "KAI": row(1.0, 150.0), "Volcano": row(0.6, 300.0)}
    assert goals(rows)  # 20x lower; fewer lost than both, at KAI's delay and within 0.5 min
    assert not goals({**rows, "KAI": row(1.0, 90.0)})  # KAI loses fewer at the same delay
    assert not goals({**rows, "no preemption": row(9.0, 0.0)})  # only 9x lower
    # a baseline that waits far longer and loses fewer is not at the same delay: not met
    assert not goals({**rows, "Kueue": row(5.0, 50.0)})
    # the swaps' rows are Muster's and Kueue TAS's parts crossed, not baselines
    assert goals({**rows, "TAS, Muster gang": row(1.0, 50.0), "Muster, TAS rest": row(0.1, 1.0)})
    # nor is Muster told the jobs' checkpoints (reported: judged against the baselines alone)
    assert goals({**rows, READ: row(1.0, 50.0)})
    assert goals({**rows, READ: row(1.0, 120.0)}, READ)
    assert not goals({**rows, READ: row(1.0, 160.0)}, READ)


def test_muster_asks_the_binders_planner_and_frees_one_leaf_of_whole_gangs() -> None:

    c = Cluster(SMALL)
    # whole-node gangs, all submitted at minute 0; those of leaf 1 (nodes 2, 3) started last:
    # the least work lost (their pods' status.startTime, not their creation, says so)
    lower = [run(c, 100 + i, 50.0 if i in (2, 3) else 0.0, (i, ALL)) for i in range(8)]
    before = list(c.free)
    got = MusterPreemption(SMALL, TableCache(warm=False))(c, job(1, 16, 8), lower, 0, 60.0)
    assert got is not None
    placement, victims = got
    assert sorted(v.job.id for v in victims) == [102, 103]
    assert placement is not None and sorted(i for i, _ in placement) == [2, 3]
    assert all(g == ALL for _, g in placement)
    assert c.free == before
    # nothing lower to evict: it waits
    assert MusterPreemption(SMALL, TableCache(warm=False))(c, job(1, 16, 8), [], 0, 60.0) is None


def test_muster_reads_the_checkpoints_the_jobs_say_they_made() -> None:

    c = Cluster(SMALL)
    # leaf 0's gangs (nodes 0, 1) started at minute 0, leaf 1's at 50, block 1's at 30. At
    # minute 130 jobs that checkpoint hourly saved at 120, 110 and 90: leaf 0's would lose
    # 10 minutes, leaf 1's 20, block 1's 40. Told none, Muster frees leaf 1 (the youngest)
    starts = {0: 0.0, 1: 0.0, 2: 50.0, 3: 50.0}
    lower = [run(c, 100 + i, starts.get(i, 30.0), (i, ALL)) for i in range(8)]
    blind = MusterPreemption(SMALL, TableCache(warm=False))
    told = MusterPreemption(SMALL, TableCache(warm=False), checkpoint=60.0)
    assert [told.saved(r, 130.0) for r in lower[:4]] == [120.0, 120.0, 110.0, 110.0]
    assert told.saved(lower[2], 109.0) is None and blind.saved(lower[0], 130.0) is None
    for mp, freed in ((blind, [102, 103]), (told, [100, 101])):
        got = mp(c, job(1, 16, 8), lower, 0, 130.0)
        assert got is not None and sorted(v.job.id for v in got[1]) == freed
    # the word is on the running pods, as the job writes it
    (pod,) = told.running(lower[:1], 130.0)[0].gang.members
    assert pod.checkpointed == EPOCH + 120.0 * 60


def test_the_latency_cluster_is_every_gpu_of_4096_nodes_held_by_2000_gangs() -> None:
    import random  # noqa: PLC0415

    from bench.bench_preemption import LATENCY_GANGS, _filled  # noqa: PLC0415

    c = Cluster(fat_tree(4096))
    lower = _filled(c, random.Random(7))
    assert len(lower) == LATENCY_GANGS == 2000 and not any(c.leaf_free)
    assert len({r.job.id for r in lower}) == 2000
    # some whole-node gangs straddle two leaves, as a busy cluster's do
    assert any(len({c.leaf_of[i] for i, _ in r.placement}) > 1 for r in lower)
    assert all(r.priority == LOW and r.start <= 0 for r in lower)


def test_the_swaps_cross_muster_and_kueue_tas_and_are_not_judged(
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench.bench_preemption import SWAPS, compare, goals  # noqa: PLC0415

    rows = compare(fat_tree(32), 300, 2.0, 0.2, 7, crossed=True)
    crossed = [name for name in rows if name in SWAPS]
    assert crossed == ["Muster, TAS rest", "Muster, TAS gang", "TAS, Muster rest",
                       "TAS, Muster gang"]
    # Kueue TAS's victims and placement everywhere but one part: figures of their own
    assert all(rows[name]["evicted"] > 0 for name in crossed)
    assert rows["TAS, Muster rest"] != rows["Kueue TAS"]
    capsys.readouterr()
    goals(rows)
    judged = capsys.readouterr().out
    assert "against Kueue TAS:" in judged and not any(name in judged for name in crossed)


def test_with_checkpoints_an_evicted_gang_loses_only_the_work_since_its_last() -> None:
    tables = TableCache(warm=False)
    c = Cluster(SMALL)
    # 8 GPUs since minute 10, 300 minutes of work at its ideal step, which it has here
    r = Running(Job(1, 8, 8, 0.0, 300.0), LOW, [(0, ALL)], 10.0)
    ideal = {1: step(c, r.placement, tables)}
    for every, lost, left in ((0.0, 8 * 150 / 60, 300.0), (60.0, 8 * 30 / 60, 300.0 - 120.0),
                              (200.0, 8 * 150 / 60, 300.0)):
        sim = _Sim(SMALL, {1: LOW}, ideal, tables, Outcome("c"), checkpoint=every)
        sim.c.take(0, ALL)
        sim.running[1], sim.ends[1] = r, 310.0
        sim.evict(160.0, [r])  # 150 minutes into its run
        assert sim.out.evicted_gpu_hours == pytest.approx(lost), every
        (queued,) = sim.queue
        # it waits again with its submit time kept, for what its last checkpoint left
        assert queued[3].arrival == 0.0 and queued[3].work == pytest.approx(left), every
        assert sim.c.free[0] == frozenset(ALL)


def test_a_gang_evicted_spends_its_restart_starting_again_which_is_lost_too() -> None:
    tables = TableCache(warm=False)
    c = Cluster(SMALL)
    job = Job(1, 8, 8, 0.0, 300.0)  # 300 minutes of work at its ideal step, which it has here
    ideal = {1: step(c, [(0, ALL)], tables)}
    sim = _Sim(SMALL, {1: LOW}, ideal, tables, Outcome("r"), checkpoint=60.0, restart=10.0)
    sim.start(10.0, job, [(0, ALL)])
    assert sim.ends[1] == pytest.approx(310.0) and sim.running[1].overhead == 0  # its first run
    sim.evict(160.0, [sim.running[1]])  # saved at 120 minutes: 30 lost
    assert sim.out.evicted_gpu_hours == pytest.approx(8 * 30 / 60)
    assert sim.out.evicted == 1 and sim.out.again == 0
    (queued,) = sim.queue
    sim.queue.clear()
    # again: 10 minutes starting, then the 180 its checkpoint left
    sim.start(200.0, queued[3], [(0, ALL)])
    again = sim.running[1]
    assert again.overhead == 10.0 and sim.ends[1] == pytest.approx(200.0 + 10.0 + 180.0)
    # evicted 75 minutes in: 10 starting, 65 of work of which its checkpoint at 60 holds 60
    # (what the job says on its pods too: the binder is told 270)
    assert MusterPreemption(SMALL, tables, checkpoint=60.0).saved(again, 275.0) == 270.0
    sim.evict(275.0, [again])
    assert sim.out.evicted_gpu_hours == pytest.approx(8 * (30 + 15) / 60)
    assert sim.out.again == 1
    (queued,) = sim.queue
    sim.queue.clear()
    assert queued[3].work == pytest.approx(120.0)
    # the run that finishes spent its 10 minutes starting: lost to the evictions too
    sim.start(300.0, queued[3], [(0, ALL)])
    sim.finish(430.0, 1)
    assert sim.out.evicted_gpu_hours == pytest.approx(8 * (30 + 15 + 10) / 60)


def test_paired_differences_say_where_muster_loses_less(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    from bench.bench_preemption import paired  # noqa: PLC0415

    def rows(mine: float, kai: float) -> dict[str, dict[str, float]]:
        return {"no preemption": {"GPU-h lost": 0.0}, "Muster": {"GPU-h lost": mine},
                "KAI": {"GPU-h lost": kai}, "TAS, Muster gang": {"GPU-h lost": 0.0}}

    paired([rows(100, 130), rows(200, 190), rows(50, 90)])
    out = capsys.readouterr().out
    assert "paired against KAI: Muster - it = -20 GPU-h lost (standard error 15); Muster " \
           "loses less on 2 of 3 seeds" in out
    assert "no preemption" not in out and "TAS, Muster gang" not in out
