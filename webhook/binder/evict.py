"""A preemption's writes: each victim gang evicted whole through the Eviction API (policy/v1
Eviction, which keeps PodDisruptionBudgets and lets each pod have its termination grace), and
Events on both sides: `GangPreempted` on each victim pod, `GangPreempting` on the preemptor's
pending members, and each on the gang's coscheduling PodGroup where it has one (`muster
analyze` and `muster explain` read them back)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from webhook import keys
from webhook.binder.allocation import holding_node
from webhook.binder.gangs import Gang
from webhook.binder.metrics import Metrics
from webhook.binder.planner import Preempt
from webhook.binder.pods import PodInfo
from webhook.binder.preemption import held
from webhook.kube.api import PODS, ApiError, KubeApi
from webhook.kube.events import EventRecorder
from webhook.kube.times import rfc3339

log = logging.getLogger(__name__)

#: the Events' reasons, on a victim's pods and on the preemptor's
PREEMPTED, PREEMPTING = "GangPreempted", "GangPreempting"


def preempted_message(victim: Gang, preemptor: Gang, domain: str) -> str:
    where = f" in {domain}" if domain else ""
    # the checkpoint its price counted from (`work_since`), where it did
    h = held(victim)
    resumes = ""
    if 0 < h.started < h.saved:
        resumes = (f"; its job's last checkpoint ({keys.ANN_LAST_CHECKPOINT}) was at "
                   f"{rfc3339(h.saved)}")
    return (f"preempted by gang {preemptor.key} of priority {preemptor.priority}: gang "
            f"{victim.key} (priority {victim.priority}) is evicted whole so that it can be "
            f"placed{where}{resumes}")


def preempting_message(pe: Preempt) -> str:
    where = f" in {pe.domain}" if pe.domain else ""
    gpus = sum(p.gpus for v in pe.victims for p in v.members if holding_node(p) is not None)
    return (f"gang {pe.gang.key} of priority {pe.gang.priority} preempts {len(pe.victims)} "
            f"gang(s) of lower priority ({', '.join(v.key for v in pe.victims)}; {gpus} GPUs) "
            f"to be placed{where} once they are gone")


@dataclass(slots=True)
class Evictor:
    api: KubeApi
    recorder: EventRecorder
    metrics: Metrics
    raw: Callable[[PodInfo], dict[str, Any] | None]
    check_fence: Callable[[], None]
    #: victims whose eviction the API refused (a budget, a race): gang key -> when
    refused: dict[str, float] = field(default_factory=dict)

    async def preempt(self, pe: Preempt, now: float) -> bool:
        """Evict every victim of `pe`, one gang after the other; False when the API refused
        a victim's first eviction (its budget changed since the plan): that gang is left whole
        and remembered in `refused`, and the victims after it are left too (the preemptor
        plans again, with what has gone)."""
        told = preempting_message(pe)
        await self._say(pe.gang.members, "Normal", PREEMPTING, told, pending=True)
        await self._say_group(pe.gang, "Normal", PREEMPTING, told)
        for victim in pe.victims:
            if not await self._evict(victim, pe):
                self.refused[victim.key] = now
                self.metrics.preemptions.labels("refused").inc()
                return False
            self.metrics.preempted_gangs.inc()
        self.metrics.preemptions.labels("evicted").inc()
        return True

    async def _evict(self, victim: Gang, pe: Preempt) -> bool:
        """Evict the gang's pods, each after the one before; False when the first is refused
        (nothing of the gang evicted). A later refusal (a budget changed meanwhile) leaves the
        rest to the next preemption."""
        message = preempted_message(victim, pe.gang, pe.domain)
        holding = [p for p in victim.members if holding_node(p) is not None]
        for i, pod in enumerate(holding):
            self.check_fence()
            try:
                await self.api.create_subresource(PODS, pod.name, "eviction", {
                    "apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": pod.name, "namespace": pod.namespace}}, pod.namespace)
            except ApiError as exc:
                if exc.not_found:
                    continue
                log.warning("eviction refused", extra={
                    "gang": victim.key, "pod": pod.key, "preemptor": pe.gang.key,
                    "error": str(exc)})
                if i == 0:
                    return False
                continue
            await self._say([pod], "Warning", PREEMPTED, message)
        await self._say_group(victim, "Warning", PREEMPTED, message)
        log.info("gang preempted", extra={"gang": victim.key, "preemptor": pe.gang.key,
                                          "pods": len(holding), "domain": pe.domain})
        return True

    async def _say(self, pods: list[PodInfo], type_: str, reason: str, message: str, *,
                   pending: bool = False) -> None:
        for pod in pods:
            if pending and pod.bound:
                continue
            raw = self.raw(pod)
            await self.recorder.emit(raw or _ref(pod), type_, reason, message)


    async def _say_group(self, gang: Gang, type_: str, reason: str, message: str) -> None:
        """The same Event on the gang's coscheduling PodGroup, where it has one."""
        group = gang.members[0].pod_group if gang.members else None
        if group is not None and gang.members[0].gang_name is None:
            api, version = keys.COSCHEDULING_API[:2]
            await self.recorder.emit({"apiVersion": f"{api}/{version}", "kind": "PodGroup",
                                      "metadata": {"name": group, "namespace": gang.namespace}},
                                     type_, reason, message)


def _ref(pod: PodInfo) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid}}
