"""The placements bench/bench_topology.py compares Muster with, each on a small cluster whose
answer can be checked by hand, and the exact optimum it measures Muster against."""

from __future__ import annotations

import random
from itertools import combinations

import pytest

from bench.topology_optimum import as_placement, optimum
from bench.topology_sim import (
    Cluster,
    ClusterSpec,
    Job,
    _greedy_best_fit,
    domains_spanned,
    fat_tree,
    kai,
    kube,
    kueue_tas,
    muster,
    step,
)
from webhook.topology.gpu_choice import TableCache, set_score

# 2 blocks x 2 leaves x 2 DGX-1 V100 nodes: nodes 0-1 leaf 0, 2-3 leaf 1 (block 0), 4-7 block 1
SMALL = ClusterSpec("small", 8, fat_tree(8).topology, 2, 2, False, fat_tree(8).fabric)


def job(gpus: int, pod: int) -> Job:
    return Job(0, gpus, pod, 0.0, 1.0)


def test_kube_least_allocated_spreads_and_most_allocated_packs() -> None:
    c = Cluster(SMALL)
    spread = kube(False, random.Random(1))(c, job(4, 1))
    assert spread is not None and len({i for i, _ in spread}) == 4
    packed = kube(True, random.Random(1))(c, job(4, 1))
    assert packed is not None and len({i for i, _ in packed}) == 1


def test_kube_most_allocated_takes_the_fullest_node_that_fits() -> None:
    c = Cluster(SMALL)
    c.take(3, range(6))  # node 3 has 2 free
    c.take(5, range(4))  # node 5 has 4 free
    got = kube(True, random.Random(1))(c, job(2, 2))
    assert got is not None and got[0][0] == 3
    got = kube(True, random.Random(1))(c, job(4, 4))
    assert got is not None and got[0][0] == 5


def test_most_allocated_with_whole_gangs_keeps_a_gang_of_one_node_on_one_node() -> None:
    c = Cluster(SMALL)
    c.take(3, range(6))  # node 3 has 2 free, node 5 has 4: pod by pod, 2 + 2 over them
    c.take(5, range(4))
    split = kube(True, random.Random(1))(c, job(4, 1))
    assert split is not None and {i for i, _ in split} == {3, 5}
    whole = kube(True, random.Random(1), whole_gangs=True)(c, job(4, 1))
    assert whole is not None and [i for i, _ in whole] == [5] * 4
    assert sorted(g for _, gpus in whole for g in gpus) == [4, 5, 6, 7]
    assert all(len(gpus) == 1 for _, gpus in whole)
    # a gang over one node's GPUs is placed pod by pod as before
    assert kube(True, random.Random(1), whole_gangs=True)(c, job(16, 8)) is not None


def test_greedy_best_fit_swaps_the_last_domain_for_the_smallest_that_covers_the_rest() -> None:
    assert _greedy_best_fit({0: 5, 1: 3, 2: 2}, 6) == [0, 2]
    assert _greedy_best_fit({0: 5, 1: 3, 2: 2}, 4) == [0]
    assert _greedy_best_fit({0: 1, 1: 1}, 3) == []


def test_kueue_best_fit_takes_the_fullest_leaf_that_holds_the_gang() -> None:
    c = Cluster(SMALL)
    c.take(0, range(4))  # leaf 0: 12 free, still holds 8 GPUs in 1-GPU pods; leaf 1 has 16
    got = kueue_tas(c, job(8, 1))
    assert got is not None and {c.leaf_of[i] for i, _ in got} == {0}
    # two whole-node pods: leaf 0 holds one only, so leaf 1
    got = kueue_tas(c, job(16, 8))
    assert got is not None and {c.leaf_of[i] for i, _ in got} == {1}


def test_kueue_goes_up_to_the_fullest_block_when_no_leaf_holds_it() -> None:
    c = Cluster(SMALL)
    c.take(4, range(8))  # block 1 holds 3 whole nodes, block 0 holds 4
    got = kueue_tas(c, job(24, 8))
    assert got is not None and {c.block_of[i] for i, _ in got} == {1}
    assert domains_spanned(c, got, 1) == 2


def test_kai_packs_the_fullest_leaf_and_its_fullest_nodes() -> None:
    c = Cluster(SMALL)
    c.take(2, range(5))  # leaf 1: node 2 has 3 free
    got = kai(c, job(2, 1))
    assert got is not None and {i for i, _ in got} == {2}
    # no leaf holds 3 whole nodes: the fullest block that does (block 0: nodes 0, 1 and 3;
    # block 1 has 4), its roomiest leaf first
    got = kai(c, job(24, 8))
    assert got is not None and [i for i, _ in got] == [0, 1, 3]


def test_muster_places_through_the_binders_function_within_one_leaf() -> None:
    c = Cluster(SMALL)
    c.take(0, range(8))
    got = muster(TableCache(warm=False))(c, job(16, 8))
    assert got is not None and len({c.leaf_of[i] for i, _ in got}) == 1


def test_the_optimum_is_the_best_bus_bandwidth_any_placement_reaches() -> None:
    tables = TableCache(warm=False)
    c = Cluster(SMALL)
    # two whole nodes of one leaf: 4 NICs x 12.5 GB/s, below the 8-GPU set's NVLink
    opt = optimum(c, job(16, 8), tables)
    assert opt is not None and opt.bus_gbps == pytest.approx(50.0)
    # only nodes of different blocks are whole: 50 / (2 x 2)
    for i in (1, 2, 3, 5, 6, 7):
        c.take(i, range(8))
    opt = optimum(c, job(16, 8), tables)
    assert opt is not None and opt.bus_gbps == pytest.approx(12.5)
    placed = as_placement(c, job(16, 8), opt, tables)
    assert sorted(i for i, _ in placed) == [0, 4]
    assert step(c, placed, tables) == pytest.approx(step(c, [(0, tuple(range(8))),
                                                             (4, tuple(range(8)))], tables))
    assert optimum(c, job(24, 8), tables) is None


def test_the_optimum_picks_the_best_gpus_of_a_node() -> None:
    tables = TableCache(warm=False)
    c = Cluster(SMALL)
    for i in range(1, 8):
        c.take(i, range(8))
    c.take(0, (1, 2, 6))
    free = (0, 3, 4, 5, 7)
    sets = [set_score(SMALL.topology, s).allreduce_gbps for s in combinations(free, 4)]
    assert min(sets) < max(sets) == 50.0  # the choice matters
    opt = optimum(c, job(4, 1), tables)
    assert opt is not None and opt.bus_gbps == pytest.approx(max(sets))


def test_slowed_jobs_are_counted_by_gang_shape() -> None:
    from bench.bench_topology import Result, slowed  # noqa: PLC0415 (the bench's own module)

    jobs = [Job(0, 4, 1, 0, 1), Job(1, 4, 1, 0, 1), Job(2, 4, 4, 0, 1), Job(3, 16, 8, 0, 1)]
    r = Result("x", steps={0: (1.5, 1.0), 1: (1.0, 1.0), 2: (1.0, 1.0), 3: (2.2, 2.0)})
    # jobs at their ideal step add nothing; shapes by GPUs, then GPUs per pod
    assert slowed(r, jobs) == "4x1 1/2 +0.50, 2x8 1/1 +0.10"
    assert slowed(Result("y", steps={2: (1.0, 1.0)}), jobs) == ""


def test_latency_rows_count_each_cycle_in_the_references_beside_it() -> None:
    from bench.bench_topology import in_references, reference  # noqa: PLC0415

    # a cycle counts in the mean of the references before and after it: 20 ms while they took
    # 2 and 6 ms (the machine slowed down) is 5 references, as 10 ms between two of 2 ms
    assert in_references([10.0, 20.0, 30.0], [2.0, 2.0, 6.0, 2.0]) == [5.0, 5.0, 7.5]
    assert reference() > 0
