"""The binder's writes of a plan, one task per gang: a placed gang's claims and Bindings, a
recovered gang's remaining Bindings, and letting go of what unbound members reserved.

Per gang there is one round of writes: every member's Binding, all at once, each carrying the
member's assignment and the whole gang's placement as annotations (the API server copies a
Binding's annotations onto the pod in the same write). That record is the crash-safety
argument: once any member is bound, the others are reserved by it, and the planner's recovery
rule binds them there on a later cycle, whoever runs it.

Members whose GPUs come through DRA claims (webhook.binder.dra) get no assignment annotation:
their claims' status is the record. Every claim of the gang is allocated before any Binding (as
KEP-4381 asks of a scheduler); if one write conflicts, those written are released and nothing
is bound (webhook.binder.claimstate).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from webhook import jsonpatch, keys
from webhook.binder.assignment import encode_assignment
from webhook.binder.claims import ClaimInfo
from webhook.binder.claimstate import ClaimState, ClaimWrite
from webhook.binder.dra import claim_devices, resolve
from webhook.binder.draview import DraView
from webhook.binder.extended import pod_status, special_claim
from webhook.binder.gate import AllocationGate
from webhook.binder.metrics import Metrics
from webhook.binder.planner import Finish, Place, Strip
from webhook.binder.pods import PodInfo, parse_pod
from webhook.binder.podview import PodView, rv
from webhook.binder.queue import GangQueue
from webhook.binder.reports import Reporter, Timeline
from webhook.kube.api import PODS, ApiError, KubeApi
from webhook.topology.model import GpuAssignment

log = logging.getLogger(__name__)

_ANN_PATH = "/metadata/annotations/" + jsonpatch.escape(keys.ANN_GPU_ASSIGNMENT)

Targets = Sequence[tuple[PodInfo, GpuAssignment]]


class WriteFenced(Exception):
    """Raised before a write when this replica may no longer be leader."""


def fence_check(leading: Callable[[], bool]) -> Callable[[], None]:
    """The check made before each write: raises WriteFenced once `leading` says no."""
    def check() -> None:
        if not leading():
            raise WriteFenced("not leader")
    return check


def raise_unexpected(results: Iterable[object]) -> None:
    """API errors are expected (conflicts, deleted pods); anything else is a bug, and
    cancellation or fencing must propagate."""
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, ApiError):
            raise r


class Writer:
    def __init__(self, api: KubeApi, *, scheduler_name: str, claims: ClaimState,
                 gate: AllocationGate, pods: PodView, dra: DraView, reports: Reporter,
                 metrics: Metrics, queue: GangQueue, check_fence: Callable[[], None],
                 acks_allocation: Callable[[str], bool], freed: Callable[[], None]) -> None:
        self._api = api
        self._scheduler_name = scheduler_name
        self._claims = claims
        self._gate = gate
        self._pods = pods
        self._dra = dra
        self._reports = reports
        self._metrics = metrics
        self._queue = queue
        self._check_fence = check_fence
        self._acks_allocation = acks_allocation
        self._freed = freed  # a reservation was let go: the next plan may differ

    async def bind_gang(self, place: Place, record: str, writes: list[ClaimWrite],
                        special: Targets, timeline: Timeline) -> None:
        """A placed gang: its special claims, its claims' allocations and its pods' statuses,
        then every Binding; nothing is bound when a claim write fails."""
        refused: list[ApiError] = []
        served = await self._make_special(special, refused) if special else []
        if served is not None:
            by_key = {p.key: (p, a) for p, a in served}
            pods = tuple(by_key.get(p.key, (p, a)) for p, a in place.assignments)
            writes = writes + [(p, a.node, claim, devices) for p, a in served
                               for claim, devices in claim_devices(p, a, self._claims.get)]
        if served is None or not await self._claim(pods, writes, refused):
            # nothing of the gang is bound
            for pod, _ in place.assignments:
                self._pods.unassume(pod.key)
            lasting = [e for e in refused if not (e.conflict or e.not_found)]
            if lasting:  # forbidden, invalid, a server error: backs off, and says so
                self._metrics.placements.labels("error").inc()
                self._reports.refused(place.gang, f"a write was refused: {lasting[0]}")
                return
            # someone else allocated a claim first, or it went: the next cycle plans the
            # gang again from what the informers show
            self._metrics.placements.labels("conflict").inc()
            log.info("claim allocation failed: gang planned again",
                     extra={"gang": place.gang.key})
            return
        failed = await self._bind_all(place.gang.key, pods, "placed", record)
        timeline.bound = time.perf_counter()
        self._queue.forget(place.gang.key)
        self._reports.bound(place, pods, failed, timeline)

    async def finish(self, finish: Finish) -> None:
        """Bind the members a bound member's record (or their claims) reserved."""
        log.info("binding reserved members", extra={"gang": finish.gang.key,
                                                    "members": len(finish.assignments)})
        # a special claim allocated by a binder that stopped before the pod's status named it
        results = await asyncio.gather(*(self._write_status(p) for p, _ in finish.assignments),
                                       return_exceptions=True)
        raise_unexpected(results)
        ready = []
        for (pod, assignment), r in zip(finish.assignments, results, strict=True):
            if r is None:
                ready.append((pod, assignment))
            else:
                self._pods.unassume(pod.key)  # bound from its claim on a later cycle
        await self._bind_all(finish.gang.key, ready, "recovered")

    async def strip(self, strip: Strip) -> None:
        """Let go of what the gang's unbound members reserved."""
        log.info("removing assignments of unbound members", extra={
            "gang": strip.gang.key, "members": len(strip.pods), "reason": strip.reason})
        results = await asyncio.gather(*(self._unreserve(p) for p in strip.pods),
                                       return_exceptions=True)
        raise_unexpected(results)

    async def _unreserve(self, pod: PodInfo) -> None:
        """Let go of an unbound pod's reservation: its claims' allocations, or its annotation."""
        if not pod.dra:
            await self._unannotate(pod)
            return
        results = await asyncio.gather(*(self._claims.let_go(k, pod.uid)
                                         for k in pod.held_claims), return_exceptions=True)
        raise_unexpected(results)
        self._freed()
        self._metrics.stripped.inc()

    async def _unannotate(self, pod: PodInfo) -> None:
        self._check_fence()
        ops = [{"op": "test", "path": "/metadata/resourceVersion",
                "value": pod.resource_version},
               {"op": "remove", "path": _ANN_PATH}]
        obj = await self._api.patch(PODS, pod.name, ops, pod.namespace, patch_type="json")
        written = parse_pod(obj, self._scheduler_name)
        self._pods.assume(written, rv(written.resource_version), False)
        self._freed()
        self._metrics.stripped.inc()

    async def _make_special(self, special: Targets, refused: list[ApiError]
                            ) -> list[tuple[PodInfo, GpuAssignment]] | None:
        """Create the special claim of each pod whose plain requests a DRA-only node serves;
        the pods as served by them (None, and none left, when one could not be created: the
        API's refusals added to `refused`)."""
        results = await asyncio.gather(*(self._claims.create(special_claim(
            p.namespace, p.name, p.uid, p.extended)) for p, _ in special
            if isinstance(p.extended, tuple)), return_exceptions=True)  # extended_on chose them
        made = [r for r in results if isinstance(r, ClaimInfo)]
        if len(made) < len(results):
            await asyncio.gather(*(self._claims.delete(c.key) for c in made),
                                 return_exceptions=True)
            raise_unexpected(results)
            refused += [r for r in results if isinstance(r, ApiError)]
            return None
        return [(resolve(self._dra.extend(replace(p, node_name=None, assignment=None,
                                                  assignment_raw=None)), self._claims.get), a)
                for p, a in special]

    async def _claim(self, pods: Targets, writes: list[ClaimWrite],
                     refused: list[ApiError]) -> bool:
        """Allocate the claims and write the pods' statuses; True when all were written.
        Otherwise nothing is left (allocations are released, special claims deleted), and the
        API's refusals are added to `refused`."""
        failed = await self._claims.allocate(writes) if writes else []
        if failed:
            refused += failed
            await self._let_go(w[2] for w in writes)
            return False
        results = await asyncio.gather(*(self._write_status(p) for p, _ in pods),
                                       return_exceptions=True)
        if any(isinstance(r, BaseException) for r in results):
            log.info("pod status not written", extra={"errors": [
                str(r) for r in results if isinstance(r, BaseException)]})
            await self._let_go(w[2] for w in writes)
            await asyncio.gather(*(self._claims.release(w[2].key, w[0].uid) for w in writes
                                   if w[2].extended_for is None), return_exceptions=True)
            raise_unexpected(results)
            refused += [r for r in results if isinstance(r, ApiError)]
            return False
        return True

    async def _let_go(self, claims: Iterable[ClaimInfo]) -> None:
        """Delete the special claims among `claims` (best effort: a later cycle finds them)."""
        await asyncio.gather(*(self._claims.delete(c.key) for c in claims
                               if c.extended_for is not None), return_exceptions=True)

    async def _write_status(self, pod: PodInfo) -> None:
        """Name the pod's special claim in its status for the kubelet (before its Binding, as
        kube-scheduler does), unless the status names it already."""
        pc = pod.claims
        if pc is None or not pc.extended or pod.extended_status == pc.names[0][1] or \
                not isinstance(pod.extended, tuple):
            return
        self._check_fence()
        await self._api.patch(PODS, pod.name, pod_status(pod.uid, pc.names[0][1], pod.extended),
                              pod.namespace, subresource="status")

    async def _bind_all(self, gang: str, targets: Targets, path: str, record: str = "") -> int:
        """Bind every target at once; how many Bindings failed."""
        results = await asyncio.gather(*(self._bind_in_turn(p, a, record) for p, a in targets),
                                       return_exceptions=True)
        failed = 0
        for (pod, _), r in zip(targets, results, strict=True):
            if isinstance(r, BaseException):
                # reserved by its gang's record (or its own annotation) if a member is bound:
                # the recovery rule binds it on a later cycle; else the gang is placed afresh
                failed += 1
                self._pods.unassume(pod.key)
                log.warning("binding failed", extra={"gang": gang, "pod": pod.key,
                                                     "error": str(r)})
            else:
                self._metrics.bindings.labels(path).inc()
        raise_unexpected(results)
        return failed

    async def _bind_in_turn(self, pod: PodInfo, assignment: GpuAssignment, record: str) -> None:
        """GPU pods on a node whose agent acknowledges them go one at a time (binder.gate)."""
        node = assignment.node
        # the kubelet names a DRA pod's claim to the driver: no need to hold the node
        if pod.gpus > 0 and not pod.dra and self._acks_allocation(node):
            await self._gate.bind(node, pod.key, lambda: self._bind(pod, assignment, record))
        else:
            await self._bind(pod, assignment, record)

    async def _bind(self, pod: PodInfo, assignment: GpuAssignment, record: str) -> None:
        """The Binding, with the pod's assignment and its gang's record (empty: none) as
        annotations that the API server writes onto the pod with spec.nodeName."""
        self._check_fence()
        # a DRA pod's claims are its record: an annotation would be a second, forgeable one
        annotations = {} if pod.dra else {keys.ANN_GPU_ASSIGNMENT: encode_assignment(assignment)}
        if record:
            annotations[keys.ANN_GANG_PLACEMENT] = record
        try:
            await self._api.bind(pod.namespace, pod.name, assignment.node, uid=pod.uid or None,
                                 annotations=annotations)
        except ApiError as exc:
            if not (exc.conflict and f"node {assignment.node}" in exc.message):
                raise
            # already bound to this node: an earlier attempt succeeded after all

