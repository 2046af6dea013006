"""Which pod is the kubelet starting? Pure matching of Allocate calls to binder assignments.

The kubelet's Allocate and GetPreferredAllocation requests name devices, never the pod. The pod
being started is one bound to this node, still Pending, not yet acknowledged as served
(muster.io/gpu-allocated), whose `muster.io/gpu-assignment` gives
its next container (init containers first, then spec order, as the kubelet allocates them) as
many GPUs as the kubelet asks for. Only pods the binder scheduled count (`spec.schedulerName`
is the binder's, immutable once the pod exists): an assignment annotation on any other pod is
ignored, whoever wrote it. Among several, the one whose assigned GPUs are exactly what
the kubelet asked for wins, then the oldest. What was already handed out is remembered so that a
container is never served twice; after an agent restart the kubelet's free-device list tells
which containers it already served.

A served pod still Pending is offered once more, but only for exactly its own GPUs and only when
the kubelet has all of them free: the kubelet then lost its record of the Allocate (it restarted
between our answer and its checkpoint) and asks again for the same container; any other time it
holds those GPUs itself and never offers them.

Since the kubelet never says which pod it admits, a grant is handed out only while every pod
pending here that asks for the resource is tied to a grant of its own. Any other one (a pod that
another scheduler placed or a user bound with spec.nodeName, or a binder's pod without a valid
assignment for this node) makes the admission ambiguous: it could be that pod asking, and
handing it the oldest grant would give it another pod's GPUs. Such a pod stops counting once the
kubelet has failed it (or it runs); until then no grant goes out, and the plugin refuses rather
than guess when the wait ends. Where a foreign pod may get the kubelet's own pick (`unassigned:
kubelet`), one the kubelet has admitted (it reports container statuses) stops counting too, so
that its image pull does not hold the binder's pods back; elsewhere no foreign GPU pod is ever
admitted, and container statuses, which a user allowed to write pods/status could forge, are
not trusted.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook import keys
from webhook.binder.assignment import AssignmentError, decode_assignment


@dataclass(frozen=True, slots=True)
class Grant:
    """A container of a pending pod not served yet, and the GPU UUIDs the binder gave it."""

    pod: str  # namespace/name
    uid: str
    container: str
    uuids: tuple[str, ...]
    created: str  # creationTimestamp (RFC 3339 sorts as text)
    #: the pod's first unserved container: the one the kubelet asks for next
    next: bool = True
    #: served before: offered again only to a kubelet that has its GPUs free (lost its record)
    again: bool = False


@dataclass(frozen=True, slots=True)
class Pending:
    """What the pods on this node offer to an Allocate call right now."""

    grants: tuple[Grant, ...]
    #: pods that cannot be served, with the reason (for the error message)
    refused: Mapping[str, str] = field(default_factory=dict)
    #: uids of pods still waiting to start (others' handed-out entries can be forgotten)
    live: frozenset[str] = frozenset()
    #: pods asking for the resource, not admitted yet, that no grant ties to (see the module)
    ambiguous: Mapping[str, str] = field(default_factory=dict)


def _is_pending(pod: Mapping[str, Any], node: str) -> bool:
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    return (spec.get("nodeName") == node and not meta.get("deletionTimestamp")
            and status.get("phase", "Pending") == "Pending")


def _asks_for(pod: Mapping[str, Any], resource: str) -> bool:
    """True when a container of `pod` requests `resource` (extended resources: limits)."""
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = container.get("resources") or {}
        for amounts in (resources.get("limits") or {}, resources.get("requests") or {}):
            if str(amounts.get(resource, "0")).strip() not in ("0", ""):
                return True
    return False


def _admitted(pod: Mapping[str, Any]) -> bool:
    """True once the kubelet has admitted the pod: only it writes container statuses (a pod's
    status is reset on create and written through pods/status)."""
    status = pod.get("status") or {}
    return bool(status.get("containerStatuses") or status.get("initContainerStatuses"))


def pending(pods: Iterable[Mapping[str, Any]], node: str, devices: Mapping[int, str],
            handed: Collection[tuple[str, str]],
            scheduler_name: str = keys.DEFAULT_BINDER_SCHEDULER_NAME, *,
            resource: str = keys.GPU_RESOURCE, trust_admitted: bool = False) -> Pending:
    """Grants offered by `pods` (raw pod dicts) on `node`; `devices` maps GPU index → UUID of
    this node's GPUs; `handed` holds (pod uid, container) pairs already served; only pods whose
    spec.schedulerName is `scheduler_name` (the binder's) offer any; pods asking for
    `resource` that none ties to make the offer ambiguous (unless admitted, with
    `trust_admitted`: the unassigned "kubelet" mode)."""
    grants: list[Grant] = []
    refused: dict[str, str] = {}
    asking: set[str] = set()
    live: set[str] = set()
    for pod in pods:
        if not _is_pending(pod, node):
            continue
        meta = pod.get("metadata", {})
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        uid = str(meta.get("uid", key))
        live.add(uid)
        if _asks_for(pod, resource) and not (trust_admitted and _admitted(pod)):
            asking.add(key)
        scheduler = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
        if scheduler != scheduler_name:
            refused[key] = (f"spec.schedulerName is {scheduler!r}, not the binder's "
                            f"{scheduler_name!r}: not placed by the binder")
            continue
        mine, why = _pod_grants(meta, key, uid, node=node, devices=devices,
                                handed=handed)
        if why is not None and keys.ANN_GPU_ALLOCATED not in (meta.get("annotations") or {}):
            refused[key] = why  # (a pod served before waits for nothing)
        grants += mine
    ambiguous = {pod: why for pod, why in refused.items() if pod in asking}
    grants.sort(key=lambda g: (g.created, g.pod))
    return Pending(tuple(grants), refused, frozenset(live), ambiguous)


def _pod_grants(meta: Mapping[str, Any], key: str, uid: str, *, node: str,
                devices: Mapping[int, str], handed: Collection[tuple[str, str]]
                ) -> tuple[list[Grant], str | None]:
    """One pending pod's grants, or why it cannot be served."""
    annotations = meta.get("annotations") or {}
    text = annotations.get(keys.ANN_GPU_ASSIGNMENT)
    if text is None:
        return [], f"no {keys.ANN_GPU_ASSIGNMENT} annotation"
    try:
        assignment = decode_assignment(text)
    except AssignmentError as exc:
        return [], f"unreadable {keys.ANN_GPU_ASSIGNMENT}: {exc}"
    if assignment.node != node:
        return [], f"assigned GPUs on node {assignment.node!r}, not {node!r}"
    containers = list(assignment.containers.items())
    again = keys.ANN_GPU_ALLOCATED in annotations or all((uid, n) in handed
                                                         for n, _ in containers)
    todo = containers if again else [(n, c) for n, c in containers if (uid, n) not in handed]
    known = set(devices.values())
    mine: list[Grant] = []
    for name, gpus in todo:
        # the binder may not know UUIDs (node published no topology): resolve by index here
        uuids = tuple(u or devices.get(i, "") for i, u in zip(gpus.indices, gpus.uuids,
                                                               strict=True))
        wrong = [u for u in uuids if u not in known]
        if wrong:
            return [], f"container {name!r} is assigned GPUs not on this node: {wrong}"
        mine.append(Grant(key, uid, name, uuids, str(meta.get("creationTimestamp", "")),
                          next=not mine, again=again))
    return mine, None


def served(offer: Pending, grant: Grant, handed: Collection[tuple[str, str]]) -> bool:
    """True when `grant` was its pod's last container still to serve."""
    return all(g is grant or (g.uid, g.container) in handed
               for g in offer.grants if g.uid == grant.uid)


def choose(offer: Pending, count: int, wanted: Collection[str] = (),
           available: Collection[str] | None = None) -> Grant | None:
    """The grant for a container asking for `count` devices.

    One whose GPUs are exactly `wanted` (the kubelet's pick) wins; else the oldest pod's next
    container with the right count. With `available` (GetPreferredAllocation), only grants whose
    GPUs the kubelet still has free count: a container whose GPUs the kubelet already gave out
    was served before this agent restarted, so a later container of that pod is the one asked for.
    A grant served before counts only with `available` or as the exact pick (see the module).
    None while the offer is ambiguous: the container may be another pod's.
    """
    if offer.ambiguous:
        return None
    fits = [g for g in offer.grants if len(g.uuids) == count
            and (available is None or set(g.uuids) <= set(available))
            and (not g.again or available is not None or set(g.uuids) == set(wanted))]
    exact = [g for g in fits if set(g.uuids) == set(wanted)]
    best = exact or [g for g in fits if g.next] or (fits if available is not None else [])
    return best[0] if best else None


def explain(offer: Pending, node: str, count: int) -> str:
    """Why no grant fits: for the gRPC error the kubelet records on the pod."""
    parts = [f"{pod}: {why}" for pod, why in sorted(offer.refused.items())]
    parts += [f"{g.pod}: container {g.container!r} is assigned {len(g.uuids)} GPU(s)"
              for g in offer.grants if g.next and not g.again]
    waiting = "; ".join(parts) if parts else "none"
    return (f"no pod bound to node {node!r} is waiting for {count} GPU(s) with a "
            f"{keys.ANN_GPU_ASSIGNMENT} annotation from the binder (pending pods here: {waiting})")


def refusal(offer: Pending, node: str, count: int, kubelet_pick: bool) -> str | None:
    """Why a container that no grant was chosen for is refused; None when it gets the
    kubelet's own pick (`kubelet_pick`: the unassigned "kubelet" mode), which never happens
    while a grant not yet served waits beside an ambiguous pod: that pick may be its GPUs, or
    the container the grant's own."""
    if offer.ambiguous and any(not g.again for g in offer.grants):
        pods = "; ".join(f"{pod} ({why})" for pod, why in sorted(offer.ambiguous.items()))
        return (f"refused: the kubelet does not say which pod it admits, and pods pending on "
                f"node {node!r} ask for GPUs without a binder assignment of their own: {pods}; "
                "no binder-assigned GPUs are handed out while they wait")
    if kubelet_pick:
        return None
    return explain(offer, node, count)


def mismatch(grant: Grant, allocated: Collection[str]) -> str:
    """Why a container the kubelet allocated other GPUs than the binder assigned is refused:
    for the gRPC error the kubelet records on the pod, and the agent's Event."""
    return (f"{grant.pod}: container {grant.container!r}: the kubelet allocated "
            f"{', '.join(sorted(allocated))}, the binder assigned {', '.join(grant.uuids)}; "
            "the container gets no GPU it was not allocated, so the pod is refused")
