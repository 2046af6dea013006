"""What a policy in audit or warn mode would have done to a pod. Pure.

Such a policy matches and decides as usual, but only the enforced policies change the pod
(`engine.decide`). What it would have done is the difference between two decisions for the same
pod: the one the enforced policies make, and the one they would make with this policy enforced
too. The difference is taken on the pod's state after each patch (the keys the pod already has
count), so "would set" names exactly what turning the policy to enforce would change, and
nothing a higher-priority enforced policy overrides.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

from webhook import keys
from webhook.policy.decision import Decision, PodGroupSpec, PolicyAudit
from webhook.policy.podview import PodShape

#: the reason of the Event that records an audit (webhook.admission: one per job and policy)
EVENT_REASON = "PolicyAudit"
#: the policy an audit Event names, and whether it would change something (`muster analyze`
#: reads it back)
_EVENT = re.compile(r"^policy (\S+) \((?:audit|warn)\) (would set|matches but would change)")

#: the keys that make a pod a member of its gang, written from `Decision.pod_group`
_GANG_KEYS = frozenset({
    keys.VOLCANO_GROUP_ANNOTATION, keys.VOLCANO_QUEUE_ANNOTATION, keys.COSCHEDULING_GROUP_LABEL,
    keys.ANN_GANG_NAME, keys.ANN_GANG_MIN_MEMBER, keys.ANN_GANG_TIMEOUT,
    keys.ANN_GANG_PREEMPTION, keys.ANN_JOINED_GANG})
_ACTION_OF_KEY = {**dict.fromkeys(_GANG_KEYS, "gang"), keys.ISTIO_INJECT: "istio",
                  keys.ISTIO_DATAPLANE_MODE: "istio", keys.ANN_GPU_TOPOLOGY: "topology"}


def audit_of(policy: str, mode: Literal["warn", "audit"], actual: Decision, would: Decision,
             shape: PodShape) -> PolicyAudit:
    """What `would` (the enforced policies and this one) changes on the pod of `shape` beyond
    `actual` (the enforced policies alone)."""
    changes: list[tuple[str, str]] = []  # (action, words; "" when said already)
    gang_changed = would.pod_group != actual.pod_group
    if gang_changed:
        changes.append(("gang", _gang(would.pod_group, actual.pod_group)))
    if would.gang_blocked and would.gang_blocked != actual.gang_blocked:
        changes.append(("gang", f"a gang it cannot form yet: {would.gang_blocked}"))
    scheduler = would.scheduler_name or shape.scheduler_name
    if scheduler != (actual.scheduler_name or shape.scheduler_name):
        changes.append(("gang", f"schedulerName {scheduler}"))
    tolerated = bool(would.tolerations) or shape.tolerations is True
    if tolerated != (bool(actual.tolerations) or shape.tolerations is True):
        changes.append(("gang", f"{'' if tolerated else 'no '}toleration "
                                f"{keys.TAINT_GPU_TOPOLOGY}"))
    if would.node_affinity != actual.node_affinity:
        changes.append(("topology", ", ".join(
            f"node affinity {e.get('key')} in {e.get('values')}" for e in would.node_affinity)
            or f"no node affinity on {keys.LABEL_GPU_MODEL}"))
    if would.node_preferences != actual.node_preferences:
        changes.append(("topology", ", ".join(
            f"preferred node affinity {e.get('key')} in {e.get('values')} (weight "
            f"{t.get('weight')})" for t in would.node_preferences
            for e in t["preference"]["matchExpressions"])
            or f"no preferred node affinity on {keys.LABEL_GPU_MODEL}"))
    for kind, wanted, before, current in (
            ("label", would.labels, actual.labels, shape.label),
            ("annotation", would.annotations, actual.annotations, shape.annotation)):
        changes += _key_changes(kind, wanted, before, current, gang_changed)
    return PolicyAudit(policy, mode, tuple(dict.fromkeys(a for a, _ in changes)),
                       tuple(w for _, w in changes if w))


def _key_changes(kind: str, wanted: Mapping[str, str | None], before: Mapping[str, str | None],
                 current: Callable[[str], Any], gang_changed: bool) -> list[tuple[str, str]]:
    out = []
    for key in dict.fromkeys([*wanted, *before]):
        if key == keys.ANN_POLICY:  # bookkeeping: names the applied policies
            continue
        after = wanted[key] if key in wanted else current(key)
        if after == (before[key] if key in before else current(key)):
            continue
        words = f"{kind} {key}={after}" if after is not None else f"no {kind} {key}"
        # a gang's keys follow from the gang, said once
        out.append((_ACTION_OF_KEY.get(key, kind + "s"),
                    "" if gang_changed and key in _GANG_KEYS else words))
    return out


def _gang(group: PodGroupSpec | None, before: PodGroupSpec | None) -> str:
    if group is None:
        return f"no gang (instead of {before.name if before else 'none'})"
    what = "binder gang" if group.backend == "muster" else "PodGroup"
    extras = [group.backend, f"minMember {group.min_member}",
              *([f"queue {group.queue}"] if group.queue else [])]
    return f"{what} {group.namespace}/{group.name} ({', '.join(extras)})"


def event_message(audit: PolicyAudit, pod: str) -> str:
    """The audit Event's message: what the policy would do, and the first pod it was seen on."""
    return f"{audit.summary} (first seen on pod {pod})"


def read_event(message: str) -> tuple[str, bool] | None:
    """(the policy an audit Event is about, whether it would change the pod); None for another
    message."""
    found = _EVENT.match(message)
    return (found[1], found[2] == "would set") if found else None
