"""After the fact: does each pod hold exactly the GPUs the binder assigned it? A pure comparison
of what the kubelet says its containers hold (PodResources API) with the pods' assignments.

The device plugin refuses every admission it cannot tie to a pod (see `matcher`); this is the
check that the kubelet's own record agrees. Three things are wrong, each reported on the pod:
a binder pod holding other GPUs than assigned (`assignment`), a pod with no assignment of its
own holding GPUs assigned to a binder pod (`foreign`), a GPU held by two containers (`shared`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook import keys
from webhook.agent.podresources.client import Held
from webhook.binder.assignment import AssignmentError, decode_assignment

_DONE = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class Finding:
    pod: str  # namespace/name
    uid: str  # "" when the API did not list the pod
    kind: str  # assignment | foreign | shared (the metric's label)
    message: str


def assigned(pod: Mapping[str, Any], node: str, devices: Mapping[int, str],
             scheduler_name: str) -> dict[str, frozenset[str]] | None:
    """The GPU UUIDs per container the binder assigned `pod` on `node`; None when it has no
    valid assignment here (not the binder's pod, none, unreadable, another node's)."""
    if ((pod.get("spec") or {}).get("schedulerName") or "default-scheduler") != scheduler_name:
        return None
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.ANN_GPU_ASSIGNMENT)
    try:
        assignment = decode_assignment(text) if text is not None else None
    except AssignmentError:
        return None
    if assignment is None or assignment.node != node:
        return None
    return {name: frozenset(u or devices.get(i, "") for i, u in zip(c.indices, c.uuids,
                                                                     strict=True))
            for name, c in assignment.containers.items()}


def audit(held: Iterable[Held], pods: Iterable[Mapping[str, Any]], node: str,
          devices: Mapping[int, str], scheduler_name: str) -> list[Finding]:
    """Every disagreement between `held` (the kubelet's record) and the assignments on `pods`
    (this node's pods, raw API dicts)."""
    uids: dict[str, str] = {}
    plans: dict[str, dict[str, frozenset[str]]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        uids[key] = str(meta.get("uid", ""))
        plan = assigned(pod, node, devices, scheduler_name)
        if plan is not None and (pod.get("status") or {}).get("phase") not in _DONE:
            plans[key] = plan
    holding: dict[str, dict[str, frozenset[str]]] = {}
    for h in held:
        if h.devices:
            holding.setdefault(h.pod, {})[h.container] = frozenset(h.devices)
    found = _against_assignments(holding, plans) + _shared(holding)
    return [Finding(pod, uids.get(pod, ""), kind, message) for pod, kind, message in found]


def _against_assignments(holding: Mapping[str, Mapping[str, frozenset[str]]],
                         plans: Mapping[str, Mapping[str, frozenset[str]]]
                         ) -> list[tuple[str, str, str]]:
    owner = {u: pod for pod, plan in plans.items() for gpus in plan.values() for u in gpus}
    out = []
    for pod, containers in sorted(holding.items()):
        plan = plans.get(pod)
        if plan is None:
            theirs = sorted(u for gpus in containers.values() for u in gpus if u in owner)
            if theirs:
                victims = ", ".join(sorted({owner[u] for u in theirs}))
                out.append((pod, "foreign", f"{pod} holds {', '.join(theirs)}, which the binder "
                                            f"assigned to {victims}"))
            continue
        for name in sorted(set(containers) | set(plan)):
            has, should = containers.get(name, frozenset()), plan.get(name, frozenset())
            if has != should:
                out.append((pod, "assignment",
                            f"{pod}: container {name!r} holds {_list(has)}, the binder "
                            f"assigned {_list(should)}"))
    return out


def _shared(holding: Mapping[str, Mapping[str, frozenset[str]]]) -> list[tuple[str, str, str]]:
    holders: dict[str, list[str]] = {}
    for pod, containers in sorted(holding.items()):
        for name, gpus in sorted(containers.items()):
            for u in gpus:
                holders.setdefault(u, []).append(f"{pod}/{name}")
    out = []
    for uuid, who in sorted(holders.items()):
        if len(who) > 1:
            for pod in sorted({w.rsplit("/", 1)[0] for w in who}):
                out.append((pod, "shared", f"{uuid} is held by {len(who)} containers: "
                                           f"{', '.join(who)}"))
    return out


def _list(gpus: frozenset[str]) -> str:
    return ", ".join(sorted(gpus)) if gpus else "no GPU"
