"""Gang placement across nodes: which nodes, and which GPUs on each, for every member of a gang.

Order of preference: fewest nodes; then the best allreduce bandwidth; then least fragmentation
(best fit: the fewest free GPUs left on the node, then the best sets left behind); then node name,
so the result is deterministic. GPU members of the gang on one node share one optimally chosen
GPU set (`inode.ClassTables.choose`), split among them the same way. 0-GPU members (the MPI
launcher) go to a node the gang already uses when it has room, else to the node with the fewest
free GPUs that has room.

Speed: nodes are looked at once per call, through per-class tables keyed by (class, free mask,
k), so the per-node cost is a few dictionary lookups. See bench/bench_placement.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from webhook.topology import scoring
from webhook.topology.inode import ClassTables, tables_for, usable_mask
from webhook.topology.model import (
    GangPlacement,
    GangRequest,
    MemberPlacement,
    MemberRequest,
    NodeState,
    Unplaceable,
)

#: GB/s between GPUs on different nodes when nothing better is known: one 100 Gb/s NIC
DEFAULT_INTER_NODE_GBPS = 12.5

_MASKS: dict[tuple[int, frozenset[int]], int] = {}
_MASKS_LIMIT = 200_000


@dataclass(slots=True)
class _Node:
    state: NodeState
    tables: ClassTables | None
    free: int  # usable free GPUs, bitmask
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


def _view(n: NodeState) -> _Node:
    t = n.topology
    free = 0
    tables = None
    if t is not None:
        tables = tables_for(t)
        key = (id(t), n.free_gpus)
        free = _MASKS.get(key, -1)
        if free < 0:
            free = usable_mask(t, n.free_gpus)
            if len(_MASKS) >= _MASKS_LIMIT:
                _MASKS.clear()
            _MASKS[key] = free
    return _Node(n, tables, free, free.bit_count(), n.free_cpu_milli, n.free_memory_bytes,
                 n.free_pods)


def _option(node: _Node, k: int) -> tuple[tuple[float, float, float, int], int, float]:
    """(rank key of the best k-set, free GPUs left, quality of what is left) on `node`."""
    assert node.tables is not None
    mask = node.tables.choose(node.free, k)
    assert mask is not None
    left = node.free & ~mask
    return node.tables.score(mask).rank_key(), left.bit_count(), node.tables.future(left)


def _rank(node: _Node, k: int) -> tuple[object, ...]:
    """Sort key for hosting k GPUs: best bandwidth, then best fit, then what stays, then name."""
    key, left, future = _option(node, k)
    return (tuple(-x for x in key), left, -future, node.state.name)


def _gbps(node: _Node, k: int) -> float:
    return _option(node, k)[0][0] if k >= 2 else math.inf


def _assign_gpus(node: _Node) -> dict[str, tuple[int, ...]]:
    """One optimal set for all GPU members on the node, split among them largest first."""
    gpu_members = sorted((m for m in node.members if m.gpus), key=lambda m: -m.gpus)
    out: dict[str, tuple[int, ...]] = {}
    if not gpu_members:
        return out
    assert node.tables is not None
    union = node.tables.choose(node.free, sum(m.gpus for m in gpu_members))
    assert union is not None
    pool = union
    for m in gpu_members:
        part = node.tables.choose(pool, m.gpus)
        assert part is not None
        pool &= ~part
        out[m.key] = tuple(scoring.members(part))
    return out


def _describe_members(members: Sequence[MemberRequest]) -> str:
    sizes = sorted({m.gpus for m in members})
    if len(sizes) == 1:
        return f"{len(members)} members x {sizes[0]} GPU{'s' if sizes[0] > 1 else ''}"
    return f"{len(members)} members with {'/'.join(map(str, sizes))} GPUs"


def place_gang(
    nodes: Sequence[NodeState],
    gang: GangRequest,
    *,
    inter_node_gbps: float = DEFAULT_INTER_NODE_GBPS,
) -> GangPlacement | Unplaceable:
    """Place every member of `gang` on `nodes` (what is free now), or say why it cannot be."""
    if not gang.members:
        return Unplaceable(f"gang {gang.name} has no members")
    gpu_members = [m for m in gang.members if m.gpus > 0]
    views = [_view(n) for n in nodes]
    used: list[_Node] = []
    if gpu_members:
        placed = _place_single(views, gang, gpu_members)
        if isinstance(placed, Unplaceable):
            if gang.single_node and gang.mode == "required":
                return placed
            multi = _place_multi(views, gang, gpu_members, inter_node_gbps)
            if isinstance(multi, Unplaceable):
                return multi if len(gpu_members) > 1 else placed
            if len(multi) == 1:  # one node after all: it failed the single-node test above
                return placed
            used = multi
        else:
            used = [placed]
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


def _place_single(
    views: list[_Node], gang: GangRequest, gpu_members: list[MemberRequest]
) -> _Node | Unplaceable:
    total = sum(m.gpus for m in gpu_members)
    cpu = sum(m.cpu_milli for m in gpu_members)
    mem = sum(m.memory_bytes for m in gpu_members)
    floor = gang.min_ring_gbps if gang.mode == "required" and total >= 2 else None
    best: _Node | None = None
    best_key: tuple[object, ...] | None = None
    most_free: _Node | None = None
    best_gbps: tuple[float, str] | None = None
    for v in views:
        if v.tables is None or v.nfree == 0:
            continue
        if most_free is None or v.nfree > most_free.nfree:
            most_free = v
        if (
            v.nfree < total
            or v.cpu < cpu
            or v.mem < mem
            or v.pods < len(gpu_members)
            or not all(m.eligible_nodes is None or v.state.name in m.eligible_nodes
                       for m in gpu_members)
        ):
            continue
        gbps = _gbps(v, total)
        if best_gbps is None or gbps > best_gbps[0]:
            best_gbps = (gbps, v.state.name)
        if floor is not None and gbps < floor:
            continue
        key = _rank(v, total)
        if best_key is None or key < best_key:
            best, best_key = v, key
    if best is not None:
        for m in gpu_members:
            best.take(m)
        return best
    if best_gbps is not None and floor is not None:
        return Unplaceable(
            f"gang {gang.name} needs {total} GPUs with an allreduce ring of at least "
            f"{floor:g} GB/s on one node; the best eligible node ({best_gbps[1]}) offers "
            f"{best_gbps[0]:g} GB/s"
        )
    where = (
        f"the node with the most free GPUs ({most_free.state.name}) has {most_free.nfree}"
        if most_free is not None
        else "no node with a published GPU topology has a free GPU"
    )
    return Unplaceable(
        f"gang {gang.name} needs {total} GPUs ({_describe_members(gpu_members)}) on one node "
        f"with room for them; {where}"
    )


def _place_multi(
    views: list[_Node], gang: GangRequest, gpu_members: list[MemberRequest], inter_gbps: float
) -> list[_Node] | Unplaceable:
    shape = {(m.gpus, m.cpu_milli, m.memory_bytes, m.eligible_nodes) for m in gpu_members}
    if len(shape) == 1:
        chosen = _multi_uniform(views, gpu_members)
    else:
        chosen = _multi_mixed(views, gpu_members)
    total = sum(m.gpus for m in gpu_members)
    if isinstance(chosen, int):
        free = sum(v.nfree for v in views if v.tables is not None)
        hosts = sum(1 for v in views if v.tables is not None and v.nfree)
        return Unplaceable(
            f"gang {gang.name} needs {total} GPUs ({_describe_members(gpu_members)}); the "
            f"eligible nodes can host {chosen} of its {len(gpu_members)} GPU members now "
            f"({free} GPUs free on {hosts} nodes)"
        )
    floor = gang.min_ring_gbps if gang.mode == "required" else None
    if floor is not None and len(chosen) > 1:
        rings = [_gbps(v, k) for v in chosen if (k := sum(m.gpus for m in v.members)) >= 2]
        slowest = min([inter_gbps, *rings])
        if slowest < floor:
            where = "between nodes" if slowest == inter_gbps else "on the nodes it would use"
            return Unplaceable(
                f"gang {gang.name} needs {total} GPUs with an allreduce ring of at least "
                f"{floor:g} GB/s; no single node can host it and {where} only "
                f"{slowest:g} GB/s is available"
            )
    return chosen


def _capacity(v: _Node, m: MemberRequest) -> int:
    if v.tables is None or not v.fits(m):
        return 0
    c = v.nfree // m.gpus
    if m.cpu_milli:
        c = min(c, v.cpu // m.cpu_milli)
    if m.memory_bytes:
        c = min(c, v.mem // m.memory_bytes)
    return min(c, v.pods)


def _multi_uniform(views: list[_Node], members: list[MemberRequest]) -> list[_Node] | int:
    """Identical members: take the nodes that hold the most of them (ties: best bandwidth, best
    fit), and finish on the best node that fits the rest. Fewest nodes is exact here."""
    m = members[0]
    caps = [(c, v) for v in views if (c := _capacity(v, m)) > 0]
    if sum(c for c, _ in caps) < len(members):
        return sum(c for c, _ in caps)
    caps.sort(key=lambda cv: (-cv[0], _rank(cv[1], cv[0] * m.gpus)))
    chosen: list[_Node] = []
    need = len(members)
    i = 0
    while need:
        c, v = caps[i]
        if c >= need:  # the rest fits on one node: pick the best of those that can take it
            finish = min(
                (cv for cv in caps[i:] if cv[0] >= need),
                key=lambda cv: _rank(cv[1], need * m.gpus),
            )[1]
            take = need
            v = finish
        else:
            take = c
        for _ in range(take):
            v.take(members[len(members) - need])
            need -= 1
        chosen.append(v)
        i += 1
    return chosen


def _multi_mixed(views: list[_Node], members: list[MemberRequest]) -> list[_Node] | int:
    """Different member sizes: first-fit decreasing over nodes ordered by free GPUs."""
    order = sorted(
        (v for v in views if v.tables is not None and v.nfree),
        key=lambda v: (-v.nfree, v.state.name),
    )
    chosen: list[_Node] = []
    placed = 0
    for m in sorted(members, key=lambda m: -m.gpus):
        host = next((v for v in chosen if v.fits(m)), None)
        if host is None:
            host = next((v for v in order if v not in chosen and v.fits(m)), None)
            if host is None:
                continue
            chosen.append(host)
        host.take(m)
        placed += 1
    if placed < len(members):
        for v in chosen:  # leave the views as they were: nothing is placed
            v.members.clear()
        return placed
    return chosen


def _place_cpu_member(views: list[_Node], used: list[_Node], m: MemberRequest) -> _Node | None:
    for v in used:
        if v.fits(m):
            v.take(m)
            return v
    best = min(
        (v for v in views if v.fits(m)),
        key=lambda v: (v.nfree, -v.cpu, v.state.name),
        default=None,
    )
    if best is not None:
        best.take(m)
    return best


def _result(used: list[_Node], gang: GangRequest, inter_gbps: float) -> GangPlacement:
    by_key: dict[str, MemberPlacement] = {}
    ring: dict[str, float] = {}
    for v in used:
        gpus = _assign_gpus(v)
        k = sum(len(g) for g in gpus.values())
        if k:
            ring[v.state.name] = _gbps(v, k) if k >= 2 else 0.0
        for m in v.members:
            by_key[m.key] = MemberPlacement(key=m.key, node=v.state.name, gpus=gpus.get(m.key, ()))
    placements = [by_key[m.key] for m in gang.members]
    local = [g for g in ring.values() if g > 0]
    # a split gang runs at its slowest node ring or the network, whichever is worse
    gang_gbps = min([inter_gbps, *local]) if len(ring) > 1 else max(local, default=0.0)
    return GangPlacement(
        members=tuple(placements),
        nodes_used=len({p.node for p in placements}),
        ring_gbps=ring,
        gang_gbps=gang_gbps,
    )
