"""The PodGroup object for a Decision's PodGroupSpec, as Volcano or scheduler-plugins expect it
(backend kubernetes: the native objects of `webhook.policy.native`).

Shapes follow the upstream CRDs (checked against their OpenAPI schemas in the tests) and the MPI
operator: Volcano gets queue and priorityClassName but has no timeout; coscheduling gets
scheduleTimeoutSeconds but has no queue or priority class.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook import keys
from webhook.policy import native
from webhook.policy.decision import PodGroupSpec, Withdrawal
from webhook.policy.native import MANAGED_BY

__all__ = ["MANAGED_BY", "gang_objects", "left_behind", "made_by_muster", "member_of",
           "podgroup_manifest", "podgroup_spec"]


def made_by_muster(obj: Mapping[str, Any]) -> bool:
    """Whether Muster made this gang object (its label): the only ones it writes or deletes."""
    labels = (obj.get("metadata") or {}).get("labels")
    return isinstance(labels, Mapping) and all(labels.get(k) == v for k, v in MANAGED_BY.items())


def member_of(pod: Mapping[str, Any], backend: str, name: str) -> bool:
    """Whether a stored pod joins gang `name` of `backend` (its group key) and may still run
    (not finished, not being deleted)."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in (
            "Succeeded", "Failed"):
        return False
    if backend == "volcano":
        return bool((meta.get("annotations") or {}).get(keys.VOLCANO_GROUP_ANNOTATION) == name)
    labels = meta.get("labels") or {}
    return name in (labels.get(keys.COSCHEDULING_GROUP_LABEL),
                    labels.get(keys.LEGACY_COSCHEDULING_GROUP_LABEL))


def left_behind(podgroup: Mapping[str, Any], gone: Withdrawal,
                pods: Iterable[Mapping[str, Any]]) -> str | None:
    """Why the PodGroup of a gang Muster stood aside from is to be deleted, or None to keep it:
    Muster did not make it, the job does not control it (another job's of that name), or a pod
    still joins it (one admitted before the other controller took its pods over)."""
    refs = (podgroup.get("metadata") or {}).get("ownerReferences") or []
    controller = next((r for r in refs if isinstance(r, Mapping) and r.get("controller")), None)
    owner_uid = gone.owner.uid if gone.owner is not None else None
    if not made_by_muster(podgroup) or (controller or {}).get("uid") != owner_uid:
        return None
    if any(member_of(pod, gone.backend, gone.name) for pod in pods):
        return None
    return (f"its pods join {gone.by} instead, set by a webhook called after Muster's (the "
            "job's own gang scheduling): Muster stands aside, and a PodGroup no pod joins "
            "would hold its minResources against the queue")


def gang_objects(spec: PodGroupSpec) -> list[dict[str, Any]]:
    """Every object the gang needs before its pods, in creation order (none for backend muster:
    its gang lives on pod annotations)."""
    if spec.backend == "kubernetes":
        return native.objects(spec)
    manifest = podgroup_manifest(spec)
    return [] if manifest is None else [manifest]


def podgroup_manifest(spec: PodGroupSpec) -> dict[str, Any] | None:
    """The PodGroup to create, or None for backend muster (its gang lives on pod annotations).
    For backend kubernetes, the native PodGroup (1.36+) or else the Workload (1.35)."""
    if spec.backend == "muster":
        return None
    if spec.backend == "kubernetes":
        return native.objects(spec)[-1]
    group, version, _ = keys.VOLCANO_API if spec.backend == "volcano" else keys.COSCHEDULING_API
    metadata: dict[str, Any] = {"name": spec.name, "namespace": spec.namespace,
                                "labels": dict(MANAGED_BY)}
    if spec.owner is not None:
        metadata["ownerReferences"] = [spec.owner.as_owner_reference()]
    return {"apiVersion": f"{group}/{version}", "kind": "PodGroup", "metadata": metadata,
            "spec": podgroup_spec(spec)}


def podgroup_spec(spec: PodGroupSpec) -> dict[str, Any]:
    """The `spec` of the PodGroup `podgroup_manifest` makes (volcano or coscheduling)."""
    if spec.backend == "kubernetes":
        return dict(native.objects(spec)[-1]["spec"])
    body: dict[str, Any] = {"minMember": spec.min_member}
    if spec.min_resources is not None:
        body["minResources"] = dict(spec.min_resources)
    if spec.backend == "volcano":
        if spec.queue:
            body["queue"] = spec.queue
        if spec.priority_class:
            body["priorityClassName"] = spec.priority_class
    elif spec.timeout_seconds is not None:
        body["scheduleTimeoutSeconds"] = spec.timeout_seconds
    return body
