"""The engine given a node set's groups (webhook.topology.groups.NodeGroups, kept across a
planning round's placements) places every gang exactly as the engine scanning every node does:
the same nodes and GPUs, the same reasons when it cannot."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

from webhook.topology import (
    GangPlacement,
    GangRequest,
    MemberRequest,
    Network,
    NetworkRequest,
    NodeState,
    Topology,
    Unplaceable,
    builtin,
    place_gang,
)
from webhook.topology.gpu_choice import TableCache
from webhook.topology.groups import NodeGroups
from webhook.topology.network import HOSTNAME

GIB = 1 << 30


def _own(name: str, rng: random.Random) -> Topology | None:
    """A node's topology: its own object (its own UUIDs), sometimes a GPU unhealthy."""
    kind = rng.choice(["dgx1-v100", "dgx1-v100", "dgx1-p100", "pcie8-dual-socket", None])
    if kind is None:
        return None
    t = builtin(kind)
    sick = rng.randrange(8) if rng.random() < 0.2 else -1
    return dataclasses.replace(t, gpus=tuple(
        dataclasses.replace(g, uuid=f"GPU-{name}-{g.index}", healthy=g.index != sick)
        for g in t.gpus))


def _cluster(rng: random.Random) -> list[NodeState]:
    """A few kinds of node in a few states, so that like nodes group, in an order other than
    their names'."""
    names = rng.sample([f"n{i:02d}" for i in range(100)], rng.randint(2, 24))
    out = []
    for name in names:
        free = rng.choice([range(8), range(8), range(4), (), rng.sample(range(8), 3)])
        out.append(NodeState(name, _own(name, rng), frozenset(free),
                             rng.choice([2000, 16000, 64000]), rng.choice([8, 64, 512]) * GIB,
                             rng.choice([0, 1, 3, 110])))
    return out


def _gang(i: int, nodes: list[NodeState], rng: random.Random) -> GangRequest:
    names = [n.name for n in nodes]
    eligible = None if rng.random() < 0.6 else frozenset(rng.sample(names, rng.randint(1,
                                                                                   len(names))))
    size = rng.choice([1, 1, 2, 4, 8])
    count = rng.choice([1, 2, 4])
    # sometimes each member has nodes of its own, as where another scheduler (Kueue's TAS)
    # pinned each pod to its node
    pinned = rng.random() < 0.3
    members = [MemberRequest(f"g{i}/w{k}", rng.choice([size, size, 1]),
                             rng.choice([1000, 4000]), rng.choice([1, 16]) * GIB,
                             frozenset(rng.sample(names, min(len(names), rng.randint(1, 4))))
                             if pinned else eligible)
               for k in range(count)]
    if rng.random() < 0.7:
        launcher_eligible = None if rng.random() < 0.7 else frozenset(rng.sample(names, 1))
        members.append(MemberRequest(f"g{i}/launcher", 0, rng.choice([500, 8000, 60000]),
                                     rng.choice([1, 100]) * GIB, launcher_eligible))
    return GangRequest(f"g{i}", tuple(members), mode=rng.choice(["required", "preferred"]),
                       single_node=rng.random() < 0.6,
                       min_ring_gbps=rng.choice([None, None, 40.0, 100.0, 150.0]))


def _consume(state: NodeState, m: MemberRequest, gpus: tuple[int, ...]) -> NodeState:
    return dataclasses.replace(
        state, free_gpus=state.free_gpus - frozenset(gpus),
        free_cpu_milli=state.free_cpu_milli - m.cpu_milli,
        free_memory_bytes=state.free_memory_bytes - m.memory_bytes,
        free_pods=state.free_pods - 1)


def test_grouped_placements_are_those_of_the_scan_over_a_round_of_gangs() -> None:
    seen: Counter[str] = Counter()
    tables = TableCache()
    for seed in range(300):
        rng = random.Random(seed)
        nodes = _cluster(rng)
        groups = NodeGroups(nodes)
        for i in range(10):
            gang = _gang(i, nodes, rng)
            grouped = place_gang(nodes, gang, tables=tables, groups=groups)
            scanned = place_gang(nodes, gang, tables=tables)
            assert grouped == scanned, (seed, gang)
            if isinstance(scanned, Unplaceable):
                seen["below the floor" if "minRingGBps" in scanned.reason else "unplaceable"] += 1
                continue
            seen["placed"] += 1
            at = {n.name: k for k, n in enumerate(nodes)}
            by_key = {m.key: m for m in gang.members}
            gpu_nodes = {p.node for p in scanned.members if p.gpus}
            for p in scanned.members:
                if not p.gpus and gpu_nodes and p.node not in gpu_nodes:
                    seen["launcher on a node of its own"] += 1
                nodes[at[p.node]] = _consume(nodes[at[p.node]], by_key[p.key], p.gpus)
                groups.put(nodes[at[p.node]])  # as the planner's round does
    # every path of the engine's choices ran, often
    assert min(seen.values()) >= 50 and len(seen) == 4, seen


def test_groups_made_with_another_table_cache_are_made_again() -> None:
    """The groups hold their cache's class tables: a call with another cache regroups, and
    places as the scan does."""
    nodes = [NodeState(f"n{i}", builtin("dgx1-v100"), frozenset(range(8)), 8000, 64 * GIB)
             for i in range(3)]
    groups = NodeGroups(nodes)
    gang = GangRequest("g", (MemberRequest("g/w", 4, 1000),), single_node=True)
    place_gang(nodes, gang, tables=TableCache(), groups=groups)
    nodes[0] = dataclasses.replace(nodes[0], free_gpus=frozenset(range(4)))
    groups.put(nodes[0])
    other = TableCache()
    placed = place_gang(nodes, gang, tables=other, groups=groups)
    assert placed == place_gang(nodes, gang, tables=other)
    assert isinstance(placed, GangPlacement) and placed.members[0].node == "n0"  # best fit


def _grouping(groups: NodeGroups) -> dict[object, object]:
    return {gpu: dict(rooms) for gpu, rooms in groups.groups()}


def test_groups_kept_across_cycles_are_those_made_afresh() -> None:
    """The binder keeps one NodeGroups for its life and `sync`s it with each cycle's states:
    it then groups, and places, as groups made afresh from those states do, whether a node's
    state changed, stayed the same object, or the node list itself changed."""
    tables = TableCache()
    seen: Counter[str] = Counter()
    for seed in range(200):
        rng = random.Random(seed)
        nodes = _cluster(rng)
        kept = NodeGroups()
        for cycle in range(6):
            kept.sync(nodes)
            before = {n.name: n for n in nodes}
            gang = _gang(cycle, nodes, rng)
            placed = place_gang(nodes, gang, tables=tables, groups=kept)
            fresh = NodeGroups(nodes)
            assert placed == place_gang(nodes, gang, tables=tables, groups=fresh), (seed, cycle)
            assert _grouping(kept) == _grouping(fresh), (seed, cycle)
            if isinstance(placed, GangPlacement):  # the round consumes it, and tells the groups
                at = {n.name: k for k, n in enumerate(nodes)}
                by_key = {m.key: m for m in gang.members}
                for p in placed.members:
                    nodes[at[p.node]] = _consume(nodes[at[p.node]], by_key[p.key], p.gpus)
                    kept.put(nodes[at[p.node]])
            nodes = list(nodes)  # the next cycle's states: some anew, most the same objects
            roll = rng.random()
            if roll < 0.15:
                seen["nodes reordered"] += 1
                rng.shuffle(nodes)
            elif roll < 0.3 and len(nodes) > 1:
                seen["a node gone"] += 1
                nodes.pop(rng.randrange(len(nodes)))
            elif roll < 0.4:
                seen["a node renamed"] += 1
                i = rng.randrange(len(nodes))
                nodes[i] = dataclasses.replace(nodes[i], name=nodes[i].name + "x")
            for i in rng.sample(range(len(nodes)), rng.randint(0, len(nodes))):
                n = nodes[i]
                roll = rng.random()
                if roll < 0.3:  # freed, as when a pod finished
                    seen["freed"] += 1
                    nodes[i] = dataclasses.replace(n, free_gpus=frozenset(range(8)))
                elif roll < 0.5:  # the same state in a new object
                    seen["same state, new object"] += 1
                    nodes[i] = dataclasses.replace(n)
                elif roll < 0.7 and n is not before.get(n.name, n):
                    # the state object it had before this cycle's placement, as when the pods
                    # placed there were deleted before they were bound
                    seen["back to the object before"] += 1
                    nodes[i] = before[n.name]
    assert min(seen.values()) >= 50 and len(seen) == 6, seen


BLOCK, RACK, CLIQUE = "example.com/block", "example.com/rack", "nvidia.com/gpu.clique"


def _labels(nodes: list[NodeState], rng: random.Random) -> dict[str, dict[str, str]]:
    """Blocks, racks and cliques, some nodes without the narrower labels or any, and a label
    no level declares."""
    out: dict[str, dict[str, str]] = {}
    for n in nodes:
        b, r = rng.randrange(2), rng.randrange(3)
        full = {BLOCK: f"b{b}", RACK: f"r{r}", CLIQUE: f"u.b{b}r{r}c{rng.randrange(2)}",
                "example.com/row": f"w{rng.randrange(2)}"}
        keep = rng.choice([4, 4, 4, 3, 2, 1, 0])
        out[n.name] = dict(list(full.items())[:keep]) if keep < 4 else full
    return out


def _network_gang(i: int, nodes: list[NodeState], rng: random.Random) -> GangRequest:
    gang = _gang(i, nodes, rng)
    if rng.random() < 0.2:
        return gang  # the plain engine binds the same groups between network gangs
    level = rng.choice([BLOCK, RACK, CLIQUE, None, "example.com/row"])
    sliced = rng.random() < 0.3
    return dataclasses.replace(gang, single_node=rng.random() < 0.2, network=NetworkRequest(
        level, rng.choice(["required", "preferred"]),
        rng.choice([RACK, CLIQUE, HOSTNAME]) if sliced else None,
        rng.choice([1, 2]) if sliced else 0, rng.choice(["required", "preferred"]),
        rng.choice([None, None, BLOCK])))


def test_grouped_network_placements_are_those_of_the_scan() -> None:
    """A gang within network domains sums each domain's room from the groups kept by path: it
    is placed as from every node, in a round where placements consume nodes, across cycles
    whose states change, and between plain gangs and requests over other levels (which bind
    the same groups with other paths, or none)."""
    tables = TableCache()
    seen: Counter[str] = Counter()
    for seed in range(300):
        rng = random.Random(seed)
        nodes = _cluster(rng)
        network = Network((BLOCK, RACK, CLIQUE), _labels(nodes, rng))
        kept = NodeGroups()
        for cycle in range(4):
            kept.sync(nodes)
            for i in range(4):
                gang = _network_gang(cycle * 4 + i, nodes, rng)
                grouped = place_gang(nodes, gang, network=network, tables=tables, groups=kept)
                scanned = place_gang(nodes, gang, network=network, tables=tables)
                assert grouped == scanned, (seed, cycle, gang)
                if isinstance(scanned, Unplaceable):
                    seen["unplaceable"] += 1
                    continue
                seen["placed" if gang.network else "placed, no level"] += 1
                if gang.network and len({m.eligible_nodes for m in gang.members if m.gpus}) > 1:
                    seen["placed, members pinned apart"] += 1
                at = {n.name: k for k, n in enumerate(nodes)}
                by_key = {m.key: m for m in gang.members}
                for p in scanned.members:
                    nodes[at[p.node]] = _consume(nodes[at[p.node]], by_key[p.key], p.gpus)
                    kept.put(nodes[at[p.node]])
            nodes = list(nodes)
            for k in rng.sample(range(len(nodes)), rng.randint(0, len(nodes))):
                nodes[k] = dataclasses.replace(nodes[k], free_gpus=frozenset(range(8)))
    pinned_apart = seen.pop("placed, members pinned apart", 0)
    assert min(seen.values()) >= 100 and len(seen) == 3 and pinned_apart >= 20, seen
