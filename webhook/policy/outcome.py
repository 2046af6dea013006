"""A memo of `evaluate` + `render_patch` for the pods of one job, which differ only in names.

The key is the pod's `PodView` (webhook.policy.podview): the one extraction of everything the
engine (`decide`) and the renderer (`render`) read, which are given nothing else. A pod whose
view is not memoisable (a bare pod, or one whose owners are unknown: their analysis reads the
pod's name, containers and priorityClassName) is evaluated fresh every time.

The memo lives in the policy set's index, so a reload starts a new one; it is bounded (LRU).
tests/policy/test_outcome_memo.py checks with hypothesis that it equals a fresh evaluation,
also for pods differing in exactly one field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from webhook import jsonpatch
from webhook.policy.decision import Decision
from webhook.policy.engine import decide
from webhook.policy.patch import render
from webhook.policy.podview import PodView, memo_key, view_of
from webhook.policy.policyset import PolicySet
from webhook.policy.workload import NO_PRIORITIES, Priorities


class Outcome(NamedTuple):
    decision: Decision
    #: the RFC 6902 operations (shared between callers: read-only)
    ops: tuple[dict[str, Any], ...]
    #: `ops` as compact JSON, encoded once per job rather than once per pod (b"" for none)
    patch_json: bytes


def outcome_key(pod: Mapping[str, Any], namespace_labels: Mapping[str, str],
                owners: Sequence[Mapping[str, Any]], policies: PolicySet,
                priorities: Priorities = NO_PRIORITIES) -> PodView | None:
    """The memo key of a pod (its view), or None when its outcome is not memoised."""
    return memo_key(view_of(pod, namespace_labels=namespace_labels, owners=owners,
                            index=policies.index, priorities=priorities))


def evaluate_and_render(pod: Mapping[str, Any], *, namespace_labels: Mapping[str, str],
                        owners: Sequence[Mapping[str, Any]], policies: PolicySet,
                        priorities: Priorities = NO_PRIORITIES) -> Outcome:
    """`evaluate` and, when it changes the pod, `render_patch` (else no ops); remembered for the
    job path."""
    view = view_of(pod, namespace_labels=namespace_labels, owners=owners,
                   index=policies.index, priorities=priorities)
    key = memo_key(view)
    memo = policies.index.outcomes
    if key is not None:
        found: Outcome | None = memo.get(key)
        if found is not None:
            return found
    decision = decide(view, policies)
    ops = tuple(render(view.shape, decision)) if decision.changes_pod else ()
    outcome = Outcome(decision, ops, jsonpatch.encode(ops) if ops else b"")
    if key is not None:
        memo.put(key, outcome)
    return outcome
