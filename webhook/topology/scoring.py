"""Bandwidth scoring of a GPU set: what an allreduce over those GPUs can reach.

Figures are GB/s. The headline figure, `allreduce_gbps`, is NCCL's "bus bandwidth" of a ring
allreduce: rings ("channels") are packed into the NVLink links as NCCL does, every link is full
duplex so each ring also runs reversed, and a ring's speed is its slowest hop. Without an NVLink
ring the set falls back to one ring over PCIe, as fast as its slowest PCIe hop. The docs/design.md
example holds: on a DGX-1 V100, {0,2,3,4,7} has one NVLink ring, 2 x 25 = 50 GB/s.

Sets are bitmasks over GPU indices. Functions here are pure and uncached;
`webhook.topology.gpu_choice` caches them per topology class.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

from webhook.topology.model import PCIeLevel, Topology

#: Per-direction GPU-to-GPU bandwidth (GB/s) over PCIe Gen3 x16 by closest common ancestor.
#: Gen3 x16 is 15.75 GB/s raw; p2pBandwidthLatencyTest measures ~12-13 GB/s through one switch,
#: less through more hops and the host bridge; across sockets NCCL stages through host memory
#: (SHM) at ~6 GB/s. Doubled per PCIe generation. Sources in docs/topology.md.
PCIE_GEN3_GBPS: dict[PCIeLevel, float] = {
    PCIeLevel.INTERNAL: 12.0,
    PCIeLevel.PIX: 12.0,
    PCIeLevel.PXB: 11.0,
    PCIeLevel.PHB: 10.0,
    PCIeLevel.NODE: 9.0,
    PCIeLevel.SYS: 6.0,
}


class SetScore(NamedTuple):
    """Scores of one GPU set; compared lexicographically through `rank_key`."""

    allreduce_gbps: float  # packed NVLink rings (both directions), else the best PCIe ring
    ring_gbps: float  # the best single ring by its slowest hop, one direction
    bisection_gbps: float  # worst balanced cut: NVLink across it plus its PCIe path
    numa_nodes: int  # distinct NUMA nodes the set spans (1 is aligned)

    def rank_key(self) -> tuple[float, float, float, int]:
        return (self.allreduce_gbps, self.ring_gbps, self.bisection_gbps, -self.numa_nodes)


def members(mask: int) -> list[int]:
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return out


def to_mask(indices: object) -> int:
    m = 0
    for i in indices:  # type: ignore[attr-defined]
        m |= 1 << i
    return m


def pcie_gbps(t: Topology, level: PCIeLevel) -> float:
    return PCIE_GEN3_GBPS[level] * 2.0 ** (t.pcie_gen - 3)


def on_switch(t: Topology, gpus: list[int]) -> bool:
    """True if all of `gpus` hang off the NVSwitch fabric (every pair fully connected)."""
    return bool(t.nvswitch) and all(g in t.nvswitch for g in gpus)


def pair_gbps(t: Topology, i: int, j: int) -> float:
    """Per-direction bandwidth of the best path between GPUs i and j."""
    if i in t.nvswitch and j in t.nvswitch:
        return t.nvswitch_links * t.nvlink_gbps
    if t.nvlinks[i][j]:
        return t.nvlinks[i][j] * t.nvlink_gbps
    return pcie_gbps(t, t.pcie[i][j])


def ring_gbps(t: Topology, mask: int) -> float:
    """Best Hamiltonian ring over the set by its slowest hop (per direction). 0 for < 2 GPUs."""
    g = members(mask)
    k = len(g)
    if k < 2:
        return 0.0
    if k == 2:
        return pair_gbps(t, g[0], g[1])
    if on_switch(t, g):
        return t.nvswitch_links * t.nvlink_gbps
    # Bottleneck Hamiltonian path DP from g[0]: best[(visited, end)] = widest path's slowest hop.
    cap = [[pair_gbps(t, a, b) if a != b else 0.0 for b in g] for a in g]
    best: dict[tuple[int, int], float] = {(1, 0): float("inf")}
    for visited in range(1, 1 << k, 2):  # paths always contain position 0 (odd masks)
        for end in range(k):
            v = best.get((visited, end))
            if v is None:
                continue
            for nxt in range(1, k):
                if visited & (1 << nxt):
                    continue
                key = (visited | (1 << nxt), nxt)
                w = min(v, cap[end][nxt])
                if w > best.get(key, -1.0):
                    best[key] = w
    full = (1 << k) - 1
    return max(
        (min(best[(full, end)], cap[end][0]) for end in range(1, k) if (full, end) in best),
        default=0.0,
    )


def _nvlink_cycles(t: Topology, g: list[int]) -> list[list[tuple[int, int]]]:
    """Hamiltonian cycles of the direct-NVLink graph on `g`, each once (fixed start, fixed
    orientation), as lists of (a, b) GPU pairs with a < b."""
    k = len(g)
    adj = {a: [b for b in g if b != a and t.nvlinks[a][b]] for a in g}
    start = g[0]
    out: list[list[tuple[int, int]]] = []
    path = [start]
    seen = {start}

    def walk(v: int) -> None:
        if len(path) == k:
            if t.nvlinks[v][start] and path[1] < path[-1]:
                hops = [*itertools.pairwise(path), (v, start)]
                out.append([(min(a, b), max(a, b)) for a, b in hops])
            return
        for w in adj[v]:
            if w not in seen:
                seen.add(w)
                path.append(w)
                walk(w)
                path.pop()
                seen.discard(w)

    walk(start)
    return out


def nvlink_channels(t: Topology, mask: int) -> int:
    """How many one-way NVLink rings (NCCL channels, one link each per hop) fit in the set."""
    g = members(mask)
    k = len(g)
    if k < 2:
        return 0
    if on_switch(t, g):
        return t.nvswitch_links  # each ring takes one switch link of each GPU per direction
    if k == 2:
        return t.nvlinks[g[0]][g[1]]  # a 2-GPU ring uses the pair both ways
    # Undirected cycles packed within link counts; each also runs reversed (full duplex).
    bound = min(sum(t.nvlinks[a][b] for b in g) for a in g) // 2
    if bound == 0:
        return 0
    cycles = _nvlink_cycles(t, g)
    if not cycles:
        return 0
    residual = {(a, b): t.nvlinks[a][b] for a, b in itertools.combinations(g, 2)}
    best = 0

    def pack(first: int, count: int) -> None:
        nonlocal best
        best = max(best, count)
        if best == bound:
            return
        for ci in range(first, len(cycles)):
            hops = cycles[ci]
            if all(residual[h] > 0 for h in hops):
                for h in hops:
                    residual[h] -= 1
                pack(ci, count + 1)  # a cycle may be used again
                for h in hops:
                    residual[h] += 1
                if best == bound:
                    return

    pack(0, 0)
    return 2 * best


def allreduce_gbps(t: Topology, mask: int) -> float:
    """NCCL-style bus bandwidth of a ring allreduce over the set (0 for < 2 GPUs)."""
    return max(nvlink_channels(t, mask) * t.nvlink_gbps, ring_gbps(t, mask))


def bisection_gbps(t: Topology, mask: int) -> float:
    """Worst balanced cut of the set: NVLink bandwidth across it plus its slowest PCIe path."""
    g = members(mask)
    k = len(g)
    if k < 2:
        return 0.0
    if on_switch(t, g):
        return (k // 2) * t.nvswitch_links * t.nvlink_gbps
    worst = float("inf")
    # With equal halves, keeping g[0] on side a lists each cut once.
    sides = (
        ({g[0], *s} for s in itertools.combinations(g[1:], k // 2 - 1))
        if k % 2 == 0
        else (set(s) for s in itertools.combinations(g, k // 2))
    )
    for a in sides:
        b = [x for x in g if x not in a]
        links = sum(t.nvlinks[x][y] for x in a for y in b) * t.nvlink_gbps
        level = max(t.pcie[x][y] for x in a for y in b)
        worst = min(worst, links + pcie_gbps(t, level))
    return worst


def numa_nodes(t: Topology, mask: int) -> int:
    return len({t.gpus[i].numa_node for i in members(mask)})


def score(t: Topology, mask: int) -> SetScore:
    return SetScore(
        allreduce_gbps=allreduce_gbps(t, mask),
        ring_gbps=ring_gbps(t, mask),
        bisection_gbps=bisection_gbps(t, mask),
        numa_nodes=numa_nodes(t, mask),
    )


def has_nvlink_ring(t: Topology, mask: int) -> bool:
    """True if the GPUs can form a ring using NVLink (direct or NVSwitch) on every hop."""
    return nvlink_channels(t, mask) > 0
