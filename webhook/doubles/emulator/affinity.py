"""A pod's node affinity and scheduling weights, validated as kube-apiserver's core validation
does. The binder reads terms the real server accepted: a test that the emulator let through with
a term the real server refuses (a node field selector naming two nodes) would prove nothing."""

from __future__ import annotations

from typing import Any

Cause = tuple[str, str, str]  # field, reason, message

_AT = "spec.affinity"
_FIELD_KEYS = ("metadata.name",)


def _invalid(field: str, value: Any, why: str) -> Cause:
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    return field, "FieldValueInvalid", f"Invalid value: {shown}: {why}"


def _expression(req: dict[str, Any], at: str) -> list[Cause]:
    """A label requirement of a node selector term (ValidateNodeSelectorRequirement)."""
    op, values = req.get("operator"), req.get("values") or []
    if op in ("In", "NotIn"):
        return [] if values else [(f"{at}.values", "FieldValueRequired", "Required value: must "
                                   "be specified when `operator` is 'In' or 'NotIn'")]
    if op in ("Exists", "DoesNotExist"):
        return [] if not values else [(f"{at}.values", "FieldValueForbidden", "Forbidden: may "
                                       "not be specified when `operator` is 'Exists' or "
                                       "'DoesNotExist'")]
    if op in ("Gt", "Lt"):
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
    pref_at = f"{at}.preferredDuringSchedulingIgnoredDuringExecution"
    for i, term in enumerate(na.get("preferredDuringSchedulingIgnoredDuringExecution") or ()):
        if isinstance(term, dict):
            causes += _weight(term, f"{pref_at}[{i}]")
            causes += _term(term.get("preference"), f"{pref_at}[{i}].preference")
    return causes


def affinity_errors(pod: dict[str, Any]) -> list[Cause]:
    """Node affinity's requirements, and every preferred term's weight (1-100)."""
    affinity = (pod.get("spec") or {}).get("affinity")
    if not isinstance(affinity, dict):
        return []
    causes = _node(affinity["nodeAffinity"]) if isinstance(
        affinity.get("nodeAffinity"), dict) else []
    for kind in ("podAffinity", "podAntiAffinity"):
        terms = affinity.get(kind)
        if not isinstance(terms, dict):
            continue
        pref_at = f"{_AT}.{kind}.preferredDuringSchedulingIgnoredDuringExecution"
        for i, term in enumerate(terms.get("preferredDuringSchedulingIgnoredDuringExecution")
                                 or ()):
            if isinstance(term, dict):
                causes += _weight(term, f"{pref_at}[{i}]")
    return causes
