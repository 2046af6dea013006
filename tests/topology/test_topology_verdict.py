"""The topology bench's verdict (issue 57): Muster against the best baseline on what users feel,
fragmentation against the gang-aware baselines only, on each metric's mean over the seeds; and
job completion time measured as finish - submit."""

from __future__ import annotations

from bench.bench_topology import BETTER_HIGH, across_seeds, run, verdicts, workload
from bench.topology_sim import fat_tree, kueue_tas


def metrics(**over: float) -> dict[str, float]:
    base = dict.fromkeys(BETTER_HIGH, 1.0)
    base.update(over)
    return base


def table(muster_frag: float, most_allocated_frag: float) -> dict[str, dict[str, float]]:
    return {"Muster": metrics(**{"frag %": muster_frag}),
            "Kueue TAS BestFit": metrics(**{"frag %": 2.0}),
            "KAI topology": metrics(**{"frag %": 3.0}),
            "kube MostAllocated": metrics(**{"frag %": most_allocated_frag})}


def test_fragmentation_is_judged_against_the_gang_aware_baselines_only() -> None:
    frag = {col: good for col, good, *_ in verdicts(table(1.5, 0.5))}["frag %"]
    assert frag  # MostAllocated strands fewer, and is not judged against
    worse = {col: (good, best) for col, good, _, best in verdicts(table(2.5, 0.5))}["frag %"]
    assert worse == (False, 2.0)  # over Kueue's


def test_every_other_metric_is_judged_against_every_baseline() -> None:
    t = table(1.0, 1.0)
    t["kube MostAllocated"]["JCT p95"] = 0.5  # lower is better: MostAllocated beats Muster
    assert {col: good for col, good, *_ in verdicts(t)}["JCT p95"] is False
    t["kube MostAllocated"]["util %"] = 0.5  # higher is better: Muster is still the best
    assert {col: good for col, good, *_ in verdicts(t)}["util %"] is True


def test_the_verdict_is_on_the_mean_over_the_seeds() -> None:
    worse, better = table(1.0, 1.0), table(1.0, 1.0)
    worse["Muster"]["delay mean"] = 1.2  # worse than the best by 0.2 on one seed
    better["Muster"]["delay mean"] = 0.5  # better by 0.5 on the other: the mean wins
    assert across_seeds("x", [worse, better])
    better["Muster"]["delay mean"] = 0.9
    assert not across_seeds("x", [worse, better])


def test_job_completion_time_is_the_delay_plus_the_run_time() -> None:
    spec = fat_tree(32)
    tables, jobs, ideal = workload(spec, 60, 1.3, 7)
    r = run(spec, jobs, "Kueue", kueue_tas, tables=tables, ideal=ideal)
    assert r.placed == len(jobs) == len(r.jct)
    by_id = {j.id: j for j in jobs}
    # placed in the order of r.steps: each JCT is its delay plus its work stretched by its step
    for jct, delay, (jid, (s, i)) in zip(r.jct, r.delay, r.steps.items(), strict=True):
        assert jct == delay + by_id[jid].work * s / i
    assert max(r.delay) > 0  # some waited: the delay is in it
    assert r.metrics()["JCT mean"] > r.metrics()["delay mean"]
