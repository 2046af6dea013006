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


def _is_pending(pod: Mapping[str, Any], node: str) -> bool:
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    return (spec.get("nodeName") == node and not meta.get("deletionTimestamp")
            and status.get("phase", "Pending") == "Pending")


def pending(pods: Iterable[Mapping[str, Any]], node: str, devices: Mapping[int, str],
            handed: Collection[tuple[str, str]],
            scheduler_name: str = keys.DEFAULT_BINDER_SCHEDULER_NAME) -> Pending:
    """Grants offered by `pods` (raw pod dicts) on `node`; `devices` maps GPU index → UUID of
    this node's GPUs; `handed` holds (pod uid, container) pairs already served; only pods whose
    spec.schedulerName is `scheduler_name` (the binder's) offer any."""
    grants: list[Grant] = []
    refused: dict[str, str] = {}
    live: set[str] = set()
    for pod in pods:
        if not _is_pending(pod, node):
            continue
        meta = pod.get("metadata", {})
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        uid = str(meta.get("uid", key))
        live.add(uid)
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
    grants.sort(key=lambda g: (g.created, g.pod))
    return Pending(tuple(grants), refused, frozenset(live))


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
    """
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


def mismatch(grant: Grant, allocated: Collection[str]) -> str:
    """Why a container the kubelet allocated other GPUs than the binder assigned is refused:
    for the gRPC error the kubelet records on the pod, and the agent's Event."""
    return (f"{grant.pod}: container {grant.container!r}: the kubelet allocated "
            f"{', '.join(sorted(allocated))}, the binder assigned {', '.join(grant.uuids)}; "
            "the container gets no GPU it was not allocated, so the pod is refused")
