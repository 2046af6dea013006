"""Label and field selectors, in the string form of list/watch query parameters and in the
`metav1.LabelSelector` form of webhook configurations. Pure functions."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import bad_request

_SET_EXPR = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*(?:(in|notin)\s*\(([^)]*)\)\s*)?$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!":
            return self.key not in labels
        value = labels.get(self.key)
        if self.op in ("=", "in"):
            return value is not None and value in self.values
        # != and notin match objects without the label, as in apimachinery
        return value is None or value not in self.values


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def parse_label_selector(text: str | None) -> list[Requirement]:
    """`a=b,c!=d,e in (x,y),f notin (z),g,!h` → requirements (all must match)."""
    if not text:
        return []
    reqs = []
    for part in _split_top(text):
        for op in ("!=", "==", "="):
            if op in part and "(" not in part:
                key, _, value = part.partition(op)
                reqs.append(Requirement(key.strip(), "!=" if op == "!=" else "=",
                                        (value.strip(),)))
                break
        else:
            m = _SET_EXPR.match(part)
            if not m:
                raise bad_request(f"unable to parse requirement: {part!r}")
            neg, key, set_op, values = m.groups()
            if set_op:
                if neg:
                    raise bad_request(f"unable to parse requirement: {part!r}")
                vals = tuple(v.strip() for v in values.split(",") if v.strip())
                reqs.append(Requirement(key, set_op, vals))
            else:
                reqs.append(Requirement(key, "!" if neg else "exists"))
    return reqs


def labels_match(reqs: list[Requirement], labels: Mapping[str, str] | None) -> bool:
    labels = labels or {}
    return all(r.matches(labels) for r in reqs)


def label_selector_object(selector: Mapping[str, Any] | None) -> list[Requirement]:
    """A metav1.LabelSelector (matchLabels, matchExpressions) as requirements.
    None or {} selects everything, as the apiserver does for webhook selectors."""
    if not selector:
        return []
    labels = selector.get("matchLabels") or {}
    exprs = selector.get("matchExpressions") or []
    if not isinstance(labels, Mapping) or not isinstance(exprs, list):
        raise bad_request("invalid label selector")
    reqs = [Requirement(str(k), "=", (str(v),)) for k, v in labels.items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expr in exprs:
        op = ops.get(expr.get("operator", "")) if isinstance(expr, Mapping) else None
        if op is None or not isinstance(expr.get("key"), str):
            raise bad_request(f"invalid label selector requirement: {expr!r}")
        values = expr.get("values") or []
        if not isinstance(values, list):
            raise bad_request(f"invalid label selector requirement: {expr!r}")
        reqs.append(Requirement(expr["key"], op, tuple(str(v) for v in values)))
    return reqs


# --- field selectors ---------------------------------------------------------------------------

FieldGetter = Callable[[Mapping[str, Any]], str]


def _path(*keys: str) -> FieldGetter:
    def get(obj: Mapping[str, Any]) -> str:
        cur: Any = obj
        for k in keys:
            if not isinstance(cur, Mapping):
                return ""
            cur = cur.get(k)
        if cur is None:
            return ""
        if isinstance(cur, bool):
            return "true" if cur else "false"
        return str(cur)
    return get


_COMMON = {"metadata.name": _path("metadata", "name"),
           "metadata.namespace": _path("metadata", "namespace")}

_BY_RESOURCE: dict[tuple[str, str], dict[str, FieldGetter]] = {
    ("", "pods"): {f: _path(*f.split(".")) for f in (
        "spec.nodeName", "spec.schedulerName", "spec.restartPolicy", "spec.serviceAccountName",
        "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName")},
    ("", "nodes"): {"spec.unschedulable": _path("spec", "unschedulable")},
    ("", "namespaces"): {"status.phase": _path("status", "phase")},
    ("", "secrets"): {"type": _path("type")},
    ("", "events"): {f: _path(*f.split(".")) for f in (
        "involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
        "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
        "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type")},
    ("resource.k8s.io", "resourceslices"): {f: _path(*f.split(".")) for f in (
        "spec.nodeName", "spec.driver")},
    ("events.k8s.io", "events"): {f: _path(*f.split(".")) for f in (
        "regarding.kind", "regarding.namespace", "regarding.name", "regarding.uid",
        "reason", "reportingController", "type")},
}
_BY_RESOURCE[("", "events")]["source"] = _path("source", "component")


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    getter: FieldGetter
    negate: bool
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (self.getter(obj) == self.value) != self.negate


def parse_field_selector(text: str | None, group: str, plural: str) -> list[FieldRequirement]:
    """`metadata.name=x,spec.nodeName!=` for the fields the resource supports (400 otherwise,
    with the apiserver's message)."""
    if not text:
        return []
    fields = {**_COMMON, **_BY_RESOURCE.get((group, plural), {})}
    reqs = []
    for part in _split_top(text):
        for op in ("!=", "==", "="):
            if op in part:
                name, _, value = part.partition(op)
                name = name.strip()
                getter = fields.get(name)
                if getter is None:
                    raise bad_request(f"field label not supported: {name}")
                reqs.append(FieldRequirement(name, getter, op == "!=", value.strip()))
                break
        else:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
    return reqs


def fields_match(reqs: list[FieldRequirement], obj: Mapping[str, Any]) -> bool:
    return all(r.matches(obj) for r in reqs)


class Selector:
    """A parsed labelSelector + fieldSelector pair, as list and watch apply them."""

    def __init__(self, group: str, plural: str, label_selector: str | None,
                 field_selector: str | None) -> None:
        self.labels = parse_label_selector(label_selector)
        self.fields = parse_field_selector(field_selector, group, plural)

    @property
    def empty(self) -> bool:
        return not self.labels and not self.fields

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return labels_match(self.labels, meta.get("labels")) and fields_match(self.fields, obj)
