"""The PodGroup janitor: the PodGroups Muster made go when their job is done.

Every `interval` seconds it lists the PodGroups labelled `app.kubernetes.io/managed-by: muster`
(Volcano's and scheduler-plugins', where their CRD is installed, and the native Workload
API's PodGroups and Workloads, where the cluster serves it), lists each kind of job that
controls them once, and deletes (with a uid precondition) those whose job
`webhook.policy.cleanup.cleanup_reason` says is done, with an Event on the job. A PodGroup whose
job is gone is left to the garbage collector. One replica works at a time (Lease
`<release>-podgroup-cleanup`), so Events are not doubled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from webhook.admission.metrics import Metrics
from webhook.admission.podgroups import native_resources
from webhook.kube import (
    COSCHEDULING_PODGROUPS,
    VOLCANO_PODGROUPS,
    ApiError,
    EventRecorder,
    KubeApi,
    Resource,
)
from webhook.kube.owners import controller_ref, owner_kind, owner_resource
from webhook.policy import native
from webhook.policy.cleanup import cleanup_reason
from webhook.policy.podgroup import MANAGED_BY

log = logging.getLogger(__name__)

_SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())


class PodGroupJanitor:
    def __init__(self, api: KubeApi, metrics: Metrics, recorder: EventRecorder | None,
                 interval: float = 30.0) -> None:
        self.api = api
        self.metrics = metrics
        self.recorder = recorder
        self.interval = interval

    async def run(self) -> None:
        while True:
            try:
                await self.sweep()
            except ApiError as exc:  # the API server is away: try again next round
                log.warning("PodGroup cleanup round failed", extra={"error": str(exc)})
            await asyncio.sleep(self.interval)

    async def sweep(self) -> int:
        """One round; the number of PodGroups deleted."""
        groups: list[tuple[Any, dict[str, Any], Mapping[str, Any]]] = []
        for resource in (VOLCANO_PODGROUPS, COSCHEDULING_PODGROUPS, *await self._native()):
            try:
                found = await self.api.list(resource, label_selector=_SELECTOR)
            except ApiError as exc:
                if exc.not_found:
                    continue  # that scheduler's CRD is not installed
                raise
            for pg in found.get("items") or ():
                ref = controller_ref(pg)
                if ref is not None:
                    groups.append((resource, pg, ref))
        jobs = await self._jobs({owner_kind(ref): ref for _, _, ref in groups})
        deleted = 0
        for resource, pg, ref in groups:
            job = jobs.get(str(ref.get("uid")))
            name = str((pg.get("metadata") or {}).get("name"))
            reason = cleanup_reason(owner_kind(ref), job, name) if job is not None else None
            if reason is not None and job is not None:
                deleted += await self._delete(resource, pg, job, reason)
        return deleted

    async def _native(self) -> tuple[Resource, ...]:
        """The native Workload API's PodGroups and Workloads, where the cluster serves them."""
        api = native.pick_api(await self.api.served(native.GROUP))
        if api is None:
            return ()
        workloads, podgroups = native_resources(api)
        return (podgroups, workloads) if native.has_podgroup_object(api) else (workloads,)

    async def _jobs(self, kinds: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        """uid → job object, one LIST per job kind that controls a PodGroup."""
        out: dict[str, dict[str, Any]] = {}
        for kind, ref in kinds.items():
            try:
                listed = await self.api.list(owner_resource(ref))
            except ApiError as exc:
                log.warning("jobs not listed; their PodGroups stay this round",
                            extra={"kind": kind, "error": str(exc)})
                continue
            for job in listed.get("items") or ():
                out[str((job.get("metadata") or {}).get("uid"))] = job
        return out

    async def _delete(self, resource: Any, pg: Mapping[str, Any], job: Mapping[str, Any],
                      reason: str) -> int:
        meta = pg["metadata"]
        try:
            await self.api.delete(resource, meta["name"], meta["namespace"],
                                  preconditions={"uid": meta["uid"]})
        except ApiError as exc:
            if exc.not_found or exc.conflict:
                return 0  # gone already, or replaced by a new job's PodGroup
            raise
        self.metrics.podgroup_cleanups.inc()
        kind = pg.get("kind") or "PodGroup"
        message = (f"{kind} {meta['namespace']}/{meta['name']} deleted: {reason}, as its "
                   "operator would (a PodGroup would hold its minResources against the queue)")
        log.info("PodGroup deleted", extra={"podgroup": f"{meta['namespace']}/{meta['name']}",
                                            "reason": reason})
        if self.recorder is not None:
            await self.recorder.emit(job, "Normal", "PodGroupDeleted", message)
        return 1
