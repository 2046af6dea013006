"""Proving two label selectors disjoint (the loader's conflict check). Matching is
`compiled.selector_matches`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from webhook.policy.schema import LabelSelector

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace since 1.22


@dataclass
class _KeyConstraint:
    allowed: set[str] | None = None  # None: any value
    excluded: set[str] = field(default_factory=set)
    must_exist: bool = False
    must_not_exist: bool = False

    def allow(self, values: Iterable[str]) -> None:
        self.allowed = set(values) if self.allowed is None else self.allowed & set(values)
        self.must_exist = True

    def satisfiable(self) -> bool:
        if self.must_exist and self.must_not_exist:
            return False
        return self.allowed is None or bool(self.allowed - self.excluded)


def constraints(*selectors: LabelSelector | None,
                names: Iterable[str] | None = None) -> dict[str, _KeyConstraint]:
    """Per-key constraints that all the selectors (and a namespace-name list) impose together."""
    out: dict[str, _KeyConstraint] = {}
    if names is not None:
        out.setdefault(NAMESPACE_NAME_LABEL, _KeyConstraint()).allow(names)
    for sel in selectors:
        if sel is None:
            continue
        for key, value in sel.matchLabels.items():
            out.setdefault(key, _KeyConstraint()).allow([value])
        for req in sel.matchExpressions:
            c = out.setdefault(req.key, _KeyConstraint())
            if req.operator == "In":
                c.allow(req.values)
            elif req.operator == "NotIn":
                c.excluded |= set(req.values)
            elif req.operator == "Exists":
                c.must_exist = True
            else:
                c.must_not_exist = True
    return out


def provably_disjoint(a: Mapping[str, _KeyConstraint],
                      b: Mapping[str, _KeyConstraint]) -> str | None:
    """A label key on which no object can satisfy both constraint sets, or None."""
    for key in a.keys() & b.keys():
        x, y = a[key], b[key]
        both = _KeyConstraint(
            allowed=None if x.allowed is None and y.allowed is None
            else (x.allowed if y.allowed is None else y.allowed if x.allowed is None
                  else x.allowed & y.allowed),
            excluded=x.excluded | y.excluded,
            must_exist=x.must_exist or y.must_exist,
            must_not_exist=x.must_not_exist or y.must_not_exist,
        )
        if both.allowed is not None:
            both.must_exist = True
        if not both.satisfiable():
            return key
    return None
