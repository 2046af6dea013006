"""Every pod as the binder believes it is, shown to the planner through the snapshot.

Writes are visible to the next cycle at once through an "assumed" overlay (as kube-scheduler's
assume cache): a pod we wrote counts as written until the informer shows it, so a lagging
cache never hands out a GPU twice. Each pod's view is refreshed as its inputs change (its
object, our write, its claims, DRA's view), so that a cycle costs what changed rather than the
cluster's size.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from webhook.binder.claimstate import ClaimState
from webhook.binder.dra import resolve
from webhook.binder.draview import DraView
from webhook.binder.pods import PodInfo
from webhook.binder.snapshot import Snapshot


@dataclass(slots=True)
class _Assumed:
    """Our belief about a pod we wrote, kept until the informer shows the write."""

    pod: PodInfo
    min_rv: int  # informer versions below this predate our write
    need_bound: bool  # also wait for the informer to show spec.nodeName


def rv(value: str) -> int:
    """A resourceVersion as a number (0 when it is not one)."""
    try:
        return int(value)
    except ValueError:
        return 0


class PodView:
    def __init__(self, scheduler_name: str, snapshot: Snapshot, dra: DraView,
                 claims: ClaimState) -> None:
        self._scheduler_name = scheduler_name
        self._snapshot = snapshot
        self._dra = dra
        self._claims = claims
        self._pods: dict[str, PodInfo] = {}
        #: each pending pod of ours: its object (for Events and status patches) and the
        #: perf_counter of its last update (when a gang's last member arrived)
        self._pending: dict[str, tuple[dict[str, Any], float]] = {}
        self._assumed: dict[str, _Assumed] = {}

    def __len__(self) -> int:
        return len(self._pods)

    def get(self, key: str) -> PodInfo | None:
        """The informer's view of a pod."""
        return self._pods.get(key)

    def pending(self) -> list[str]:
        """Our pods not bound yet."""
        return list(self._pending)

    def observe(self, key: str, obj: dict[str, Any], pod: PodInfo) -> bool:
        """Take the informer's object of a pod; True when that changed what a plan can see."""
        self._pods[key] = pod
        if pod.scheduler_name == self._scheduler_name and not pod.bound:
            self._pending[key] = (obj, time.perf_counter())
        else:
            self._pending.pop(key, None)
        assumed = self._assumed.get(key)
        if assumed is not None and rv(pod.resource_version) >= assumed.min_rv and (
                not assumed.need_bound or pod.bound):
            del self._assumed[key]
        return self.refresh(key)

    def remove(self, key: str) -> None:
        self._pods.pop(key, None)
        self._pending.pop(key, None)
        self._assumed.pop(key, None)
        self._snapshot.remove(key)

    def refresh(self, key: str) -> bool:
        """Show the planner the pod as we believe it is: our write if the informer lags. True
        when that changed what a plan can see."""
        pod = self._pods.get(key)
        if pod is None:
            self._snapshot.remove(key)
            return True
        assumed = self._assumed.get(key)
        if assumed is not None:
            pod = assumed.pod
        pod = self._dra.extend(pod)
        # every claim-using pod of ours, its claims named yet or not: one whose template claim
        # the resourceclaim controller has not made yet waits (a claim problem), never binds
        if pod.claims is not None and (pod.scheduler_name == self._scheduler_name
                                       or pod.claims.extended):
            pod = resolve(pod, self._claims.get)
        return self._snapshot.put(pod)

    def assume(self, pod: PodInfo, min_rv: int, need_bound: bool) -> None:
        """Believe our write of `pod` until the informer shows a version from `min_rv` on
        (and, with `need_bound`, its spec.nodeName)."""
        self._assumed[pod.key] = _Assumed(pod, min_rv, need_bound)
        self.refresh(pod.key)

    def unassume(self, key: str) -> None:
        """Drop our belief about a write that failed."""
        if self._assumed.pop(key, None) is not None:
            self.refresh(key)

    def raw(self, pod: PodInfo) -> dict[str, Any] | None:
        """The object of a pending pod, for its Events and status patches."""
        pending = self._pending.get(pod.key)
        return pending[0] if pending is not None else None

    def arrived(self, keys: Iterable[str], default: float) -> float:
        """When the last of these pods arrived (perf_counter; `default` for those not pending)."""
        return max((self._pending.get(k, (None, default))[1] for k in keys), default=default)
