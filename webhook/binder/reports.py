"""What the binder tells about gangs: Events and PodScheduled conditions on their pods, the
placement metrics and log lines, and when a waiting gang's timeout falls. Reports are best
effort and go out from a bounded pool of their own, so that they never hold up binding.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.binder.gangs import Gang
from webhook.binder.metrics import Metrics
from webhook.binder.planner import Place, Wait
from webhook.binder.pods import PodInfo
from webhook.binder.queue import GangQueue
from webhook.kube.api import PODS, ApiError, KubeApi
from webhook.kube.events import EventRecorder
from webhook.kube.times import rfc3339
from webhook.topology.model import GpuAssignment

log = logging.getLogger(__name__)

#: the gang states the pending-gangs gauge shows
_WAIT_KINDS = ("members", "unplaceable", "invalid", "blocked", "backoff")


@dataclass(slots=True)
class Timeline:
    """perf_counter marks of one gang's placement: the stage histogram and the "gang bound"
    log line say where its time went."""

    arrived: float  # the informer's update of its last member
    cycle: float  # the cycle that placed it began
    planned: float  # that cycle's plan was done
    bound: float = 0.0  # every Binding answered

    def stages(self) -> dict[str, float]:
        return {"queued": max(0.0, self.cycle - self.arrived),
                "plan": self.planned - self.cycle,
                "bind": self.bound - self.planned}


class Reporter:
    def __init__(self, api: KubeApi, recorder: EventRecorder, metrics: Metrics,
                 queue: GangQueue, *, raw: Callable[[PodInfo], dict[str, Any] | None],
                 event_interval: float, members_event_after: float, concurrency: int,
                 clock: Callable[[], float]) -> None:
        self._api = api
        self._recorder = recorder
        self._metrics = metrics
        self._queue = queue
        self._raw = raw
        self._event_interval = event_interval
        self._members_event_after = members_event_after
        self._clock = clock
        self._slots = asyncio.Semaphore(concurrency)
        self._background: set[asyncio.Task[Any]] = set()
        #: gang → when it was first ready to place (the bind-duration histogram's start)
        self._ready_since: dict[str, float] = {}
        #: gang → the reason and time of its last FailedScheduling Event
        self._last_event: dict[str, tuple[str, float]] = {}
        #: the earliest timeout of a waiting gang, or time to say why one waits for members
        self.next_timeout: float | None = None

    def ready(self, gang: str, now: float) -> None:
        """The gang could be placed from `now` on (kept from the first time)."""
        self._ready_since.setdefault(gang, now)

    def retain(self, live: set[str]) -> None:
        """Forget the gangs no longer pending or being bound."""
        for stale in (self._ready_since, self._last_event):
            for key in [k for k in stale if k not in live]:
                del stale[key]

    def cancel(self) -> list[asyncio.Task[Any]]:
        """Cancel the reports still queued or being written; the tasks, to await."""
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        self._background.clear()
        return tasks

    def gauge_waits(self, waits: Sequence[Wait]) -> None:
        counts: dict[str, int] = {}
        for w in waits:
            counts[w.kind] = counts.get(w.kind, 0) + 1
        for state in _WAIT_KINDS:
            self._metrics.pending_gangs.labels(state).set(counts.get(state, 0))

    def bound(self, place: Place, pods: Sequence[tuple[PodInfo, GpuAssignment]], failed: int,
              timeline: Timeline) -> None:
        """A placed gang's Bindings all answered, `failed` of them with an error."""
        gang = place.gang
        stages = timeline.stages()
        for stage, seconds in stages.items():
            self._metrics.stage_seconds.labels(stage).observe(seconds)
        # a member whose Binding failed is bound from the record on a later cycle
        self._metrics.placements.labels("conflict" if failed else "placed").inc()
        started = self._ready_since.pop(gang.key, None)
        if started is not None and not failed:
            self._metrics.bind_seconds.observe(max(0.0, self._clock() - started))
        log.info("gang bound", extra={
            "gang": gang.key, "members": len(pods), "failed": failed,
            "nodes": place.placement.nodes_used, "gbps": round(place.placement.gang_gbps, 1),
            **{f"{stage}_ms": round(seconds * 1e3, 1) for stage, seconds in stages.items()}})
        for pod, a in pods:
            gpus = ",".join(str(i) for c in a.containers.values() for i in c.indices)
            self._spawn(self._recorder.emit(
                self._raw(pod) or _ref(pod), "Normal", "Scheduled",
                f"Successfully assigned {pod.key} to {a.node}"
                + (f" (GPUs {gpus})" if gpus else "") + f" as part of gang {gang.key}"))

    def waits(self, waits: Sequence[Wait], now: float, generation: int) -> None:
        """Back off the gangs that could not be placed, and say why each waits."""
        # a waiting gang's timeout is reported when it falls, not at the next event; so is a
        # gang that has waited for its members long enough to say so
        timeouts = [w.gang.created + w.gang.timeout_seconds for w in waits
                    if w.gang.timeout_seconds is not None and not w.timed_out]
        short = [due for w in waits if w.kind == "members"
                 and (due := w.gang.created + self._members_event_after) > now]
        self.next_timeout = min(timeouts + short, default=None)
        for w in waits:
            if w.kind in ("unplaceable", "blocked"):
                self.ready(w.gang.key, now)
            if w.kind in ("unplaceable", "invalid", "blocked") or (
                    w.kind == "members" and now - w.gang.created >= self._members_event_after):
                self._failed(w, now, generation)
            if w.timed_out and self._queue.mark_timeout_reported(w.gang.key, now):
                why = w.reason or "still waiting"
                log.warning("gang timed out", extra={"gang": w.gang.key, "reason": why})
                self._announce(w, "GangScheduleTimeout",
                               f"gang {w.gang.key} was not scheduled within "
                               f"{w.gang.timeout_seconds}s: {why}", True)

    def refused(self, gang: Gang, reason: str) -> None:
        """The API refused one of the gang's writes (not a conflict): it backs off whatever
        else changes, so that a lasting refusal (RBAC, a webhook on claims) is not retried in a
        loop, and its members say why."""
        now = self._clock()
        new = self._queue.failed(gang.key, now, 0, reason, hold=True)
        self._last_event[gang.key] = (reason, now)
        log.warning("gang waits", extra={"gang": gang.key, "kind": "refused", "reason": reason})
        self._announce(Wait(gang, "unplaceable", reason), "FailedScheduling",
                       f"gang {gang.key} cannot be placed: {reason}", new)

    def _failed(self, w: Wait, now: float, generation: int) -> None:
        key = w.gang.key
        last = self._last_event.get(key)
        changed = last is None or last[0] != w.reason
        since = now - last[1] if last is not None else float("inf")  # the last Event
        if w.kind == "members":
            # a gang short of members (one lost, or never made) is said once an interval:
            # its count changes with every pod that comes, and each would be a new reason
            new, due = changed, since >= self._event_interval
        else:
            if w.kind != "blocked":
                self._metrics.placements.labels(w.kind).inc()
            # only a tried placement backs off. An invalid gang waits for its own objects
            # (claims the resourceclaim controller makes, its PodGroup): looked at every
            # cycle, placed in the first that finds it whole. A blocked one tried nothing.
            if w.kind == "unplaceable":
                new = self._queue.failed(key, now, generation, w.reason, reserves=w.reserves)
            else:
                new = w.kind == "invalid" and changed
            due = new or changed or since >= self._event_interval
        if due:
            self._last_event[key] = (w.reason, now)
            log.info("gang waits", extra={"gang": key, "kind": w.kind, "reason": w.reason})
            self._announce(w, "FailedScheduling", f"gang {key} cannot be placed: {w.reason}",
                           new)

    def _announce(self, w: Wait, reason: str, message: str, condition: bool) -> None:
        for pod in w.gang.members:
            if pod.bound:
                continue
            raw = self._raw(pod)
            self._spawn(self._recorder.emit(raw or _ref(pod), "Warning", reason, message))
            if condition and raw is not None:
                self._spawn(self._set_unschedulable(pod, raw, message))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Fire-and-forget writes, cancelled on shutdown. At most `concurrency` run at once:
        in a burst they queue behind the assignments and Bindings instead of taking a third of
        the API calls (kube-scheduler's Events, too, go out from a queue of their own)."""
        async def run() -> None:
            try:
                async with self._slots:
                    await work
            except Exception as exc:  # best effort: never let a report disturb binding
                log.info("report not written", extra={"error": repr(exc)})

        def done(task: asyncio.Task[None]) -> None:
            self._background.discard(task)
            # cancelled while queued, or before it first ran: closed, not left "never awaited"
            work.close()
        task = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(done)

    async def _set_unschedulable(self, pod: PodInfo, raw: dict[str, Any], message: str) -> None:
        """PodScheduled=False reason Unschedulable, as kube-scheduler reports it."""
        conditions = [c for c in (raw.get("status") or {}).get("conditions") or ()
                      if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                           "message": message[:1024],
                           "lastTransitionTime": rfc3339(self._clock())})
        try:
            await self._api.patch(PODS, pod.name, {"status": {"conditions": conditions}},
                                  pod.namespace, subresource="status")
        except ApiError as exc:
            log.info("could not set PodScheduled condition",
                     extra={"pod": pod.key, "error": str(exc)})


def _ref(pod: PodInfo) -> dict[str, Any]:
    """The minimal object an Event can refer to, when the raw pod is not cached."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                         "resourceVersion": pod.resource_version}}

