"""Gang placement across nodes (webhook.topology.placement.place_gang)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.topology import (
    GangPlacement,
    GangRequest,
    MemberRequest,
    NodeState,
    Unplaceable,
    builtin,
    place_gang,
)
from webhook.topology.gpu_choice import TableCache, set_score

V100 = builtin("dgx1-v100")
GIB = 1 << 30


def node(name: str, free: object = range(8), *, topo: str | None = "dgx1-v100",
         cpu: int = 64000, mem: int = 512 * GIB, pods: int = 110) -> NodeState:
    return NodeState(
        name=name,
        topology=builtin(topo) if topo else None,
        free_gpus=frozenset(free),  # type: ignore[arg-type]
        free_cpu_milli=cpu,
        free_memory_bytes=mem,
        free_pods=pods,
    )


def workers(n: int, gpus: int = 1, **kw: object) -> tuple[MemberRequest, ...]:
    return tuple(MemberRequest(key=f"ns/w{i}", gpus=gpus, **kw) for i in range(n))  # type: ignore[arg-type]


def launcher(**kw: object) -> MemberRequest:
    return MemberRequest(key="ns/launcher", gpus=0, cpu_milli=1000, **kw)  # type: ignore[arg-type]


def ok(result: GangPlacement | Unplaceable) -> GangPlacement:
    assert isinstance(result, GangPlacement), result
    return result


def test_reference_gang_lands_on_one_node_on_a_good_quad() -> None:
    gang = GangRequest(name="vgg16", members=(launcher(), *workers(4)))
    p = ok(place_gang([node("a"), node("b")], gang))
    assert p.nodes_used == 1
    gpus = sorted(g for m in p.members for g in m.gpus)
    assert gpus in ([0, 1, 2, 3], [4, 5, 6, 7])
    assert p.gang_gbps == 100.0 and p.ring_gbps == {p.members[0].node: 100.0}
    assert [m.key for m in p.members] == ["ns/launcher", *(f"ns/w{i}" for i in range(4))]
    assert p.members[0].gpus == () and p.members[0].node == p.members[1].node


def test_best_fit_prefers_a_node_whose_free_quad_is_exactly_enough() -> None:
    gang = GangRequest(name="g", members=workers(4))
    p = ok(place_gang([node("empty"), node("half", free=(4, 5, 6, 7))], gang))
    assert {m.node for m in p.members} == {"half"}


def test_bandwidth_beats_fit() -> None:
    # "poor" has 4 free GPUs with no NVLink ring; a full node gives a 100 GB/s quad
    gang = GangRequest(name="g", members=workers(4))
    p = ok(place_gang([node("poor", free=(0, 1, 6, 7)), node("full")], gang))
    assert {m.node for m in p.members} == {"full"} and p.gang_gbps == 100.0


def test_fit_beats_numa_and_bisection_at_the_same_bandwidth() -> None:
    # both give a 50 GB/s pair: "numa" keeps one NUMA node ({1, 2}) but leaves GPU 7 alone;
    # "fit" ({0, 4}, one per NUMA node) is used up, so no node is left part-free
    gang = GangRequest(name="g", members=workers(2))
    p = ok(place_gang([node("numa", free=(1, 2, 7)), node("fit", free=(0, 4))], gang))
    assert {m.node for m in p.members} == {"fit"} and p.gang_gbps == 50.0
    assert sorted(g for m in p.members for g in m.gpus) == [0, 4]


def test_a_one_gpu_gang_keeps_a_free_quad_whole_for_a_quad_gang() -> None:
    # "quad" has the 100 GB/s quad free; "odd" ({0, 2, 3, 4, 5}) has no such quad. Best fit
    # alone puts the 1-GPU gang on "quad" (3 left, not 4), so the 4-GPU gang after it breaks
    # the empty node; least loss puts it on "odd", and the quad gang then fills "quad"
    nodes = [node("quad", free=(0, 1, 2, 3)), node("odd", free=(0, 2, 3, 4, 5)), node("empty")]
    one = ok(place_gang(nodes, GangRequest(name="one", members=workers(1))))
    assert one.members[0].node == "odd"
    odd = node("odd", free={0, 2, 3, 4, 5} - set(one.members[0].gpus))
    left = [odd if n.name == "odd" else n for n in nodes]
    quad = ok(place_gang(left, GangRequest(name="quad", members=workers(4))))
    assert {m.node for m in quad.members} == {"quad"} and quad.gang_gbps == 100.0


def test_two_by_four_splits_a_node_into_its_quads() -> None:
    gang = GangRequest(name="g", members=workers(2, gpus=4))
    p = ok(place_gang([node("a")], gang))
    assert sorted(m.gpus for m in p.members) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert p.gang_gbps == 150.0


def test_sixteen_by_eight_uses_sixteen_whole_nodes() -> None:
    nodes = [node(f"n{i:02}") for i in range(16)] + [node("busy", free=range(7))]
    p = ok(place_gang(nodes, GangRequest(name="big", members=workers(16, gpus=8))))
    assert p.nodes_used == 16 and "busy" not in {m.node for m in p.members}
    assert p.gang_gbps == 12.5  # the network, not NVLink, bounds a split gang
    assert all(v == 150.0 for v in p.ring_gbps.values())


def test_split_uses_fewest_nodes() -> None:
    nodes = [node("a", free=(0, 1)), node("b", free=(0, 1, 2)), node("c", free=range(6))]
    p = ok(place_gang(nodes, GangRequest(name="g", members=workers(8))))
    # two nodes at the least; c + b splits 5 + 3, more evenly than c + a's 6 + 2
    assert p.nodes_used == 2 and Counter(m.node for m in p.members) == {"c": 5, "b": 3}
    assert p.ring_gbps["b"] == 50.0


def test_a_split_is_as_even_as_the_fewest_nodes_allow() -> None:
    # 7 + 1 would leave one GPU on the network through one NIC; the two 4-free nodes give
    # 4 + 4 and leave the 7-free node whole for another gang
    nodes = [node("seven", free=range(7)), node("four-a", free=(0, 1, 2, 3)),
             node("four-b", free=(4, 5, 6, 7))]
    p = ok(place_gang(nodes, GangRequest(name="g", members=workers(8))))
    assert Counter(m.node for m in p.members) == {"four-a": 4, "four-b": 4}
    assert p.ring_gbps == {"four-a": 100.0, "four-b": 100.0}


def test_an_even_split_never_costs_a_node() -> None:
    # 6 + 2 on two nodes, or 3 + 3 + 2 on three: the fewest nodes come first
    nodes = [node("six", free=range(6)), node("three-a", free=(0, 1, 2)),
             node("three-b", free=(4, 5, 6)), node("two", free=(6, 7))]
    p = ok(place_gang(nodes, GangRequest(name="g", members=workers(8))))
    assert p.nodes_used == 2 and Counter(m.node for m in p.members) == {"six": 5, "three-a": 3}


def test_single_node_required_says_why() -> None:
    nodes = [node("a", free=(0, 1, 2)), node("b", free=(4, 5))]
    gang = GangRequest(name="g", members=workers(4), single_node=True)
    r = place_gang(nodes, gang)
    assert isinstance(r, Unplaceable)
    assert "needs 4 GPUs" in r.reason and "(a) has 3" in r.reason


def test_single_node_members_pinned_apart_are_said_apart_from_free_gpus() -> None:
    """As when Kueue's topology-aware scheduling spread the gang: each member's nodeSelector
    names another node, so no free GPUs would make one node hold them."""
    nodes = [node("a"), node("b"), node("c")]
    a, b = (MemberRequest(f"ns/w{i}", 8, eligible_nodes=frozenset({n})) for i, n in enumerate("ab"))
    r = place_gang(nodes, GangRequest(name="g", members=(a, b), single_node=True))
    assert isinstance(r, Unplaceable)
    assert r.reason == ("gang g must be on one node, but its members' node selectors, affinity "
                        "or tolerations leave them no node in common: ns/w0 may use a; ns/w1 "
                        "may use b")
    # the control: members that share a node with room are placed there
    c = replace(b, eligible_nodes=frozenset({"a", "c"}))
    small = GangRequest(name="g", members=(replace(a, gpus=4), replace(c, gpus=4)),
                        single_node=True)
    assert {m.node for m in ok(place_gang(nodes, small)).members} == {"a"}
    # and preferred: it is no conflict, the gang spreads over the two nodes
    spread = GangRequest(name="g", members=(a, b), single_node=True, mode="preferred")
    assert ok(place_gang(nodes, spread)).nodes_used == 2


def test_single_node_preferred_falls_back_to_more_nodes() -> None:
    nodes = [node("a", free=(0, 1, 2)), node("b", free=(4, 5))]
    gang = GangRequest(name="g", members=workers(4), single_node=True, mode="preferred")
    assert ok(place_gang(nodes, gang)).nodes_used == 2


def test_min_ring_required_refuses_a_poor_set_preferred_takes_it() -> None:
    nodes = [node("poor", free=(0, 1, 6, 7))]
    gang = GangRequest(name="g", members=workers(4), min_ring_gbps=50.0)
    r = place_gang(nodes, gang)
    assert isinstance(r, Unplaceable)
    assert "at least 50 GB/s" in r.reason and "poor" in r.reason and "6 GB/s" in r.reason
    soft = GangRequest(name="g", members=workers(4), min_ring_gbps=50.0, mode="preferred")
    assert ok(place_gang(nodes, soft)).gang_gbps == 6.0


def test_min_ring_required_refuses_a_split_over_a_slow_network() -> None:
    nodes = [node("a", free=(0, 1)), node("b", free=(0, 1))]
    gang = GangRequest(name="g", members=workers(4), min_ring_gbps=20.0)
    r = place_gang(nodes, gang)
    assert isinstance(r, Unplaceable) and "between nodes only 12.5 GB/s" in r.reason


def test_eligible_nodes_restrict_members() -> None:
    gang = GangRequest(name="g", members=workers(4, eligible_nodes=frozenset({"b"})))
    p = ok(place_gang([node("a"), node("b", free=(0, 1, 2, 3))], gang))
    assert {m.node for m in p.members} == {"b"}
    none = GangRequest(name="g", members=workers(2, eligible_nodes=frozenset({"zzz"})))
    assert isinstance(place_gang([node("a")], none), Unplaceable)


def test_cpu_and_memory_limit_hosts() -> None:
    gang = GangRequest(name="g", members=workers(4, cpu_milli=8000, memory_bytes=64 * GIB))
    nodes = [node("thin", cpu=16000), node("fat", free=range(4))]
    p = ok(place_gang(nodes, gang))
    assert {m.node for m in p.members} == {"fat"}


def test_launcher_goes_elsewhere_when_the_gpu_node_is_full_of_cpu() -> None:
    gang = GangRequest(name="g", members=(*workers(2, cpu_milli=4000), launcher()))
    nodes = [node("gpu", cpu=8000), node("cpu-only", topo=None), node("gpu2", free=(0,), cpu=9000)]
    p = ok(place_gang(nodes, gang))
    assert {m.node for m in p.members if m.gpus} == {"gpu"}
    assert next(m.node for m in p.members if not m.gpus) == "cpu-only"
    assert p.nodes_used == 2


def test_launcher_without_room_anywhere() -> None:
    gang = GangRequest(name="g", members=(*workers(1), launcher(eligible_nodes=frozenset())))
    r = place_gang([node("a")], gang)
    assert isinstance(r, Unplaceable) and "ns/launcher" in r.reason


def test_nodes_without_topology_never_get_gpu_members() -> None:
    r = place_gang([node("x", topo=None)], GangRequest(name="g", members=workers(1)))
    assert isinstance(r, Unplaceable) and "topology" in r.reason


def test_mixed_member_sizes() -> None:
    gang = GangRequest(name="g", members=(MemberRequest("ns/big", 4), *workers(2, gpus=2)))
    p = ok(place_gang([node("a", free=range(4)), node("b", free=range(4, 8))], gang))
    assert p.nodes_used == 2
    big = next(m for m in p.members if m.key == "ns/big")
    assert len(big.gpus) == 4


def test_not_enough_gpus_anywhere_is_explained() -> None:
    r = place_gang([node("a", free=(0,)), node("b", free=(1, 2))],
                   GangRequest(name="g", members=workers(4)))
    assert isinstance(r, Unplaceable)
    assert "can host 3 of its 4 GPU members" in r.reason and "3 GPUs free on 2 nodes" in r.reason


def test_empty_gang() -> None:
    assert isinstance(place_gang([node("a")], GangRequest(name="g", members=())), Unplaceable)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), count=st.integers(1, 24), size=st.sampled_from([1, 2, 4, 8]))
def test_random_clusters_give_valid_minimal_placements(seed: int, count: int, size: int) -> None:
    rng = random.Random(seed)
    kinds = ["dgx1-v100", "dgx1-p100", "hgx-a100", "pcie8-nvlink-pairs"]
    nodes = [
        node(f"n{i}", free=rng.sample(range(8), rng.randint(0, 8)), topo=rng.choice(kinds),
             cpu=rng.choice([2000, 64000]))
        for i in range(rng.randint(1, 12))
    ]
    members = (*workers(count, gpus=size, cpu_milli=1000), MemberRequest("ns/launcher", 0))
    gang = GangRequest(name="g", members=members)
    result = place_gang(nodes, gang)
    caps = sorted((min(len(n.free_gpus) // size, n.free_cpu_milli // 1000) for n in nodes),
                  reverse=True)
    if sum(caps) < count:
        assert isinstance(result, Unplaceable)
        return
    p = ok(result)
    by_name = {n.name: n for n in nodes}
    taken: Counter[tuple[str, int]] = Counter()
    cpu: Counter[str] = Counter()
    for m in p.members:
        n = by_name[m.node]
        assert set(m.gpus) <= n.free_gpus and len(m.gpus) == (size if m.key != "ns/launcher" else 0)
        taken.update((m.node, g) for g in m.gpus)
        cpu[m.node] += 1000 if m.gpus else 0
    assert max(taken.values()) == 1  # no GPU given twice
    assert all(cpu[name] <= by_name[name].free_cpu_milli for name in cpu)
    gpu_nodes = {m.node for m in p.members if m.gpus}
    minimal = next(i for i in range(1, len(caps) + 1) if sum(caps[:i]) >= count)
    assert len(gpu_nodes) == minimal
    parts = Counter(m.node for m in p.members if m.gpus)
    if minimal > 1:  # as even as the fewest nodes allow
        assert min(parts.values()) >= min(caps[minimal - 1], count // minimal)
    if len(gpu_nodes) == 1 and count * size >= 2:
        (name,) = gpu_nodes
        chosen = [g for m in p.members for g in m.gpus]
        assert p.gang_gbps == set_score(by_name[name].topology, chosen).allreduce_gbps  # type: ignore[arg-type]


def test_malformed_gangs_are_refused_not_crashed() -> None:
    neg = GangRequest(name="g", members=(MemberRequest("ns/a", -1),))
    r = place_gang([node("a")], neg)
    assert isinstance(r, Unplaceable) and "negative" in r.reason
    dup = GangRequest(name="g", members=(MemberRequest("ns/a", 1), MemberRequest("ns/a", 1)))
    r = place_gang([node("a")], dup)
    assert isinstance(r, Unplaceable) and "twice" in r.reason
    too_big = GangRequest(name="g", members=(MemberRequest("ns/a", 9),))
    r = place_gang([node("a", free=range(8)), node("b", free=(0, 99))], too_big)
    assert isinstance(r, Unplaceable) and "needs 9 GPUs" in r.reason


#: one cache for every example: a class's tables are the same in each, and computing them
#: anew for each example was nearly all of this test's time
_TABLES = TableCache()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([frozenset(range(8)), frozenset({0, 1, 2, 3}),
                                           frozenset({4, 5, 6, 7}), frozenset({1, 2, 5, 6}),
                                           frozenset({0, 7})]),
                          st.sampled_from(["dgx1-v100", "hgx-a100"]),
                          st.sampled_from([2000, 64000])), min_size=1, max_size=40),
       st.integers(1, 4), st.randoms(use_true_random=False))
def test_single_node_choice_is_the_best_key_over_every_node(
        shapes: list[tuple[frozenset[int], str, int]], k: int, rnd: random.Random) -> None:
    """Many nodes alike (as in a real cluster): the node chosen is the one a scan of every
    node would choose, the least (placement key, name) among the nodes that fit."""
    nodes = [node(f"n{i:02d}", free, topo=topo, cpu=cpu)
             for i, (free, topo, cpu) in enumerate(shapes)]
    rnd.shuffle(nodes)
    gang = GangRequest("g", workers(k, cpu_milli=4000), single_node=True)
    tables = _TABLES

    def key(n: NodeState) -> tuple[object, str]:
        assert n.topology is not None
        choice, free = tables.usable(n.topology, n.free_gpus)
        return choice.placement_key(free, k), n.name

    fits = [key(n) for n in nodes if len(n.free_gpus) >= k and n.free_cpu_milli >= 4000 * k]
    result = place_gang(nodes, gang, tables=tables)
    if not fits:
        assert isinstance(result, Unplaceable)
        return
    assert {p.node for p in ok(result).members} == {min(fits)[1]}
