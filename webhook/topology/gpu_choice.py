"""Optimal choice of k free GPUs inside one node, cached per topology class.

The choice maximises, in this order: allreduce bandwidth, best single ring, bisection bandwidth,
NUMA alignment (fewest NUMA nodes), then what is left behind: the sum over every size j of the
best allreduce bandwidth a later j-GPU request could still get from the remaining free GPUs
(fragmentation-aware). Remaining ties go to the lowest GPU indices. Every k-subset of the free
GPUs is considered (at most 70 on an 8-GPU node), so the choice is exact, not a proxy. On
uniform NVSwitch nodes every set has the same bandwidth and only NUMA packing differs: taking
whole NUMA nodes largest first, and the last one best-fit, uses the fewest NUMA nodes (exact)
and keeps the other NUMA nodes whole.

Caches are per topology class (`codec.topology_class`): all DGX-1 V100 nodes share one table of
set scores and one table of choices per (free mask, k), found through a `TableCache` its user
owns.
"""

from __future__ import annotations

import functools
import itertools
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

from webhook.lru import Lru
from webhook.topology import scoring
from webhook.topology.codec import topology_class
from webhook.topology.model import Topology
from webhook.topology.scoring import SetScore


class ClassTables:
    """Memoised scores and choices for one topology class. Thread-safe enough for the binder:
    entries are computed from immutable data and a race only computes one twice."""

    def __init__(self, t: Topology) -> None:
        self.topology = t
        self.key = topology_class(t)
        self.n = t.size
        self.uniform = bool(t.nvswitch) and len(t.nvswitch) == t.size and not any(
            any(row) for row in t.nvlinks
        )
        self._scores: dict[int, SetScore] = {}
        self._best: dict[int, tuple[float, ...]] = {}
        self._choice: dict[tuple[int, int], int | None] = {}
        self._placement: dict[tuple[int, int], tuple[float, ...]] = {}
        self._indices: dict[int, tuple[int, ...]] = {}

    def indices(self, mask: int) -> tuple[int, ...]:
        """The GPU indices of a set, ascending (every placed member reads its set's)."""
        out = self._indices.get(mask)
        if out is None:
            out = self._indices[mask] = tuple(scoring.members(mask))
        return out

    def score(self, mask: int) -> SetScore:
        s = self._scores.get(mask)
        if s is None:
            s = self._scores[mask] = scoring.score(self.topology, mask)
        return s

    def best_by_size(self, mask: int) -> tuple[float, ...]:
        """Entry j: the best allreduce bandwidth of any j-subset of `mask`."""
        b = self._best.get(mask)
        if b is not None:
            return b
        size = mask.bit_count()
        if size == 0:
            b = (0.0,)
        else:
            best = [0.0] * (size + 1)
            rest = mask
            while rest:
                low = rest & -rest
                rest ^= low
                for j, v in enumerate(self.best_by_size(mask ^ low)):
                    best[j] = max(best[j], v)
            best[size] = self.score(mask).allreduce_gbps
            b = tuple(best)
        self._best[mask] = b
        return b

    def future(self, remaining: int) -> float:
        """How good the GPUs left free stay for later requests of every size."""
        if self.uniform:  # every j-set is as good as any other: only the count matters
            size = remaining.bit_count()
            t = self.topology
            return max(size - 1, 0) * t.nvswitch_links * t.nvlink_gbps
        return sum(self.best_by_size(remaining)[2:])

    def choose(self, free: int, k: int) -> int | None:
        """Best k-subset (bitmask) of `free`, or None if fewer than k are free."""
        key = (free, k)
        if key in self._choice:
            return self._choice[key]
        if k <= 0 or free.bit_count() < k:
            result = None
        elif self.uniform:
            result = self._numa_best_fit(free, k)
        else:
            result = self._enumerate(free, k)
        self._choice[key] = result
        return result

    def placement_key(self, free: int, k: int) -> tuple[float, ...]:
        """Sort key (smaller is better) for putting k GPUs on a node with `free` GPUs: the best
        set's allreduce bandwidth (what the step time reads); then the least loss of what the
        node can still offer (`future` before minus after: a node whose intact NVLink quad a
        1-GPU gang would break loses more than one whose leftovers no 4-GPU gang could use);
        then best fit (fewest GPUs left free); then the set's other scores (ring, bisection,
        NUMA span) and what the rest is worth. Least loss and best fit before the other scores
        keep small gangs in part-used nodes, and whole NVLink sets whole for the gangs that
        need them (docs/topology.md, "Bench figures"). Element 0 is minus the set's allreduce
        bandwidth. Requires k <= free GPUs."""
        key = self._placement.get((free, k))
        if key is None:
            mask = self.choose(free, k)
            assert mask is not None, "placement_key needs k free GPUs"
            a, r, b, numa = self.score(mask).rank_key()
            left = free & ~mask
            after = self.future(left)
            key = (-a, self.future(free) - after, left.bit_count(), -r, -b, -numa, -after)
            self._placement[(free, k)] = key
        return key

    def warm(self) -> None:
        """Precompute every (free mask, k) choice; about 25 ms for an 8-GPU class."""
        if self.n <= 8:
            for free in range(1 << self.n):
                for k in range(1, free.bit_count() + 1):
                    self.placement_key(free, k)

    def _enumerate(self, free: int, k: int) -> int:
        best_mask = 0
        best_key: tuple[float, float, float, int, float] | None = None
        for combo in itertools.combinations(scoring.members(free), k):
            mask = scoring.to_mask(combo)
            s = self.score(mask).rank_key()
            key = (*s, self.future(free & ~mask))
            if best_key is None or key > best_key:  # strict: lowest indices win ties
                best_key, best_mask = key, mask
        return best_mask

    def _numa_best_fit(self, free: int, k: int) -> int:
        # All sets have equal bandwidth: use as few NUMA nodes as possible, taking whole groups
        # largest first and the last one best-fit, so other groups stay whole.
        groups: dict[int | None, list[int]] = {}
        for i in scoring.members(free):
            groups.setdefault(self.topology.gpus[i].numa_node, []).append(i)
        ordered = sorted(groups.values(), key=lambda g: (-len(g), g[0]))
        chosen: list[int] = []
        while len(chosen) < k:
            need = k - len(chosen)
            fits = [g for g in ordered if len(g) >= need]
            group = min(fits, key=lambda g: (len(g), g[0])) if fits else ordered[0]
            ordered.remove(group)
            chosen.extend(group[: min(need, len(group))])
        return scoring.to_mask(chosen)


class TableCache:
    """The ClassTables of each topology class, found from a node's Topology object, and each
    node's usable free GPUs: caches owned by the caller. The binder keeps one for its life (its
    nodes keep their decoded Topology objects, so a lookup is one dictionary hit); a one-off
    caller (the CLI, simulate) gets a fresh one per call.

    Every node has its own Topology object (its own GPU UUIDs), so what is kept per object is
    held only while the object lives (a weak reference): the map is as large as the cluster its
    owner holds, never smaller (a fixed bound below the node count made every placement on a
    larger cluster recompute each node's class) nor larger (a node's old Topology takes its
    entry with it). Everything else is keyed on what repeats across nodes and calls: the
    topology class, and (free GPUs, healthy GPUs) for the usable mask."""

    def __init__(self, classes: int = 64, masks: int = 16384, *, warm: bool = True) -> None:
        # warm: compute every table up front (88 ms for a DGX-1 V100), for a long-lived owner;
        # a one-off caller fills only the entries it asks for
        self.warm = warm
        self._by_class: Lru[str, ClassTables] = Lru(classes)
        # id of a live Topology -> (weak reference to it, its class's tables, healthy mask)
        self._by_object: dict[int, _Known] = {}
        # (free GPU indices, healthy mask) -> usable free mask: 8-GPU nodes have at most 256
        # free sets per health state, however many nodes share them
        self._masks: Lru[tuple[frozenset[int], int], int] = Lru(masks)
        self._lock = threading.Lock()

    def tables(self, t: Topology) -> ClassTables:
        return self._known(t).tables

    def usable(self, t: Topology, free: frozenset[int]) -> tuple[ClassTables, int]:
        """(class tables, usable free mask) of a node: one lookup when the node asks with the
        free set it last asked with (its state is kept until a placement changes it), else two
        (`frozenset` caches its hash)."""
        known = self._known(t)
        if not free:  # a node whose GPUs are all taken; `last` is kept for its free set
            return known.tables, 0
        last = known.last
        if last[0] is free:
            return known.tables, last[1]
        key = (free, known.healthy)
        mask = self._masks.get(key)
        if mask is None:
            mask = usable_mask(t, free)
            self._masks.put(key, mask)
        known.last = (free, mask)  # one assignment: a thread beside reads a matching pair
        return known.tables, mask

    def objects(self) -> int:
        """Topology objects known (as many as the live nodes that were looked at)."""
        return len(self._by_object)

    def _known(self, t: Topology) -> _Known:
        key = id(t)
        hit = self._by_object.get(key)
        if hit is not None and hit.ref() is t:
            return hit
        cls = topology_class(t)
        with self._lock:
            tables = self._by_class.get(cls)
            if tables is None:
                tables = ClassTables(t)
                if self.warm:
                    tables.warm()
                self._by_class.put(cls, tables)
        entry = _Known(weakref.ref(t, functools.partial(_forget, self._by_object, key)), tables,
                       usable_mask(t, range(t.size)))
        self._by_object[key] = entry
        return entry


@dataclass(slots=True)
class _Known:
    """What a TableCache keeps per live Topology object: a weak reference to it, its class's
    tables, its healthy GPUs as a bitmask, and the free set it was last asked about with that
    set's usable mask."""

    ref: weakref.ref[Topology]
    tables: ClassTables
    healthy: int
    last: tuple[frozenset[int] | None, int] = (None, 0)


def _forget(known: dict[int, _Known], key: int, ref: weakref.ref[Topology]) -> None:
    """A Topology is gone: drop its entry, unless its id already names a newer object's."""
    entry = known.get(key)
    if entry is not None and entry.ref is ref:
        known.pop(key, None)


def usable_mask(t: Topology, free: Iterable[int]) -> int:
    """Free GPUs that exist and are healthy, as a bitmask."""
    m = 0
    for i in free:
        if 0 <= i < t.size and t.gpus[i].healthy:
            m |= 1 << i
    return m


def choose_gpus(t: Topology, free: Iterable[int], k: int, tables: TableCache | None = None
                ) -> tuple[int, ...] | None:
    """The best k GPUs among `free` on a node of topology `t` (sorted indices), or None when
    fewer than k healthy GPUs are free."""
    class_tables = _class_tables(t, tables)
    mask = class_tables.choose(usable_mask(t, free), k)
    return None if mask is None else class_tables.indices(mask)


def set_score(t: Topology, gpus: Iterable[int], tables: TableCache | None = None) -> SetScore:
    """Scores of a given GPU set (cached per class in `tables`)."""
    return _class_tables(t, tables).score(scoring.to_mask(gpus))


def _class_tables(t: Topology, tables: TableCache | None) -> ClassTables:
    """`t`'s class tables: the caller's cached ones, else fresh ones for this call."""
    return tables.tables(t) if tables is not None else ClassTables(t)
