from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from binder_objects import node, pod

from webhook.binder.fit import FitCache, eligible_nodes, why_not
from webhook.binder.nodes import parse_node
from webhook.binder.pods import parse_pod


def constraints(**spec: Any) -> Any:
    obj = pod("p")
    obj["spec"]["tolerations"] = []
    obj["spec"].update(spec)
    return parse_pod(obj).constraints


def affinity(*exprs: dict[str, Any], fields: list[dict[str, Any]] | None = None) -> Any:
    term: dict[str, Any] = {}
    if exprs:
        term["matchExpressions"] = list(exprs)
    if fields:
        term["matchFields"] = fields
    return constraints(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}})


N = parse_node(node("n1", labels={"zone": "a", "gpus": "8"}))


def test_node_selector() -> None:
    assert why_not(constraints(nodeSelector={"zone": "a"}), N) is None
    assert "nodeSelector zone=b" in (why_not(constraints(nodeSelector={"zone": "b"}), N) or "")


@pytest.mark.parametrize(("expr", "ok"), [
    ({"key": "zone", "operator": "In", "values": ["a", "b"]}, True),
    ({"key": "zone", "operator": "In", "values": ["b"]}, False),
    ({"key": "zone", "operator": "NotIn", "values": ["b"]}, True),
    ({"key": "zone", "operator": "NotIn", "values": ["a"]}, False),
    ({"key": "absent", "operator": "NotIn", "values": ["a"]}, True),
    ({"key": "zone", "operator": "Exists"}, True),
    ({"key": "absent", "operator": "Exists"}, False),
    ({"key": "absent", "operator": "DoesNotExist"}, True),
    ({"key": "zone", "operator": "DoesNotExist"}, False),
    ({"key": "gpus", "operator": "Gt", "values": ["4"]}, True),
    ({"key": "gpus", "operator": "Gt", "values": ["8"]}, False),
    ({"key": "gpus", "operator": "Lt", "values": ["9"]}, True),
    ({"key": "zone", "operator": "Lt", "values": ["9"]}, False),  # not an integer
])
def test_required_affinity_operators(expr: dict[str, Any], ok: bool) -> None:
    assert (why_not(affinity(expr), N) is None) is ok


def test_match_fields_and_terms_are_ored() -> None:
    assert why_not(affinity(fields=[{"key": "metadata.name", "operator": "In",
                                     "values": ["n1"]}]), N) is None
    assert why_not(affinity(fields=[{"key": "metadata.name", "operator": "In",
                                     "values": ["n2"]}]), N) is not None
    two_terms = constraints(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["x"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}})
    assert why_not(two_terms, N) is None
    assert why_not(affinity(), N) is not None  # an empty term matches nothing


def test_taints_and_tolerations() -> None:
    tainted = parse_node(node("t", taints=[
        {"key": "muster.io/gpu-topology", "value": "", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "ml", "effect": "NoExecute"},
        {"key": "soft", "value": "x", "effect": "PreferNoSchedule"}]))
    assert "untolerated taint muster.io/gpu-topology" in (why_not(constraints(), tainted) or "")
    both = constraints(tolerations=[
        {"key": "muster.io/gpu-topology", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml"}])
    assert why_not(both, tainted) is None
    wrong_value = constraints(tolerations=[
        {"key": "muster.io/gpu-topology", "operator": "Exists"},
        {"key": "dedicated", "operator": "Equal", "value": "web"}])
    assert "dedicated:NoExecute" in (why_not(wrong_value, tainted) or "")
    wrong_effect = constraints(tolerations=[
        {"key": "muster.io/gpu-topology", "operator": "Exists", "effect": "NoExecute"},
        {"key": "dedicated", "operator": "Exists"}])
    assert why_not(wrong_effect, tainted) is not None
    assert why_not(constraints(tolerations=[{"operator": "Exists"}]), tainted) is None


def test_cordoned_nodes_and_gpu_pods_need_topology() -> None:
    cordoned = parse_node(node("c", unschedulable=True))
    assert "unschedulable" in (why_not(constraints(), cordoned) or "")
    plain = parse_node(node("plain", kind=None, gpus=8))
    nodes = {n.name: n for n in (N, cordoned, plain)}
    c = constraints()
    assert eligible_nodes(c, nodes.values(), "devicePlugin") == {"n1"}
    assert eligible_nodes(c, nodes.values(), "none") == {"n1", "plain"}
    cache = FitCache()
    assert cache.eligible(c, nodes, "devicePlugin") == {"n1"}
    assert cache.eligible(c, {}, "devicePlugin") == {"n1"}  # cached until cleared
    cache.clear()
    assert cache.eligible(c, {}, "devicePlugin") == frozenset()


def test_dra_pods_need_a_resource_slice_and_others_a_device_plugin() -> None:
    dra_only = replace(parse_node(node("dra", gpus=0)), dra_gpus=frozenset(range(8)))
    both = replace(parse_node(node("both")), dra_gpus=frozenset(range(8)))
    nodes = [N, dra_only, both]
    assert eligible_nodes(constraints(), nodes, "dra") == {"dra", "both"}
    assert eligible_nodes(constraints(), nodes, "devicePlugin") == {"n1", "both"}
    assert dra_only.gpu_capacity == 8 and N.gpu_capacity == 8
