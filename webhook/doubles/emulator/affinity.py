"""A pod's affinity, validated as kube-apiserver's core validation does: node affinity's
requirements, every preferred term's weight, and each pod (anti-)affinity term's selectors,
namespaces and topologyKey. The binder reads terms the real server accepted: a test that the
emulator let through with a term the real server refuses (a node field selector naming two
nodes, a pod term without a topologyKey) would prove nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .names import dns1123_label_errors, label_key_errors, label_value_errors

Cause = tuple[str, str, str]  # field, reason, message

_AT = "spec.affinity"
_FIELD_KEYS = ("metadata.name",)


def _invalid(field: str, value: Any, why: str) -> Cause:
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    return field, "FieldValueInvalid", f"Invalid value: {shown}: {why}"


def _expression(req: dict[str, Any], at: str, *, numeric: bool = True) -> list[Cause]:
    """A label requirement's operator and values: of a node selector term
    (ValidateNodeSelectorRequirement), or without `numeric` (Gt, Lt) of a label selector
    (ValidateLabelSelectorRequirement), whose messages are the same."""
    op, values = req.get("operator"), req.get("values") or []
    if op in ("In", "NotIn"):
        return [] if values else [(f"{at}.values", "FieldValueRequired", "Required value: must "
                                   "be specified when `operator` is 'In' or 'NotIn'")]
    if op in ("Exists", "DoesNotExist"):
        return [] if not values else [(f"{at}.values", "FieldValueForbidden", "Forbidden: may "
                                       "not be specified when `operator` is 'Exists' or "
                                       "'DoesNotExist'")]
    if numeric and op in ("Gt", "Lt"):
        return [] if len(values) == 1 else [(f"{at}.values", "FieldValueRequired", "Required "
                                             "value: must be specified single value when "
                                             "`operator` is 'Lt' or 'Gt'")]
    return [_invalid(f"{at}.operator", op, "not a valid selector operator")]


def _field(req: dict[str, Any], at: str) -> list[Cause]:
    """A field requirement: only the node's name, In or NotIn exactly one name."""
    op, values = req.get("operator"), req.get("values") or []
    causes = []
    if op not in ("In", "NotIn"):
        causes.append(_invalid(f"{at}.operator", op, "not a valid selector operator"))
    elif len(values) != 1:
        causes.append((f"{at}.values", "FieldValueRequired", "Required value: must be only one "
                       "value when `operator` is 'In' or 'NotIn' for node field selector"))
    if req.get("key") not in _FIELD_KEYS:
        causes.append(_invalid(f"{at}.key", req.get("key"), "not a valid field selector key"))
    return causes


def _term(term: Any, at: str) -> list[Cause]:
    if not isinstance(term, dict):
        return []
    causes = []
    for kind, check in (("matchExpressions", _expression), ("matchFields", _field)):
        for j, req in enumerate(term.get(kind) or ()):
            if isinstance(req, dict):
                causes += check(req, f"{at}.{kind}[{j}]")
    return causes


def _weight(term: dict[str, Any], at: str) -> list[Cause]:
    w = term.get("weight")
    return [] if isinstance(w, int) and 1 <= w <= 100 else [
        _invalid(f"{at}.weight", w, "must be in the range 1-100")]


def _node(na: dict[str, Any]) -> list[Cause]:
    at = f"{_AT}.nodeAffinity"
    causes = []
    required = na.get("requiredDuringSchedulingIgnoredDuringExecution")
    if isinstance(required, dict):
        req_at = f"{at}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
        terms = required.get("nodeSelectorTerms") or []
        if not terms:
            causes.append((req_at, "FieldValueRequired",
                           "Required value: must have at least one node selector term"))
        for i, term in enumerate(terms):
            causes += _term(term, f"{req_at}[{i}]")
    return causes + _preferred(na, at, "preference", _term)


def _preferred(terms: dict[str, Any], at: str, inner: str,
               check: Callable[[Any, str], list[Cause]]) -> list[Cause]:
    """Each preferred term's weight, then the term it weighs (its `inner` field)."""
    at = f"{at}.preferredDuringSchedulingIgnoredDuringExecution"
    causes = []
    for i, term in enumerate(terms.get("preferredDuringSchedulingIgnoredDuringExecution") or ()):
        if isinstance(term, dict):
            causes += _weight(term, f"{at}[{i}]") + check(term.get(inner), f"{at}[{i}].{inner}")
    return causes


def _label_name(key: Any, at: str) -> list[Cause]:
    return [_invalid(at, key, m) for m in label_key_errors(str(key or ""))]


def _selector(sel: Any, at: str) -> list[Cause]:
    """metav1 ValidateLabelSelector: matchLabels' keys and values, then each expression."""
    if not isinstance(sel, dict):
        return []
    causes = []
    for key, value in (sel.get("matchLabels") or {}).items():
        causes += _label_name(key, f"{at}.matchLabels")
        causes += [_invalid(f"{at}.matchLabels", value, m)
                   for m in label_value_errors(str(value))]
    for j, req in enumerate(sel.get("matchExpressions") or ()):
        if not isinstance(req, dict):
            continue
        req_at = f"{at}.matchExpressions[{j}]"
        causes += _expression(req, req_at, numeric=False)
        causes += _label_name(req.get("key"), f"{req_at}.key")
        causes += [_invalid(f"{req_at}.values[{k}]", v, m)
                   for k, v in enumerate(req.get("values") or [])
                   for m in label_value_errors(str(v))]
    return causes


def _label_keys(term: dict[str, Any], at: str) -> list[Cause]:
    """matchLabelKeys and mismatchLabelKeys, checked on the selector they were merged into: a
    key the selector already had is then there twice (the real server's field path, the term's
    own with the key's index, kept)."""
    selector = term.get("labelSelector")
    match, mismatch = term.get("matchLabelKeys") or [], term.get("mismatchLabelKeys") or []
    causes = []
    for kind, keys_ in (("matchLabelKeys", match), ("mismatchLabelKeys", mismatch)):
        if keys_ and selector is None:
            causes.append((f"{at}.{kind}", "FieldValueForbidden",
                           "Forbidden: must not be specified when labelSelector is not set"))
        elif keys_:
            for i, key in enumerate(keys_):
                causes += _label_name(key, f"{at}.{kind}[{i}]")
    if isinstance(selector, dict):
        index = {key: i for i, key in enumerate(match)}
        seen = set(selector.get("matchLabels") or {})
        for req in selector.get("matchExpressions") or ():
            key = req.get("key") if isinstance(req, dict) else None
            if key in index and key in seen:
                causes.append(_invalid(f"{at}[{index[key]}]", key,
                                       "exists in both matchLabelKeys and labelSelector"))
            seen.add(key)
    causes += [_invalid(f"{at}.matchLabelKeys[{i}]", key, "exists in both matchLabelKeys and "
                        "mismatchLabelKeys") for i, key in enumerate(match) if key in mismatch]
    return causes


def _pod_term(term: Any, at: str) -> list[Cause]:
    """validatePodAffinityTerm: the selectors, the namespaces' names, the label keys, a
    topologyKey."""
    if not isinstance(term, dict):
        return []
    causes = [*_selector(term.get("labelSelector"), f"{at}.labelSelector"),
              *_selector(term.get("namespaceSelector"), f"{at}.namespaceSelector")]
    for name in term.get("namespaces") or ():
        causes += [_invalid(f"{at}.namespace", name, m) for m in dns1123_label_errors(str(name))]
    causes += _label_keys(term, at)
    key = term.get("topologyKey") or ""
    if not key:
        causes.append((f"{at}.topologyKey", "FieldValueRequired", "Required value: can not be "
                       "empty"))
    return causes + _label_name(key, f"{at}.topologyKey")


def _pod(kind: str, terms: dict[str, Any]) -> list[Cause]:
    at = f"{_AT}.{kind}"
    req_at = f"{at}.requiredDuringSchedulingIgnoredDuringExecution"
    causes = []
    for i, term in enumerate(terms.get("requiredDuringSchedulingIgnoredDuringExecution") or ()):
        causes += _pod_term(term, f"{req_at}[{i}]")
    return causes + _preferred(terms, at, "podAffinityTerm", _pod_term)


def affinity_errors(pod: dict[str, Any]) -> list[Cause]:
    """Node affinity, then pod affinity, then pod anti-affinity, each in the real order."""
    affinity = (pod.get("spec") or {}).get("affinity")
    if not isinstance(affinity, dict):
        return []
    causes = _node(affinity["nodeAffinity"]) if isinstance(
        affinity.get("nodeAffinity"), dict) else []
    for kind in ("podAffinity", "podAntiAffinity"):
        if isinstance(affinity.get(kind), dict):
            causes += _pod(kind, affinity[kind])
    return causes


def _terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = (pod.get("spec") or {}).get("affinity")
    found = []
    for kind in ("podAffinity", "podAntiAffinity"):
        terms = affinity.get(kind) if isinstance(affinity, dict) else None
        if not isinstance(terms, dict):
            continue
        found += [t for t in terms.get("requiredDuringSchedulingIgnoredDuringExecution") or ()
                  if isinstance(t, dict)]
        found += [t["podAffinityTerm"] for t in
                  terms.get("preferredDuringSchedulingIgnoredDuringExecution") or ()
                  if isinstance(t, dict) and isinstance(t.get("podAffinityTerm"), dict)]
    return found


def merge_label_keys(pod: dict[str, Any]) -> None:
    """What the real server does on create, after the webhooks (the pod strategy's
    PrepareForCreate): each pod term's matchLabelKeys become `key In [the pod's value]` in its
    labelSelector, its mismatchLabelKeys `key NotIn [...]`; keys the pod lacks, and terms
    without a labelSelector, are left."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    for term in _terms(pod):
        selector = term.get("labelSelector")
        if not isinstance(selector, dict):
            continue
        for kind, op in (("matchLabelKeys", "In"), ("mismatchLabelKeys", "NotIn")):
            for key in term.get(kind) or ():
                if key in labels:
                    selector.setdefault("matchExpressions", []).append(
                        {"key": key, "operator": op, "values": [labels[key]]})
