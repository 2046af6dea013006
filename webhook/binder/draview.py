"""What the informers show of DRA, kept for the binder: which of our pods use which claim, which
pod a special claim was made for, the GPUs our driver's ResourceSlices publish per node, and the
DeviceClass that serves plain nvidia.com/gpu requests. The binder's handlers feed it; it answers
whose view each change touches, and how one of our pods looks with DRA's view added (`extend`).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from webhook.binder.claims import DEVICE_CLASS, ClaimInfo
from webhook.binder.extended import class_resources, gpu_class, pod_claims
from webhook.binder.nodes import slice_gpus
from webhook.binder.pods import PodInfo

log = logging.getLogger(__name__)


class DraView:
    def __init__(self, scheduler_name: str) -> None:
        self._scheduler_name = scheduler_name
        #: claim key → keys of our pods that use it, and the reverse
        self._claim_users: dict[str, set[str]] = {}
        self._claims_of: dict[str, frozenset[str]] = {}
        #: ResourceSlice name → (node, GPU indices) of our driver's slices
        self._slices: dict[str, tuple[str, frozenset[int]]] = {}
        #: DeviceClass name → object, and the class that serves nvidia.com/gpu through DRA
        self._classes: dict[str, dict[str, Any]] = {}
        self._gpu_class = ""
        #: special claim key → (pod key, pod uid) it was made for, and pod key → its claims
        self._special: dict[str, tuple[str, str]] = {}
        self._specials_of: dict[str, set[str]] = {}

    def gpus_on(self, node: str) -> frozenset[int]:
        """The GPUs our driver's slices publish on `node`."""
        return frozenset().union(*(g for n, g in self._slices.values() if n == node))

    def on_slice(self, event: str, obj: dict[str, Any]) -> set[str]:
        """Take a ResourceSlice's change; the nodes whose published GPUs it may change."""
        name = str((obj.get("metadata") or {}).get("name"))
        published = None if event == "DELETED" else slice_gpus(obj)
        before = self._slices.pop(name, None)
        if published is not None:
            self._slices[name] = published
        return {p[0] for p in (before, published) if p is not None}

    def on_device_class(self, event: str, obj: dict[str, Any]) -> bool:
        """Take a DeviceClass's change; True when the class serving nvidia.com/gpu changed."""
        name = str((obj.get("metadata") or {}).get("name"))
        if event == "DELETED":
            self._classes.pop(name, None)
        else:
            self._classes[name] = obj
        served = gpu_class(class_resources(self._classes.values()))
        if served == self._gpu_class:
            return False
        self._gpu_class = served
        log.info("DeviceClass serving nvidia.com/gpu through DRA changed", extra={
            "deviceClass": served or None,
            "ours": served == DEVICE_CLASS})
        return True

    def index_claims(self, key: str, pod: PodInfo | None) -> None:
        """Which of our pods use which claim: a claim's change re-resolves its users."""
        now: frozenset[str] = frozenset()
        if pod is not None and pod.claims is not None and \
                pod.scheduler_name == self._scheduler_name:
            now = frozenset(f"{pod.namespace}/{n}" for _, n in pod.claims.names if n)
        before = self._claims_of.pop(key, frozenset())
        for claim in before - now:
            users = self._claim_users[claim]
            users.discard(key)
            if not users:
                del self._claim_users[claim]
        for claim in now - before:
            self._claim_users.setdefault(claim, set()).add(key)
        if now:
            self._claims_of[key] = now

    def on_claim(self, key: str, info: ClaimInfo | None) -> set[str]:
        """Take a claim's new view (None: gone); the pods whose view it changes."""
        return {*self._claim_users.get(key, ()), *self._index_special(key, info)}

    def _index_special(self, key: str, info: ClaimInfo | None) -> set[str]:
        """Which pod a special claim was made for (found by it, as kube-scheduler finds it,
        before the pod's status names it): the pods whose view the claim changes."""
        before = self._special.pop(key, None)
        if before is not None:
            self._specials_of[before[0]].discard(key)
        if info is not None and info.extended_for is not None:
            pod = f"{info.namespace}/{info.extended_for[0]}"
            self._special[key] = (pod, info.extended_for[1])
            self._specials_of.setdefault(pod, set()).add(key)
        return {p[0] for p in (before, self._special.get(key)) if p is not None}

    def extend(self, pod: PodInfo) -> PodInfo:
        """A pod of ours with plain GPU requests: the class that may serve them through DRA,
        and while it is unbound the special claim made for it, if any (the status names the
        claim once it is written)."""
        if pod.scheduler_name != self._scheduler_name or not pod.gpus or (
                pod.claims is not None and not pod.claims.extended):
            return pod
        if pod.bound:
            return replace(pod, gpu_class=self._gpu_class)  # its status names its claim
        # unbound: the claim found by its owner, not the one its status may still name (a
        # special claim deleted since, when its placement was given up)
        pod = replace(pod, gpu_class=self._gpu_class, claims=None, dra=False)
        made = sorted(k for k in self._specials_of.get(pod.key, ())
                      if self._special[k][1] == pod.uid)
        if not made or not isinstance(pod.extended, tuple):
            return pod
        apps = [name for name, _ in pod.container_gpus[pod.init_containers:]]
        return replace(pod, claims=pod_claims(pod.extended, made[0].split("/", 1)[1], apps))
