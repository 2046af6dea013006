"""Gang placement on a set of nodes: which nodes, and which GPUs on each, for every member of a
gang (`hierarchy` first chooses the network domains whose nodes these are).

Order of preference: fewest nodes; then the best allreduce bandwidth; then the least loss of
what the node can still offer later gangs (`ClassTables.placement_key`); then best fit (the
fewest free GPUs left on the node); then the set's ring, bisection and NUMA span; then the best
sets left behind; then the caller's rank (node name by default), so the result is deterministic.
GPU members of the gang on one node share one optimally chosen GPU set
(`gpu_choice.ClassTables.choose`), split among them the same way. 0-GPU members (the MPI
launcher) go to a node the gang already uses when it has room, else to the node with the fewest
free GPUs that has room. `min_ring_gbps` (a policy's minRingGBps) is decided by `ringfloor`.

Speed: nodes are looked at once per call, through per-class tables keyed by (class, free mask,
k). The single-node search scores each group of like nodes (same class, same usable free GPUs,
whatever their Topology objects) once, so its per-node cost is two dictionary lookups, one
insert and the resource checks. A caller that places many gangs on one node set (the binder,
cycle after cycle) passes the nodes grouped (`groups.NodeGroups`, kept current as placements
consume nodes): then the single-node search, the multi-node search for identical members and a
0-GPU member's host read the groups, not the nodes, and choose the same nodes. See
bench/bench_placement.py, bench/bench_cycle.py and bench/bench_topology.py's latency rows.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from webhook.topology.gpu_choice import ClassTables, TableCache
from webhook.topology.groups import Members, NodeGroups, RoomKey
from webhook.topology.model import (
    GangPlacement,
    GangRequest,
    MemberPlacement,
    MemberRequest,
    NodeState,
    Unplaceable,
)
from webhook.topology.network import nvlink_level
from webhook.topology.ringfloor import gang_gbps, link_gbps, meets_min_ring

#: GB/s between GPUs on different nodes when nothing better is known: one 100 Gb/s NIC
DEFAULT_INTER_NODE_GBPS = 12.5

#: how nodes that score alike are ordered (smaller first): by name unless the caller says
Rank = Callable[[NodeState], tuple[object, ...]]


def _by_name(n: NodeState) -> tuple[object, ...]:
    return (n.name,)


@dataclass(slots=True, eq=False)
class _Node:
    """A node during one placement: what is still free after the members put on it. One view
    per node (`_Views.get`), so a view is itself: `in` compares identity, not every field."""

    state: NodeState
    tables: ClassTables | None
    free: int  # usable free GPUs at the start, bitmask
    nfree: int
    cpu: int
    mem: int
    pods: int
    members: list[MemberRequest] = field(default_factory=list)

    def fits(self, m: MemberRequest) -> bool:
        return (
            (m.eligible_nodes is None or self.state.name in m.eligible_nodes)
            and m.cpu_milli <= self.cpu
            and m.memory_bytes <= self.mem
            and self.pods >= 1
            and (m.gpus == 0 or (self.tables is not None and m.gpus <= self.nfree))
        )

    def take(self, m: MemberRequest) -> None:
        self.members.append(m)
        self.cpu -= m.cpu_milli
        self.mem -= m.memory_bytes
        self.pods -= 1
        self.nfree -= m.gpus

    def gbps(self) -> float:
        """Allreduce bus bandwidth of the set its GPU members get (0 below 2 GPUs)."""
        k = sum(m.gpus for m in self.members)
        if k < 2:
            return 0.0
        assert self.tables is not None
        return -self.tables.placement_key(self.free, k)[0]


@dataclass(frozen=True, slots=True)
class _Need:
    """What a node must have for some GPU members together: GPUs, CPU, memory, pods, and to
    be in every eligible set."""

    gpus: int
    cpu: int
    mem: int
    pods: int
    eligible: tuple[frozenset[str], ...]

    def room(self, cpu: int, mem: int, pods: int) -> bool:
        return cpu >= self.cpu and mem >= self.mem and pods >= self.pods

    def allows(self, name: str) -> bool:
        return all(name in e for e in self.eligible)


@dataclass(frozen=True, slots=True)
class _GpuGroup:
    """Nodes alike to scoring (class tables, usable free mask) with the GPUs for a `_Need`:
    the first in the list of those that fit it, and the nodes to find the lowest by rank
    among (`_Views.lowest`): those that fit, or the group's rooms (`NodeGroups`)."""

    tables: ClassTables
    free: int
    earliest: tuple[int, NodeState]
    fits: list[tuple[int, NodeState]] | None = None
    rooms: dict[RoomKey, Members] | None = None


class _Views:
    """Per-call node views, made only for nodes that are looked at closely. With `groups` (the
    same nodes, grouped: `groups.NodeGroups`) the single-node search and a 0-GPU member's host
    read its groups instead of every node."""

    def __init__(self, nodes: Sequence[NodeState], tables: TableCache,
                 groups: NodeGroups | None = None, rank: Rank | None = None) -> None:
        self.nodes = nodes
        self.tables = tables
        self.groups = groups
        self.rank = rank or _by_name
        self._views: dict[int, _Node] = {}
        self._gpu: list[tuple[int, NodeState, ClassTables, int]] | None = None
        if groups is not None:
            assert len(groups) == len(nodes), "groups must hold the nodes placed on"
            groups.bind(tables)

    def get(self, n: NodeState, usable: tuple[ClassTables, int] | None = None) -> _Node:
        """The node's view; `usable`: its (tables, usable free mask), when already looked up."""
        v = self._views.get(id(n))
        if v is None:
            tables, free = usable or (self.tables.usable(n.topology, n.free_gpus)
                                      if n.topology else (None, 0))
            v = self._views[id(n)] = _Node(n, tables, free, free.bit_count(), n.free_cpu_milli,
                                           n.free_memory_bytes, n.free_pods)
        return v

    def gpu_nodes(self) -> list[tuple[int, NodeState, ClassTables, int]]:
        """(position, node, tables, free mask) of every node with a topology and a usable free
        GPU, looked up once per call (the single-node and the multi-node search both read
        them)."""
        if self._gpu is None:
            self._gpu = []
            for i, n in enumerate(self.nodes):
                if n.topology is not None and n.free_gpus:
                    tables, free = self.tables.usable(n.topology, n.free_gpus)
                    if free:
                        self._gpu.append((i, n, tables, free))
        return self._gpu

    def _hosts(self) -> Iterator[tuple[int, int, int]]:
        """(usable free GPUs, position of the first, how many) for the nodes with some, alike in
        that count: a group's nodes with `groups`, else each node (for messages)."""
        if self.groups is None:
            for i, *_, free in self.gpu_nodes():
                yield free.bit_count(), i, 1
            return
        for (tables, free), rooms in self.groups.groups():
            if tables is not None and free:
                yield (free.bit_count(), min(m.positions[0] for m in rooms.values()),
                       sum(len(m.names) for m in rooms.values()))

    def most_free(self) -> int:
        """The most usable free GPUs on one node (on the hot path: counts only, not `_hosts`)."""
        if self.groups is not None:
            return max((free.bit_count() for (tables, free), _ in self.groups.groups()
                        if tables is not None), default=0)
        return max((free.bit_count() for *_, free in self.gpu_nodes()), default=0)

    def free_gpus(self) -> tuple[int, int]:
        """(usable free GPUs, nodes with some) over every node."""
        runs = list(self._hosts())
        return sum(free * count for free, _, count in runs), sum(count for *_, count in runs)

    def most_free_node(self) -> tuple[int, str] | None:
        """(usable free GPUs, name) of the node with the most, the first in the list of those
        (for messages)."""
        best = max(((free, -at) for free, at, _ in self._hosts()), default=None)
        return None if best is None else (best[0], self.nodes[-best[1]].name)

    def gpu_groups(self, need: _Need) -> Iterator[_GpuGroup]:
        """`gpu_nodes` with `need.gpus` free GPUs, grouped by what scoring them reads, their
        class's tables and usable free mask, with their nodes that fit `need`. Scoring a group
        once, not each of its nodes, is what keeps a placement cheap on a large cluster of like
        nodes (each with its own Topology object)."""
        if self.groups is not None:
            yield from self._indexed_groups(self.groups, need)
            return
        groups: dict[tuple[ClassTables, int], list[tuple[int, NodeState]]] = {}
        for i, n, tables, free in self.gpu_nodes():
            if free.bit_count() >= need.gpus:
                groups.setdefault((tables, free), []).append((i, n))
        for (tables, free), group in groups.items():
            fits = [
                (i, n) for i, n in group
                if n.free_cpu_milli >= need.cpu and n.free_memory_bytes >= need.mem
                and n.free_pods >= need.pods
            ]
            if need.eligible:
                fits = [(i, n) for i, n in fits if need.allows(n.name)]
            if fits:
                yield _GpuGroup(tables, free, fits[0], fits=fits)

    def _indexed_groups(self, groups: NodeGroups, need: _Need) -> Iterator[_GpuGroup]:
        for (tables, free), rooms in groups.groups():
            if tables is None or free.bit_count() < need.gpus:
                continue
            earliest = _earliest(groups, rooms, need)
            if earliest is not None:
                yield _GpuGroup(tables, free, earliest, rooms=rooms)

    def lowest(self, g: _GpuGroup, need: _Need) -> NodeState:
        """The group's node that fits `need` and comes first by rank: the first fitting name of
        each room with `NodeGroups` ranked by name; else every fitting node ranked."""
        if g.fits is not None:
            return min((n for _, n in g.fits), key=self.rank)
        assert self.groups is not None and g.rooms is not None
        names = (name for room, members in g.rooms.items() if need.room(*room)
                 for name in ((members.first_name(need.allows),) if self.rank is _by_name
                              else (n for n in members.names if need.allows(n))))
        return min((self.groups.state(n) for n in names if n is not None), key=self.rank)

    def cpu_host(self, m: MemberRequest, skip: Sequence[_Node]) -> NodeState | None:
        """The node, not in `skip` (tried first), where the 0-GPU member `m` fits with the
        fewest free GPUs (spare GPU nodes' CPUs for GPU pods), then the most free CPU, then the
        lowest name."""
        names = {v.state.name for v in skip}
        if self.groups is None:
            best: tuple[int, int, str, NodeState] | None = None
            for n in self.nodes:
                if n.name in names:
                    continue
                v = self.get(n)
                if v.fits(m) and (best is None or (v.nfree, -v.cpu, n.name) < best[:3]):
                    best = (v.nfree, -v.cpu, n.name, n)
            return None if best is None else best[3]

        def ok(name: str) -> bool:
            return name not in names and (m.eligible_nodes is None or name in m.eligible_nodes)

        found: tuple[int, int, str] | None = None
        for (_, free), rooms in self.groups.groups():
            for (cpu, mem, pods), members in rooms.items():
                if cpu >= m.cpu_milli and mem >= m.memory_bytes and pods >= 1:
                    name = members.first_name(ok)
                    key = (free.bit_count(), -cpu, name) if name is not None else None
                    if key is not None and (found is None or key < found):
                        found = key
        return None if found is None else self.groups.state(found[2])


def _earliest(groups: NodeGroups, rooms: dict[RoomKey, Members], need: _Need
              ) -> tuple[int, NodeState] | None:
    """Of one group's nodes that fit `need`, the first in the list (None: none fits)."""
    found = [i for room, members in rooms.items() if need.room(*room)
             and (i := members.first_position(lambda p: need.allows(groups.node(p).name)))
             is not None]
    if not found:
        return None
    first = min(found)
    return first, groups.node(first)


def _assign_gpus(node: _Node) -> dict[str, tuple[int, ...]]:
    """One optimal set for all GPU members on the node, split among them largest first."""
    if len(node.members) == 1:  # (most nodes of a multi-node gang: one worker each)
        m = node.members[0]
        if not m.gpus:
            return {}
        assert node.tables is not None
        best = node.tables.choose(node.free, m.gpus)
        assert best is not None
        return {m.key: node.tables.indices(best)}
    gpu_members = sorted((m for m in node.members if m.gpus), key=lambda m: -m.gpus)
    out: dict[str, tuple[int, ...]] = {}
    if not gpu_members:
        return out
    assert node.tables is not None
    union = node.tables.choose(node.free, sum(m.gpus for m in gpu_members))
    assert union is not None
    pool = union
    for m in gpu_members[:-1]:
        part = node.tables.choose(pool, m.gpus)
        assert part is not None
        pool &= ~part
        out[m.key] = node.tables.indices(part)
    out[gpu_members[-1].key] = node.tables.indices(pool)  # what is left is exactly its size
    return out


def _describe_members(members: Sequence[MemberRequest]) -> str:
    sizes = sorted({m.gpus for m in members})
    if len(sizes) == 1:
        return f"{len(members)} members x {sizes[0]} GPU{'s' if sizes[0] > 1 else ''}"
    return f"{len(members)} members with {'/'.join(map(str, sizes))} GPUs"


def place_on_nodes(
    nodes: Sequence[NodeState],
    gang: GangRequest,
    *,
    inter_node_gbps: float = DEFAULT_INTER_NODE_GBPS,
    tables: TableCache | None = None,
    groups: NodeGroups | None = None,
    one_node: bool = False,
    rank: Rank | None = None,
) -> GangPlacement | Unplaceable:
    """Place every member of `gang` on `nodes` (what is free now), or say why it cannot be,
    whatever the network between the nodes (`hierarchy.place_gang` chooses the nodes' domains
    first). `tables`: the caller's cache of per-class choice tables (a fresh one when None).
    `groups`: the same nodes grouped (`groups.NodeGroups`, kept by a caller that places many
    gangs on one node set): the same placement, at a cost of the groups, not the nodes.
    `one_node`: all GPU members on one node, or Unplaceable. `rank`: the order of nodes that
    score alike (the name when None); ranked only among the groups with the best score."""
    if not gang.members:
        return Unplaceable(f"gang {gang.name} has no members")
    bad = next((m for m in gang.members if m.gpus < 0 or m.cpu_milli < 0 or m.memory_bytes < 0),
               None)
    if bad is not None:
        return Unplaceable(f"gang {gang.name}: member {bad.key} asks for a negative amount")
    if len({m.key for m in gang.members}) != len(gang.members):
        return Unplaceable(f"gang {gang.name} lists a member twice")
    gpu_members = [m for m in gang.members if m.gpus > 0]
    views = _Views(nodes, tables or TableCache(warm=False), groups, rank)
    used: list[_Node] = []
    if gpu_members:
        alone = one_node or (gang.single_node and gang.mode == "required")
        placed = _place_gpus(views, gang, gpu_members, alone, inter_node_gbps)
        if isinstance(placed, Unplaceable):
            return placed
        used = placed
    for m in gang.members:
        if m.gpus == 0:
            host = _place_cpu_member(views, used, m)
            if host is None:
                return Unplaceable(
                    f"gang {gang.name}: no eligible node has room for {m.key} "
                    f"({m.cpu_milli}m CPU, {m.memory_bytes} bytes memory)"
                )
            if host not in used:
                used.append(host)
    return _result(used, gang, inter_node_gbps)


def _place_gpus(views: _Views, gang: GangRequest, gpu_members: list[MemberRequest], alone: bool,
                inter_gbps: float) -> list[_Node] | Unplaceable:
    """The nodes of the GPU members: one node when one holds them all (the single-node search),
    else the fewest (the multi-node search). `alone`: one node, or Unplaceable."""
    if alone and (apart := _apart(gang, gpu_members)) is not None:
        return apart
    if not alone and len(gpu_members) > 1 and \
            sum(m.gpus for m in gpu_members) > views.most_free():
        # no node has the GPUs for all of them: the single-node search could only fail
        return _place_multi(views, gang, gpu_members, inter_gbps)
    placed = _place_single(views, gang, gpu_members)
    if not isinstance(placed, Unplaceable):
        return [placed]
    if alone:
        return placed
    multi = _place_multi(views, gang, gpu_members, inter_gbps)
    if isinstance(multi, Unplaceable):
        return multi if len(gpu_members) > 1 else placed
    return placed if len(multi) == 1 else multi  # one node after all: it failed the search


def _apart(gang: GangRequest, members: Sequence[MemberRequest]) -> Unplaceable | None:
    """Members that may share no node, when the gang must be on one: a lasting conflict (as
    when another scheduler, such as Kueue's topology-aware scheduling, pinned them to nodes
    apart), said apart from a lack of free GPUs."""
    pinned = [nodes for m in members if (nodes := m.eligible_nodes) is not None]
    if len(pinned) < 2 or not all(pinned) or frozenset.intersection(*pinned):
        return None  # (a member no node may host is said where the search fails)
    return Unplaceable(
        f"gang {gang.name} must be on one node, but its members' node selectors, affinity or "
        f"tolerations leave them no node in common: {where_pinned(members)}"
    )


def where_pinned(members: Sequence[MemberRequest], most: int = 3) -> str:
    """The nodes each member with eligible nodes may use, the first `most` of them."""
    pinned = [(m.key, nodes) for m in members if (nodes := m.eligible_nodes) is not None]
    shown = "; ".join(f"{key} may use {_few(nodes, most)}" for key, nodes in pinned[:most])
    return shown + (f"; and {len(pinned) - most} more" if len(pinned) > most else "")


def _few(names: frozenset[str], most: int) -> str:
    rest = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(sorted(names)[:most]) + rest


def _place_single(
    views: _Views, gang: GangRequest, gpu_members: list[MemberRequest]
) -> _Node | Unplaceable:
    total = sum(m.gpus for m in gpu_members)
    need = _Need(total, sum(m.cpu_milli for m in gpu_members),
                 sum(m.memory_bytes for m in gpu_members), len(gpu_members),
                 tuple({m.eligible_nodes for m in gpu_members if m.eligible_nodes is not None}))
    floor = gang.min_ring_gbps if gang.mode == "required" else None
    scored: list[tuple[tuple[float, ...], _GpuGroup]] = []
    best_refused: tuple[float, int, str] | None = None  # the best node below minRingGBps
    for g in views.gpu_groups(need):
        pkey = g.tables.placement_key(g.free, total)  # one per group: its nodes score alike
        if floor is not None and not meets_min_ring(-pkey[0], floor, total):
            # ties go to the node that comes first, as in a scan
            if best_refused is None or (-pkey[0], -g.earliest[0]) > best_refused[:2]:
                best_refused = (-pkey[0], -g.earliest[0], g.earliest[1].name)
            continue
        scored.append((pkey, g))
    if scored:
        # the best key, then the rank among the groups that share it (ranked only there)
        top = min(pkey for pkey, _ in scored)
        best = min((views.lowest(g, need) for pkey, g in scored if pkey == top),
                   key=views.rank)
        v = views.get(best)
        for m in gpu_members:
            v.take(m)
        return v
    if best_refused is not None and floor is not None:
        return Unplaceable(
            f"gang {gang.name} needs {total} GPUs on one node with an allreduce bus bandwidth "
            f"of at least {floor:g} GB/s (minRingGBps); the best eligible node "
            f"({best_refused[2]}) offers {best_refused[0]:g} GB/s"
        )
    most_free = views.most_free_node()
    where = (
        f"the node with the most free GPUs ({most_free[1]}) has {most_free[0]}"
        if most_free is not None
        else "no node with a published GPU topology has a free GPU"
    )
    return Unplaceable(
        f"gang {gang.name} needs {total} GPUs ({_describe_members(gpu_members)}) on one node "
        f"with room for them; {where}"
    )


def _place_multi(
    views: _Views, gang: GangRequest, gpu_members: list[MemberRequest], inter_gbps: float
) -> list[_Node] | Unplaceable:
    shape = {(m.gpus, m.cpu_milli, m.memory_bytes, m.eligible_nodes) for m in gpu_members}
    if len(shape) == 1:
        chosen = _multi_uniform(views, gpu_members)
    else:
        chosen = _multi_mixed(views, gpu_members)
    total = sum(m.gpus for m in gpu_members)
    if isinstance(chosen, int):
        free, hosts = views.free_gpus()
        return Unplaceable(
            f"gang {gang.name} needs {total} GPUs ({_describe_members(gpu_members)}); the "
            f"eligible nodes can host {chosen} of its {len(gpu_members)} GPU members now "
            f"({free} GPUs free on {hosts} nodes)"
        )
    floor = gang.min_ring_gbps if gang.mode == "required" else None
    if floor is None or len(chosen) < 2:  # (the figure is worked out once, in `_result`)
        return chosen
    between = link_gbps([v.state for v in chosen], inter_gbps)
    figure = gang_gbps([v.gbps() for v in chosen], between)
    if not meets_min_ring(figure, floor, total):
        where = "between nodes" if figure == between else "on the nodes it would use"
        return Unplaceable(
            f"gang {gang.name} needs {total} GPUs with an allreduce bus bandwidth of at least "
            f"{floor:g} GB/s (minRingGBps); no single node can host it and {where} only "
            f"{figure:g} GB/s is available{_over_domains(chosen, figure == between)}"
        )
    return chosen


def _over_domains(chosen: list[_Node], network_bound: bool) -> str:
    """A hint when the network bounds a gang whose nodes span NVLink domains, inside one of
    which NVLink would join them."""
    domains = {v.state.nvlink_domain for v in chosen}
    named = sorted(d for d in domains if d is not None)
    if not network_bound or not named or len(domains) < 2:
        return ""
    return (" (its nodes span NVLink domains, and NVLink joins only the nodes of one: a gang "
            f"requires one with network: {{required: {nvlink_level(named[0])}}})")


def member_capacity(n: NodeState, free: int, m: MemberRequest) -> int:
    """How many members like `m` fit on the node, whose usable free GPUs are `free`."""
    if m.eligible_nodes is not None and n.name not in m.eligible_nodes:
        return 0
    return capacity(free, n.free_cpu_milli, n.free_memory_bytes, n.free_pods, m)


def capacity(free: int, cpu_milli: int, memory_bytes: int, pods: int, m: MemberRequest) -> int:
    """How many members like `m` fit in this much room (usable free GPUs as a bitmask), whatever
    the node's name: all a node's capacity reads, so callers may remember it by these."""
    c = min(free.bit_count() // m.gpus, pods)
    if m.cpu_milli:
        c = min(c, cpu_milli // m.cpu_milli)
    if m.memory_bytes:
        c = min(c, memory_bytes // m.memory_bytes)
    return c


@dataclass(slots=True)
class _Bucket:
    """Nodes alike for one member shape: the same class tables and usable free GPUs, so the
    same GPU sets; the same room, so `cap` members each; `names` the eligible ones, sorted."""

    cap: int
    tables: ClassTables
    free: int
    names: list[str]

    def first(self, skip: set[str]) -> str | None:
        return next((n for n in self.names if n not in skip), None)


class _Ranked:
    """The nodes that hold a member like `m`, in the multi-node search's order: the most
    members first, then the best set for them (`placement_key`), then the name. Read from
    buckets of like nodes (one per group with `NodeGroups`: a gang's search then costs the
    groups and the nodes it takes, not the cluster), and merged by name only as far as read."""

    def __init__(self, views: _Views, m: MemberRequest) -> None:
        self.gpus = m.gpus
        buckets = _buckets(views, m)
        self.state = views.groups.state if views.groups is not None else \
            {n.name: n for n in views.nodes}.__getitem__
        self.buckets = buckets
        self.total = sum(b.cap * len(b.names) for b in buckets)
        buckets.sort(key=self._order)
        self._stream = self._merged()
        #: the nodes read so far, in order: (members it holds, name, its bucket)
        self.head: list[tuple[int, str, _Bucket]] = []

    def _order(self, b: _Bucket) -> tuple[int, tuple[float, ...]]:
        return -b.cap, b.tables.placement_key(b.free, b.cap * self.gpus)

    def _merged(self) -> Iterator[tuple[int, str, _Bucket]]:
        for _, alike in itertools.groupby(self.buckets, key=self._order):
            for name, b in heapq.merge(*(zip(b.names, itertools.repeat(b)) for b in alike)):
                yield b.cap, name, b

    def at(self, i: int) -> tuple[int, str, _Bucket]:
        while len(self.head) <= i:
            self.head.append(next(self._stream))
        return self.head[i]

    def all(self) -> list[tuple[int, str, _Bucket]]:
        self.head.extend(self._stream)
        return self.head

    def best_for(self, need: int, start: int) -> tuple[int, str, _Bucket]:
        """Of the nodes after the first `start`, one that holds `need` members with the best
        set for them, then the lowest name."""
        taken = {name for _, name, _ in self.head[:start]}
        best: tuple[tuple[float, ...], str, _Bucket] | None = None
        for b in self.buckets:
            if b.cap < need:
                continue
            name = b.first(taken)
            if name is None:
                continue
            key = b.tables.placement_key(b.free, need * self.gpus)
            if best is None or (key, name) < best[:2]:
                best = (key, name, b)
        assert best is not None, "a node after the first `start` holds `need`"
        return best[2].cap, best[1], best[2]


def _buckets(views: _Views, m: MemberRequest) -> list[_Bucket]:
    """The nodes that hold a member like `m`, in buckets of like nodes."""
    eligible = m.eligible_nodes
    out: list[_Bucket] = []
    if views.groups is not None:
        for (tables, free), rooms in views.groups.groups():
            if tables is None or not free:
                continue
            for (cpu, mem, pods), members in rooms.items():
                c = capacity(free, cpu, mem, pods, m)
                if c > 0:
                    names = members.names if eligible is None else \
                        [n for n in members.names if n in eligible]
                    if names:
                        out.append(_Bucket(c, tables, free, names))
        return out
    alike: dict[tuple[ClassTables, int, int], _Bucket] = {}
    for _, n, tables, free in views.gpu_nodes():
        c = member_capacity(n, free, m)
        if c > 0:
            b = alike.get((tables, free, c))
            if b is None:
                b = alike[(tables, free, c)] = _Bucket(c, tables, free, [])
            b.names.append(n.name)
    for b in alike.values():
        b.names.sort()
    return list(alike.values())


def _multi_uniform(views: _Views, members: list[MemberRequest]) -> list[_Node] | int:
    """Identical members: the nodes that hold the most of them (ties: best bandwidth, best
    fit), the last the best node that fits the rest; fewest nodes is exact here. When that
    leaves the last node a smaller part than an even split would (7 + 1), the split is evened
    out (`_even_parts`): the smallest part reaches the network through the fewest NICs."""
    ranked = _Ranked(views, members[0])
    if ranked.total < len(members):
        return ranked.total
    parts: list[tuple[tuple[int, str, _Bucket], int]] = []  # (node, members)
    need = len(members)
    i = 0
    while True:
        c = ranked.at(i)[0]
        if c >= need:  # the rest fits on one node: the best of those that can take it
            parts.append((ranked.best_for(need, i), need))
            break
        parts.append((ranked.at(i), c))
        need -= c
        i += 1
    count, need = len(parts), len(members)
    even = min(c, need // count)  # (c: what the count-th node in order holds)
    if parts[-1][1] < even:  # those that hold `even` are a prefix of the order: same indices
        caps = ranked.all()
        parts = [(caps[j], part) for j, part in
                 _even_parts([e[0] for e in caps if e[0] >= even], need, count, even)]
    chosen: list[_Node] = []
    at = 0
    for (_, name, b), part in parts:
        v = views.get(ranked.state(name), (b.tables, b.free))
        for member in members[at:at + part]:
            v.take(member)
        at += part
        chosen.append(v)
    return chosen


def _even_parts(caps: list[int], need: int, count: int, even: int) -> list[tuple[int, int]]:
    """(index into `caps`, members) on `count` nodes for `need` members, each node at least
    `even`: node by node, the smallest capacity that still lets the roomiest left cover the
    rest (best fit; among equal ones the first, the better bandwidth). `caps` is sorted
    roomiest first, and its first `count` hold `need`. Each pick costs a bisection and the
    roomiest left, not a scan of every node."""
    smallest = sorted((c, j) for j, c in enumerate(caps))
    taken: set[int] = set()
    left = need
    for k in range(count - 1, -1, -1):  # k: nodes still to pick after this one
        top = list(itertools.islice((j for j in range(len(caps)) if j not in taken), k + 1))
        head, covered = set(top[:k]), sum(caps[j] for j in top[:k])
        # a node outside the k roomiest works when it holds what they leave over
        at = bisect.bisect_left(smallest, (left - covered, -1))
        while at < len(smallest) and smallest[at][1] in head:
            at += 1
        pick = smallest[at][1] if at < len(smallest) else None
        # one of them works when they and the next roomiest hold it all; the smallest of them
        if head and covered + caps[top[k]] >= left:
            low = min(head, key=lambda j: (caps[j], j))
            if pick is None or (caps[low], low) < (caps[pick], pick):
                pick = low
        assert pick is not None, "the roomiest left always hold the rest"
        taken.add(pick)
        smallest.remove((caps[pick], pick))
        left -= caps[pick]
    # every node gets `even`; the rest fills the nodes with the least room above it first
    out = dict.fromkeys(taken, even)
    extra = need - even * count
    for j in sorted(taken, key=lambda j: (caps[j], j)):
        more = min(caps[j] - even, extra)
        out[j] += more
        extra -= more
    return sorted(out.items())


def _multi_mixed(views: _Views, members: list[MemberRequest]) -> list[_Node] | int:
    """Different member sizes: first-fit decreasing over nodes ordered by free GPUs."""
    order = sorted(
        (views.get(n, (tables, free)) for _, n, tables, free in views.gpu_nodes()),
        key=lambda v: (-v.nfree, v.state.name),
    )
    chosen: list[_Node] = []
    names: set[str] = set()  # the chosen ones, not scanned for each member
    placed = 0
    for m in sorted(members, key=lambda m: -m.gpus):
        host = next((v for v in chosen if v.fits(m)), None)
        if host is None:
            host = next((v for v in order if v.state.name not in names and v.fits(m)), None)
            if host is None:
                continue
            chosen.append(host)
            names.add(host.state.name)
        host.take(m)
        placed += 1
    return chosen if placed == len(members) else placed


def _place_cpu_member(views: _Views, used: list[_Node], m: MemberRequest) -> _Node | None:
    for v in used:
        if v.fits(m):
            v.take(m)
            return v
    host = views.cpu_host(m, used)
    if host is None:
        return None
    v = views.get(host)
    v.take(m)
    return v


def _result(used: list[_Node], gang: GangRequest, inter_gbps: float) -> GangPlacement:
    by_key: dict[str, MemberPlacement] = {}
    ring: dict[str, float] = {}
    gpu_nodes: list[NodeState] = []
    for v in used:
        gpus = _assign_gpus(v)
        if gpus:
            ring[v.state.name] = v.gbps()
            gpu_nodes.append(v.state)
        for m in v.members:
            by_key[m.key] = MemberPlacement(key=m.key, node=v.state.name, gpus=gpus.get(m.key, ()))
    placements = [by_key[m.key] for m in gang.members]
    return GangPlacement(
        members=tuple(placements),
        nodes_used=len({p.node for p in placements}),
        ring_gbps=ring,
        gang_gbps=gang_gbps(ring.values(), link_gbps(gpu_nodes, inter_gbps)),
    )
