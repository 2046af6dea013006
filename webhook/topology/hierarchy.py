"""One decision per gang, from the network down to the GPUs (docs/topology.md, "Network levels").

1. The domain: at the level the gang requires, or prefers (then the narrowest level that fits,
   wider level by wider level, then the whole cluster; with a bound, `max_level`, no wider
   than that level, or it waits), the **fullest domain that still fits**
   (best fit, as Kueue's BestFit and KAI's bin-packing), so that big free domains stay whole
   for big gangs.
   A gang that fits one node goes to the best node anywhere allowed (the narrowest domain); where
   the deepest level is an NVLink domain and that node would be wholly free, several members
   take the part-used nodes of the fullest such domain that holds them instead (`_clique_holes`).
2. Inside it, level by level down: one child domain when one fits (again best fit), else the
   fewest children, the roomiest first and the last one best fit.
3. On the nodes of the domains so chosen, today's engine (`placement.place_on_nodes`): the
   fewest nodes, then the NVLink-optimal GPU sets on each.
Slices (`slice_size` GPU members, in member order) are placed the same way, each within one
domain of the slice level: the levels above it count whole slices, not members. Preferred slices
that do not fit leave the gang placed without them. A level may be named by an alias of the
declared levels (`Network.label`).

Room is counted in members a domain can hold (GPUs, CPU, memory and pods of each node, as the
engine counts them), so a domain that fits holds the gang for certain; for a gang of unlike
members it is counted in GPUs and checked by the engine, trying the next domain when it fails.
Nodes are grouped by domain once per call (`Network.paths` is made once per node set), from
the binder's node groups when it gives them (`groups.NodeGroups`, kept by path: the groups with
room for a member, not every node), else from every node.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import re
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from webhook.topology.gpu_choice import TableCache
from webhook.topology.groups import NodeGroups
from webhook.topology.model import (
    GangPlacement,
    GangRequest,
    MemberPlacement,
    MemberRequest,
    NetworkRequest,
    NodeState,
    Unplaceable,
)
from webhook.topology.network import HOSTNAME, NVLINK_LEVELS, Network, resolved
from webhook.topology.placement import (
    DEFAULT_INTER_NODE_GBPS,
    capacity,
    place_on_nodes,
    where_pinned,
)
from webhook.topology.ringfloor import gang_gbps, link_gbps, meets_min_ring

#: how many domains that fit are tried in best-fit order when the engine refuses one (a gang
#: of unlike members, counted in GPUs, or a minRingGBps floor)
_TRIES = 4

Key = tuple[str, ...]
#: path components that no label value can be: a leaf of nodes without the narrower labels,
#: and a node as a domain of its own (slices of one node)
_OWN, _NODE = "\x00", "\x01"


def _real(key: Key) -> bool:
    """A domain of a level (not a leaf of its own nodes, not one node)."""
    return not key or key[-1][:1] not in (_OWN, _NODE)


@dataclass(slots=True)
class _Domain:
    room: int = 0  # members (GPUs for unlike members) its nodes can take
    gpus: int = 0  # free GPUs
    pieces: int = 0  # members, or whole slices, it can take
    children: set[Key] = field(default_factory=set)
    own: list[int] = field(default_factory=list)  # its nodes' positions, at the deepest level


def place_gang(
    nodes: Sequence[NodeState],
    gang: GangRequest,
    *,
    network: Network | None = None,
    inter_node_gbps: float = DEFAULT_INTER_NODE_GBPS,
    tables: TableCache | None = None,
    groups: NodeGroups | None = None,
) -> GangPlacement | Unplaceable:
    """Place every member of `gang` on `nodes` (what is free now) within the network domains its
    `gang.network` asks for, or say why it cannot be. `network`: every node's domains (None:
    no levels declared). `tables`: the caller's cache of choice tables (fresh when None).
    `groups`: `nodes` grouped, for the engine on all of them (`placement.place_on_nodes`).
    Pure: the same inputs give the same placement."""
    tables = tables or TableCache(warm=False)
    req = gang.network
    if req is None:
        return place_on_nodes(nodes, gang, inter_node_gbps=inter_node_gbps, tables=tables,
                              groups=groups)
    req = _bounded(resolved(req, network))
    place = functools.partial(_place, nodes, network=network, inter_node_gbps=inter_node_gbps,
                              tables=tables, groups=groups)
    if req.slice_level is not None and req.slice_mode == "preferred":
        sliced = place(replace(gang, network=replace(req, slice_mode="required")))
        if isinstance(sliced, GangPlacement):
            return sliced
        req = replace(req, slice_level=None, slice_size=0, slice_mode="required")
    return place(replace(gang, network=req))


def _place(nodes: Sequence[NodeState], gang: GangRequest, *, network: Network | None,
           inter_node_gbps: float, tables: TableCache, groups: NodeGroups | None
           ) -> GangPlacement | Unplaceable:
    """`place_gang` for a request whose levels are labels and whose slices are required."""
    req = gang.network
    assert req is not None
    if req.level == HOSTNAME and req.mode == "required":
        gang = replace(gang, single_node=True, mode="required")  # the engine's own rule
    if req.unconstrained and not (gang.single_node and gang.mode == "required"):
        return _fill_gaps(nodes, gang, inter_node_gbps=inter_node_gbps, tables=tables)
    if req.level == HOSTNAME or (req.level is None and req.slice_level is None):
        return place_on_nodes(nodes, gang, inter_node_gbps=inter_node_gbps, tables=tables,
                              groups=groups)
    if (req.slice_level is None) != (req.slice_size < 1):
        return Unplaceable(f"gang {gang.name}: a slice needs both a level and a size of at "
                           "least 1")
    if not any(m.gpus for m in gang.members):  # network levels place GPU members
        return place_on_nodes(nodes, gang, inter_node_gbps=inter_node_gbps, tables=tables,
                              groups=groups)
    return _Decision(nodes, gang, req, network or Network((), {}),
                     inter_gbps=inter_node_gbps, tables=tables, groups=groups).run()


def _fill_gaps(nodes: Sequence[NodeState], gang: GangRequest, *, inter_node_gbps: float,
               tables: TableCache) -> GangPlacement | Unplaceable:
    """Kueue's unconstrained pod set: its members one at a time, largest first, each on the
    node the engine chooses for it alone (its best GPU set, then the least loss of what the
    node can still offer and the best fit, so a one-GPU member takes a gap before it breaks a
    free NVLink group), not on the fewest nodes: what is left stays whole for gangs that
    need it (Kueue's LeastFreeCapacity)."""
    states = list(nodes)
    placed: dict[str, GangPlacement] = {}  # per member key: its placement alone
    ordered = sorted(gang.members, key=lambda m: -m.gpus)
    for _, alike in itertools.groupby(ordered, key=_shape):
        run = list(alike)
        best = _Best(states, run[0], tables) if run[0].gpus else None
        for m in run:
            i = best.pop() if best is not None else None
            one = replace(gang, members=(m,), network=None, single_node=False, min_ring_gbps=None)
            # on the node chosen (the engine gives it the member's set), else every node: a
            # 0-GPU member's host, or the engine's reason why none has room
            got = place_on_nodes(states if i is None else [states[i]], one,
                                 inter_node_gbps=inter_node_gbps, tables=tables)
            if isinstance(got, Unplaceable):
                return Unplaceable(f"gang {gang.name} (unconstrained: each member where it "
                                   f"fits best) has no room for {m.key}: {got.reason}")
            (mp,) = got.members
            at = i if i is not None else next(j for j, n in enumerate(states) if n.name == mp.node)
            states[at] = states[at].less(mp.gpus, m.cpu_milli, m.memory_bytes)
            if best is not None:
                best.scored_again(at)
            placed[m.key] = got
    result = joined([placed[m.key] for m in gang.members], states, inter_node_gbps)
    floor = gang.min_ring_gbps if gang.mode == "required" else None
    total = sum(m.gpus for m in gang.members)
    if not meets_min_ring(result.gang_gbps, floor, total):
        return Unplaceable(f"gang {gang.name} needs {total} GPUs with an allreduce bus bandwidth "
                           f"of at least {floor:g} GB/s (minRingGBps); unconstrained, its "
                           f"members' nodes offer {result.gang_gbps:g} GB/s")
    return result


def joined(parts: Sequence[GangPlacement], nodes: Iterable[NodeState],
           inter_node_gbps: float) -> GangPlacement:
    """One gang's placement from its members placed one at a time (`parts`, in member order)
    on `nodes` (those it uses among them): a node's ring is the slowest its members got there
    (members sharing a node)."""
    ring: dict[str, float] = {}
    for part in parts:
        for node, gbps in part.ring_gbps.items():
            ring[node] = min(ring.get(node, gbps), gbps)
    members = tuple(mp for part in parts for mp in part.members)
    between = link_gbps([n for n in nodes if n.name in ring], inter_node_gbps)
    return GangPlacement(members=members, nodes_used=len({p.node for p in members}),
                         ring_gbps=ring, gang_gbps=gang_gbps(ring.values(), between))


def _wholly_free(n: NodeState) -> bool:
    return n.topology is not None and len(n.free_gpus) == n.topology.size


def _shape(m: MemberRequest) -> tuple[int, int, int, frozenset[str] | None]:
    return (m.gpus, m.cpu_milli, m.memory_bytes, m.eligible_nodes)


class _Best:
    """The nodes in the order the engine's single-node search ranks them for one member of a
    shape alone (its best set's `placement_key`, then the name), kept while members take them:
    only the node a member took is scored again, so a gang of n members costs one pass over
    the nodes and n heap steps, not n passes."""

    def __init__(self, states: list[NodeState], m: MemberRequest, tables: TableCache) -> None:
        self.states, self.m, self.tables = states, m, tables
        self.heap = [e for i in range(len(states)) if (e := self._entry(i)) is not None]
        heapq.heapify(self.heap)

    def _entry(self, i: int) -> tuple[tuple[float, ...], str, int] | None:
        """The node's rank for the member, where it fits one (None where not)."""
        s, m = self.states[i], self.m
        if s.topology is None or (m.eligible_nodes is not None and s.name not in m.eligible_nodes):
            return None
        class_tables, free = self.tables.usable(s.topology, s.free_gpus)
        if capacity(free, s.free_cpu_milli, s.free_memory_bytes, s.free_pods, m) < 1:
            return None
        return (class_tables.placement_key(free, m.gpus), s.name, i)

    def pop(self) -> int | None:
        """The best node's position (None: no node fits one)."""
        return heapq.heappop(self.heap)[2] if self.heap else None

    def scored_again(self, i: int) -> None:
        """The node at `i` (taken by `pop`) changed: back in, where it still fits one."""
        entry = self._entry(i)
        if entry is not None:
            heapq.heappush(self.heap, entry)


def _bounded(req: NetworkRequest) -> NetworkRequest:
    """A bound at the node itself: a bound of one node is one node, required; one node
    preferred within a bound is the bound required (where one node comes first anyway)."""
    if req.max_level == HOSTNAME:
        return replace(req, level=HOSTNAME, mode="required", max_level=None)
    if req.max_level is not None and req.level == HOSTNAME:
        return replace(req, level=req.max_level, mode="required", max_level=None)
    return req


_DIGITS = re.compile(r"(\d+)")


@functools.lru_cache(maxsize=1 << 16)
def _natural(key: str) -> tuple[str | int, ...]:
    """worker-2 before worker-10: slices follow the ranks' order where no label gives the
    ranks (`MemberRequest.rank`). The split alternates text and digits, text first (maybe ""),
    so keys compare text with text and number with number; "" sorts first, so digits sort
    before text where one key has digits and the other text. Remembered: a pending gang's
    members are sorted again in every planning cycle."""
    parts: list[str | int] = list(_DIGITS.split(key))
    parts[1::2] = map(int, parts[1::2])
    return tuple(parts)


def _may_use(nodes: Sequence[NodeState], members: Sequence[MemberRequest]) -> bool:
    """Each of the members may use one of the nodes."""
    names = {n.name for n in nodes}
    return all(m.eligible_nodes is None or not m.eligible_nodes.isdisjoint(names)
               for m in members)


def _fewest_first(where: Sequence[Sequence[Key]]) -> list[int]:
    return sorted(range(len(where)), key=lambda i: (len(where[i]), i))


def slice_domains(where: Sequence[Sequence[Key]], room: Mapping[Key, int],
                  pick: Callable[[list[Key], set[Key]], Key]) -> list[Key] | int:
    """A domain for each slice `i` among `where[i]`, at most `room[k]` slices in domain `k`;
    else the position of a slice that no assignment places. The slices with the fewest
    domains go first, each where `pick` chooses among those with room left (given the domains
    taken so far); a slice that finds none moves earlier ones to other domains of theirs
    (augmenting paths, as in Kuhn's matching, with capacities), so a slice waits only when no
    assignment exists (the first come took the domain another slice needed, and it waited)."""
    left = dict(room)
    at: list[Key | None] = [None] * len(where)
    holders: dict[Key, list[int]] = {}

    def put(i: int, k: Key) -> None:
        at[i] = k
        left[k] -= 1
        holders.setdefault(k, []).append(i)

    def lift(i: int, k: Key) -> None:
        at[i] = None
        left[k] += 1
        holders[k].remove(i)

    def moved(i: int) -> bool:
        """Slice i placed, each slice on a shortest path of full domains moved one along to
        the next (a breadth-first search, so no recursion however long the path)."""
        via = dict.fromkeys(where[i], i)  # a domain: the slice that may move into it
        queue = deque(via)
        while queue:
            k = queue.popleft()
            if left[k] > 0:  # the path's end: each slice on it moves into the domain after it
                while True:
                    s, old = via[k], at[via[k]]
                    if old is not None:
                        lift(s, old)
                    put(s, k)
                    if old is None:  # slice i, the only one without a domain yet
                        return True
                    k = old
            for j in holders.get(k, ()):
                for nxt in where[j]:
                    if nxt not in via:
                        via[nxt] = j
                        queue.append(nxt)
        return False

    for i in _fewest_first(where):
        free = [k for k in where[i] if left[k] > 0]
        if free:
            put(i, pick(free, {k for k, h in holders.items() if h}))
        elif not moved(i):
            return i
    placed = [k for k in at if k is not None]
    assert len(placed) == len(at), "a move left a slice without a domain"
    return placed


class _Decision:
    def __init__(self, nodes: Sequence[NodeState], gang: GangRequest, req: NetworkRequest,
                 network: Network, *, inter_gbps: float, tables: TableCache,
                 groups: NodeGroups | None) -> None:
        self.nodes, self.gang, self.req, self.tables = nodes, gang, req, tables
        self.groups = groups
        gpu = [m for m in gang.members if m.gpus > 0]
        self.inter_gbps = inter_gbps
        self.declared = network.declared
        self.chain = network.chain(req.max_level, req.level, req.slice_level)
        self.paths = network.paths(self.chain)
        depth = len(self.chain)
        self.level = self.chain.index(req.level) if req.level is not None else -1
        #: the widest level the gang may span, or wait (-1: the whole cluster): a required
        #: level, or a preferred one's bound (a bound at or below the level makes it required)
        self.bound = -1
        if req.mode == "required":
            self.bound = self.level
        elif req.max_level is not None:
            self.bound = self.chain.index(req.max_level)
            self.level = max(self.level, self.bound)
        #: where pieces are whole: a slice's level (depth: one node), or one member per node
        self.slice_at = depth if req.slice_level in (None, HOSTNAME) else \
            self.chain.index(req.slice_level)
        self.gpu = sorted(gpu, key=lambda m: (m.rank, _natural(m.key)))
        self.others = [m for m in gang.members if m.gpus == 0]
        self.uniform = len({(m.gpus, m.cpu_milli, m.memory_bytes, m.eligible_nodes)
                            for m in gpu}) == 1
        #: members whose eligible nodes differ (as Kueue's topology-aware scheduling pins each
        #: pod to its node): a domain's room is not every member's, so each is placed where
        #: it may go (`_reaches`, `_place_pinned`)
        self.pinned = len({m.eligible_nodes for m in gpu}) > 1
        #: unlike members, how many of each shape (GPUs, CPU, memory): what `_unlike_room` reads
        self.shapes = [] if self.uniform else \
            list(Counter((m.gpus, m.cpu_milli, m.memory_bytes) for m in gpu).items())
        #: unlike members: per GPU count, how many members take at least that many
        self.at_least = [] if self.uniform else \
            [(size, sum(m.gpus >= size for m in gpu)) for size in sorted({m.gpus for m in gpu})]
        # (unsliced, the gang is one slice: its domains count members, not slices)
        size = req.slice_size if req.slice_level is not None else len(self.gpu)
        self.slices = [self.gpu[i:i + size] for i in range(0, len(self.gpu), size)]
        #: the units a slice takes at most: members, or GPUs for unlike members
        self.per_piece = max(self._units(s) for s in self.slices)
        self.doms: dict[Key, _Domain] = {}
        self.most_gpus = 0  # the most free GPUs on one node with room
        #: alike nodes have the same room: (usable free mask, CPU, memory, pods) -> room, what
        #: `_room` reads (not the node's Topology object: every node has its own)
        self._rooms: dict[tuple[int, int, int, int], int] = {}

    def _units(self, members: Sequence[MemberRequest]) -> int:
        return len(members) if self.uniform else sum(m.gpus for m in members)

    @property
    def sliced(self) -> bool:
        return self.req.slice_level is not None

    @property
    def node_slices(self) -> bool:
        """Slices of one node each: every node is a slice domain."""
        return self.sliced and self.slice_at == len(self.chain)

    def run(self) -> GangPlacement | Unplaceable:
        if self.sliced and self.slice_at < self.level:
            return Unplaceable(f"gang {self.gang.name}: its slice level {self.req.slice_level} "
                               f"is wider than its level {self.req.level}")
        self._group()
        one = self._one_node()
        if one is not None:
            return one
        need = len(self.slices) if self.sliced else self._units(self.gpu)
        levels = range(self.level, self.bound - 1, -1)  # (-1: the whole cluster)
        refused: Unplaceable | None = None
        for level in levels:
            fit = sorted((k for k, d in self.doms.items()
                          if len(k) == level + 1 and _real(k) and d.pieces >= need
                          and (self.uniform or self._may_hold(k))),
                         key=self._best_fit)
            for key in fit[:_TRIES]:
                placed = self._place_pinned(key) if self.pinned else \
                    self._place(self._descend(key, need))
                if isinstance(placed, GangPlacement):
                    return placed
                refused = refused or placed
            if fit:
                break
        if refused is not None:
            return refused
        if self.bound < 0 and not self.sliced:
            return place_on_nodes(self.nodes, replace(self.gang, network=None),
                                  inter_node_gbps=self.inter_gbps, tables=self.tables)
        return self._why_not(need)

    def _group(self) -> None:
        """Every node's room, summed into each of its domains (one pass over the nodes with
        room, `_hosts`). A node whose path stops above the deepest level (it lacks a narrower
        label) sits in a leaf of its own under its last domain; with slices of one node, each
        node is a domain."""
        doms = self.doms
        doms[()] = _Domain()
        node_slices = self.node_slices
        leaves: dict[Key, _Domain] = {}
        most = 0
        for found, room, gpus, at in self._hosts():
            path = self._leaf(found)
            leaf = leaves.get(path)
            if leaf is None:
                leaf = leaves[path] = _Domain()
            leaf.room += room * len(at)
            leaf.gpus += gpus * len(at)
            leaf.own += at
            most = max(most, gpus)
            if node_slices:
                for i in at:
                    node_key = (*path, _NODE + self.nodes[i].name)
                    doms[node_key] = _Domain(room, gpus, own=[i])
                    leaf.children.add(node_key)
        self.most_gpus = most
        for path, leaf in leaves.items():
            for i in range(len(path)):
                d = doms.get(path[:i])
                if d is None:
                    d = doms[path[:i]] = _Domain()
                d.room += leaf.room
                d.gpus += leaf.gpus
                d.children.add(path[:i + 1])
            doms[path] = leaf
        if not self.sliced:
            for d in doms.values():
                d.pieces = d.room
            return
        for key, d in list(doms.items()):  # whole slices of each slice domain, summed upwards
            if self._is_slice(key):
                d.pieces = d.room // self.per_piece
                for i in range(len(key)):
                    doms[key[:i]].pieces += d.pieces

    def _hosts(self) -> Iterator[tuple[Key, int, int, list[int]]]:
        """(path, room, free GPUs, positions) of the nodes with room for a member in a domain
        of the levels, alike in path, room and free GPUs: with the node groups, a group's
        nodes of one path (their sums cost the groups with room, not the nodes); else each
        node. A node with fewer free GPUs than one member has no room, and is skipped before
        its usable mask is looked up (most nodes, for gangs of whole-node members)."""
        eligible = self.gpu[0].eligible_nodes if self.uniform else None
        # (a sliced gang needs the slice level's label)
        shallow = self.slice_at if self.sliced and not self.node_slices else 0
        least = self.gpu[0].gpus if self.uniform else 1
        nodes = self.nodes
        if self.groups is not None:
            assert len(self.groups) == len(nodes), "groups must hold the nodes placed on"
            self.groups.bind(self.tables, self.paths)
            for (tables, free), rooms in self.groups.groups():
                gpus = free.bit_count()
                if tables is None or gpus < least:
                    continue
                for rkey, members in rooms.items():
                    room = self._room(free, *rkey)
                    if room <= 0:
                        continue
                    for path, at in members.by_path.items():
                        mine = at if eligible is None else \
                            [i for i in at if nodes[i].name in eligible]
                        if len(path) > shallow and mine:
                            yield path, room, gpus, mine
            return
        paths, usable = self.paths, self.tables.usable
        for i, n in enumerate(nodes):
            topology = n.topology
            if topology is None or len(n.free_gpus) < least:
                continue
            path = paths.get(n.name, ())
            if len(path) <= shallow or (eligible is not None and n.name not in eligible):
                continue
            free = usable(topology, n.free_gpus)[1]
            room = self._room(free, n.free_cpu_milli, n.free_memory_bytes, n.free_pods)
            if room > 0:
                yield path, room, free.bit_count(), [i]

    def _one_node(self) -> GangPlacement | None:
        """A gang whose GPU members fit on one node is within one domain of every level: the
        narrowest domain that fits is that node, chosen over every node the levels allow as
        the engine chooses (bandwidth, then least loss and best fit), ties to the node whose
        leaf is the fullest (best fit, as for the domains). None: no node holds it. With the
        node groups the engine reads them, the nodes allowed as its members' eligible ones."""
        if sum(m.gpus for m in self.gpu) > self.most_gpus:
            return None
        wide = self.bound
        # the nodes in a leaf (a domain with nodes of its own, not one node as a slice domain)
        # where their labels reach the required level
        allowed = sorted(i for k, d in self.doms.items()
                         if d.own and not k[-1].startswith(_NODE)
                         and len(k) - (k[-1] == _OWN) > wide for i in d.own)

        def rank(n: NodeState) -> tuple[object, ...]:
            leaf = self._leaf(self.paths[n.name])
            d = self.doms[leaf]
            return (d.room, d.gpus, leaf, n.name)

        gang = replace(self.gang, network=None)
        nodes: Sequence[NodeState]
        if self.groups is None:
            nodes = [self.nodes[i] for i in allowed] + self._spare()
        else:
            nodes = self.nodes
            gang = replace(gang, members=self._within(gang.members, allowed))
        placed = place_on_nodes(nodes, gang, one_node=True, rank=rank, groups=self.groups,
                                inter_node_gbps=self.inter_gbps, tables=self.tables)
        if not isinstance(placed, GangPlacement):
            return None
        if self._clique_members and self._takes_a_whole_node(placed):
            return self._clique_holes(allowed) or placed
        return placed

    @property
    def _clique_members(self) -> bool:
        """Several GPU members, free to share out, on a network whose deepest level is an NVLink
        domain (a GB200 NVL72 rack): there they are as fast on several nodes of one domain as on
        one node."""
        return (len(self.gpu) > 1 and not self.pinned and not self.gang.single_node
                and bool(self.chain) and self.chain[-1] in NVLINK_LEVELS)

    def _takes_a_whole_node(self, placed: GangPlacement) -> bool:
        """The one node `_one_node` chose is wholly free (looked up among its leaf's nodes)."""
        (name,) = {p.node for p in placed.members if p.gpus}
        own = self.doms[self._leaf(self.paths[name])].own
        return any(_wholly_free(n) for i in own if (n := self.nodes[i]).name == name)

    def _clique_holes(self, allowed: list[int]) -> GangPlacement | None:
        """The gang on the part-used nodes of one NVLink domain, each member where it fits best
        alone (`_fill_gaps`: its set, then the least loss and best fit), in the fullest domain
        whose part-used nodes hold it: the whole node it would have taken stays whole for a
        gang of whole nodes, which needs several in one domain (KAI and Kueue fill a rack's
        holes too). None: no domain's part-used nodes hold it."""
        need = self._units(self.gpu)
        may = set(allowed)
        fits: list[tuple[tuple[int, int, Key], list[NodeState]]] = []
        for key, d in self.doms.items():
            if len(key) != len(self.chain) or not d.own or not _real(key):
                continue
            holes, room = [], 0
            for i in d.own:
                n = self.nodes[i]
                if i in may and n.topology is not None and not _wholly_free(n):
                    holes.append(n)
                    room += self._room(self.tables.usable(n.topology, n.free_gpus)[1],
                                       n.free_cpu_milli, n.free_memory_bytes, n.free_pods)
            if room >= need:
                fits.append((self._best_fit(key), holes))
        for _, holes in sorted(fits, key=lambda f: f[0])[:_TRIES]:
            got = _fill_gaps(holes + self._spare(), replace(self.gang, network=None),
                             inter_node_gbps=self.inter_gbps, tables=self.tables)
            if isinstance(got, GangPlacement):
                return got
        return None

    def _within(self, members: Sequence[MemberRequest], allowed: list[int]
                ) -> tuple[MemberRequest, ...]:
        """The members, each eligible only where the gang may go: its GPU members on the nodes
        at `allowed`, its 0-GPU members there or on the CPU-only nodes."""
        gpu = frozenset(self.nodes[i].name for i in allowed)
        cpu = gpu | {n.name for n in self._spare()}
        out = []
        for m in members:
            where = gpu if m.gpus else cpu
            out.append(replace(m, eligible_nodes=where if m.eligible_nodes is None
                               else m.eligible_nodes & where))
        return tuple(out)

    def _leaf(self, path: Key) -> Key:
        """The leaf a node of this path sits in: its deepest domain, or one of its own under
        its last domain when it lacks a narrower label."""
        return path if len(path) == len(self.chain) else (*path, _OWN)

    def _spare(self) -> list[NodeState]:
        """The CPU-only nodes, when the gang has 0-GPU members (a launcher): they ride with the
        GPU members, and may use these."""
        return [n for n in self.nodes if n.topology is None] if self.others else []

    def _is_slice(self, key: Key) -> bool:
        if self.slice_at == len(self.chain):
            return bool(key) and key[-1].startswith(_NODE)
        return len(key) == self.slice_at + 1 and _real(key)

    def _room(self, free: int, cpu_milli: int, memory_bytes: int, pods: int) -> int:
        """Members (GPUs for unlike members) a node with this much room can take, whatever its
        name (eligibility is checked apart); alike nodes are counted once."""
        rkey = (free, cpu_milli, memory_bytes, pods)
        room = self._rooms.get(rkey)
        if room is None:
            room = self._rooms[rkey] = capacity(free, cpu_milli, memory_bytes, pods,
                                                self.gpu[0]) if self.uniform else \
                self._unlike_room(free.bit_count(), cpu_milli, memory_bytes, pods)
        return room

    def _unlike_room(self, free: int, cpu_milli: int, memory_bytes: int, pods: int) -> int:
        """At most how many GPUs of this gang's members a node takes: the largest sum of their
        GPU counts within its free GPUs, of the members its CPU and memory hold one by one. An
        upper bound, so a domain that holds the gang is never passed over; its free GPUs alone
        counted holes no member fits (a rack of half-free nodes looked like room for 8-GPU
        members, and the gang waited once the domains tried had refused it)."""
        if pods <= 0:
            return 0
        sums = 1  # bit i: some of the members take i GPUs
        for (gpus, cpu, memory), count in self.shapes:
            if cpu <= cpu_milli and memory <= memory_bytes:
                for _ in range(min(count, free // gpus)):
                    sums |= sums << gpus
        return (sums & ((2 << free) - 1)).bit_length() - 1

    def _best_fit(self, key: Key) -> tuple[int, int, Key]:
        d = self.doms[key]
        return (d.pieces, d.gpus, key)

    def _descend(self, key: Key, need: int) -> list[tuple[Key, int]]:
        """The domains, at the slice level (or the deepest level), the gang takes under `key`,
        with how many pieces each: one child when one fits, else the fewest."""
        kids = self.doms[key].children
        if not kids or (self.sliced and self._is_slice(key)):
            return [(key, need)]
        fit = [k for k in kids if self.doms[k].pieces >= need]
        if fit:
            return self._descend(min(fit, key=self._best_fit), need)
        out: list[tuple[Key, int]] = []
        order = sorted(kids, key=lambda k: (-self.doms[k].pieces, k))
        for i, k in enumerate(order):
            have = self.doms[k].pieces
            if have >= need:  # the rest fits in one: the fullest of those that can take it
                last = min((c for c in order[i:] if self.doms[c].pieces >= need),
                           key=self._best_fit)
                return out + self._descend(last, need)
            if have > 0:
                out += self._descend(k, have)
                need -= have
        return out

    def _reaches(self, key: Key, members: Sequence[MemberRequest]) -> bool:
        """Each of the members may use a node with room under `key`."""
        return _may_use(self._nodes_under(key), members)

    def _may_hold(self, key: Key) -> bool:
        """Whether the nodes under `key` may hold unlike members, which a domain's room (a sum
        over its nodes) cannot say: each member may use one of them, and for each GPU count,
        its nodes have room for as many members of it as there are members that take at
        least it (a rack of 4-GPU holes holds no 8-GPU member, however many 1-GPU ones)."""
        nodes = self._nodes_under(key)
        if self.pinned and not _may_use(nodes, self.gpu):
            return False
        free = [len(n.free_gpus) for n in nodes]
        return all(sum(f // size for f in free) >= members for size, members in self.at_least)

    def _place_pinned(self, key: Key) -> GangPlacement | Unplaceable:
        """Pinned members under `key`: the engine on its nodes, which honours each member's
        eligible nodes (the descent counts room, not whose it is); each slice in a slice
        domain under `key` with room for it that all its members may use (`slice_domains`):
        one an earlier slice took where it can, else the best fit."""
        spare = self._spare()
        if not self.sliced:
            return self._run([(self._nodes_under(key) + spare, [*self.gpu, *self.others])])
        under = [k for k in self.doms if k[:len(key)] == key and self._is_slice(k)]
        where = [[k for k in under if self._reaches(k, members)] for members in self.slices]
        got = slice_domains(where, {k: self.doms[k].pieces for k in under},
                            lambda room, taken: next((k for k in room if k in taken), None)
                            or min(room, key=self._best_fit))
        if isinstance(got, int):
            kind = self.declared.kind(self.req.slice_level or HOSTNAME)
            return Unplaceable(f"gang {self.gang.name}: no {kind} has room on nodes that each "
                               f"member of a slice may use: {where_pinned(self.slices[got])}")
        taken: dict[Key, list[MemberRequest]] = {}
        for i in _fewest_first(where):
            taken.setdefault(got[i], []).extend(self.slices[i])
        groups = [(self._nodes_under(k), members) for k, members in taken.items()]
        groups[0] = (groups[0][0] + spare, groups[0][1] + self.others)
        return self._run(groups)

    def _nodes_under(self, key: Key) -> list[NodeState]:
        d = self.doms[key]
        if d.own:
            return [self.nodes[i] for i in sorted(d.own)]  # (in the list's order)
        return [n for k in sorted(d.children) for n in self._nodes_under(k)]

    def _place(self, parts: list[tuple[Key, int]]) -> GangPlacement | Unplaceable:
        """The engine on the chosen domains' nodes: all at once, or slice by slice."""
        spare = self._spare()  # with the 0-GPU members, in the first part
        if not self.sliced:
            nodes = [n for key, _ in parts for n in self._nodes_under(key)]
            groups = [(nodes + spare, [*self.gpu, *self.others])]
        else:
            groups, i = [], 0
            for key, count in parts:
                members = [m for s in self.slices[i:i + count] for m in s]
                groups.append((self._nodes_under(key) + (spare if i == 0 else []),
                               members + (self.others if i == 0 else [])))
                i += count
        return self._run(groups)

    def _run(self, groups: list[tuple[list[NodeState], list[MemberRequest]]]
             ) -> GangPlacement | Unplaceable:
        """The engine on each group's nodes for its members, merged."""
        results: list[GangPlacement] = []
        for nodes_, members_ in groups:
            placed = self._engine(nodes_, members_)
            if isinstance(placed, Unplaceable):
                return placed
            results.append(placed)
        return self._merge(results, [n for nodes_, _ in groups for n in nodes_])

    def _engine(self, nodes: list[NodeState], members: list[MemberRequest]
                ) -> GangPlacement | Unplaceable:
        part = replace(self.gang, members=tuple(members), network=None)
        return place_on_nodes(nodes, part, inter_node_gbps=self.inter_gbps, tables=self.tables)

    def _merge(self, parts: list[GangPlacement], nodes: list[NodeState]
               ) -> GangPlacement | Unplaceable:
        """The parts placed on `nodes` as one gang, its figure checked."""
        by_key = {p.key: p for part in parts for p in part.members}
        ring = {node: g for part in parts for node, g in part.ring_gbps.items()}
        used = {n.name: n for n in nodes if n.name in ring}  # (slices' groups may share one)
        between = link_gbps(used.values(), self.inter_gbps)
        figure = gang_gbps(ring.values(), between)
        floor = self.gang.min_ring_gbps if self.gang.mode == "required" else None
        total = sum(m.gpus for m in self.gpu)
        if not meets_min_ring(figure, floor, total):
            return Unplaceable(f"gang {self.gang.name} needs {total} GPUs with an allreduce bus "
                               f"bandwidth of at least {floor:g} GB/s (minRingGBps); its "
                               f"slices' nodes offer {figure:g} GB/s")
        members: list[MemberPlacement] = [by_key[m.key] for m in self.gang.members]
        return GangPlacement(members=tuple(members), nodes_used=len({p.node for p in members}),
                             ring_gbps=ring, gang_gbps=figure)

    def _most_free_at(self, level: int) -> int:
        """The most free GPUs on one node the gang may use that has the level's label."""
        eligible = self.gpu[0].eligible_nodes if self.uniform else None
        return max((len(n.free_gpus) for n in self.nodes if n.free_gpus
                    and n.topology is not None and len(self.paths.get(n.name, ())) > level
                    and (eligible is None or n.name in eligible)), default=0)

    def _why_not(self, need: int) -> Unplaceable:
        """The level it needs, the free GPUs of that level's roomiest domain, what it needs."""
        total = sum(m.gpus for m in self.gpu)
        sizes = sorted({m.gpus for m in self.gpu})
        what = f"{len(self.gpu)} members x {sizes[0]} GPU{'s' if sizes[0] > 1 else ''}" \
            if len(sizes) == 1 else f"{len(self.gpu)} members"
        gang_level = self.bound if self.bound >= 0 else self.level
        level = gang_level if gang_level >= 0 else self.slice_at
        label = self.chain[level] if level < len(self.chain) else HOSTNAME
        at = [(d.pieces, d.gpus, k) for k, d in self.doms.items()
              if len(k) == level + 1 and _real(k)]
        kind = self.declared.kind(label)
        if self.sliced:
            head = (f"gang {self.gang.name} needs {total} GPUs ({what}) in {len(self.slices)} "
                    f"slices of {self.req.slice_size}, each within one "
                    f"{self.declared.kind(self.req.slice_level or HOSTNAME)}"
                    + (f", all within one {kind}" if gang_level >= 0 else ""))
        else:
            head = f"gang {self.gang.name} needs {total} GPUs ({what}) within one {kind}"
        if not at:
            within = (f"is in a {kind}" if self.declared.is_tier(label)
                      else f"has the label {label}")
            most = self._most_free_at(level)
            if most:  # nodes with free GPUs there, none with room for a member
                each = f"each member takes {sizes[0]}" if len(sizes) == 1 else \
                    f"its members take {sizes[0]} to {sizes[-1]}"
                return Unplaceable(f"{head}; no node that {within} has room for one of its "
                                   f"members (GPUs, CPU, memory, pods): the most free GPUs on "
                                   f"one is {most}, and {each}")
            return Unplaceable(f"{head}; no node with a free GPU {within}"
                               if self.paths or not self.nodes else f"{head}; no node {within}")
        if self.pinned and not self.sliced and \
                not any(self._reaches(k, self.gpu) for _, _, k in at):
            return Unplaceable(f"{head}, and no {kind} has room on nodes that each member may "
                               f"use: {where_pinned(self.gpu)}")
        pieces, gpus, key = max(at, key=lambda e: (e[1], e[0], e[2]))
        held = f", room for {pieces} of its slices" if self.sliced else ""
        which = self.declared.which(label, key[-1])
        return Unplaceable(f"{head}; the largest free one ({which}) has {gpus} free GPUs{held}")
