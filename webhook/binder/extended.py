"""Plain `nvidia.com/gpu` requests served through DRA (Kubernetes 1.37, DRA-backed extended
resources): pure functions of DeviceClasses and pods, shaped as kube-scheduler shapes them so that
the kubelet treats the binder's pods as it treats kube-scheduler's.

A DeviceClass serves the extended resource its `spec.extendedResourceName` names, and always the
implicit `deviceclass.resource.kubernetes.io/<class>`. On a node without allocatable
`nvidia.com/gpu` whose driver publishes a ResourceSlice, a pod's plain GPU requests are served by
one "special" ResourceClaim made for the pod: named `<pod>-extended-resources-<random>`, owned
(controller) by the pod, annotated `resource.kubernetes.io/extended-resource-claim: "true"`, with
one request per container, `container-<i>-request-<j>` (i: the container's index among init and
app containers, j: the resource's index among the container's sorted request names). The pod's
`status.extendedResourceClaimStatus` names the claim and maps each container to its request: the
kubelet admits the pod by it and hands each container the devices of its request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook import keys
from webhook.binder.claims import DEVICE_CLASS, PodClaims

#: the pod claim name the binder gives the special claim: not a valid claim name, so that it
#: cannot be a pod's own (kube-scheduler's in-memory name for the claim)
POD_CLAIM = "<extended-resources>"

#: (container, request name, GPUs) of each app container that asks for GPUs
Requests = tuple[tuple[str, str, int], ...]


def class_resources(classes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Extended resource name → the DeviceClass that serves it. Where two classes name the
    same resource, the one created later wins, and of two created together the name sorted
    first (resource.k8s.io/v1 DeviceClassSpec.ExtendedResourceName)."""
    def meta(c: Mapping[str, Any], field: str) -> str:
        return str((c.get("metadata") or {}).get(field) or "")

    # the winner is written last: oldest first, and names in reverse within one second
    # (RFC 3339 times of one format sort as text)
    ranked = sorted(sorted(classes, key=lambda c: meta(c, "name"), reverse=True),
                    key=lambda c: meta(c, "creationTimestamp"))
    out: dict[str, str] = {}
    for c in ranked:
        name = meta(c, "name")
        out[keys.IMPLICIT_EXTENDED_PREFIX + name] = name
        explicit = (c.get("spec") or {}).get("extendedResourceName")
        if explicit:
            out[str(explicit)] = name
    return out


def gpu_class(classes: Mapping[str, str]) -> str:
    """The DeviceClass that serves `nvidia.com/gpu` ("" when none does)."""
    return classes.get(keys.GPU_RESOURCE, "")


def _requests_of(container: Mapping[str, Any]) -> Mapping[str, Any]:
    """The container's requests, as the API server defaults them: a resource with a limit and
    no request requests its limit."""
    resources = container.get("resources") or {}
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def _count(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def extended_requests(spec: Mapping[str, Any]) -> Requests | str:
    """The special claim's requests for the pod's GPUs, or why the binder does not make one
    (init containers that ask for GPUs: their requests are shared with later containers)."""
    inits = spec.get("initContainers") or ()
    if any(_count(_requests_of(c).get(keys.GPU_RESOURCE, 0)) for c in inits):
        return "init containers ask for GPUs"
    out = []
    for i, c in enumerate(spec.get("containers") or ()):
        requests = _requests_of(c)
        count = _count(requests.get(keys.GPU_RESOURCE, 0))
        if count > 0:
            ridx = sorted(map(str, requests)).index(keys.GPU_RESOURCE)
            out.append((str(c.get("name", "")), f"container-{len(inits) + i}-request-{ridx}",
                        count))
    return tuple(out)


def pod_claims(requests: Requests, claim_name: str,
               containers: Iterable[str]) -> PodClaims:
    """The pod's claims when its special claim is `claim_name`: each container gets its
    request of it."""
    mine = {c: r for c, r, _ in requests}
    return PodClaims(names=((POD_CLAIM, claim_name),),
                     containers=tuple((c, ((POD_CLAIM, mine[c]),) if c in mine else ())
                                      for c in containers),
                     extended=True)


def status_claims(spec: Mapping[str, Any], status: Mapping[str, Any]) -> PodClaims | None:
    """The pod's claims as its status.extendedResourceClaimStatus names them (for its GPUs;
    None when it names none)."""
    doc = status.get("extendedResourceClaimStatus") or {}
    mapped = tuple((str(m.get("containerName", "")), str(m.get("requestName", "")), 0)
                   for m in doc.get("requestMappings") or ()
                   if m.get("resourceName") == keys.GPU_RESOURCE)
    if not doc.get("resourceClaimName") or not mapped:
        return None
    return pod_claims(mapped, str(doc["resourceClaimName"]),
                      (str(c.get("name", "")) for c in spec.get("containers") or ()))


def special_claim(namespace: str, pod: str, pod_uid: str, requests: Requests
                  ) -> dict[str, Any]:
    """The ResourceClaim to create for the pod's GPU requests, as kube-scheduler creates it."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{pod}-extended-resources-", "namespace": namespace,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod,
                                 "uid": pod_uid, "controller": True}],
            "annotations": {keys.EXTENDED_CLAIM_ANNOTATION: "true"},
            # kube-scheduler adds it before allocating; made with it, one write less
            "finalizers": [keys.CLAIM_FINALIZER]},
        "spec": {"devices": {"requests": [
            {"name": request, "exactly": {"deviceClassName": DEVICE_CLASS,
                                          "allocationMode": "ExactCount", "count": count}}
            for _, request, count in sorted(requests, key=lambda r: r[1])]}},
    }


def pod_status(pod_uid: str, claim_name: str, requests: Requests) -> dict[str, Any]:
    """The pod status merge patch that names its special claim to the kubelet (its uid: never
    another pod of the same name)."""
    return {"metadata": {"uid": pod_uid}, "status": {"extendedResourceClaimStatus": {
        "resourceClaimName": claim_name,
        "requestMappings": [{"containerName": c, "resourceName": keys.GPU_RESOURCE,
                             "requestName": r} for c, r, _ in requests]}}}
