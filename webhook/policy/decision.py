"""The policy engine's output: typed, immutable, and independent of how it is applied.

`webhook.policy.evaluate(...)` returns a Decision; `webhook.policy.render_patch(pod, decision)`
turns it into an RFC 6902 JSON Patch; the admission server ensures `decision.pod_group`
(via `webhook.policy.podgroup_manifest`) before answering.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from webhook.records import record

Backend = Literal["volcano", "coscheduling", "muster", "kubernetes"]


@dataclass(frozen=True, slots=True)
class OwnerRef:
    api_version: str
    kind: str
    name: str
    uid: str

    def as_owner_reference(self) -> dict[str, Any]:
        """The ownerReference a PodGroup carries so that it is garbage-collected with the job."""
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@record
class PodGroupSpec:
    backend: Backend
    name: str
    namespace: str
    min_member: int
    min_resources: Mapping[str, str] | None = None
    queue: str | None = None
    priority_class: str | None = None
    timeout_seconds: int | None = None
    owner: OwnerRef | None = None
    #: Volcano: the queue to use when `queue` is missing or not Open; None admits the pod
    #: without the gang instead (policy field gang.unavailableQueue)
    fallback_queue: str | None = None
    #: backend kubernetes: the scheduling.k8s.io apiVersion whose shape the objects and the
    #: pod's reference take (None: the newest, `native.DEFAULT_API`, until admission learns
    #: what the cluster serves)
    api_version: str | None = None
    #: backend kubernetes: when the cluster serves no Workload API, "Refuse" the pods or admit
    #: them "WithoutGang" (policy field gang.unavailableApi)
    unavailable_api: str | None = None
    #: backend muster: the policy's gang.preemption (None: the binder's default)
    preemption: str | None = None


@record
class Withdrawal:
    """A gang an earlier pass of the webhook joined the pod to, whose group key another
    controller's webhook has replaced since (e.g. LeaderWorkerSet's Volcano provider, called
    after Muster): Muster stands aside. Its record leaves the pod, and admission deletes the
    PodGroup it made for that gang unless a pod still joins it."""

    backend: Backend
    name: str
    namespace: str
    #: the job whose PodGroup it is: only a PodGroup that job controls is deleted
    owner: OwnerRef | None
    #: the gang the pod joins instead, in words
    by: str


@dataclass(frozen=True, slots=True)
class PolicyMatch:
    """Why one policy matched the pod or not (for `muster policy explain` and audit)."""

    policy: str
    matched: bool
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Override:
    """A field a matched policy writes that a policy of higher precedence (priority) writes
    differently: the pod gets the other value."""

    policy: str
    #: the merge key, as the policy spells the field: "gang.backend", "labels.team"
    field: str
    by: str

    def describe(self) -> str:
        return f"{self.policy}: {self.field} overridden by {self.by} (higher precedence)"


@record
class PolicyAudit:
    """What a matching policy in audit or warn mode would have done to the pod, had it been
    enforced alongside the enforced policies, and did not do (`webhook.policy.audit`)."""

    policy: str
    mode: Literal["warn", "audit"]
    #: what it would change, by kind: gang, istio, topology, labels, annotations (the metric's
    #: `action`); empty: nothing (the enforced policies already do it, or override it)
    actions: tuple[str, ...]
    #: the same changes, in words
    changes: tuple[str, ...]

    @property
    def summary(self) -> str:
        what = f"would set {'; '.join(self.changes)}" if self.changes else \
            "matches but would change nothing"
        return f"policy {self.policy} ({self.mode}) {what}"


@record
class Decision:
    #: every policy considered, in evaluation order, with the reasons it matched or not
    matches: tuple[PolicyMatch, ...] = ()
    #: names of the policies applied (also written to the muster.io/policy annotation)
    policies: tuple[str, ...] = ()
    #: the pod's gang (None: no gang). For backend "muster" it is carried on pod annotations
    #: and podgroup_manifest() returns None: there is no PodGroup object to ensure.
    pod_group: PodGroupSpec | None = None
    #: desired pod state: keys to set (value) or remove (None)
    labels: Mapping[str, str | None] = field(default_factory=dict)
    annotations: Mapping[str, str | None] = field(default_factory=dict)
    scheduler_name: str | None = None
    tolerations: tuple[Mapping[str, Any], ...] = ()
    #: nodeSelectorTerms' matchExpressions to AND into required node affinity
    node_affinity: tuple[Mapping[str, Any], ...] = ()
    #: preferred node affinity terms (weight, preference) to add beside the pod's own
    node_preferences: tuple[Mapping[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()
    #: a gang policy matched but the job's object was not available to size or own the gang:
    #: why (admission then denies the pod for a while, so that no member joins half a gang)
    gang_blocked: str | None = None
    #: the matched policies' fields that lost to a policy of higher precedence
    overrides: tuple[Override, ...] = ()
    #: the matching policies in audit or warn mode, in evaluation order: what each would have
    #: done (none of it is in the fields above)
    audits: tuple[PolicyAudit, ...] = ()
    #: the network level the gang asks for and why (policy, or the job's Kueue/KAI
    #: annotations a policy honours), in words; None when it asks for none
    network: str | None = None
    #: the gang Muster joined the pod to on an earlier pass and now leaves (see Withdrawal)
    withdrawn: Withdrawal | None = None

    @property
    def changes_pod(self) -> bool:
        return bool(
            self.labels or self.annotations or self.scheduler_name or self.tolerations
            or self.node_affinity or self.node_preferences
            or (self.pod_group is not None and self.pod_group.backend == "kubernetes")
        )
