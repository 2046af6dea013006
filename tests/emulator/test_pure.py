"""Pure parts of the emulator: selectors, merge and strategic merge patch, CRD schema checks."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.doubles.emulator.errors import ApiStatusError
from webhook.doubles.emulator.patch import merge_patch, strategic_merge
from webhook.doubles.emulator.resources import ResourceType
from webhook.doubles.emulator.schema import validate_custom
from webhook.doubles.emulator.selectors import (
    Selector,
    label_selector_object,
    labels_match,
    parse_label_selector,
)

LABELS = {"app": "mpi", "role": "worker", "tier": "gpu"}


@pytest.mark.parametrize(("selector", "matches"), [
    ("app=mpi", True), ("app==mpi", True), ("app!=mpi", False), ("app=other", False),
    ("role in (worker,launcher)", True), ("role notin (worker)", False),
    ("missing notin (x)", True), ("missing!=x", True), ("tier", True), ("!tier", False),
    ("!missing", True), ("app=mpi,role in (launcher)", False),
    ("app = mpi , role in ( worker , x )", True), ("", True),
])
def test_label_selector_strings(selector: str, matches: bool) -> None:
    assert labels_match(parse_label_selector(selector), LABELS) is matches


@pytest.mark.parametrize("bad", ["app in x", "!app in (x)", "in (a)", "a b"])
def test_bad_label_selector_is_400(bad: str) -> None:
    with pytest.raises(ApiStatusError) as err:
        parse_label_selector(bad)
    assert err.value.code == 400


def test_label_selector_objects() -> None:
    sel = label_selector_object({"matchLabels": {"app": "mpi"}, "matchExpressions": [
        {"key": "role", "operator": "In", "values": ["worker"]},
        {"key": "skip", "operator": "DoesNotExist"}]})
    assert labels_match(sel, LABELS)
    assert not labels_match(sel, {**LABELS, "skip": "1"})
    assert label_selector_object({}) == [] and label_selector_object(None) == []


def test_field_selectors_for_pods_and_events() -> None:
    pod = {"metadata": {"name": "p", "namespace": "a"}, "spec": {"schedulerName": "x"},
           "status": {"phase": "Pending"}}
    assert Selector("", "pods", None, "spec.nodeName=,status.phase=Pending").matches(pod)
    assert not Selector("", "pods", None, "spec.schedulerName!=x").matches(pod)
    event = {"metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "p"},
             "source": {"component": "muster"}}
    assert Selector("", "events", None, "involvedObject.name=p,source=muster").matches(event)
    with pytest.raises(ApiStatusError):
        Selector("", "configmaps", None, "spec.nodeName=x")


# RFC 7386 appendix A
@pytest.mark.parametrize(("target", "patch", "result"), [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
])
def test_merge_patch_rfc7386(target: Any, patch: Any, result: Any) -> None:
    assert merge_patch(target, patch) == result


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=2), children, max_size=3), max_leaves=10)


@settings(max_examples=150, deadline=None)
@given(target=st.dictionaries(st.text(max_size=2), json_values, max_size=4),
       patch=st.dictionaries(st.text(max_size=2), json_values, max_size=4))
def test_merge_patch_is_idempotent_and_leaves_inputs_alone(target: dict[str, Any],
                                                           patch: dict[str, Any]) -> None:
    before = repr(target), repr(patch)
    once = merge_patch(target, patch)
    assert merge_patch(once, patch) == once
    assert (repr(target), repr(patch)) == before


def test_strategic_merge_by_key_and_directives() -> None:
    pod = {"spec": {"containers": [{"name": "a", "image": "1", "env": [{"name": "X", "value":
                                                                       "1"}]},
                                   {"name": "b", "image": "1"}],
                    "tolerations": [{"key": "t1"}]},
           "metadata": {"finalizers": ["f1"]}}
    out = strategic_merge(pod, {
        "spec": {"containers": [{"name": "a", "env": [{"name": "Y", "value": "2"}]},
                                {"name": "b", "$patch": "delete"},
                                {"name": "c", "image": "3"}],
                 "tolerations": [{"key": "t2"}]},
        "metadata": {"finalizers": ["f2"]}})
    assert [c["name"] for c in out["spec"]["containers"]] == ["a", "c"]
    assert out["spec"]["containers"][0]["image"] == "1"
    assert [e["name"] for e in out["spec"]["containers"][0]["env"]] == ["X", "Y"]
    assert out["spec"]["tolerations"] == [{"key": "t2"}]  # no merge key upstream: replaced
    assert out["metadata"]["finalizers"] == ["f1", "f2"]
    assert pod["spec"]["containers"][1]["name"] == "b"  # input untouched
    replaced = strategic_merge(pod, {"spec": {"$patch": "replace", "x": 1}})
    assert replaced["spec"] == {"x": 1}


def test_strategic_merge_keys_of_the_chart_objects() -> None:
    """What `helm upgrade` patches: webhooks by name (a caBundle another writer set survives),
    Service ports by port and container ports by containerPort, spread constraints by
    topologyKey."""
    hooks = {"webhooks": [{"name": "pods.muster.io", "timeoutSeconds": 5,
                           "clientConfig": {"caBundle": "Q0E=", "service": {"name": "w"}}}]}
    out = strategic_merge(hooks, {"$setElementOrder/webhooks": [{"name": "pods.muster.io"}],
                                  "webhooks": [{"name": "pods.muster.io", "timeoutSeconds": 7}]})
    assert out["webhooks"] == [{"name": "pods.muster.io", "timeoutSeconds": 7,
                                "clientConfig": {"caBundle": "Q0E=", "service": {"name": "w"}}}]
    service = {"spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443},
                                  {"name": "metrics", "port": 9090}]}}
    out = strategic_merge(service, {"spec": {"ports": [{"port": 443, "targetPort": 9443}]}})
    assert out["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": 9443},
                                    {"name": "metrics", "port": 9090}]
    container = {"ports": [{"containerPort": 8443, "name": "https"}]}
    out = strategic_merge(container, {"ports": [{"containerPort": 9090, "name": "metrics"}]})
    assert [p["containerPort"] for p in out["ports"]] == [8443, 9090]
    spread = {"topologySpreadConstraints": [{"topologyKey": "kubernetes.io/hostname",
                                             "maxSkew": 1}]}
    out = strategic_merge(spread, {"topologySpreadConstraints": [
        {"topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule"}]})
    assert out["topologySpreadConstraints"] == [{
        "topologyKey": "kubernetes.io/hostname", "maxSkew": 1,
        "whenUnsatisfiable": "DoNotSchedule"}]


SCHEMA = {"type": "object", "properties": {
    "apiVersion": {"type": "string"}, "kind": {"type": "string"},
    "metadata": {"type": "object"},
    "spec": {"type": "object", "required": ["minMember"], "properties": {
        "minMember": {"type": "integer", "minimum": 0},
        "queue": {"type": "string"},
        "mode": {"type": "string", "enum": ["a", "b"]},
        "minResources": {"type": "object", "additionalProperties": {
            "x-kubernetes-int-or-string": True}},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "n": {"type": "integer"}}}}}}}}
RT = ResourceType("example.com", "v1", "things", "Thing", True, schema=SCHEMA)


def thing(spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t"},
            "spec": spec, **extra}


def test_schema_prunes_unknown_fields_and_keeps_preserved_ones() -> None:
    obj = thing({"minMember": 1, "extra": 1, "free": {"any": {"thing": 1}},
                 "minResources": {"cpu": "1", "nvidia.com/gpu": 4},
                 "items": [{"n": 1, "zap": 2}], "queue": None}, status={"x": 1})
    pruned = validate_custom(RT, obj)
    assert obj["spec"] == {"minMember": 1, "free": {"any": {"thing": 1}},
                           "minResources": {"cpu": "1", "nvidia.com/gpu": 4},
                           "items": [{"n": 1}]}
    assert "status" not in obj and sorted(pruned) == ["spec.extra", "spec.items[0].zap",
                                                       "status"]


def test_schema_reports_every_invalid_field() -> None:
    with pytest.raises(ApiStatusError) as err:
        validate_custom(RT, thing({"minMember": -1, "mode": "c", "queue": 3,
                                   "minResources": {"cpu": 1.5}}))
    causes = {c["field"]: c["reason"] for c in err.value.details["causes"]}
    assert causes == {"spec.minMember": "FieldValueInvalid", "spec.mode": "FieldValueNotSupported",
                      "spec.queue": "FieldValueTypeInvalid",
                      "spec.minResources.cpu": "FieldValueTypeInvalid"}
    assert err.value.code == 422
    assert err.value.message.startswith('Thing.example.com "t" is invalid')
    with pytest.raises(ApiStatusError) as err:
        validate_custom(RT, thing({}))
    assert err.value.details["causes"][0]["field"] == "spec.minMember"
