"""Every free-GPU mask and every k on the NVLink/NVSwitch built-ins: the engine's choice reaches
the brute-force optimum. The brute force below shares no code with the engine's scoring: rings
are enumerated with itertools.permutations and ring packings with combinations_with_replacement.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import pytest

from webhook.topology import besteffort, builtin
from webhook.topology.gpu_choice import choose_gpus
from webhook.topology.model import Topology
from webhook.topology.scoring import PCIE_GEN3_GBPS

EXHAUSTIVE = ("dgx1-v100", "dgx1-p100", "hgx-a100", "hgx-h100")


class Brute:
    """Straightforward, slow definitions of the scores (see webhook/topology/scoring.py)."""

    def __init__(self, t: Topology) -> None:
        self.t = t

    def cap(self, a: int, b: int) -> float:
        t = self.t
        if a in t.nvswitch and b in t.nvswitch:
            return t.nvswitch_links * t.nvlink_gbps
        if t.nvlinks[a][b] > 0:
            return t.nvlinks[a][b] * t.nvlink_gbps
        return PCIE_GEN3_GBPS[t.pcie[a][b]] * 2 ** (t.pcie_gen - 3)

    @staticmethod
    def cycles(s: tuple[int, ...]) -> list[list[tuple[int, int]]]:
        out = []
        for perm in itertools.permutations(s[1:]):
            if perm[0] > perm[-1]:
                continue  # the same cycle reversed
            order = (s[0], *perm)
            out.append([(order[i], order[(i + 1) % len(order)]) for i in range(len(order))])
        return out

    @functools.cache  # noqa: B019 - one Brute per topology for the whole session
    def allreduce(self, s: tuple[int, ...]) -> float:
        t = self.t
        if len(s) < 2:
            return 0.0
        if len(s) == 2:
            return self.cap(*s)
        rings = self.cycles(s)
        ring = max(min(self.cap(a, b) for a, b in c) for c in rings)
        if t.nvswitch and set(s) <= t.nvswitch:
            return max(ring, t.nvswitch_links * t.nvlink_gbps)
        nv = [c for c in rings if all(t.nvlinks[a][b] > 0 for a, b in c)]
        packed = 0
        for r in itertools.count(1):
            fits = False
            for combo in itertools.combinations_with_replacement(nv, r):
                use: dict[frozenset[int], int] = {}
                for c in combo:
                    for a, b in c:
                        use[frozenset((a, b))] = use.get(frozenset((a, b)), 0) + 1
                if all(n <= t.nvlinks[min(p)][max(p)] for p, n in use.items()):
                    fits = True
                    break
            if not fits:
                break
            packed = r
        return max(ring, 2 * packed * t.nvlink_gbps)

    def has_nvlink_ring(self, s: tuple[int, ...]) -> bool:
        t = self.t
        if len(s) < 2:
            return False
        if t.nvswitch and set(s) <= t.nvswitch:
            return True
        if len(s) == 2:
            return t.nvlinks[s[0]][s[1]] > 0
        return any(all(t.nvlinks[a][b] > 0 for a, b in c) for c in self.cycles(s))

    @functools.cache  # noqa: B019
    def best(self, free: tuple[int, ...], k: int) -> float:
        return max(self.allreduce(c) for c in itertools.combinations(free, k))


@functools.cache
def brute(name: str) -> Brute:
    return Brute(builtin(name))


def _free_sets(n: int) -> list[tuple[int, ...]]:
    return [tuple(i for i in range(n) if m >> i & 1) for m in range(1, 1 << n)]


@pytest.mark.parametrize("name", EXHAUSTIVE)
def test_engine_reaches_brute_force_optimum_everywhere(name: str) -> None:
    t, b = builtin(name), brute(name)
    cases = misses = 0
    for free in _free_sets(t.size):
        for k in range(1, len(free) + 1):
            chosen = choose_gpus(t, free, k)
            assert chosen is not None and len(chosen) == k and set(chosen) <= set(free)
            cases += 1
            if b.allreduce(chosen) != b.best(free, k):
                misses += 1
    assert cases == 1024  # every non-empty mask of 8 GPUs and every k
    assert misses == 0


@pytest.mark.parametrize("name", EXHAUSTIVE)
def test_engine_never_breaks_a_ring_and_best_effort_is_measured(name: str) -> None:
    t, b = builtin(name), brute(name)
    ours_broken = theirs_broken = theirs_optimal = cases = 0
    for free in _free_sets(t.size):
        for k in range(2, len(free) + 1):
            cases += 1
            ring_free = any(b.has_nvlink_ring(c) for c in itertools.combinations(free, k))
            ours = choose_gpus(t, free, k)
            theirs = besteffort.allocate(t, free, k)
            assert ours is not None and len(theirs) == k and set(theirs) <= set(free)
            ours_broken += ring_free and not b.has_nvlink_ring(ours)
            theirs_broken += ring_free and not b.has_nvlink_ring(theirs)
            theirs_optimal += b.allreduce(theirs) == b.best(free, k)
    assert ours_broken == 0
    if name.startswith("dgx1"):
        # the pairwise-sum proxy is measurably wrong on hybrid cube-mesh machines
        assert theirs_broken > 0 and theirs_optimal < cases
    else:
        # on NVSwitch systems every set is equally good, whatever the proxy says
        assert theirs_broken == 0 and theirs_optimal == cases


def test_design_example_dgx1v_five_gpus() -> None:
    t, b = builtin("dgx1-v100"), brute("dgx1-v100")
    assert besteffort.allocate(t, range(8), 5) == (0, 1, 2, 3, 4)
    assert not b.has_nvlink_ring((0, 1, 2, 3, 4))
    assert b.allreduce((0, 2, 3, 4, 7)) == 50.0
    ours = choose_gpus(t, range(8), 5)
    assert ours is not None and b.allreduce(ours) == 50.0


def test_fragmentation_tie_break_keeps_the_other_quad_whole() -> None:
    t = builtin("dgx1-v100")
    first = choose_gpus(t, range(8), 4)
    assert first in ((0, 1, 2, 3), (4, 5, 6, 7))
    rest = tuple(sorted(set(range(8)) - set(first or ())))
    second = choose_gpus(t, rest, 4)
    assert second == rest and brute("dgx1-v100").allreduce(rest) == 100.0


def test_ties_prefer_leaving_good_sets_over_lowest_indices() -> None:
    # free {0,1,2,3,6}, one GPU wanted: all single GPUs tie on bandwidth. Taking 6 (the only
    # GPU away from the quad) leaves the 100 GB/s quad intact; lowest-index would take 0.
    t = builtin("dgx1-v100")
    assert choose_gpus(t, (0, 1, 2, 3, 6), 1) == (6,)


def test_unhealthy_and_missing_gpus_are_not_chosen() -> None:
    t = builtin("dgx1-v100")
    sick = dataclasses.replace(
        t, gpus=tuple(dataclasses.replace(g, healthy=g.index != 0) for g in t.gpus))
    assert choose_gpus(sick, range(8), 8) is None
    chosen = choose_gpus(sick, (0, 1, 2, 3, 42), 3)
    assert chosen == (1, 2, 3)
    assert choose_gpus(t, (), 1) is None and choose_gpus(t, (0, 1), 0) is None


def test_nvswitch_nodes_pack_numa_nodes_best_fit() -> None:
    h100 = builtin("hgx-h100")  # NUMA 0: GPUs 0-3, NUMA 1: GPUs 4-7
    assert choose_gpus(h100, (0, 1, 2, 4, 5, 6, 7), 3) == (0, 1, 2)  # NUMA 1 stays whole
    assert choose_gpus(h100, (0, 1, 2, 4, 5, 6, 7), 4) == (4, 5, 6, 7)  # one NUMA node
    assert choose_gpus(h100, (0, 1, 2, 4, 5, 6, 7), 5) == (0, 4, 5, 6, 7)
    dgx2 = builtin("dgx2")
    assert choose_gpus(dgx2, (*range(8), 15), 1) == (15,)
    assert choose_gpus(dgx2, range(16), 8) == tuple(range(8))
