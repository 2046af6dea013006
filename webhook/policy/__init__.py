"""Policies: schema, loader, engine (`evaluate`), JSON Patch rendering and PodGroup objects."""

from webhook.policy.decision import Decision, Override, OwnerRef, PodGroupSpec, PolicyMatch
from webhook.policy.engine import evaluate, explain
from webhook.policy.errors import PolicyError, PolicyIssue
from webhook.policy.loader import load_policies, load_policy_texts
from webhook.policy.patch import render_patch
from webhook.policy.podgroup import podgroup_manifest
from webhook.policy.policyset import PolicySet
from webhook.policy.schema import SchedulingPolicy

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
