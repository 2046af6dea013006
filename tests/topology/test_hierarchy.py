"""One decision from the network levels down to the GPUs (webhook.topology.hierarchy)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from webhook.topology import (
    GangPlacement,
    GangRequest,
    Levels,
    LevelsError,
    MemberRequest,
    Network,
    NetworkRequest,
    NodeState,
    Topology,
    Unplaceable,
    builtin,
    parse_levels,
    place_gang,
)
from webhook.topology.gpu_choice import TableCache
from webhook.topology.groups import NodeGroups
from webhook.topology.hierarchy import slice_domains
from webhook.topology.network import CLIQUE, HOSTNAME, resolve_request

H100 = builtin("hgx-h100")
BLOCK, RACK = "example.com/block", "example.com/rack"
LEVELS = (BLOCK, RACK, CLIQUE)
TABLES = TableCache()


def node(name: str, free: Iterable[int] = range(8)) -> NodeState:
    return NodeState(name, H100, frozenset(free), 64000, 1 << 40, 110)


def cluster(free: dict[str, Iterable[int]] | None = None
            ) -> tuple[list[NodeState], dict[str, dict[str, str]]]:
    """2 blocks x 2 racks x 4 nodes; nodes of rack b0-r0 and b0-r1 form cliques of 2."""
    nodes, labels = [], {}
    for b in range(2):
        for r in range(2):
            for i in range(4):
                name = f"b{b}-r{r}-n{i}"
                nodes.append(node(name, (free or {}).get(name, range(8))))
                labels[name] = {BLOCK: f"b{b}", RACK: f"r{r}", CLIQUE: f"uuid.b{b}r{r}c{i // 2}",
                                HOSTNAME: name}
    return nodes, labels


def gang(n: int, gpus: int = 8, *, level: str | None = RACK, mode: str = "required",
         slice_level: str | None = None, size: int = 0, launcher: bool = False,
         slice_mode: str = "required", max_level: str | None = None) -> GangRequest:
    members = tuple(MemberRequest(f"ns/w-{i}", gpus, 1000, 1 << 30) for i in range(n))
    if launcher:
        members = (MemberRequest("ns/launcher", 0, 500, 1 << 28), *members)
    return GangRequest("ns/g", members, mode="preferred",
                       network=NetworkRequest(level, mode, slice_level, size,  # type: ignore[arg-type]
                                              slice_mode, max_level))  # type: ignore[arg-type]


def place(nodes: list[NodeState], labels: dict[str, dict[str, str]], g: GangRequest,
          levels: Levels | tuple[str, ...] = LEVELS) -> GangPlacement | Unplaceable:
    return place_gang(nodes, g, network=Network(levels, labels), tables=TABLES)


def ok(result: GangPlacement | Unplaceable) -> GangPlacement:
    assert isinstance(result, GangPlacement), result
    return result


def domains(p: GangPlacement, labels: dict[str, dict[str, str]], *level: str
            ) -> set[tuple[str, ...]]:
    return {tuple(labels[m.node][lv] for lv in level) for m in p.members if m.gpus}


def test_required_rack_lands_in_one_rack_the_fullest_that_fits() -> None:
    nodes, labels = cluster({"b0-r0-n0": (), "b1-r1-n0": (), "b1-r1-n1": range(4)})
    p = ok(place(nodes, labels, gang(2)))
    # b1-r1 has 20 free GPUs, the least of the racks that hold 2 x 8: best fit
    assert domains(p, labels, BLOCK, RACK) == {("b1", "r1")}
    assert p.nodes_used == 2 and all(len(m.gpus) == 8 for m in p.members)


FULL: tuple[int, ...] = ()


def only(free: dict[str, Iterable[int]]) -> dict[str, Iterable[int]]:
    """Every node of `cluster` full but these."""
    return {f"b{b}-r{r}-n{i}": free.get(f"b{b}-r{r}-n{i}", FULL)
            for b in range(2) for r in range(2) for i in range(4)}


def test_a_gang_on_one_node_takes_the_fullest_node_whatever_its_rack() -> None:
    # b0-r0 has room for 5 pairs (2 + 8 free), b1-r1 for 2 (4 free): the fullest rack is
    # b1-r1, but one node is the narrowest domain, and the fullest node is in b0-r0
    nodes, labels = cluster(only({"b0-r0-n0": (0, 1), "b0-r0-n1": range(8),
                                  "b1-r1-n0": range(4)}))
    for mode in ("preferred", "required"):
        p = ok(place(nodes, labels, gang(1, 2, mode=mode)))
        assert [(m.node, m.gpus) for m in p.members] == [("b0-r0-n0", (0, 1))]


def test_nodes_alike_go_by_the_fullest_rack() -> None:
    # two nodes with 2 free GPUs: the one in the rack with the least room (b1-r0) wins, so
    # that the roomier rack stays whole for wider gangs
    nodes, labels = cluster(only({"b0-r0-n0": (0, 1), "b0-r0-n1": range(8),
                                  "b1-r0-n3": (0, 1)}))
    p = ok(place(nodes, labels, gang(1, 2, level=BLOCK, mode="preferred")))
    assert {m.node for m in p.members} == {"b1-r0-n3"}


def test_a_required_level_still_needs_its_label_on_the_one_node() -> None:
    nodes, labels = cluster(only({"b0-r0-n0": (0, 1), "b1-r1-n0": range(8)}))
    del labels["b0-r0-n0"][RACK]  # the fullest node is in no rack
    p = ok(place(nodes, labels, gang(1, 2)))
    assert {m.node for m in p.members} == {"b1-r1-n0"}
    p = ok(place(nodes, labels, gang(1, 2, mode="preferred")))  # in block b0 all the same
    assert {m.node for m in p.members} == {"b0-r0-n0"}


def nodes_of(p: GangPlacement) -> set[str]:
    return {m.node for m in p.members if m.gpus}


def placed_alike(nodes: list[NodeState], labels: dict[str, dict[str, str]], g: GangRequest,
                 levels: tuple[str, ...] = LEVELS) -> GangPlacement:
    """The placement, the same with the binder's node groups as from the scan of every node."""
    p = ok(place(nodes, labels, g, levels))
    assert place_gang(nodes, g, network=Network(levels, labels), tables=TABLES,
                      groups=NodeGroups(nodes)) == p
    return p


def test_several_members_take_the_holes_of_an_nvlink_clique_before_a_whole_node() -> None:
    # four 1-GPU members fit no part-used node alone: one node would take the whole b0-r0-n2.
    # The part-used nodes of a clique take them instead (its NVLink joins them), those of the
    # fullest clique that holds them: b1r1c0 (2 + 3 free) before b0r0c0 (3 + 3), so b0-r0-n2
    # stays whole for a gang of whole nodes
    holes = only({"b0-r0-n0": (0, 1, 2), "b0-r0-n1": (0, 1, 2), "b0-r0-n2": range(8),
                  "b1-r1-n0": (0, 1), "b1-r1-n1": (0, 1, 2)})
    nodes, labels = cluster(holes)
    for mode in ("preferred", "required"):
        for level in (RACK, BLOCK, CLIQUE):
            p = placed_alike(nodes, labels, gang(4, 1, level=level, mode=mode))
            assert nodes_of(p) == {"b1-r1-n0", "b1-r1-n1"}, (mode, level)
    # one node when the gang must be on one, or when no level is an NVLink domain
    one = replace(gang(4, 1), single_node=True)
    assert nodes_of(placed_alike(nodes, labels, one)) == {"b0-r0-n2"}
    assert nodes_of(placed_alike(nodes, labels, gang(4, 1), (BLOCK, RACK))) == {"b0-r0-n2"}
    # one member cannot be shared out: a whole node
    assert nodes_of(placed_alike(nodes, labels, gang(1, 4))) == {"b0-r0-n2"}
    # Topograph's NVLink domain label is such a level too
    domain = "accelerator.topograph.run/domain"
    relabelled = {n: {(domain if k == CLIQUE else k): v for k, v in lv.items()}
                  for n, lv in labels.items()}
    assert nodes_of(placed_alike(nodes, relabelled, gang(4, 1), (BLOCK, RACK, domain))) \
        == {"b1-r1-n0", "b1-r1-n1"}


def test_a_part_used_node_that_holds_the_gang_comes_before_a_cliques_holes() -> None:
    nodes, labels = cluster(only({"b0-r0-n0": (0, 1), "b0-r0-n1": range(4),
                                  "b0-r0-n2": range(8)}))
    assert nodes_of(placed_alike(nodes, labels, gang(4, 1))) == {"b0-r0-n1"}


def test_the_holes_of_two_cliques_never_hold_a_gang_a_whole_node_can() -> None:
    # 2 + 2 free GPUs, in cliques b0r0c0 and b0r0c1: the gang takes the whole node, in one
    # clique, rather than span two
    nodes, labels = cluster(only({"b0-r0-n0": (0, 1), "b0-r0-n2": (0, 1),
                                  "b1-r0-n0": range(8)}))
    assert nodes_of(placed_alike(nodes, labels, gang(4, 1, level=BLOCK, mode="preferred"))) \
        == {"b1-r0-n0"}


def test_preferred_rack_that_fits_no_rack_spans_the_fewest_racks_of_one_block() -> None:
    nodes, labels = cluster({"b1-r0-n0": range(4)})
    p = ok(place(nodes, labels, gang(6, mode="preferred")))
    assert domains(p, labels, BLOCK) == {("b1",)}  # the fuller block, which holds 7
    assert len(domains(p, labels, BLOCK, RACK)) == 2
    p = ok(place(nodes, labels, gang(8, mode="preferred")))
    assert domains(p, labels, BLOCK) == {("b0",)}  # b1 holds only 7 members now
    assert len(domains(p, labels, BLOCK, RACK)) == 2


def test_preferred_takes_the_narrowest_level_that_fits() -> None:
    nodes, labels = cluster()
    p = ok(place(nodes, labels, gang(2, mode="preferred", level=RACK)))
    assert len(domains(p, labels, CLIQUE)) == 1  # a clique under the rack held it


def test_preferred_spans_blocks_when_no_block_fits_and_nothing_is_left_out() -> None:
    nodes, labels = cluster()
    p = ok(place(nodes, labels, gang(12, mode="preferred", level=BLOCK)))
    assert len(domains(p, labels, BLOCK)) == 2 and p.nodes_used == 12
    assert len(domains(p, labels, BLOCK, RACK)) == 3  # 8 + 4 nodes: two racks and one more


def test_a_preferred_rack_within_one_block_spans_no_wider() -> None:
    """KAI's required level beside its preferred one: the narrowest domain that fits, falling
    back no wider than one domain of the bound; beyond it the gang waits."""
    nodes, labels = cluster({"b1-r0-n0": range(4)})
    p = ok(place(nodes, labels, gang(6, mode="preferred", max_level=BLOCK)))
    assert domains(p, labels, BLOCK) == {("b1",)} and len(domains(p, labels, BLOCK, RACK)) == 2
    p = ok(place(nodes, labels, gang(2, mode="preferred", max_level=BLOCK)))
    assert len(domains(p, labels, BLOCK, RACK)) == 1
    r = place(nodes, labels, gang(9, mode="preferred", max_level=BLOCK))
    assert isinstance(r, Unplaceable)
    assert r.reason == ("gang ns/g needs 72 GPUs (9 members x 8 GPUs) within one "
                        "example.com/block domain; the largest free one (example.com/block=b0) "
                        "has 64 free GPUs")
    # unbounded, the same gang spans both blocks
    assert ok(place(nodes, labels, gang(9, mode="preferred"))).nodes_used == 9


def test_a_bound_at_or_below_the_preferred_level_makes_it_required() -> None:
    nodes, labels = cluster()
    p = ok(place(nodes, labels, gang(3, level=BLOCK, mode="preferred", max_level=RACK)))
    assert len(domains(p, labels, BLOCK, RACK)) == 1
    r = place(nodes, labels, gang(5, level=BLOCK, mode="preferred", max_level=RACK))
    assert isinstance(r, Unplaceable) and "within one example.com/rack domain" in r.reason
    # the node at either end: a bound of one node is one node; one node within a rack is the
    # rack, one node first
    r = place(nodes, labels, gang(2, 4, level=RACK, mode="preferred", max_level=HOSTNAME))
    assert ok(r).nodes_used == 1
    assert isinstance(place(nodes, labels, gang(3, 4, level=RACK, mode="preferred",
                                                max_level=HOSTNAME)), Unplaceable)
    assert ok(place(nodes, labels, gang(2, 4, level=HOSTNAME, mode="preferred",
                                        max_level=RACK))).nodes_used == 1
    p = ok(place(nodes, labels, gang(3, level=HOSTNAME, mode="preferred", max_level=RACK)))
    assert len(domains(p, labels, BLOCK, RACK)) == 1


def test_preferred_slices_that_do_not_fit_leave_the_gang_placed_without_them() -> None:
    # every clique (2 nodes) has 4 + 2 free GPUs: no slice of 2 x 4 GPUs fits in one
    nodes, labels = cluster({n.name: range(4) if n.name[-1] in "02" else range(2)
                             for n in cluster()[0]})
    g = gang(4, 4, level=BLOCK, slice_level=CLIQUE, size=2)
    assert isinstance(place(nodes, labels, g), Unplaceable)
    assert g.network is not None
    p = ok(place(nodes, labels, replace(g, network=replace(g.network, slice_mode="preferred"))))
    assert len(domains(p, labels, BLOCK)) == 1  # the gang's own level still holds
    # where they fit, preferred slices are the slices
    nodes, labels = cluster()
    g = gang(4, 4, level=BLOCK, slice_level=CLIQUE, size=2, slice_mode="preferred")
    assert g.network is not None
    assert ok(place(nodes, labels, g)) == ok(place(nodes, labels, replace(
        g, network=replace(g.network, slice_mode="required"))))


def test_an_alias_names_its_level() -> None:
    nodes, labels = cluster({"b0-r0-n0": (), "b1-r1-n0": (), "b1-r1-n1": range(4)})
    levels = Levels(LEVELS, (("block", BLOCK), ("rack", RACK)))
    by_alias = place(nodes, labels, gang(2, level="rack"), levels)
    assert by_alias == place(nodes, labels, gang(2))
    sliced = gang(4, 4, level="block", slice_level="rack", size=2, max_level=None)
    assert place(nodes, labels, sliced, levels) == place(
        nodes, labels, gang(4, 4, level=BLOCK, slice_level=RACK, size=2))
    r = place(nodes, labels, gang(5, level="rack"), levels)
    assert isinstance(r, Unplaceable) and "within one example.com/rack domain" in r.reason
    # without the alias declared, "rack" is a label no node has
    r = place(nodes, labels, gang(2, level="rack"))
    assert isinstance(r, Unplaceable) and "no node has the label rack" in r.reason


def test_tiers_resolve_from_the_narrowest_level_up() -> None:
    levels = Levels(LEVELS, (("rack", RACK),))
    assert [levels.resolve(f"tier:{n}") for n in (1, 2, 3, 4)] == [CLIQUE, RACK, BLOCK, None]
    assert levels.resolve("rack") == RACK and levels.resolve(BLOCK) == BLOCK
    assert levels.resolve("tier:0") == "tier:0" and levels.resolve("tier:x") == "tier:x"
    bounded = NetworkRequest("tier:1", "preferred", max_level="tier:9")
    assert resolve_request(bounded, levels) == NetworkRequest(CLIQUE, "preferred")
    sliced = NetworkRequest("tier:5", "required", "tier:2", 4)  # no level, its slices kept
    assert resolve_request(sliced, levels) == NetworkRequest(None, "required", RACK, 4)
    assert resolve_request(NetworkRequest("tier:1"), Levels()) == NetworkRequest(None)


def test_a_gang_named_by_tiers_lands_as_one_named_by_labels() -> None:
    nodes, labels = cluster({"b0-r0-n0": (), "b1-r1-n0": (), "b1-r1-n1": range(4)})
    two_racks = gang(6, level="tier:2", mode="preferred", max_level="tier:3")
    assert place(nodes, labels, two_racks) == place(
        nodes, labels, gang(6, level=RACK, mode="preferred", max_level=BLOCK))
    # no levels declared: a tier names nothing, and the gang is placed as one without a level
    assert place(nodes, labels, gang(2, level="tier:1"), ()) == place(
        nodes, labels, gang(2, level=None), ())


def test_required_rack_that_cannot_fit_says_the_level_the_room_and_the_need() -> None:
    nodes, labels = cluster()
    r = place(nodes, labels, gang(5))
    assert isinstance(r, Unplaceable)
    assert r.reason == ("gang ns/g needs 40 GPUs (5 members x 8 GPUs) within one "
                        "example.com/rack domain; the largest free one (example.com/rack=r1) "
                        "has 32 free GPUs")


def test_each_slice_lands_within_one_clique() -> None:
    nodes, labels = cluster({"b0-r0-n1": range(4), "b0-r1-n3": range(6)})
    p = ok(place(nodes, labels, gang(6, 4, level=BLOCK, slice_level=CLIQUE, size=2,
                                     launcher=True)))
    by = {m.key: m for m in p.members}
    for s in range(3):
        pair = {labels[by[f"ns/w-{2 * s + j}"].node][CLIQUE] for j in range(2)}
        assert len(pair) == 1, (s, pair)
    assert len(domains(p, labels, BLOCK)) == 1
    assert by["ns/launcher"].gpus == () and by["ns/launcher"].node in {m.node for m in p.members
                                                                      if m.gpus}


def pinned(g: GangRequest, *nodes: str) -> GangRequest:
    """Each GPU member eligible on one node only, as Kueue's topology-aware scheduling leaves a
    pod it ungated with its node's hostname."""
    it = iter(nodes)
    return replace(g, members=tuple(replace(m, eligible_nodes=frozenset({next(it)}))
                                    if m.gpus else m for m in g.members))


def test_members_pinned_apart_are_placed_where_each_may_go_within_the_level() -> None:
    """The descent counts a domain's room, not whose it is: members pinned to nodes of two
    racks of one block fit that block, and each lands on its own node."""
    nodes, labels = cluster()
    apart = ("b0-r0-n0", "b0-r1-n0")
    for level, mode in ((BLOCK, "required"), (RACK, "preferred"), (None, "required")):
        g = pinned(gang(2, level=level, mode=mode, launcher=True), *apart)
        p = ok(place(nodes, labels, g))
        assert {m.key: m.node for m in p.members if m.gpus} == \
            {"ns/w-0": "b0-r0-n0", "ns/w-1": "b0-r1-n0"}, (level, mode)
        assert len(p.members) == 3 and p.members[0].node in apart
    # one rack required: no rack holds both, and the Event says why, not that GPUs are short
    r = place(nodes, labels, pinned(gang(2), *apart))
    assert isinstance(r, Unplaceable)
    assert r.reason == ("gang ns/g needs 16 GPUs (2 members x 8 GPUs) within one "
                        "example.com/rack domain, and no example.com/rack domain has room on "
                        "nodes that each member may use: ns/w-0 may use b0-r0-n0; ns/w-1 may "
                        "use b0-r1-n0")
    # a pinned node without room: the member waits for it, where the level allowed another
    busy, _ = cluster({"b0-r1-n0": range(4)})
    assert isinstance(place(busy, labels, pinned(gang(2, level=BLOCK), *apart)), Unplaceable)


def test_pinned_slices_land_in_the_clique_their_members_may_use() -> None:
    nodes, labels = cluster()
    four = ("b0-r0-n1", "b0-r1-n2", "b0-r0-n0", "b0-r1-n3")  # slices: w-0 + w-1, w-2 + w-3
    g = gang(4, 4, level=BLOCK, slice_level=CLIQUE, size=2)
    with_cliques = pinned(g, "b0-r0-n0", "b0-r0-n1", "b0-r1-n2", "b0-r1-n3")
    p = ok(place(nodes, labels, with_cliques))
    assert [m.node for m in p.members] == ["b0-r0-n0", "b0-r0-n1", "b0-r1-n2", "b0-r1-n3"]
    # the slice that can go to one clique only goes first, and fills it: the other, which could
    # go to either, takes the other clique (in slice order the first took the clique both need)
    either = replace(g, members=(
        MemberRequest("ns/w-0", 8, 1000, 1 << 30, frozenset({"b0-r0-n0", "b0-r0-n2"})),
        MemberRequest("ns/w-1", 8, 1000, 1 << 30, frozenset({"b0-r0-n1", "b0-r0-n3"})),
        MemberRequest("ns/w-2", 8, 1000, 1 << 30, frozenset({"b0-r0-n0"})),
        MemberRequest("ns/w-3", 8, 1000, 1 << 30, frozenset({"b0-r0-n1"}))))
    p = ok(place(nodes, labels, either))
    assert [m.node for m in p.members] == ["b0-r0-n2", "b0-r0-n3", "b0-r0-n0", "b0-r0-n1"]
    # a slice whose members' nodes are in two cliques cannot be one slice
    r = place(nodes, labels, pinned(g, *four))
    assert isinstance(r, Unplaceable)
    assert r.reason == ("gang ns/g: no nvidia.com/gpu.clique domain has room on nodes that each "
                        "member of a slice may use: ns/w-0 may use b0-r0-n1; ns/w-1 may use "
                        "b0-r1-n2")


def test_a_pinned_slice_moves_an_earlier_one_rather_than_wait() -> None:
    """Three cliques of room for one slice each: A may use cliques 0 and 1, B 1 and 2, C 0
    and 1. First come, A takes clique 0 and B clique 1, and C had nowhere to go (the gang
    waited); now B moves on to clique 2, and C takes clique 1."""
    nodes, labels = cluster()
    c0, c1, c2 = ("b0-r0-n0", "b0-r0-n1"), ("b0-r0-n2", "b0-r0-n3"), ("b0-r1-n0", "b0-r1-n1")
    may = [(c0, c1), (c1, c2), (c0, c1)]  # per slice: its two members' cliques

    def member(i: int) -> MemberRequest:
        first, second = may[i // 2]
        return MemberRequest(f"ns/w-{i}", 8, 1000, 1 << 30,
                             frozenset({first[i % 2], second[i % 2]}))
    g = replace(gang(6, level=BLOCK, slice_level=CLIQUE, size=2),
                members=tuple(member(i) for i in range(6)))
    p = ok(place(nodes, labels, g))
    clique = [labels[m.node][CLIQUE] for m in p.members]
    assert clique[0] == clique[1] and clique[2] == clique[3] and clique[4] == clique[5]
    assert (clique[0], clique[2], clique[4]) == ("uuid.b0r0c0", "uuid.b0r1c0", "uuid.b0r0c1")


def test_slice_domains_finds_an_assignment_where_first_come_does_not() -> None:
    where = [["a", "b"], ["b", "c"], ["a", "b"]]
    room = {"a": 1, "b": 1, "c": 1}
    got = slice_domains([[(k,) for k in w] for w in where], {(k,): n for k, n in room.items()},
                        lambda free, _taken: min(free))
    assert got == [("a",), ("c",), ("b",)]  # first come: a, b; the third moves the second on
    # one domain too few: the slice that cannot be placed is named
    assert slice_domains([[("a",)], [("a",)]], {("a",): 1}, lambda free, _: free[0]) == 1


@settings(max_examples=300, deadline=None)
@given(where=st.lists(st.lists(st.sampled_from("abcd"), max_size=3, unique=True), max_size=6),
       room=st.fixed_dictionaries({k: st.integers(0, 2) for k in "abcd"}))
def test_slice_domains_places_every_slice_whenever_some_assignment_does(
        where: list[list[str]], room: dict[str, int]) -> None:
    keyed = [[(k,) for k in w] for w in where]
    got = slice_domains(keyed, {(k,): n for k, n in room.items()}, lambda free, _: free[-1])
    exists = any(all(n <= room[k] for k, n in Counter(pick).items())
                 for pick in itertools.product(*where))
    if not exists:
        assert isinstance(got, int) and 0 <= got < len(where)
        return
    assert isinstance(got, list) and len(got) == len(where)
    assert all(k in w for k, w in zip(got, keyed, strict=True))
    assert all(n <= room[k[0]] for k, n in Counter(got).items())


@settings(max_examples=60, deadline=None)
@given(frees=st.lists(st.sampled_from([range(8), range(4), range(0), range(2, 8)]),
                      min_size=16, max_size=16),
       pins=st.lists(st.sets(st.integers(0, 15), min_size=1, max_size=3), min_size=2,
                     max_size=4),
       gpus=st.sampled_from([2, 4, 8]), level=st.sampled_from([BLOCK, RACK]))
def test_members_pinned_anywhere_are_placed_when_one_domain_of_the_level_holds_them(
        *, frees: list[range], pins: list[set[int]], gpus: int, level: str) -> None:
    """Whatever nodes each member may use: placed within one domain of the level, each on a
    node it may use, whenever the engine alone places the gang on some domain's nodes."""
    nodes, labels = cluster({f"b{i // 8}-r{i // 4 % 2}-n{i % 4}": f for i, f in enumerate(frees)})
    members = tuple(MemberRequest(f"ns/w-{i}", gpus, 1000, 1 << 30,
                                  frozenset(nodes[j].name for j in pin))
                    for i, pin in enumerate(pins))
    g = GangRequest("ns/g", members, network=NetworkRequest(level, "required"))
    got = place(nodes, labels, g)
    levels = (BLOCK, RACK)[:(BLOCK, RACK).index(level) + 1]

    def domain(name: str) -> tuple[str, ...]:
        return tuple(labels[name][lv] for lv in levels)
    fits = [d for d in {domain(n.name) for n in nodes} if isinstance(place_gang(
        [n for n in nodes if domain(n.name) == d], replace(g, network=None), tables=TABLES),
        GangPlacement)]
    if not fits:
        assert isinstance(got, Unplaceable)
        return
    p = ok(got)
    assert all(m.node in (m_.eligible_nodes or ()) for m, m_ in zip(p.members, members,
                                                                     strict=True))
    assert len(domains(p, labels, *levels)) == 1


def test_unlike_members_pass_over_racks_whose_free_gpus_no_member_fits() -> None:
    """A leader and a worker of 8 GPUs each, unlike in CPU: five racks of half-free nodes (16
    free GPUs each, in holes of 4) hold neither, and the free rack after them holds both."""
    nodes, labels = [], {}
    for r in range(6):
        for i in range(4):
            name = f"r{r}-n{i}"
            nodes.append(node(name, range(4) if r < 5 else range(8)))
            labels[name] = {BLOCK: "b0", RACK: f"r{r}", CLIQUE: f"c{r}.{i}", HOSTNAME: name}
    members = (MemberRequest("ns/leader", 8, 2000, 1 << 30), MemberRequest("ns/w-0", 8, 1000,
                                                                          1 << 30))
    p = ok(place(nodes, labels, GangRequest("ns/g", members,
                                            network=NetworkRequest(RACK, "required"))))
    assert {labels[m.node][RACK] for m in p.members} == {"r5"}
    # without the free rack, the Event says that no node has room for a member, not that no
    # node has a free GPU
    r = place(nodes[:20], labels, GangRequest("ns/g", members,
                                              network=NetworkRequest(RACK, "required")))
    assert isinstance(r, Unplaceable)
    assert r.reason == ("gang ns/g needs 16 GPUs (2 members x 8 GPUs) within one "
                        "example.com/rack domain; no node that has the label example.com/rack "
                        "has room for one of its members (GPUs, CPU, memory, pods): the most "
                        "free GPUs on one is 4, and each member takes 8")


#: how a rack's four nodes are free: half of each (holes no 8-GPU member fits), whole, none
RACK_FREE = {"holes": [range(4)] * 4, "free": [range(8)] * 4, "full": [range(0)] * 4,
             "mixed": [range(8), range(1), range(4), range(2, 8)]}


@settings(max_examples=150, deadline=None)
@given(racks=st.lists(st.sampled_from(sorted(RACK_FREE)), min_size=6, max_size=6),
       sizes=st.lists(st.sampled_from([1, 2, 4, 8, 8]), min_size=2, max_size=5),
       cpus=st.lists(st.sampled_from([1000, 2000]), min_size=5, max_size=5),
       mode=st.sampled_from(["required", "preferred"]))
def test_unlike_members_are_placed_in_a_rack_whenever_one_holds_them(
        *, racks: list[str], sizes: list[int], cpus: list[int], mode: str) -> None:
    """Six racks of four nodes (more than the domains the decision tries when the engine
    refuses one): a gang of unlike members lands within one rack whenever the engine alone
    places it on some rack's nodes."""
    nodes, labels = [], {}
    for r, kind in enumerate(racks):
        for i, free in enumerate(RACK_FREE[kind]):
            name = f"r{r}-n{i}"
            nodes.append(node(name, free))
            labels[name] = {BLOCK: "b0", RACK: f"r{r}", CLIQUE: f"c.{r}.{i}", HOSTNAME: name}
    members = tuple(MemberRequest(f"ns/w-{i}", g, cpus[i], 1 << 30) for i, g in enumerate(sizes))
    g = GangRequest("ns/g", members, network=NetworkRequest(RACK, mode))
    got = place(nodes, labels, g)
    fits = [r for r in {labels[n.name][RACK] for n in nodes} if isinstance(place_gang(
        [n for n in nodes if labels[n.name][RACK] == r], replace(g, network=None),
        tables=TABLES), GangPlacement)]
    if fits:
        assert len(domains(ok(got), labels, BLOCK, RACK)) == 1


def test_slices_of_one_node() -> None:
    nodes, labels = cluster({n.name: range(6) for n in cluster()[0]})
    p = ok(place(nodes, labels, gang(4, 2, level=RACK, slice_level=HOSTNAME, size=2)))
    by = {m.key: m.node for m in p.members}
    assert by["ns/w-0"] == by["ns/w-1"] and by["ns/w-2"] == by["ns/w-3"]


def test_slices_follow_the_ranks_order() -> None:
    nodes, labels = cluster()
    g = gang(12, 4, level=BLOCK, slice_level=CLIQUE, size=4)
    p = ok(place(nodes, labels, g))
    by = {m.key: labels[m.node][CLIQUE] for m in p.members}
    assert by["ns/w-8"] == by["ns/w-11"] != by["ns/w-2"]  # w-10 is rank 10, not rank 2


def test_a_slice_wider_than_the_gang_is_refused() -> None:
    nodes, labels = cluster()
    r = place(nodes, labels, gang(2, level=CLIQUE, slice_level=BLOCK, size=2))
    assert isinstance(r, Unplaceable) and "wider than its level" in r.reason


def test_a_slice_needs_a_size() -> None:
    nodes, labels = cluster()
    r = place(nodes, labels, gang(2, slice_level=CLIQUE, size=0))
    assert isinstance(r, Unplaceable) and "slice needs both" in r.reason


def test_a_label_no_node_has() -> None:
    nodes, labels = cluster()
    r = place(nodes, labels, gang(2, level="example.com/pod"))
    assert isinstance(r, Unplaceable) and "no node has the label example.com/pod" in r.reason


def test_an_undeclared_label_still_means_one_domain_of_it() -> None:
    nodes, labels = cluster()
    p = ok(place(nodes, labels, gang(3), levels=()))
    assert len(domains(p, labels, BLOCK, RACK)) == 1


def test_hostname_required_is_one_node() -> None:
    nodes, labels = cluster({n.name: range(4) for n in cluster()[0]})
    r = place(nodes, labels, gang(2, 2, level=HOSTNAME))
    assert isinstance(r, GangPlacement) and r.nodes_used == 1
    r = place(nodes, labels, gang(3, 2, level=HOSTNAME))
    assert isinstance(r, Unplaceable)


def test_without_a_network_request_it_is_the_engine() -> None:
    nodes, labels = cluster()
    g = GangRequest("ns/g", tuple(MemberRequest(f"ns/w-{i}", 8) for i in range(3)))
    assert place(nodes, labels, g) == place_gang(nodes, g, tables=TABLES)


def test_unlike_members_within_one_rack() -> None:
    nodes, labels = cluster({"b0-r0-n0": range(2)})
    members = (MemberRequest("ns/a", 8), MemberRequest("ns/b", 4), MemberRequest("ns/c", 4),
               MemberRequest("ns/d", 2))
    g = GangRequest("ns/g", members, mode="preferred", network=NetworkRequest(RACK))
    p = ok(place(nodes, labels, g))
    assert len(domains(p, labels, BLOCK, RACK)) == 1 and p.nodes_used == 3  # 18 GPUs


@settings(max_examples=60, deadline=None)
@given(frees=st.lists(st.integers(0, 8), min_size=16, max_size=16), n=st.integers(1, 8),
       gpus=st.sampled_from([1, 2, 4, 8]), mode=st.sampled_from(["required", "preferred"]),
       size=st.sampled_from([0, 2]), bound=st.sampled_from([None, BLOCK]))
def test_what_is_placed_keeps_the_levels_and_a_fit_is_found(
        *, frees: list[int], n: int, gpus: int, mode: str, size: int, bound: str | None
) -> None:
    base, labels = cluster()
    nodes = [node(b.name, range(f)) for b, f in zip(base, frees, strict=True)]
    bound = bound if mode == "preferred" else None
    g = gang(n, gpus, mode=mode, slice_level=CLIQUE if size else None, size=size,
             max_level=bound)
    r = place(nodes, labels, g)
    racks: dict[tuple[str, str], int] = {}
    for s in nodes:
        key = (labels[s.name][BLOCK], labels[s.name][RACK])
        racks[key] = racks.get(key, 0) + len(s.free_gpus) // gpus
    blocks = [sum(c for (b, _), c in racks.items() if b == block) for block in ("b0", "b1")]
    if isinstance(r, Unplaceable):
        if not size:  # without slices a domain that holds the gang would have been found
            if mode == "required":
                most = max(racks.values())
            else:
                most = max(blocks) if bound is not None else sum(racks.values())
            assert most < n
        return
    if bound is not None:
        assert len(domains(r, labels, BLOCK)) == 1
    free = {s.name: s.free_gpus for s in nodes}
    used = [(m.node, g_) for m in r.members for g_ in m.gpus]
    assert len(used) == len(set(used)) == n * gpus
    assert all(g_ in free[node_] for node_, g_ in used)
    if mode == "required":
        assert len(domains(r, labels, BLOCK, RACK)) == 1
    if size:
        by = {m.key: labels[m.node][CLIQUE] for m in r.members}
        for s0 in range(0, n, size):
            assert len({by[f"ns/w-{i}"] for i in range(s0, min(s0 + size, n))}) == 1


def test_levels_in_the_shapes_users_have() -> None:
    kueue = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology",
             "metadata": {"name": "default"},
             "spec": {"levels": [{"nodeLabel": BLOCK}, {"nodeLabel": RACK},
                                 {"nodeLabel": HOSTNAME}]}}
    assert parse_levels(kueue) == Levels((BLOCK, RACK))
    assert parse_levels("topograph") == Levels(topograph=True)
    assert parse_levels([BLOCK, RACK, CLIQUE]) == Levels(LEVELS)
    kai = {"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology",
           "metadata": {"name": "cluster-topology"},
           "spec": {"levels": [{"nodeLabel": BLOCK, "alias": "block"}, {"nodeLabel": RACK},
                               {"nodeLabel": HOSTNAME, "alias": "node"}]}}
    levels = parse_levels(kai)
    assert levels == Levels((BLOCK, RACK), (("block", BLOCK), ("node", HOSTNAME)))
    assert (levels.label("block"), levels.label("node"), levels.label(RACK)) == (
        BLOCK, HOSTNAME, RACK)
    assert parse_levels([{"nodeLabel": BLOCK, "alias": "b"}, RACK]) == Levels(
        (BLOCK, RACK), (("b", BLOCK),))


V0 = "network.topology.nvidia.com/"
V1, V1_NVL = "fabric.topograph.run/tier-", "accelerator.topograph.run/"


@pytest.mark.parametrize(("nodes", "levels"), [
    # v0 on a fabric of two tiers: no core (a node without the widest level would be in no
    # domain); the NVLink domain left to GPU feature discovery's clique label, as Topograph does
    ([{f"{V0}spine": "s1", f"{V0}leaf": "l1", CLIQUE: "u.1"}, {f"{V0}spine": "s1"}],
     (f"{V0}spine", f"{V0}leaf", CLIQUE)),
    ([{f"{V0}core": "c", f"{V0}spine": "s", f"{V0}leaf": "l", f"{V0}accelerator": "nvl1"},
      {f"{V0}core": "c", f"{V0}spine": "s", f"{V0}leaf": "l"}, {}],
     (f"{V0}core", f"{V0}spine", f"{V0}leaf", f"{V0}accelerator")),
    # v1: tiers of any depth, numbered from the leaf outwards; its own domain and sub-domain
    ([{f"{V1}0": "l1", f"{V1}1": "s1", f"{V1}10": "x", f"{V1}2": "c", f"{V1}z": "?",
       f"{V1_NVL}domain": "d", f"{V1_NVL}sub-domain": "sd", CLIQUE: "u.1"},
      {f"{V1}0": "l2", f"{V1}1": "s1", f"{V1}10": "x", f"{V1}2": "c", f"{V0}leaf": "old"}],
     (f"{V1}10", f"{V1}2", f"{V1}1", f"{V1}0", f"{V1_NVL}domain", f"{V1_NVL}sub-domain")),
    ([{f"{V1}0": "l1", CLIQUE: "u.1"}, {f"{V1}0": "l2", f"{V1}1": "s"}], (f"{V1}0", CLIQUE)),
    ([{HOSTNAME: "n"}], ()),
])
def test_topograph_is_the_labels_it_wrote(nodes: list[dict[str, str]],
                                          levels: tuple[str, ...]) -> None:
    assert Levels(topograph=True).on(nodes) == Levels(levels)


def test_a_two_tier_topograph_fabric_places_by_leaf() -> None:
    """Topograph writes no core label where the fabric has two tiers: the leaf still counts."""
    nodes = [node(f"n{i}") for i in range(4)]
    labels = {f"n{i}": {f"{V0}spine": "s1", f"{V0}leaf": f"l{i // 2}"} for i in range(4)}
    p = ok(place(nodes, labels, gang(2, level=f"{V0}leaf"), Levels(topograph=True)))
    assert len(domains(p, labels, f"{V0}leaf")) == 1
    p = ok(place(nodes, labels, gang(2, level="tier:1"), Levels(topograph=True)))
    assert len(domains(p, labels, f"{V0}leaf")) == 1


@pytest.mark.parametrize(("doc", "error"), [
    ([RACK, RACK], "declared twice"),
    ([HOSTNAME, RACK], "can only come last"),
    (["not a label!"], "not a node label key"),
    ({"apiVersion": "v1", "kind": "ConfigMap"}, "expected a Kueue .* or KAI"),
    ([{"nodeLabel": BLOCK, "alias": RACK}, RACK], "alias example.com/rack is a level's node"),
    ([{"nodeLabel": BLOCK, "alias": "x"}, {"nodeLabel": RACK, "alias": "x"}],
     "alias x names two levels"),
    ([{"nodeLabel": BLOCK, "alias": "not an alias!"}], "is not a label key"),
    ([{"alias": "x"}], "needs a nodeLabel"),
    ({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology", "spec": {"levels": []}},
     "non-empty list"),
    ({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology", "spec": {"levels": [{}]}},
     "needs a nodeLabel"),
    (3, "must be a list"),
])
def test_levels_that_cannot_be_used(doc: object, error: str) -> None:
    with pytest.raises(LevelsError, match=error):
        parse_levels(doc)


def test_missing_labels_are_listed() -> None:
    net = Network(LEVELS, {"a": {BLOCK: "b"}, "b": {BLOCK: "b", RACK: "r", CLIQUE: "c"}})
    assert net.missing(RACK) == ["a"] and net.missing(HOSTNAME) == []


def test_the_domains_of_a_level_group_the_nodes_that_reach_it_once_per_network() -> None:
    net = Network(LEVELS, {"a": {BLOCK: "b1"}, "b": {BLOCK: "b0", RACK: "r1"},
                           "c": {BLOCK: "b0", RACK: "r0"}, "d": {BLOCK: "b0", RACK: "r0"}})
    racks = net.domains(LEVELS, 2)
    assert racks.names == (f"{BLOCK}=b0, {RACK}=r0", f"{BLOCK}=b0, {RACK}=r1")
    assert racks.members == (frozenset("cd"), frozenset("b"))
    assert dict(racks.index) == {"c": 0, "d": 0, "b": 1}  # "a" is in no rack
    assert net.domains(LEVELS, 1).members == (frozenset("bcd"), frozenset("a"))
    assert net.domains(LEVELS, 2) is racks


def test_a_node_without_a_narrower_label_is_still_in_its_rack() -> None:
    nodes, labels = cluster()
    for name in labels:
        if name.startswith("b0-r0"):
            del labels[name][CLIQUE]
    p = ok(place(nodes, labels, gang(4)))  # a whole rack: b0-r0 holds 4 like any other
    assert len(domains(p, labels, BLOCK, RACK)) == 1
    sliced = ok(place(nodes, labels, gang(12, 8, level=None, slice_level=CLIQUE, size=2)))
    assert not {m.node for m in sliced.members} & {n for n in labels if n.startswith("b0-r0")}


def _own(t: Topology, name: str) -> Topology:
    """The same node type with its own GPU UUIDs: its own Topology object, as a real node's."""
    return replace(t, gpus=tuple(replace(g, uuid=f"GPU-{name}-{g.index}") for g in t.gpus))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0xFF, 0x0F, 0xF0, 0x3C, 0x81, 0x01]),
                          st.sampled_from([1000, 3000, 64000]), st.sampled_from([0, 1, 8])),
                min_size=16, max_size=16),
       st.integers(1, 24), st.sampled_from([1, 2, 4, 8]), st.sampled_from(["required",
                                                                           "preferred"]),
       st.sampled_from([0, 2]))
@example([(0xFF, 1000, 8)] + [(0xFF, 64000, 8)] * 15, 20, 1, "required", 0)  # alike but CPU
def test_nodes_with_their_own_topology_objects_are_placed_as_alike_nodes(
        rooms: list[tuple[int, int, int]], n: int, gpus: int, mode: str, size: int) -> None:
    """Nodes are grouped and their room remembered by what is free on them (GPUs as their
    class sees them, CPU, pods), not by their Topology objects: every node with its own gives
    the same decision as all sharing one, and a rack that holds the gang is found."""
    base, labels = cluster()
    dgx = builtin("dgx1-v100")
    shared = [NodeState(b.name, dgx, frozenset(i for i in range(8) if mask >> i & 1), cpu,
                        1 << 40, pods) for b, (mask, cpu, pods) in zip(base, rooms, strict=True)]
    own = [replace(s, topology=_own(dgx, s.name)) for s in shared]
    g = gang(n, gpus, mode=mode, slice_level=CLIQUE if size else None, size=size)
    r = place(own, labels, g)
    assert r == place(shared, labels, g)
    if isinstance(r, Unplaceable) and mode == "required" and not size:
        racks: dict[tuple[str, str], int] = {}
        for s in shared:  # members of 1,000m CPU each
            rack = (labels[s.name][BLOCK], labels[s.name][RACK])
            held = min(len(s.free_gpus) // gpus, s.free_cpu_milli // 1000, s.free_pods)
            racks[rack] = racks.get(rack, 0) + held
        assert max(racks.values()) < n, r


def unconstrained(members: tuple[MemberRequest, ...], **more: object) -> GangRequest:
    return GangRequest("ns/g", members, network=NetworkRequest(unconstrained=True),
                       **more)  # type: ignore[arg-type]


def test_an_unconstrained_gang_fills_the_gaps_each_member_where_it_fits_best() -> None:
    """Kueue's unconstrained pod set: each member on the node that fits it best alone (the
    node it costs the least), largest first, not the fewest nodes; whole nodes stay whole."""
    nodes = [node("a"), node("b", [3]), node("c", [5, 6]), node("d", range(4, 8)), node("e")]
    ones = tuple(MemberRequest(f"ns/w-{i}", 1, 1000, 1 << 30) for i in range(3))
    packed = ok(place_gang(nodes, GangRequest("ns/g", ones), tables=TABLES))
    assert {m.node for m in packed.members} == {"d"}  # the gang on its fewest nodes: one
    gaps = ok(place_gang(nodes, unconstrained(ones), tables=TABLES))
    assert sorted((m.node, m.gpus) for m in gaps.members) == [("b", (3,)), ("c", (5,)),
                                                              ("c", (6,))]
    # a 4-GPU member first: the half-free node, then the 1-GPU ones in what is left
    mixed = (MemberRequest("ns/w-0", 1, 1000, 1 << 30), MemberRequest("ns/w-4", 4, 1000, 1))
    got = ok(place_gang(nodes, unconstrained(mixed), tables=TABLES))
    assert [(m.key, m.node) for m in got.members] == [("ns/w-0", "b"), ("ns/w-4", "d")]
    assert got.ring_gbps["d"] == ok(place_gang([node("d", range(4, 8))], GangRequest(
        "ns/h", (mixed[1],)), tables=TABLES)).gang_gbps


def test_an_unconstrained_gang_keeps_a_required_single_node_and_its_floor() -> None:
    nodes = [node("b", [3]), node("c", [5, 6]), node("e")]
    ones = tuple(MemberRequest(f"ns/w-{i}", 1, 1000, 1 << 30) for i in range(3))
    alone = ok(place_gang(nodes, unconstrained(ones, mode="required", single_node=True),
                          tables=TABLES))
    assert alone.nodes_used == 1
    refused = place_gang(nodes, unconstrained(ones, mode="required", min_ring_gbps=100.0),
                         tables=TABLES)
    assert isinstance(refused, Unplaceable) and "unconstrained" in refused.reason
    full = place_gang([node("b", [3])], unconstrained(ones), tables=TABLES)
    assert isinstance(full, Unplaceable)
    assert full.reason.startswith("gang ns/g (unconstrained: each member where it fits best) "
                                  "has no room for ns/w-1: ")


def one_by_one(nodes: list[NodeState], gang: GangRequest) -> list[tuple[str, str, tuple[int, ...]]]:
    """What an unconstrained gang means, the slow way: each member, largest first, given to the
    engine alone on every node, what it took taken away before the next."""
    states, out = list(nodes), []
    for m in sorted(gang.members, key=lambda m: -m.gpus):
        got = place_gang(states, GangRequest("ns/one", (m,)), tables=TABLES)
        if isinstance(got, Unplaceable):
            return []
        (mp,) = got.members
        states = [s.less(mp.gpus, m.cpu_milli, m.memory_bytes) if s.name == mp.node else s
                  for s in states]
        out.append((m.key, mp.node, mp.gpus))
    return sorted(out)


V100 = builtin("dgx1-v100")  # an NVLink hybrid cube mesh: which GPUs are left free matters


@settings(max_examples=150, deadline=None)
@given(frees=st.lists(st.tuples(st.sets(st.integers(0, 7)), st.booleans(), st.integers(1, 4)),
                      min_size=1, max_size=12),
       sizes=st.lists(st.sampled_from([0, 1, 1, 2, 4, 8]), min_size=1, max_size=10),
       only=st.booleans())
def test_an_unconstrained_gang_is_what_its_members_given_one_at_a_time_would_get(
        *, frees: list[tuple[set[int], bool, int]], sizes: list[int], only: bool) -> None:
    """The ranked nodes kept between members (`_Best`) choose what the engine, asked for each
    member alone on every node, would: the same node and GPUs for every member."""
    nodes = [NodeState(f"n{i}", V100 if v100 else H100, frozenset(free), 1000 * cpus, 1 << 40,
                       110) for i, (free, v100, cpus) in enumerate(frees)]
    eligible = frozenset(n.name for n in nodes[::2]) if only else None
    members = tuple(MemberRequest(f"ns/w-{i}", g, 1000, 1 << 20, eligible if g == 1 else None)
                    for i, g in enumerate(sizes))
    got = place_gang(nodes, unconstrained(members), tables=TABLES)
    want = one_by_one(nodes, GangRequest("ns/g", members))
    if not want:
        assert isinstance(got, Unplaceable)
        return
    assert sorted((m.key, m.node, m.gpus) for m in ok(got).members) == want
