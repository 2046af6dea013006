"""Policies: schema, loader, engine (`evaluate`), JSON Patch rendering and PodGroup objects.

Loaded lazily: `webhook.policy.cli` is imported by every `muster` command, so the schema and the
engine (pydantic) load only with a command that uses them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from webhook.lazy import lazy_getattr

if TYPE_CHECKING:
    from webhook.policy.decision import Decision, Override, OwnerRef, PodGroupSpec, PolicyMatch
    from webhook.policy.engine import evaluate, explain
    from webhook.policy.errors import PolicyError, PolicyIssue
    from webhook.policy.loader import load_policies, load_policy_texts
    from webhook.policy.patch import render_patch
    from webhook.policy.podgroup import podgroup_manifest
    from webhook.policy.policyset import PolicySet
    from webhook.policy.schema import SchedulingPolicy

_EXPORTS = {
    "Decision": "webhook.policy.decision",
    "Override": "webhook.policy.decision",
    "OwnerRef": "webhook.policy.decision",
    "PodGroupSpec": "webhook.policy.decision",
    "PolicyMatch": "webhook.policy.decision",
    "evaluate": "webhook.policy.engine",
    "explain": "webhook.policy.engine",
    "PolicyError": "webhook.policy.errors",
    "PolicyIssue": "webhook.policy.errors",
    "load_policies": "webhook.policy.loader",
    "load_policy_texts": "webhook.policy.loader",
    "render_patch": "webhook.policy.patch",
    "podgroup_manifest": "webhook.policy.podgroup",
    "PolicySet": "webhook.policy.policyset",
    "SchedulingPolicy": "webhook.policy.schema",
}

__all__ = [
    "Decision",
    "Override",
    "OwnerRef",
    "PodGroupSpec",
    "PolicyError",
    "PolicyIssue",
    "PolicyMatch",
    "PolicySet",
    "SchedulingPolicy",
    "evaluate",
    "explain",
    "load_policies",
    "load_policy_texts",
    "podgroup_manifest",
    "render_patch",
]

__getattr__ = lazy_getattr(__name__, _EXPORTS)
