"""ResourceClaims (resource.k8s.io/v1) as the binder reads and writes them: pure functions of the
API objects (plain dicts).

The binder allocates only what it can decide with its NVLink choice: requests of the device
class `gpu.muster.io` (the chart's DeviceClass, named after the driver), allocationMode
ExactCount, without CEL selectors, constraints or alternatives (firstAvailable). Whatever else
a claim asks for is a problem reported on the pod, never guessed at.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook import keys

#: the DeviceClass the chart ships for the driver carries the driver's name
DEVICE_CLASS = keys.DRA_DRIVER
#: status fields that describe an allocation: cleared together when it is released
_ALLOCATION_FIELDS = ("allocation", "reservedFor", "devices")


@dataclass(frozen=True, slots=True)
class ClaimInfo:
    key: str  # "namespace/name"
    namespace: str
    name: str
    uid: str
    resource_version: str
    #: (request name, GPUs) in spec order
    requests: tuple[tuple[str, int], ...]
    #: why the binder cannot allocate the claim ("" when it can)
    problem: str = ""
    #: the node whose GPUs of our driver are allocated to it (None: not allocated, or no GPU of
    #: ours in its allocation)
    node: str | None = None
    #: (request, GPU index) of each of its allocation's results of our driver
    devices: tuple[tuple[str, int], ...] = ()
    allocated: bool = False  # status.allocation is set, whoever's devices it names
    #: (pod name, pod uid) of its reservedFor consumers that are pods
    reserved_for: tuple[tuple[str, str], ...] = ()
    #: how many consumers reservedFor names (pods or not)
    consumers: int = 0
    #: (name, uid) of the pod whose plain requests it serves, when it is such a special claim
    #: (the annotation, and that pod as its controller: as kube-scheduler finds it)
    extended_for: tuple[str, str] | None = None

    @property
    def gpus(self) -> int:
        return sum(count for _, count in self.requests)

    def reserved_only_for(self, uid: str) -> bool:
        """Allocated and reserved for exactly the pod `uid`: that pod's reservation."""
        return (self.allocated and self.consumers == len(self.reserved_for) == 1
                and self.reserved_for[0][1] == uid)


#: what a container lists: (pod claim name, request name; "" for every request of the claim)
ClaimRef = tuple[str, str]


@dataclass(frozen=True, slots=True)
class PodClaims:
    """A pod's spec.resourceClaims and which of its containers use them."""

    #: (pod claim name, ResourceClaim name; "" while a template's claim is not made yet)
    names: tuple[tuple[str, str], ...]
    #: (app container, what it lists in resources.claims, in order)
    containers: tuple[tuple[str, tuple[ClaimRef, ...]], ...]
    #: init containers that list a claim
    init_users: tuple[str, ...] = ()
    #: its one claim is the special claim of its plain GPU requests (webhook.binder.extended)
    extended: bool = False

    def claim_name(self, pod_claim: str) -> str:
        return dict(self.names).get(pod_claim, "")


def _request_problem(request: Mapping[str, Any]) -> str:
    name = request.get("name", "")
    exactly = request.get("exactly")
    if not isinstance(exactly, Mapping):
        return f"request {name!r} lists alternatives (firstAvailable): not supported"
    if exactly.get("deviceClassName") != DEVICE_CLASS:
        return (f"request {name!r} asks for device class {exactly.get('deviceClassName')!r}, "
                f"only {DEVICE_CLASS!r} is allocated by this binder")
    if exactly.get("allocationMode", "ExactCount") != "ExactCount":
        return f"request {name!r}: allocationMode {exactly['allocationMode']}, only ExactCount"
    if exactly.get("selectors") or exactly.get("adminAccess") or exactly.get("tolerations"):
        return f"request {name!r}: selectors, adminAccess and tolerations are not supported"
    count = exactly.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        return f"request {name!r}: count must be a whole number of at least 1"
    return ""


def _requests(spec: Mapping[str, Any]) -> tuple[tuple[tuple[str, int], ...], str]:
    devices = spec.get("devices") or {}
    problems = [p for p in map(_request_problem, devices.get("requests") or ()) if p]
    if devices.get("constraints"):
        problems.append("constraints are not supported")
    if problems:
        return (), "; ".join(problems)
    requests = tuple((str(r.get("name", "")), int(r["exactly"].get("count", 1)))
                     for r in devices.get("requests") or ())
    return requests, "" if requests else "it requests no devices"


def _allocated(status: Mapping[str, Any]) -> tuple[str | None, tuple[tuple[str, int], ...]]:
    """(node, devices) of our driver in an allocation (None, () when it names none)."""
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or ()
    ours = [r for r in results if r.get("driver") == keys.DRA_DRIVER]
    devices = tuple((str(r.get("request", "")), index) for r in ours
                    if (index := keys.dra_device_index(str(r.get("device", "")))) is not None)
    pools = {str(r.get("pool", "")) for r in ours}
    return (pools.pop() if len(pools) == 1 and devices else None), devices


def _extended_for(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    if (meta.get("annotations") or {}).get(keys.EXTENDED_CLAIM_ANNOTATION) != "true":
        return None
    owners = [(str(o.get("name", "")), str(o.get("uid", "")))
              for o in meta.get("ownerReferences") or ()
              if o.get("kind") == "Pod" and o.get("apiVersion") == "v1" and o.get("controller")]
    return owners[0] if owners else None


def parse_claim(obj: Mapping[str, Any]) -> ClaimInfo:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    requests, problem = _requests(obj.get("spec") or {})
    node, devices = _allocated(status)
    consumers = status.get("reservedFor") or ()
    return ClaimInfo(
        key=f"{ns}/{name}", namespace=ns, name=name, uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""), requests=requests,
        problem=problem, node=node, devices=devices, allocated=bool(status.get("allocation")),
        reserved_for=tuple((str(c.get("name", "")), str(c.get("uid", ""))) for c in consumers
                           if c.get("resource") == "pods" and not c.get("apiGroup")),
        consumers=len(consumers), extended_for=_extended_for(meta))


def parse_pod_claims(spec: Mapping[str, Any], status: Mapping[str, Any]) -> PodClaims | None:
    """The pod's claims (None when it has none). A template's claim is named by the
    resourceclaim controller in status.resourceClaimStatuses; "" until it is."""
    entries = spec.get("resourceClaims") or ()
    if not entries:
        return None
    generated = {str(s.get("name", "")): str(s.get("resourceClaimName") or "")
                 for s in status.get("resourceClaimStatuses") or ()}
    names = tuple((str(e.get("name", "")), str(e.get("resourceClaimName") or "")
                   or generated.get(str(e.get("name", "")), "")) for e in entries)

    def refs(c: Mapping[str, Any]) -> tuple[ClaimRef, ...]:
        return tuple((str(r.get("name", "")), str(r.get("request") or ""))
                     for r in (c.get("resources") or {}).get("claims") or ())

    return PodClaims(
        names=names,
        containers=tuple((str(c.get("name", "")), refs(c)) for c in spec.get("containers") or ()),
        init_users=tuple(str(c.get("name", "")) for c in spec.get("initContainers") or ()
                         if refs(c)))


def allocated_status(status: Mapping[str, Any], node: str,
                     devices: Sequence[tuple[str, int]], pod: str, pod_uid: str
                     ) -> dict[str, Any]:
    """The claim's status once allocated: `devices` (request, GPU index) of `node`'s pool, for
    the pod alone, with a node selector that pins the claim's users to the node."""
    return {**status, "allocation": {
        "devices": {"results": [{"request": request, "driver": keys.DRA_DRIVER, "pool": node,
                                 "device": keys.dra_device_name(index)}
                                for request, index in devices]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
        "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}]}


def released_status(status: Mapping[str, Any]) -> dict[str, Any]:
    """The claim's status with its allocation and reservation removed."""
    return {k: v for k, v in status.items() if k not in _ALLOCATION_FIELDS}
