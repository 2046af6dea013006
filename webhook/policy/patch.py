"""Render a Decision as an RFC 6902 JSON Patch against the pod it was made for.

Only differences are rendered, so a pod that already has everything gets an empty patch; keys are
escaped per RFC 6901 (`muster.io/policy` → `muster.io~1policy`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from webhook.jsonpatch import escape
from webhook.policy import native
from webhook.policy.decision import Decision
from webhook.policy.jsonshape import as_map
from webhook.policy.podview import PodShape, shape_of

_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
_NODE = "/spec/affinity/nodeAffinity"


def _map_ops(present: bool, current: Callable[[str], Any], wanted: Mapping[str, str | None],
             base: str) -> list[dict[str, Any]]:
    if not present:
        fresh = {k: v for k, v in wanted.items() if v is not None}
        return [{"op": "add", "path": base, "value": fresh}] if fresh else []
    ops: list[dict[str, Any]] = []
    for key, value in wanted.items():
        path = f"{base}/{escape(key)}"
        have = current(key)
        if value is None:
            if have is not None:
                ops.append({"op": "remove", "path": path})
        elif have != value:
            ops.append({"op": "add", "path": path, "value": value})
    return ops


def _affinity_ops(affinity: Any, exprs: tuple[Mapping[str, Any], ...],
                  preferences: tuple[Mapping[str, Any], ...]) -> list[dict[str, Any]]:
    """Required node affinity ANDed into each of the pod's terms, and preferred terms added
    beside the pod's own (each once); one `add` where the pod has no node affinity yet."""
    if not exprs and not preferences:
        return []
    wanted = [dict(e) for e in exprs]
    fresh: dict[str, Any] = {}
    if wanted:
        fresh[_REQUIRED] = {"nodeSelectorTerms": [{"matchExpressions": wanted}]}
    if preferences:
        fresh[_PREFERRED] = [dict(t) for t in preferences]
    if not isinstance(affinity, Mapping):
        return [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": fresh}}]
    node = affinity.get("nodeAffinity")
    if not isinstance(node, Mapping):
        return [{"op": "add", "path": "/spec/affinity/nodeAffinity", "value": fresh}]
    return [*_required_ops(node, wanted), *_preferred_ops(node, fresh.get(_PREFERRED, []))]


def _required_ops(node: Mapping[str, Any], wanted: list[dict[str, Any]]
                  ) -> list[dict[str, Any]]:
    if not wanted:
        return []
    base = f"{_NODE}/{_REQUIRED}"
    terms = as_map(node.get(_REQUIRED)).get("nodeSelectorTerms")
    if not isinstance(terms, list) or not terms:
        return [{"op": "add", "path": base,
                 "value": {"nodeSelectorTerms": [{"matchExpressions": wanted}]}}]
    # Terms are ORed: the requirement must hold in each of them.
    ops: list[dict[str, Any]] = []
    for i, t in enumerate(terms):
        have = as_map(t).get("matchExpressions")
        if not isinstance(have, list):
            ops.append({"op": "add", "path": f"{base}/nodeSelectorTerms/{i}/matchExpressions",
                        "value": wanted})
            continue
        ops.extend({"op": "add", "path": f"{base}/nodeSelectorTerms/{i}/matchExpressions/-",
                    "value": e} for e in wanted if e not in have)
    return ops


def _preferred_ops(node: Mapping[str, Any], wanted: list[dict[str, Any]]
                   ) -> list[dict[str, Any]]:
    if not wanted:
        return []
    have = node.get(_PREFERRED)
    if not isinstance(have, list):
        return [{"op": "add", "path": f"{_NODE}/{_PREFERRED}", "value": wanted}]
    return [{"op": "add", "path": f"{_NODE}/{_PREFERRED}/-", "value": t}
            for t in wanted if t not in have]


def render(shape: PodShape, decision: Decision) -> list[dict[str, Any]]:
    """RFC 6902 operations that bring the pod of `shape` to the state the decision describes."""
    ops = _map_ops(shape.labels is not None, shape.label, decision.labels, "/metadata/labels")
    ops += _map_ops(shape.annotations is not None, shape.annotation, decision.annotations,
                    "/metadata/annotations")
    if decision.scheduler_name and shape.scheduler_name != decision.scheduler_name:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": decision.scheduler_name})
    if decision.tolerations and not shape.tolerations:
        # the engine adds one toleration, the one `shape.tolerations` says is present or not
        missing = [dict(t) for t in decision.tolerations]
        if shape.tolerations is None:
            ops.append({"op": "add", "path": "/spec/tolerations", "value": missing})
        else:
            ops.extend({"op": "add", "path": "/spec/tolerations/-", "value": t} for t in missing)
    ops += _affinity_ops(shape.affinity, decision.node_affinity, decision.node_preferences)
    group = decision.pod_group
    if group is not None and group.backend == "kubernetes":
        name, value = native.pod_reference(group)
        if shape.native_ref != native.frozen_reference(group.name, native.api_of(group)):
            ops.append({"op": "add", "path": f"/spec/{name}", "value": value})
    return ops


def render_patch(pod: Mapping[str, Any], decision: Decision) -> list[dict[str, Any]]:
    """`render` for a pod given whole (the CLI, PolicyTests, benches): its shape on the
    decision's keys."""
    return render(shape_of(pod, tuple(decision.labels), tuple(decision.annotations)), decision)
