"""minRingGBps has one meaning: the gang's allreduce bus bandwidth reaches it. A figure exactly at
the threshold passes and the next float below it does not, on one node and split alike."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from webhook.topology import (
    GangPlacement,
    GangRequest,
    MemberRequest,
    NetworkRequest,
    NodeState,
    Unplaceable,
    builtin,
    place_gang,
)
from webhook.topology.gpu_choice import choose_gpus, set_score
from webhook.topology.network import CLIQUE, HOSTNAME, Network, nvlink_domain, nvlink_level
from webhook.topology.ringfloor import gang_gbps, link_gbps, meets_min_ring


def above(x: float) -> float:
    return math.nextafter(x, math.inf)


def node(name: str, free: tuple[int, ...], kind: str = "dgx1-v100") -> NodeState:
    return NodeState(name, builtin(kind), frozenset(free), 64000, 1 << 40)


def gang(k: int, floor: float | None, *, per_member: int = 1,
         mode: str = "required") -> GangRequest:
    members = tuple(MemberRequest(f"ns/w{i}", per_member) for i in range(k))
    return GangRequest("g", members, mode=mode, min_ring_gbps=floor)  # type: ignore[arg-type]


def test_the_comparison() -> None:
    assert meets_min_ring(50.0, 50.0, 4) and not meets_min_ring(50.0, above(50.0), 4)
    assert meets_min_ring(0.0, None, 4)
    assert meets_min_ring(0.0, 1000.0, 1) and meets_min_ring(0.0, 1000.0, 0)  # no allreduce


def test_the_figure_of_a_gang() -> None:
    assert gang_gbps([100.0], 12.5) == 100.0  # one node: its set
    assert gang_gbps([100.0, 50.0], 12.5) == 12.5  # split: the network bounds it
    assert gang_gbps([100.0, 6.0], 12.5) == 6.0  # ... or the slowest node set
    assert gang_gbps([0.0, 0.0], 12.5) == 12.5  # one GPU per node: only the network
    assert gang_gbps([0.0], 12.5) == 0.0 and gang_gbps([], 12.5) == 0.0


@pytest.mark.parametrize(("free", "k"), [
    ((0, 1, 2, 3, 4, 5, 6, 7), 4),  # the best quad, 100
    ((0, 2, 3, 4, 7), 5),  # DESIGN's one-ring set, 50
    ((0, 1, 4, 5), 3),
    ((0, 5), 2),  # no NVLink between them: PCIe across sockets
    ((0, 1, 2, 3, 4, 5, 6, 7), 8),
])
def test_one_node_passes_at_its_figure_and_not_above(free: tuple[int, ...], k: int) -> None:
    t = builtin("dgx1-v100")
    figure = set_score(t, choose_gpus(t, free, k) or ()).allreduce_gbps
    placed = place_gang([node("a", free)], gang(k, figure))
    assert isinstance(placed, GangPlacement) and placed.gang_gbps == figure
    refused = place_gang([node("a", free)], gang(k, above(figure)))
    assert isinstance(refused, Unplaceable)
    assert f"at least {above(figure):g} GB/s (minRingGBps)" in refused.reason
    assert f"offers {figure:g} GB/s" in refused.reason
    soft = place_gang([node("a", free)], gang(k, above(figure), mode="preferred"))
    assert isinstance(soft, GangPlacement) and soft.gang_gbps == figure


def test_a_multi_gpu_member_is_held_to_the_same_figure() -> None:
    free = (0, 1, 2, 3, 4, 5, 6, 7)
    figure = set_score(builtin("dgx1-v100"), (0, 1, 2, 3)).allreduce_gbps
    assert isinstance(place_gang([node("a", free)], gang(1, figure, per_member=4)),
                      GangPlacement)
    assert isinstance(place_gang([node("a", free)], gang(1, above(figure), per_member=4)),
                      Unplaceable)


def test_a_split_gang_passes_at_the_network_figure_and_not_above() -> None:
    nodes = [node("a", (0, 1, 2, 3)), node("b", (4, 5, 6, 7))]  # 8 workers need both
    placed = place_gang(nodes, gang(8, 12.5), inter_node_gbps=12.5)
    assert isinstance(placed, GangPlacement) and placed.nodes_used == 2
    assert placed.gang_gbps == gang_gbps(placed.ring_gbps.values(), 12.5) == 12.5
    refused = place_gang(nodes, gang(8, above(12.5)), inter_node_gbps=12.5)
    assert isinstance(refused, Unplaceable) and "between nodes only 12.5 GB/s" in refused.reason


def test_a_split_gang_is_held_to_its_slowest_node_set() -> None:
    # node b's free GPUs have no NVLink ring (6 GB/s over SYS), below the 12.5 GB/s network
    nodes = [node("a", (0, 1, 2, 3)), node("b", (0, 1, 6, 7))]
    slow = set_score(builtin("dgx1-v100"), (0, 1, 6, 7)).allreduce_gbps
    assert slow < 12.5
    placed = place_gang(nodes, gang(8, slow))
    assert isinstance(placed, GangPlacement) and placed.gang_gbps == slow
    refused = place_gang(nodes, gang(8, above(slow)))
    assert isinstance(refused, Unplaceable) and "on the nodes it would use" in refused.reason


def test_a_one_gpu_gang_has_no_ring_to_hold_to() -> None:
    placed = place_gang([node("a", (5,))], gang(1, 1000.0))
    assert isinstance(placed, GangPlacement) and placed.gang_gbps == 0.0


# --- a multi-node NVLink domain (a GB200 NVL72 rack; here HGX H100 nodes: 18 x 25 GB/s) ------

H100_SWITCH = 18 * 25.0  # the hgx-h100 built-in's NVSwitch figure per GPU


TG_DOMAIN, TG_SUB = "accelerator.topograph.run/domain", "accelerator.topograph.run/sub-domain"
TG_V0 = "network.topology.nvidia.com/accelerator"


def clique_node(name: str, clique: str | None, free: tuple[int, ...] = tuple(range(8)),
                kind: str = "hgx-h100") -> NodeState:
    return NodeState(name, builtin(kind), frozenset(free), 64000, 1 << 40,
                     nvlink_domain=nvlink_domain({CLIQUE: clique} if clique else {}))


def test_a_nodes_nvlink_domain_is_every_nvlink_label_it_carries() -> None:
    assert nvlink_domain({CLIQUE: "uuid.1", HOSTNAME: "n"}) == f"{CLIQUE}=uuid.1"
    both = nvlink_domain({CLIQUE: "uuid.1", "accelerator.topograph.run/domain": "d1"})
    assert both == f"{CLIQUE}=uuid.1, accelerator.topograph.run/domain=d1"
    assert nvlink_domain({HOSTNAME: "n", "example.com/rack": "r1"}) is None


@pytest.mark.parametrize(("labels", "level"), [
    ({CLIQUE: "uuid.1"}, CLIQUE),
    ({CLIQUE: "uuid.1", TG_DOMAIN: "d1"}, CLIQUE),
    ({TG_DOMAIN: "d1"}, TG_DOMAIN),
    ({TG_DOMAIN: "d1", TG_SUB: "s1"}, TG_SUB),  # the sub-domain, not the domain around it
    ({TG_V0: "a1"}, TG_V0),
])
def test_the_label_that_keeps_a_gang_in_one_nvlink_domain(labels: dict[str, str],
                                                          level: str) -> None:
    domain = nvlink_domain(labels)
    assert domain is not None and nvlink_level(domain) == level


def test_between_nodes_of_one_nvlink_domain_the_figure_is_their_switch_links() -> None:
    a, b = clique_node("a", "c0"), clique_node("b", "c0")
    assert link_gbps([a, b], 12.5) == H100_SWITCH
    assert link_gbps([a, clique_node("c", "c1")], 12.5) == 12.5  # two domains: the network
    assert link_gbps([a, clique_node("c", None)], 12.5) == 12.5  # one in none
    assert link_gbps([a], 12.5) == 12.5  # one node: nothing between nodes
    # a node of the domain whose GPUs hang off no NVSwitch: its NICs
    assert link_gbps([a, clique_node("v", "c0", kind="dgx1-v100")], 12.5) == 12.5


def clique_gang(k: int, floor: float | None, per_member: int = 8,
                level: str = CLIQUE) -> GangRequest:
    members = tuple(MemberRequest(f"ns/w{i}", per_member) for i in range(k))
    return GangRequest("g", members, mode="required", min_ring_gbps=floor,
                       network=NetworkRequest(level, "preferred"))


def cliques(free: dict[str, tuple[int, ...]] | None = None
            ) -> tuple[list[NodeState], Network]:
    """Two NVLink cliques of two nodes: c0 = n0, n1; c1 = n2, n3."""
    names = [f"n{i}" for i in range(4)]
    labels = {n: {CLIQUE: f"c{i // 2}", HOSTNAME: n} for i, n in enumerate(names)}
    nodes = [clique_node(n, f"c{i // 2}", (free or {}).get(n, tuple(range(8))))
             for i, n in enumerate(names)]
    return nodes, Network((CLIQUE,), labels)


def test_a_gang_over_the_nodes_of_one_clique_passes_at_their_nvlink_figure() -> None:
    nodes, net = cliques()
    placed = place_gang(nodes, clique_gang(2, H100_SWITCH), network=net, inter_node_gbps=12.5)
    assert isinstance(placed, GangPlacement) and placed.gang_gbps == H100_SWITCH
    assert {m.node for m in placed.members} in ({"n0", "n1"}, {"n2", "n3"})
    refused = place_gang(nodes, clique_gang(2, above(H100_SWITCH)), network=net)
    assert isinstance(refused, Unplaceable) and f"only {H100_SWITCH:g} GB/s" in refused.reason
    # three nodes span the two cliques: the network's figure
    over = place_gang(nodes, clique_gang(3, 13.0), network=net, inter_node_gbps=12.5)
    assert isinstance(over, Unplaceable) and "between nodes only 12.5 GB/s" in over.reason
    assert "its nodes span NVLink domains" in over.reason
    assert f"network: {{required: {CLIQUE}}}" in over.reason
    # nodes that Topograph labels: the hint names its label, the one they carry
    tg = [replace(n, nvlink_domain=nvlink_domain({TG_DOMAIN: "r0", TG_SUB: f"s{i // 2}"}))
          for i, n in enumerate(nodes)]
    over_tg = place_gang(tg, clique_gang(3, 13.0), network=net, inter_node_gbps=12.5)
    assert isinstance(over_tg, Unplaceable) and f"network: {{required: {TG_SUB}}}" in over_tg.reason
    # without NVLink domains, no such hint
    plain = [NodeState(n.name, n.topology, n.free_gpus, 64000, 1 << 40) for n in nodes]
    bare = place_gang(plain, clique_gang(3, 13.0), network=net, inter_node_gbps=12.5)
    assert isinstance(bare, Unplaceable) and "NVLink domains" not in bare.reason
    spread = place_gang(nodes, clique_gang(3, None), network=net, inter_node_gbps=12.5)
    assert isinstance(spread, GangPlacement) and spread.gang_gbps == 12.5


def test_members_in_a_cliques_holes_are_joined_by_its_nvlink() -> None:
    # four 1-GPU members: n0 and n1 have 2 free each (clique c0), n2 is wholly free. The
    # holes of c0 keep n2 whole, and NVLink joins them: they meet a floor no NIC could
    nodes, net = cliques({"n0": (0, 1), "n1": (0, 1), "n3": ()})
    placed = place_gang(nodes, clique_gang(4, 400.0, per_member=1), network=net)
    assert isinstance(placed, GangPlacement)
    assert {m.node for m in placed.members} == {"n0", "n1"} and placed.gang_gbps == H100_SWITCH
