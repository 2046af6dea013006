"""Helm values files as `helm -f base.yaml -f team.yaml` takes them: which file is one, and the
values they give together. Helm's rule: a later file wins; where both set a map, the two merge
key by key, deeply; any other value (a list included) replaces the earlier one whole; a null
removes the value (then the chart's default applies).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.yamlpos import Document, Path

#: the chart's top-level values (charts/muster/values.schema.json, which takes no other)
VALUE_KEYS = frozenset({
    "agent", "annotationGuard", "binder", "certs", "fullnameOverride", "image",
    "imagePullSecrets", "log", "metrics", "nameOverride", "podSecurityContext", "policies",
    "policyCheck", "reader", "tests", "uninstall", "webhook"})


@dataclass(frozen=True, slots=True)
class ValuesFile:
    """A values file's one document, under the name its problems are reported by."""

    name: str
    doc: Document


def is_values(data: Any) -> bool:
    """A values file's document: a map that is no Kubernetes object (no kind, no apiVersion:
    not a policy, however broken) and sets one of the chart's values."""
    return (isinstance(data, dict) and "kind" not in data and "apiVersion" not in data
            and not VALUE_KEYS.isdisjoint(data))


def merged(files: Sequence[ValuesFile]) -> dict[str, Any]:
    """The values of `files` together, later ones winning (Helm's rule)."""
    return functools.reduce(_merge, (f.doc.data for f in files), {})


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        below = out.get(key)
        out[key] = _merge(below, value) if isinstance(below, dict) and isinstance(value, dict) \
            else value
    return out


def setter(files: Sequence[ValuesFile], path: Path) -> ValuesFile:
    """The file whose value at `path` the merge keeps: the last that sets it (the last file
    when none does)."""
    return next((f for f in reversed(files) if _sets(f.doc.data, path)), files[-1])


def _sets(data: Any, path: Path) -> bool:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return False
        data = data[key]
    return True
