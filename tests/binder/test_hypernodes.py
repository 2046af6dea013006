"""Volcano's HyperNodes as the binder's network levels: the members each selector picks, the
tiers and domains they make, what cannot be read, and gangs placed by them (the planning path,
and the binder through the emulator, which serves the HyperNode CRD of ../shared/crds)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from binder_objects import job, node, pod
from binder_run import bound, serving

from e2e.probes import eventually
from webhook import keys
from webhook.binder.cli import network_levels
from webhook.binder.controller import Binder, BinderConfig
from webhook.binder.fit import FitCache
from webhook.binder.hypernodes import (
    Candidates,
    HyperNodeError,
    HyperNodeView,
    Tiers,
    parse_hypernode,
    selected,
    tier_label,
)
from webhook.binder.nodes import NodeInfo, parse_node
from webhook.binder.planner import Plan, PlanConfig, plan
from webhook.binder.pods import parse_pod
from webhook.binder.queue import GangQueue
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi
from webhook.kube.api import CRDS, PODS, VOLCANO_HYPERNODES
from webhook.topology.hierarchy import place_gang
from webhook.topology.network import HOSTNAME, Levels

T1, T2, T3 = tier_label(1), tier_label(2), tier_label(3)


def hypernode(name: str, tier: int, *members: dict[str, Any], tier_name: str = ""
              ) -> dict[str, Any]:
    spec: dict[str, Any] = {"tier": tier, "members": list(members)}
    if tier_name:
        spec["tierName"] = tier_name
    return {"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
            "metadata": {"name": name}, "spec": spec}


def exact(name: str, kind: str = "Node") -> dict[str, Any]:
    return {"type": kind, "selector": {"exactMatch": {"name": name}}}


def regex(pattern: str) -> dict[str, Any]:
    return {"type": "Node", "selector": {"regexMatch": {"pattern": pattern}}}


def labelled(**labels: str) -> dict[str, Any]:
    return {"type": "Node", "selector": {"labelMatch": {"matchLabels": labels}}}


def infos(nodes: dict[str, dict[str, str]]) -> dict[str, NodeInfo]:
    return {name: parse_node(node(name, labels=labels)) for name, labels in nodes.items()}


def read(objs: list[dict[str, Any]], nodes: dict[str, dict[str, str]]) -> Tiers:
    """The tiers as the binder's view makes them, of every object at once."""
    view = HyperNodeView()
    for obj in objs:
        view.on_event("ADDED", obj)
    return view.tiers(infos(nodes))[0]


def fabric() -> list[dict[str, Any]]:
    """A spine over two leaves: one by pattern, one by label (the second's nodes carry
    `pool=b`), as Volcano's UFM discovery or an admin writes them."""
    return [hypernode("leaf-a", 1, regex("^a-"), tier_name="leaf"),
            hypernode("leaf-b", 1, labelled(pool="b"), tier_name="leaf"),
            hypernode("spine", 2, exact("leaf-a", "HyperNode"), exact("leaf-b", "HyperNode"),
                      tier_name="spine")]


NODES = {"a-0": {}, "a-1": {}, "b-0": {"pool": "b"}, "b-1": {"pool": "b"}, "xa-2": {},
         "c-0": {"pool": "c"}}


def test_selectors_pick_nodes_as_volcano_does() -> None:
    t = read(fabric(), NODES)
    # the pattern is a search in the name (Go's MatchString): "xa-2" has no "a-" at its start
    # but "^a-" is anchored; a label selector picks by label; a node in no HyperNode is in none
    assert t.domains == {"a-0": {T2: "spine", T1: "leaf-a"}, "a-1": {T2: "spine", T1: "leaf-a"},
                         "b-0": {T2: "spine", T1: "leaf-b"}, "b-1": {T2: "spine", T1: "leaf-b"}}
    assert t.levels == Levels((T2, T1), (("spine", T2), ("leaf", T1)), True, (2, 1))
    assert t.problems == ()
    t = read([hypernode("l", 1, regex("a-"))], NODES)  # unanchored: a search
    assert set(t.domains) == {"a-0", "a-1", "xa-2"}


def test_a_skipped_tier_is_filled_from_below_and_roots_stand_for_wider_tiers() -> None:
    objs = [hypernode("l1", 1, exact("n1")), hypernode("top", 3, exact("l1", "HyperNode")),
            hypernode("l2", 1, exact("n2")), hypernode("mid", 2, exact("l2", "HyperNode")),
            hypernode("alone", 2, exact("n3"))]
    t = read(objs, {"n1": {}, "n2": {}, "n3": {}})
    assert t.levels.labels == (T3, T2, T1) and t.levels.tiers == (3, 2, 1)
    assert t.domains == {"n1": {T3: "top", T2: "l1", T1: "l1"},
                         "n2": {T3: "mid", T2: "mid", T1: "l2"},
                         # a tier-2 leaf: no tier-1 domain, as a node without a narrower label
                         "n3": {T3: "alone", T2: "alone"}}


def test_what_cannot_be_read_is_said_and_left_out() -> None:
    objs = [hypernode("l1", 1, exact("n1"), regex("(")),
            hypernode("l2", 1, exact("n1"), {"type": "Node", "selector": {"labelMatch": {}}}),
            hypernode("s1", 2, exact("l1", "HyperNode"), exact("gone", "HyperNode"),
                      regex("x") | {"type": "HyperNode"}),
            hypernode("s2", 2, exact("l1", "HyperNode"), exact("s1", "HyperNode"))]
    t = read(objs, {"n1": {}})
    assert t.domains == {"n1": {T2: "s1", T1: "l1"}}
    said = "\n".join(t.problems)
    for part in ("HyperNode l1: member 2: regexMatch '(' is not a regular expression",
                 "HyperNode l2: member 2: no exactMatch, regexMatch or non-empty labelMatch",
                 "HyperNode s1: member 3: a HyperNode member is selected by exactMatch only",
                 "HyperNode s1: member HyperNode gone does not exist",
                 "HyperNode l1 is a member of s1 and s2: read as in s1",
                 "HyperNode s2 (tier 2): member s1 has tier 2, not a lower one: left out",
                 "node n1 is a member of HyperNodes l1, l2: read as in l1"):
        assert part in said
    for obj, error in (({"metadata": {}, "spec": {"tier": 1}}, "without a name"),
                       (hypernode("x", 1) | {"spec": {"tier": "1"}}, "not a whole number"),
                       (hypernode("x", 1) | {"spec": {"tier": True}}, "not a whole number")):
        with pytest.raises(HyperNodeError, match=error):
            parse_hypernode(obj)


def test_tier_names_alias_their_level_where_they_agree() -> None:
    objs = [hypernode("l1", 1, exact("n1"), tier_name="leaf"),
            hypernode("l2", 1, exact("n2"), tier_name="rack"),
            hypernode("s", 2, exact("l1", "HyperNode"), tier_name="not a key!")]
    t = read(objs, {"n1": {}, "n2": {}})
    assert t.levels.aliases == ()
    assert any("name it leaf, rack" in p for p in t.problems)
    assert any("tierName 'not a key!' cannot name a level" in p for p in t.problems)


@pytest.mark.parametrize(("tier", "level"), [(1, T1), (2, T1), (3, T3), (4, None)])
def test_a_tier_is_the_widest_hypernode_tier_at_most_it(tier: int, level: str | None) -> None:
    """Tiers 1 and 3: tier 2 asks for no wider than tier 2, so tier 1; above the widest, the
    whole cluster; below the narrowest, one node."""
    levels = Levels((T3, T1), (), True, (3, 1))
    assert levels.resolve(keys.network_tier_level(tier)) == level
    # no HyperNode yet: every node is its own narrowest domain
    assert Levels(hypernodes=True).resolve(keys.network_tier_level(tier)) == HOSTNAME
    assert Levels((T3,), (), True, (3,)).resolve(keys.network_tier_level(1)) == HOSTNAME


def test_the_view_follows_hypernodes_and_nodes_as_they_change() -> None:
    """Each change is matched where it lands: the same tiers as all read at once."""
    view = HyperNodeView()
    nodes = infos({"a-0": {}, "b-0": {"pool": "b"}})
    for obj in fabric():
        view.on_event("ADDED", obj)
    first, remade = view.tiers(nodes)
    assert remade and set(first.domains) == {"a-0", "b-0"}
    assert view.tiers(nodes) == (first, False)
    # a node joins leaf b, one leaves, one changes its label into leaf b
    nodes |= infos({"b-1": {"pool": "b"}, "a-1": {}})
    for name in ("b-1", "a-1"):
        view.nodes_changed(name)
    del nodes["a-0"]
    view.nodes_changed("a-0")
    nodes["a-1"] = infos({"a-1": {"pool": "b"}})["a-1"]
    now, remade = view.tiers(nodes)
    assert remade and now.domains == read(fabric(), {n: dict(i.labels) for n, i in
                                                     nodes.items()}).domains
    # a-1 matches both leaves now (pattern and label): the first by name
    assert {n: d[T1] for n, d in now.domains.items()} == {
        "a-1": "leaf-a", "b-0": "leaf-b", "b-1": "leaf-b"}
    view.on_event("DELETED", fabric()[0])
    after, remade = view.tiers(nodes)
    assert remade and {n: d[T1] for n, d in after.domains.items()} == {
        "a-1": "leaf-b", "b-0": "leaf-b", "b-1": "leaf-b"}
    view.on_event("ADDED", hypernode("bad", 1) | {"spec": {"tier": -1}})
    assert "HyperNode bad: spec.tier -1 is not a whole number" in view.tiers(nodes)[0].problems


def topo(**network: Any) -> str:
    return json.dumps({"v": 1, "mode": "preferred", "network": network})


def spread_nodes() -> list[dict[str, Any]]:
    """Two leaves of two DGX-1 nodes under one spine, no topology labels at all."""
    return [node(f"a-{i}") for i in range(2)] + \
        [node(f"b-{i}", labels={"pool": "b"}) for i in range(2)]


def run(pods: list[dict[str, Any]], objs: list[dict[str, Any]]) -> Plan:
    nodes = {n["metadata"]["name"]: parse_node(n) for n in objs}
    t = read(fabric(), {name: dict(n.labels) for name, n in nodes.items()})
    config = PlanConfig(keys.DEFAULT_BINDER_SCHEDULER_NAME, levels=t.levels, domains=t.domains)
    return plan([parse_pod(p) for p in pods], nodes, None, config=config, queue=GangQueue(),
                fit=FitCache(), place=place_gang, now=1795237200.0)


def test_a_volcano_gang_is_placed_within_the_hypernodes() -> None:
    # hard, highest tier 1 (as the webhook writes Volcano's annotations): one leaf
    taken = [pod("busy", gpus=4, node_name="a-0", topology=None)]
    p = run([*job("j", workers=2, gpus=4, topology=topo(level="tier:1")), *taken],
            spread_nodes())
    assert len(p.places) == 1
    assert {a.node for pod_, a in p.places[0].assignments if pod_.gpus} <= {"a-0", "a-1"}
    # by tierName, as a KAI alias: two leaves' worth waits within one leaf, with the reason
    p = run(job("j", workers=3, gpus=8, topology=topo(level="leaf")), spread_nodes())
    assert not p.places
    # (named as HyperNodes: by tier and tierName, and the leaf by its name)
    assert p.waits[0].reason == ("gang team-a/j needs 24 GPUs (3 members x 8 GPUs) within one "
                                 "tier-1 HyperNode (leaf); the largest free one (HyperNode leaf-b) "
                                 "has 16 free GPUs")
    # within the spine it spans both leaves
    p = run(job("j", workers=3, gpus=8, topology=topo(level="tier:1", mode="preferred",
                                                      maxLevel="tier:2")), spread_nodes())
    assert len(p.places) == 1


@pytest.mark.parametrize("crd_later", [False, True], ids=["crd-installed", "crd-installed-later"])
async def test_the_binder_reads_hypernodes_as_they_change(
        apiserver: ApiServerEmulator, kube: KubeApi, shared_crds: list[dict[str, Any]],
        crd_later: bool) -> None:
    """Through the emulator: a leaf-bound gang of two whole nodes waits while no HyperNode
    holds the nodes (each node is then its own narrowest domain), and is bound within the one
    leaf with room once the HyperNodes are created; also where Volcano's HyperNode CRD is
    installed only after the binder started (webhook.binder.sources)."""
    [crd] = [c for c in shared_crds if c["spec"]["names"]["plural"] == "hypernodes"]
    if crd_later:
        await kube.delete(CRDS, crd["metadata"]["name"])
    for n in spread_nodes():
        apiserver.seed(n)
    # half of a-0 taken: leaf a has 12 free GPUs, b 16; the fewest nodes by name would be a-1
    # and b-0, across the leaves
    apiserver.seed(pod("busy", gpus=4, node_name="a-0", topology=None))
    b = Binder(kube, BinderConfig(backoff_initial=0.05, backoff_max=0.2,
                                  network_levels=network_levels("volcano"),
                                  crd_probe_seconds=0.1))
    async with serving(b):
        for p in job("j", workers=2, gpus=8, topology=topo(level="tier:1")):
            await kube.create(PODS, p)

        def waits() -> list[str]:
            return [w.reason for w in b.last_plan.waits if "GPUs" in w.reason] \
                if b.last_plan else []
        [reason] = await eventually(waits, within=5)
        assert "needs 16 GPUs (2 members x 8 GPUs) on one node" in reason
        assert not any(p["spec"].get("nodeName") for p in apiserver.objects("pods", "team-a")
                       if p["metadata"]["name"].startswith("j-"))
        if crd_later:
            await kube.create(CRDS, crd)
        for obj in fabric():
            await kube.create(VOLCANO_HYPERNODES, obj)
        where = await eventually(lambda: bound(apiserver, "j-"), within=5)
        assert where == {"b-0", "b-1"}


NAMES = ["a-1", "a-10", "a-2", "ab-1", "b-1", "node-1", "node-12", "node-2", "nodes", "rack.a-1",
         "racka-1", "x-a-1"]


@pytest.mark.parametrize("pattern", [
    "^a-", "a-", "^a-1", "^a-1?", "^a-1*", "^ab{0}", "^a|^b", "^node-1$", r"^node-\d", "^nodes?",
    r"^rack\.a", r"^rack\.?a", "^rack.a", "(?i)^NODE", "^[ab]-1", "^x*-a", "1$"])
def test_a_pattern_selects_what_a_search_in_every_name_would(pattern: str) -> None:
    """The literal prefix only narrows where to look: the same nodes as searching every name."""
    nodes = infos({n: {} for n in NAMES})
    h, _ = parse_hypernode(hypernode("h", 1, regex(pattern)))
    assert selected(h, Candidates(nodes)) == {n for n in NAMES if re.search(pattern, n)}


@pytest.mark.parametrize(("pattern", "chosen"), [
    # Go's regexp (RE2) where Python's re reads the same text otherwise or refuses it
    ("^node-[[:digit:]]+$", {"node-1", "node-12", "node-2"}),  # re: a set of ":digt[" and "]"
    (r"^node-\d\z", {"node-1", "node-2"}),  # re refuses \z
    (r"^\pL+$", {"nodes"}),  # re refuses \p
    ("(?U)^a-1+", {"a-1", "a-10"}),  # re has no U flag
])
def test_a_pattern_reads_as_go_reads_it(pattern: str, chosen: set[str]) -> None:
    nodes = infos({n: {} for n in NAMES})
    h, problems = parse_hypernode(hypernode("h", 1, regex(pattern)))
    assert problems == [] and selected(h, Candidates(nodes)) == chosen


@pytest.mark.parametrize("pattern", ["^a-(?=1)", r"^(a)-\1", "^a{1001}", "(?<!x)-a"])
def test_a_pattern_go_refuses_selects_nothing(pattern: str) -> None:
    """Python's re accepts lookarounds, back-references and repeats over 1,000; Go does not, and
    Volcano leaves such a member out: so does Muster, saying why."""
    h, problems = parse_hypernode(hypernode("h", 1, exact("a-1"), regex(pattern)))
    assert len(h.nodes) == 1 and len(problems) == 1
    assert f"member 2: regexMatch {pattern!r} is not a regular expression (" in problems[0]


@pytest.mark.parametrize("match", [
    {"matchLabels": {"rack": "r1"}},
    {"matchLabels": {"rack": "r1", "pool": "p"}},
    {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1", "r2"]}]},
    {"matchExpressions": [{"key": "pool", "operator": "Exists"}]},
    {"matchExpressions": [{"key": "rack", "operator": "NotIn", "values": ["r1"]}]},
    {"matchExpressions": [{"key": "pool", "operator": "DoesNotExist"}]}])
def test_a_label_member_selects_what_its_selector_matches(match: dict[str, Any]) -> None:
    labels = {"n1": {"rack": "r1"}, "n2": {"rack": "r1", "pool": "p"}, "n3": {"rack": "r2"},
              "n4": {"pool": "q"}, "n5": {}}
    nodes = infos(labels)
    obj = hypernode("h", 1, {"type": "Node", "selector": {"labelMatch": match}})
    h, _ = parse_hypernode(obj)
    naive = {n for n, i in nodes.items() if h.nodes[0].matches(n, i.labels)}
    assert selected(h, Candidates(nodes)) == naive
    assert naive  # (each selector here selects something)


@pytest.mark.parametrize("changed", [3, 40])
def test_a_few_or_many_changed_nodes_give_the_tiers_of_a_fresh_read(changed: int) -> None:
    """A few changed nodes are matched against every HyperNode, many by matching every
    HyperNode again: either way the tiers of reading everything anew."""
    labels = {f"n-{i}": {"pool": "b" if i % 2 else "c"} for i in range(60)}
    objs = [hypernode("by-name", 1, regex("^n-1")), hypernode("by-label", 1, labelled(pool="b")),
            hypernode("top", 2, exact("by-name", "HyperNode"), exact("by-label", "HyperNode"))]
    view = HyperNodeView()
    for obj in objs:
        view.on_event("ADDED", obj)
    view.tiers(infos(labels))
    for i in range(changed):
        labels[f"n-{i}"] = {"pool": "c" if i % 2 else "b"}
        view.nodes_changed(f"n-{i}")
    labels["n-100"] = {"pool": "b"}
    view.nodes_changed("n-100")
    assert view.tiers(infos(labels))[0] == read(objs, labels)
