"""A node set grouped by what the placement engine reads of a node, kept across the placements
of a planning cycle and across cycles: its class's choice tables and usable free GPUs (what
scoring reads), then its free CPU, memory and pods (what fitting reads). On a cluster of like
nodes a gang's placement then costs the number of distinct groups, not the number of nodes
(`placement.place_on_nodes` with `groups`).

The binder keeps one for its life. Each planning round hands it the cycle's node states
(`sync`: only the nodes whose state changed since are grouped again, so a cycle that places one
gang costs the nodes that changed, not the cluster), tells it each node whose state a placement
consumed (`put`), and hands it to the engine with the same node list. The engine groups the
nodes on first use, with its TableCache (`bind`): the owner needs no tables. A put is applied
when the engine next binds, so a node put twice between two placements (consumed by one, then
its next cycle's state synced) is grouped again once.
Within a group, nodes are kept sorted by name and by position in the list, which is all the
engine's choices among like nodes read (the lowest name that fits; the first such node in the
list, for messages). Bound with the network's paths of the nodes (`hierarchy`'s domains), a
group also keeps its nodes' positions by path, so that a gang within network domains sums each
domain's room from the groups with room for it, not from every node."""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from webhook.topology.gpu_choice import ClassTables, TableCache
from webhook.topology.model import NodeState

#: what scoring reads: the node's class tables (None: no published topology), usable free mask
GpuKey = tuple[ClassTables | None, int]
#: what fitting reads: free CPU (millicores), memory (bytes), pods
RoomKey = tuple[int, int, int]
#: a node's network path (`network.Network.paths`; () for a node outside every domain)
Path = tuple[str, ...]


@dataclass(slots=True)
class Members:
    """The nodes of one group, by name and by position in the node list, each sorted."""

    names: list[str] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    #: the positions by network path, each sorted (kept while the groups are bound with paths)
    by_path: dict[Path, list[int]] = field(default_factory=dict)

    def first_name(self, ok: Callable[[str], bool]) -> str | None:
        """The lowest name that `ok` accepts."""
        return next((n for n in self.names if ok(n)), None)

    def first_position(self, ok: Callable[[int], bool]) -> int | None:
        """The lowest position that `ok` accepts."""
        return next((p for p in self.positions if ok(p)), None)


class NodeGroups:
    """The nodes of one list grouped by (GpuKey, RoomKey); see the module's docstring."""

    def __init__(self, nodes: Sequence[NodeState] = ()) -> None:
        self._nodes = list(nodes)
        self._at: dict[str, int] = {}  # name -> position, made by `bind`
        # states put since the last `bind`: a round that never calls the engine with its groups
        # (a gang within network domains) never applies them
        self._pending: dict[str, NodeState] = {}
        self._tables: TableCache | None = None  # the cache the groups were made with
        self._keys: list[tuple[GpuKey, RoomKey]] = []  # per position
        self._groups: dict[GpuKey, dict[RoomKey, Members]] = {}
        self._paths: Mapping[str, Path] | None = None  # what `by_path` is keyed on

    def __len__(self) -> int:
        return len(self._nodes)

    def sync(self, nodes: Sequence[NodeState]) -> None:
        """Hold `nodes`, a cycle's states of the nodes held, in the same order: a node whose
        state object is not the one grouped is put again (the caller keeps a node's object
        while it does not change, as the binder's snapshot does), and what was put since is
        superseded. Other nodes, or the same in another order, are held anew and grouped on
        first use."""
        held = self._nodes
        if self._tables is not None and len(nodes) == len(held):
            # (compress and is_not: a cycle compares every node held, without a Python loop)
            changed = list(itertools.compress(range(len(nodes)),
                                              map(operator.is_not, nodes, held)))
            if all(nodes[i].name == held[i].name for i in changed):
                self._pending = {nodes[i].name: nodes[i] for i in changed}
                return
        self._nodes = list(nodes)
        self._pending = {}
        self._tables = None  # (grouped again by the next `bind`)

    def bind(self, tables: TableCache, paths: Mapping[str, Path] | None = None) -> None:
        """Ready the groups for reading: group the nodes with `tables` (again if they were
        grouped with another cache: the keys hold its class tables), or apply what was put.
        `paths`: the nodes' network paths, to keep each group's nodes by path from now on (by
        another mapping than before: again; None: as before)."""
        if self._tables is not tables:
            self._group(tables)
        else:
            pending, self._pending = self._pending, {}
            for state in pending.values():
                self._regroup(state)
        if paths is not None and paths is not self._paths:
            self._paths = paths
            for rooms in self._groups.values():
                for members in rooms.values():
                    members.by_path = {}
                    for i in members.positions:
                        members.by_path.setdefault(self._path(i), []).append(i)

    def _path(self, position: int) -> Path:
        assert self._paths is not None
        return self._paths.get(self._nodes[position].name, ())

    def _group(self, tables: TableCache) -> None:
        self._tables = tables
        self._at = {n.name: i for i, n in enumerate(self._nodes)}
        for name, state in self._pending.items():
            self._nodes[self._at[name]] = state
        self._pending = {}
        self._groups = {}
        self._paths = None  # (indexed again by the `bind` that asks)
        self._keys = [self._key(n) for n in self._nodes]
        for i, key in enumerate(self._keys):
            self._rooms(key[0]).setdefault(key[1], Members()).positions.append(i)
        for rooms in self._groups.values():
            for members in rooms.values():
                members.names = sorted(self._nodes[i].name for i in members.positions)

    def put(self, state: NodeState) -> None:
        """The node named `state.name` is now `state` (a placement consumed some of it), from
        the next `bind` on."""
        self._pending[state.name] = state

    def _regroup(self, state: NodeState) -> None:
        i = self._at[state.name]
        self._nodes[i] = state
        old, new = self._keys[i], self._key(state)
        if new == old:
            return
        self._remove(old, i, state.name)
        self._keys[i] = new
        rooms = self._rooms(new[0])
        members = rooms.get(new[1])
        if members is None:
            members = rooms[new[1]] = Members()
        bisect.insort(members.names, state.name)
        bisect.insort(members.positions, i)
        if self._paths is not None:
            bisect.insort(members.by_path.setdefault(self._path(i), []), i)

    def node(self, position: int) -> NodeState:
        """The node at `position` (as of the last `bind`, like every read below)."""
        return self._nodes[position]

    def state(self, name: str) -> NodeState:
        return self._nodes[self._at[name]]

    def groups(self) -> Iterator[tuple[GpuKey, dict[RoomKey, Members]]]:
        """Every (GpuKey, its groups by RoomKey); `bind` first."""
        return iter(self._groups.items())

    def _key(self, n: NodeState) -> tuple[GpuKey, RoomKey]:
        assert self._tables is not None
        gpu: GpuKey = self._tables.usable(n.topology, n.free_gpus) if n.topology else (None, 0)
        return gpu, (n.free_cpu_milli, n.free_memory_bytes, n.free_pods)

    def _rooms(self, gpu: GpuKey) -> dict[RoomKey, Members]:
        rooms = self._groups.get(gpu)
        if rooms is None:
            rooms = self._groups[gpu] = {}
        return rooms

    def _remove(self, key: tuple[GpuKey, RoomKey], position: int, name: str) -> None:
        rooms = self._groups[key[0]]
        members = rooms[key[1]]
        del members.names[bisect.bisect_left(members.names, name)]
        del members.positions[bisect.bisect_left(members.positions, position)]
        if self._paths is not None:
            path = self._path(position)
            at = members.by_path[path]
            del at[bisect.bisect_left(at, position)]
            if not at:
                del members.by_path[path]
        if not members.names:
            del rooms[key[1]]
            if not rooms:
                del self._groups[key[0]]
