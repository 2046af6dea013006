"""A re-implementation of NVIDIA go-gpuallocator's best-effort policy (used by the NVIDIA device
plugin's GetPreferredAllocation), written from its documented behaviour, for comparison.

The policy scores a pair of GPUs by summing its links: the PCIe common ancestor (same board 60,
one switch 50, several switches 40, host bridge 30, same CPU 20, across CPUs 10) plus 100 per
direct NVLink link. NVSwitch links are not seen (their remote end is the switch, not a GPU).
A set scores the sum over its pairs. To pick `size` GPUs it pads the free GPUs with empty slots
to a multiple of `size`, walks every partition of them into sets of `size` (each set padded
fully or not at all), keeps the first partition with the highest total score, and returns the
highest-scoring set of that partition (first on ties).

One deliberate difference: upstream may return a padded set (with a nil device) when it wins;
that allocation would be invalid, so here the best set without padding is returned instead.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import combinations

from webhook.topology.model import PCIeLevel, Topology

_PCIE_SCORE = {
    PCIeLevel.INTERNAL: 60,
    PCIeLevel.PIX: 50,
    PCIeLevel.PXB: 40,
    PCIeLevel.PHB: 30,
    PCIeLevel.NODE: 20,
    PCIeLevel.SYS: 10,
}

_Slot = int | None  # a GPU index, or padding


def pair_score(t: Topology, i: int, j: int) -> int:
    if i == j:
        return 0
    return _PCIE_SCORE[t.pcie[i][j]] + 100 * t.nvlinks[i][j]


def set_score(t: Topology, gpus: Sequence[_Slot]) -> int:
    return sum(
        pair_score(t, a, b) for a, b in combinations(gpus, 2) if a is not None and b is not None
    )


def _partitions(slots: list[_Slot], size: int, padding: int) -> Iterator[list[list[_Slot]]]:
    """Partitions of `slots` into sets of `size`, in upstream's order: each set holds the first
    remaining slot plus a combination of the others (lexicographic), padded fully or not at all.
    """
    if len(slots) == size:
        yield [slots]
        return
    head, tail = slots[0], slots[1:]
    for rest in combinations(tail, size - 1):
        chosen = [head, *rest]
        pads = sum(1 for s in chosen if s is None)
        if pads not in (0, padding):
            continue
        remaining = _without(tail, rest)
        for part in _partitions(remaining, size, padding):
            yield [chosen, *part]


def _without(tail: list[_Slot], rest: tuple[_Slot, ...]) -> list[_Slot]:
    # Remove one slot per taken one: padding slots are all None and must not go all at once.
    out = list(tail)
    for s in rest:
        out.remove(s)
    return out


def allocate(t: Topology, available: Sequence[int], size: int) -> tuple[int, ...]:
    """The GPUs best-effort would give a container asking for `size` (empty if impossible)."""
    devices = sorted(available)
    if size <= 0 or len(devices) < size:
        return ()
    if size == 1:
        return (devices[0],)  # every single-GPU partition scores 0: the first one wins
    slots: list[_Slot] = list(devices)
    while len(slots) % size:
        slots.append(None)
    padding = len(slots) - len(devices)
    best: list[list[_Slot]] | None = None
    best_score = 0
    for part in _partitions(slots, size, padding):
        total = sum(set_score(t, s) for s in part)
        if best is None or total > best_score:
            best, best_score = part, total
    assert best is not None
    real = [s for s in best if None not in s]
    chosen = real[0]
    chosen_score = set_score(t, chosen)
    for s in real[1:]:
        sc = set_score(t, s)
        if sc > chosen_score:
            chosen, chosen_score = s, sc
    return tuple(sorted(i for i in chosen if i is not None))
