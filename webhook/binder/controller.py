"""The binder controller: informers in, Bindings out.

Each cycle plans from the informer caches (webhook.binder.planner, pure) and starts the I/O of
the plan as tasks, one per gang. Writes are visible to the next cycle at once through an
"assumed" overlay (as kube-scheduler's assume cache): a pod we bound counts as such until the
informer shows it, so a lagging cache never hands out a GPU twice. The planner's inputs are
kept current pod by pod, overlay included (webhook.binder.snapshot), so that a cycle costs what
changed rather than the cluster's size.

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
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from webhook import jsonpatch, keys
from webhook.binder.assignment import RECORD_LIMIT, encode_assignment, encode_record
from webhook.binder.claims import DEVICE_CLASS, ClaimInfo
from webhook.binder.claimstate import ClaimState, ClaimWrite
from webhook.binder.dra import claim_devices, resolve
from webhook.binder.extended import (
    class_resources,
    gpu_class,
    pod_claims,
    pod_status,
    special_claim,
)
from webhook.binder.fit import FitCache, extended_on
from webhook.binder.gangs import PodGroupInfo
from webhook.binder.gate import AllocationGate
from webhook.binder.metrics import Metrics
from webhook.binder.nodes import NodeInfo, parse_node, slice_gpus
from webhook.binder.planner import (
    Finish,
    Place,
    PlaceFn,
    Plan,
    PlanConfig,
    Strip,
    Wait,
    plan_gangs,
)
from webhook.binder.pods import PodInfo, parse_pod
from webhook.binder.queue import GangQueue
from webhook.binder.snapshot import Snapshot
from webhook.kube.api import (
    COSCHEDULING_PODGROUPS,
    DEVICE_CLASSES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ApiError,
    KubeApi,
    Resource,
)
from webhook.kube.events import EventRecorder
from webhook.kube.informer import Informer
from webhook.topology.gpu_choice import TableCache
from webhook.topology.hierarchy import place_gang
from webhook.topology.model import GpuAssignment

log = logging.getLogger(__name__)

_ANN_PATH = "/metadata/annotations/" + jsonpatch.escape(keys.ANN_GPU_ASSIGNMENT)


@dataclass(frozen=True, slots=True)
class BinderConfig:
    scheduler_name: str = keys.DEFAULT_BINDER_SCHEDULER_NAME
    #: an unplaceable gang waiting longer than this reserves resources (see planner)
    starvation_seconds: float = 60.0
    backoff_initial: float = 1.0
    backoff_max: float = 60.0
    podgroup_default_timeout: int = 60
    #: at most one FailedScheduling Event per gang per this many seconds for the same reason
    event_interval: float = 30.0
    #: component name on Events
    component: str = "muster-binder"
    #: the longest a node's next GPU pod waits for the agent to acknowledge the previous one
    allocation_wait_seconds: float = 30.0
    #: Events and status conditions written at once, at most (see Binder._spawn)
    report_concurrency: int = 8
    #: the cluster's network levels, node labels widest first (`--network-levels`)
    network_levels: tuple[str, ...] = ()


@dataclass(slots=True)
class _Assumed:
    """Our belief about a pod we wrote, kept until the informer shows the write."""

    pod: PodInfo
    min_rv: int  # informer versions below this predate our write
    need_bound: bool  # also wait for the informer to show spec.nodeName


@dataclass(slots=True)
class _Timeline:
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


def _rv(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


class WriteFenced(Exception):
    """Raised before a write when this replica may no longer be leader."""


class Binder:
    def __init__(self, api: KubeApi, config: BinderConfig | None = None, *,
                 metrics: Metrics | None = None, recorder: EventRecorder | None = None,
                 place: PlaceFn | None = None,
                 fence: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.time) -> None:
        #: the binder's own choice tables, kept for its life (None when given `place`)
        self._tables = TableCache() if place is None else None
        self.api = api
        self.config = config or BinderConfig()
        self.metrics = metrics or Metrics()
        self.recorder = recorder or EventRecorder(api, self.config.component, "binder")
        self._place = place or functools.partial(place_gang, tables=self._tables)
        self._fence = fence
        self._clock = clock
        self.plan_config = PlanConfig(self.config.scheduler_name,
                                      self.config.starvation_seconds,
                                      self.config.podgroup_default_timeout,
                                      self.config.network_levels)
        self.queue = GangQueue(self.config.backoff_initial, self.config.backoff_max)
        self.fit = FitCache()
        self.gate = AllocationGate(
            self.config.allocation_wait_seconds,
            on_timeout=lambda _node, _pod: self.metrics.allocation_timeouts.inc(),
            acks=self._acks_allocation)
        self.synced = asyncio.Event()
        self.last_plan: Plan | None = None
        self._pods: dict[str, PodInfo] = {}
        #: each pending pod of ours: its object (for Events and status patches) and the
        #: perf_counter of its last update (when a gang's last member arrived)
        self._pending: dict[str, tuple[dict[str, Any], float]] = {}
        self._nodes: dict[str, NodeInfo] = {}
        self._pod_groups: dict[str, PodGroupInfo] | None = None
        self._assumed: dict[str, _Assumed] = {}
        self.snapshot = Snapshot(self.config.scheduler_name)  # _pods with _assumed over them
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._report_slots = asyncio.Semaphore(self.config.report_concurrency)
        self._ready_since: dict[str, float] = {}
        self._last_event: dict[str, tuple[str, float]] = {}
        self._generation = 0
        self._last_cycle = 0.0
        self._next_timeout: float | None = None  # the earliest timeout of a waiting gang
        self._dirty = asyncio.Event()
        self.claims = ClaimState(api, changed=self._on_claim_changed,
                                 check_fence=self._check_fence)
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

    # --- informer handlers ----------------------------------------------------------------

    def _on_pod(self, event: str, obj: dict[str, Any], _old: dict[str, Any] | None) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        prev = self._pods.get(key)
        if event == "DELETED":
            self._pods.pop(key, None)
            self._pending.pop(key, None)
            self._assumed.pop(key, None)
            self._index_claims(key, None)
            self.snapshot.remove(key)
            self.gate.release(key)
            self._generation += 1
            self._dirty.set()
            return
        pod = parse_pod(obj, self.config.scheduler_name)
        self._pods[key] = pod
        self._index_claims(key, pod)
        self.gate.observe(pod)
        if pod.scheduler_name == self.config.scheduler_name and not pod.bound:
            self._pending[key] = (obj, time.perf_counter())
        else:
            self._pending.pop(key, None)
        assumed = self._assumed.get(key)
        if assumed is not None and _rv(pod.resource_version) >= assumed.min_rv and (
                not assumed.need_bound or pod.bound):
            del self._assumed[key]
        seen_new = self._refresh(key)
        freed = prev is not None and (
            (pod.terminated and not prev.terminated)
            or (prev.assignment_raw is not None and pod.assignment_raw is None))
        if freed:
            self._generation += 1
        # the echo of our own write (the snapshot showed it already) plans nothing new; such
        # echoes started about a fifth of an arrival run's cycles
        if (prev is None or freed or pod.node_name != prev.node_name
                or (pod.scheduler_name == self.config.scheduler_name and seen_new)):
            self._dirty.set()

    def _acks_allocation(self, node: str) -> bool:
        """Its agent's device plugin serves the kubelet and marks the pods it served (label)."""
        info = self._nodes.get(node)
        return info is not None and info.acks_allocation

    def _on_node(self, event: str, obj: dict[str, Any], _old: dict[str, Any] | None) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        before = self._nodes.get(name)
        if event == "DELETED":
            self._nodes.pop(name, None)
            self.gate.release_node(name)
        else:
            node = replace(parse_node(obj), dra_gpus=self._dra_gpus(name))
            if before == node:
                return  # heartbeat-only change: nothing the binder reads
            self._nodes[name] = node
            if before is not None and before.acks_allocation and not node.acks_allocation:
                # its agent's plugin is no longer registered: no acknowledgement will come
                self.gate.release_node(name)
            if self._tables is not None and node.topology is not None:
                # a new node type's tables (88 ms for a DGX-1) are made as it is seen, not
                # during the first placement on it, which would wait that long
                self._tables.tables(node.topology)
        self.fit.clear()
        self._generation += 1
        self._dirty.set()

    def _dra_gpus(self, node: str) -> frozenset[int]:
        return frozenset().union(*(g for n, g in self._slices.values() if n == node))

    def _on_slice(self, event: str, obj: dict[str, Any], _old: dict[str, Any] | None) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        published = None if event == "DELETED" else slice_gpus(obj)
        before = self._slices.pop(name, None)
        if published is not None:
            self._slices[name] = published
        for node in {p[0] for p in (before, published) if p is not None} & self._nodes.keys():
            self._nodes[node] = replace(self._nodes[node], dra_gpus=self._dra_gpus(node))
        self.fit.clear()
        self._generation += 1
        self._dirty.set()

    def _index_claims(self, key: str, pod: PodInfo | None) -> None:
        """Which of our pods use which claim: a claim's change re-resolves its users."""
        now: frozenset[str] = frozenset()
        if pod is not None and pod.claims is not None and \
                pod.scheduler_name == self.config.scheduler_name:
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

    def _on_claim_changed(self, key: str) -> None:
        """A claim's view changed (informer or our write): what it holds, and its users."""
        info = self.claims.get(key)
        held = self.snapshot.remove_claim(key) if info is None else self.snapshot.put_claim(info)
        users = {*self._claim_users.get(key, ()), *self._index_special(key, info)}
        for user in users:
            self._refresh(user)
        if held or users:  # GPUs let go, or a pod's claim appeared or changed
            self._generation += 1
            self._dirty.set()

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

    def _on_device_class(self, event: str, obj: dict[str, Any],
                         _old: dict[str, Any] | None) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        if event == "DELETED":
            self._classes.pop(name, None)
        else:
            self._classes[name] = obj
        served = gpu_class(class_resources(self._classes.values()))
        if served != self._gpu_class:
            self._gpu_class = served
            log.info("DeviceClass serving nvidia.com/gpu through DRA changed", extra={
                "deviceClass": served or None,
                "ours": served == DEVICE_CLASS})
            for key in list(self._pending):
                self._refresh(key)
            self.fit.clear()
            self._generation += 1
            self._dirty.set()

    def _extend(self, pod: PodInfo) -> PodInfo:
        """A pod of ours with plain GPU requests: the class that may serve them through DRA,
        and while it is unbound the special claim made for it, if any (the status names the
        claim once it is written)."""
        if pod.scheduler_name != self.config.scheduler_name or not pod.gpus or (
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

    def _on_pod_group(self, event: str, obj: dict[str, Any],
                      _old: dict[str, Any] | None) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        groups = self._pod_groups if self._pod_groups is not None else {}
        if event == "DELETED":
            groups.pop(key, None)
        else:
            spec = obj.get("spec") or {}
            try:
                groups[key] = PodGroupInfo(max(1, int(spec.get("minMember") or 1)),
                                           int(spec.get("scheduleTimeoutSeconds") or 0) or None)
            except (TypeError, ValueError):
                groups.pop(key, None)
        self._pod_groups = groups
        self._dirty.set()

    # --- main loop --------------------------------------------------------------------------

    async def run(self) -> None:
        """Watch and bind until cancelled; cancels its own writes on the way out."""
        informers = [Informer(self.api, PODS), Informer(self.api, NODES)]
        informers[0].add_handler(self._on_pod)
        informers[1].add_handler(self._on_node)
        for resource, handler in ((RESOURCE_SLICES, self._on_slice),
                                  (RESOURCE_CLAIMS, self.claims.on_event),
                                  (DEVICE_CLASSES, self._on_device_class)):
            if await self._served(resource):
                informers.append(Informer(self.api, resource))
                informers[-1].add_handler(handler)
        try:
            await self.api.list(COSCHEDULING_PODGROUPS, limit=1)
        except ApiError as exc:
            if not exc.not_found:
                raise
            log.info("coscheduling PodGroup CRD not installed: only muster.io gang annotations")
        else:
            self._pod_groups = {}
            pg = Informer(self.api, COSCHEDULING_PODGROUPS)
            pg.add_handler(self._on_pod_group)
            informers.append(pg)
        tasks = [asyncio.create_task(i.run(), name=f"informer:{i.resource.plural}")
                 for i in informers]
        try:
            for informer in informers:
                await informer.synced.wait()
            self.synced.set()
            log.info("binder synced", extra={"pods": len(self._pods),
                                             "nodes": len(self._nodes),
                                             "scheduler": self.config.scheduler_name})
            await self._loop()
        finally:
            pending = [*tasks, *self._inflight.values(), *self._background]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            self._inflight.clear()
            self._background.clear()

    async def _served(self, resource: Resource) -> bool:
        try:
            await self.api.list(resource, limit=1)
        except ApiError as exc:
            if not exc.not_found:
                raise
            log.info("resource not served: no DRA claims are allocated",
                     extra={"resource": resource.plural})
            return False
        return True

    async def _loop(self) -> None:
        while True:
            deadline = min((d for d in (self.queue.next_deadline(after=self._last_cycle),
                                        self._next_timeout) if d is not None), default=None)
            timeout = None if deadline is None else max(0.0, deadline - self._clock())
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancel that
            # lands as the event is set, and this loop would then never stop (gh-86296)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._dirty.wait()
            self._dirty.clear()
            try:
                self.cycle()
            except Exception:
                # a bug in planning must not stop binding for good: log, pause, retry
                log.exception("scheduling cycle failed")
                self.metrics.placements.labels("error").inc()
                await asyncio.sleep(1.0)
                self._dirty.set()
            await asyncio.sleep(0)  # let handlers and writes run between cycles

    def _refresh(self, key: str) -> bool:
        """Show the planner the pod as we believe it is: our write if the informer lags. True
        when that changed what a plan can see."""
        pod = self._pods.get(key)
        if pod is None:
            self.snapshot.remove(key)
            return True
        assumed = self._assumed.get(key)
        if assumed is not None:
            pod = assumed.pod
        pod = self._extend(pod)
        # every claim-using pod of ours, its claims named yet or not: one whose template claim
        # the resourceclaim controller has not made yet waits (a claim problem), never binds
        if pod.claims is not None and (pod.scheduler_name == self.config.scheduler_name
                                       or pod.claims.extended):
            pod = resolve(pod, self.claims.get)
        return self.snapshot.put(pod)

    def cycle(self) -> Plan:
        """Plan once from the caches and start the plan's writes."""
        started = time.perf_counter()
        now = self._last_cycle = self._clock()
        gangs = self.snapshot.open_gangs(self._pod_groups,
                                         self.plan_config.podgroup_default_timeout)
        result = plan_gangs(gangs, self.snapshot.allocation,
                            self.snapshot.node_states(self._nodes), self._nodes,
                            config=self.plan_config, queue=self.queue, fit=self.fit,
                            place=self._place, now=now, generation=self._generation,
                            inflight=self._inflight.keys())
        planned = time.perf_counter()
        self.metrics.cycle_seconds.observe(planned - started)
        self.last_plan = result
        for place in result.places:
            self._ready_since.setdefault(place.gang.key, now)
            record = place.record
            text = encode_record(record)
            if len(text) > RECORD_LIMIT:
                log.warning("gang placement too large to record: a member a crash leaves "
                            "unbound is placed afresh", extra={"gang": place.gang.key,
                                                               "bytes": len(text)})
                record, text = (), ""
            writes = [(pod, a.node, claim, devices) for pod, a in place.assignments if pod.dra
                      for claim, devices in claim_devices(pod, a, self.claims.get)]
            self.claims.assume_allocated(writes)
            # plain requests a DRA-only node serves: their claims are made before the Binding
            special = [(pod, a) for pod, a in place.assignments
                       if extended_on(pod, self._nodes[a.node])]
            for pod, assignment in place.assignments:
                self._assume(replace(pod, assignment=assignment,
                                     assignment_raw=encode_assignment(assignment),
                                     node_name=assignment.node, placement=record), 0, True)
            arrived = max((self._pending.get(p.key, (None, started))[1]
                           for p, _ in place.assignments), default=started)
            self._start(place.gang.key, self._bind_gang(
                place, text, writes, special, _Timeline(arrived, started, planned)))
        for finish in result.finishes:
            for pod, assignment in finish.assignments:
                self._assume(replace(pod, node_name=assignment.node, assignment=assignment,
                                     assignment_raw=encode_assignment(assignment)), 0, True)
            self._start(finish.gang.key, self._finish(finish))
        for strip in result.strips:
            self._start(strip.gang.key, self._strip(strip))
        self._report_waits(result.waits, now)
        live = set(result.gangs) | set(self._inflight)  # a gang being bound looks bound
        self.queue.retain(live)
        for stale in (self._ready_since, self._last_event):
            for key in [k for k in stale if k not in live]:
                del stale[key]
        counts: dict[str, int] = {}
        for w in result.waits:
            counts[w.kind] = counts.get(w.kind, 0) + 1
        for state in ("members", "unplaceable", "invalid", "blocked", "backoff"):
            self.metrics.pending_gangs.labels(state).set(counts.get(state, 0))
        return result

    @property
    def writing(self) -> bool:
        """True while some gang's writes are in flight."""
        return bool(self._inflight)

    def gpu_counts(self) -> dict[str, tuple[int, int]]:
        """Per node with a topology: (GPUs held by live pods, healthy GPUs)."""
        alloc = self.last_plan.allocation if self.last_plan else None
        return {name: (alloc.assigned_gpus(name) if alloc else 0, len(node.healthy_gpus))
                for name, node in self._nodes.items() if node.topology is not None}

    def _assume(self, pod: PodInfo, min_rv: int, need_bound: bool) -> None:
        self._assumed[pod.key] = _Assumed(pod, min_rv, need_bound)
        self._refresh(pod.key)

    def _unassume(self, key: str) -> None:
        if self._assumed.pop(key, None) is not None:
            self._refresh(key)

    def _start(self, key: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name=f"gang:{key}")
        self._inflight[key] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._inflight.get(key) is t:
                del self._inflight[key]
            if not t.cancelled() and t.exception() is not None:
                log.error("gang write failed", extra={"gang": key},
                          exc_info=t.exception())
                self.metrics.placements.labels("error").inc()
            self._dirty.set()

        task.add_done_callback(done)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Fire-and-forget writes (Events, status conditions), cancelled on shutdown. At most
        `report_concurrency` run at once: in a burst they queue behind the assignments and
        Bindings instead of taking a third of the API calls (kube-scheduler's Events, too, go
        out from a queue of their own)."""
        async def run() -> None:
            try:
                async with self._report_slots:
                    await work
            except Exception as exc:  # best effort: never let a report disturb binding
                log.info("report not written", extra={"error": repr(exc)})
            finally:
                work.close()  # cancelled while queued: closed, not left "never awaited"
        task = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- writes -----------------------------------------------------------------------------

    def _check_fence(self) -> None:
        if not self._fence():
            raise WriteFenced("not leader")

    async def _unannotate(self, pod: PodInfo) -> None:
        self._check_fence()
        ops = [{"op": "test", "path": "/metadata/resourceVersion",
                "value": pod.resource_version},
               {"op": "remove", "path": _ANN_PATH}]
        obj = await self.api.patch(PODS, pod.name, ops, pod.namespace, patch_type="json")
        written = parse_pod(obj, self.config.scheduler_name)
        self._assume(written, _rv(written.resource_version), False)
        self._generation += 1
        self.metrics.stripped.inc()

    async def _unreserve(self, pod: PodInfo) -> None:
        """Let go of an unbound pod's reservation: its claims' allocations, or its annotation."""
        if not pod.dra:
            await self._unannotate(pod)
            return
        results = await asyncio.gather(*(self.claims.let_go(k, pod.uid)
                                         for k in pod.held_claims), return_exceptions=True)
        self._raise_unexpected(results)
        self._generation += 1
        self.metrics.stripped.inc()

    async def _bind(self, pod: PodInfo, assignment: GpuAssignment, record: str) -> None:
        """The Binding, with the pod's assignment and its gang's record (empty: none) as
        annotations that the API server writes onto the pod with spec.nodeName."""
        self._check_fence()
        # a DRA pod's claims are its record: an annotation would be a second, forgeable one
        annotations = {} if pod.dra else {keys.ANN_GPU_ASSIGNMENT: encode_assignment(assignment)}
        if record:
            annotations[keys.ANN_GANG_PLACEMENT] = record
        try:
            await self.api.bind(pod.namespace, pod.name, assignment.node, uid=pod.uid or None,
                                annotations=annotations)
        except ApiError as exc:
            if not (exc.conflict and f"node {assignment.node}" in exc.message):
                raise
            # already bound to this node: an earlier attempt succeeded after all

    async def _make_special(self, special: Sequence[tuple[PodInfo, GpuAssignment]]
                            ) -> list[tuple[PodInfo, GpuAssignment]] | None:
        """Create the special claim of each pod whose plain requests a DRA-only node serves;
        the pods as served by them (None, and none left, when one could not be created)."""
        results = await asyncio.gather(*(self.claims.create(special_claim(
            p.namespace, p.name, p.uid, p.extended)) for p, _ in special
            if isinstance(p.extended, tuple)), return_exceptions=True)  # extended_on chose them
        made = [r for r in results if isinstance(r, ClaimInfo)]
        if len(made) < len(results):
            await asyncio.gather(*(self.claims.delete(c.key) for c in made),
                                 return_exceptions=True)
            self._raise_unexpected(results)
            return None
        return [(resolve(self._extend(replace(p, node_name=None, assignment=None,
                                              assignment_raw=None)), self.claims.get), a)
                for p, a in special]

    async def _write_status(self, pod: PodInfo) -> None:
        """Name the pod's special claim in its status for the kubelet (before its Binding, as
        kube-scheduler does), unless the status names it already."""
        pc = pod.claims
        if pc is None or not pc.extended or pod.extended_status == pc.names[0][1] or \
                not isinstance(pod.extended, tuple):
            return
        self._check_fence()
        await self.api.patch(PODS, pod.name, pod_status(pod.uid, pc.names[0][1], pod.extended),
                             pod.namespace, subresource="status")

    async def _claim(self, pods: Sequence[tuple[PodInfo, GpuAssignment]],
                     writes: list[ClaimWrite]) -> bool:
        """Allocate the claims and write the pods' statuses; True when all were written.
        Otherwise nothing is left: allocations are released, special claims deleted."""
        if writes and not await self.claims.allocate(writes):
            await self._let_go(w[2] for w in writes)
            return False
        results = await asyncio.gather(*(self._write_status(p) for p, _ in pods),
                                       return_exceptions=True)
        if any(isinstance(r, BaseException) for r in results):
            log.info("pod status not written", extra={"errors": [
                str(r) for r in results if isinstance(r, BaseException)]})
            await self._let_go(w[2] for w in writes)
            await asyncio.gather(*(self.claims.release(w[2].key, w[0].uid) for w in writes
                                   if w[2].extended_for is None), return_exceptions=True)
            self._raise_unexpected(results)
            return False
        return True

    async def _let_go(self, claims: Iterable[ClaimInfo]) -> None:
        """Delete the special claims among `claims` (best effort: a later cycle finds them)."""
        await asyncio.gather(*(self.claims.delete(c.key) for c in claims
                               if c.extended_for is not None), return_exceptions=True)

    async def _bind_gang(self, place: Place, record: str, writes: list[ClaimWrite],
                         special: Sequence[tuple[PodInfo, GpuAssignment]],
                         timeline: _Timeline) -> None:
        gang = place.gang
        served = await self._make_special(special) if special else []
        if served is not None:
            by_key = {p.key: (p, a) for p, a in served}
            pods = tuple(by_key.get(p.key, (p, a)) for p, a in place.assignments)
            writes = writes + [(p, a.node, claim, devices) for p, a in served
                               for claim, devices in claim_devices(p, a, self.claims.get)]
        if served is None or not await self._claim(pods, writes):
            # someone else allocated a claim first, or a write failed: nothing of the gang is
            # bound, and the next cycle plans it again from what the informers show
            for pod, _ in place.assignments:
                self._unassume(pod.key)
            self.metrics.placements.labels("conflict").inc()
            log.info("claim allocation failed: gang planned again", extra={"gang": gang.key})
            return
        failed = await self._bind_all(gang.key, pods, "placed", record)
        timeline.bound = time.perf_counter()
        stages = timeline.stages()
        for stage, seconds in stages.items():
            self.metrics.stage_seconds.labels(stage).observe(seconds)
        # a member whose Binding failed is bound from the record on a later cycle
        self.metrics.placements.labels("conflict" if failed else "placed").inc()
        self.queue.forget(gang.key)
        started = self._ready_since.pop(gang.key, None)
        if started is not None and not failed:
            self.metrics.bind_seconds.observe(max(0.0, self._clock() - started))
        log.info("gang bound", extra={
            "gang": gang.key, "members": len(pods), "failed": failed,
            "nodes": place.placement.nodes_used, "gbps": round(place.placement.gang_gbps, 1),
            **{f"{stage}_ms": round(seconds * 1e3, 1) for stage, seconds in stages.items()}})
        for pod, a in pods:
            gpus = ",".join(str(i) for c in a.containers.values() for i in c.indices)
            self._spawn(self.recorder.emit(
                self._raw(pod) or _ref(pod), "Normal", "Scheduled",
                f"Successfully assigned {pod.key} to {a.node}"
                + (f" (GPUs {gpus})" if gpus else "") + f" as part of gang {gang.key}"))

    def _raw(self, pod: PodInfo) -> dict[str, Any] | None:
        pending = self._pending.get(pod.key)
        return pending[0] if pending is not None else None

    async def _bind_in_turn(self, pod: PodInfo, assignment: GpuAssignment, record: str) -> None:
        """GPU pods on a node whose agent acknowledges them go one at a time (binder.gate)."""
        node = assignment.node
        # the kubelet names a DRA pod's claim to the driver: no need to hold the node
        if pod.gpus > 0 and not pod.dra and self._acks_allocation(node):
            await self.gate.bind(node, pod.key, lambda: self._bind(pod, assignment, record))
        else:
            await self._bind(pod, assignment, record)

    async def _bind_all(self, gang: str, targets: Sequence[tuple[PodInfo, GpuAssignment]],
                        path: str, record: str = "") -> int:
        """Bind every target at once; how many Bindings failed."""
        results = await asyncio.gather(*(self._bind_in_turn(p, a, record) for p, a in targets),
                                       return_exceptions=True)
        failed = 0
        for (pod, _), r in zip(targets, results, strict=True):
            if isinstance(r, BaseException):
                # reserved by its gang's record (or its own annotation) if a member is bound:
                # the recovery rule binds it on a later cycle; else the gang is placed afresh
                failed += 1
                self._unassume(pod.key)
                log.warning("binding failed", extra={"gang": gang, "pod": pod.key,
                                                     "error": str(r)})
            else:
                self.metrics.bindings.labels(path).inc()
        self._raise_unexpected(results)
        return failed

    async def _finish(self, finish: Finish) -> None:
        log.info("binding reserved members", extra={"gang": finish.gang.key,
                                                    "members": len(finish.assignments)})
        # a special claim allocated by a binder that stopped before the pod's status named it
        results = await asyncio.gather(*(self._write_status(p) for p, _ in finish.assignments),
                                       return_exceptions=True)
        self._raise_unexpected(results)
        ready = []
        for (pod, assignment), r in zip(finish.assignments, results, strict=True):
            if r is None:
                ready.append((pod, assignment))
            else:
                self._unassume(pod.key)  # bound from its claim on a later cycle
        await self._bind_all(finish.gang.key, ready, "recovered")

    async def _strip(self, strip: Strip) -> None:
        log.info("removing assignments of unbound members", extra={
            "gang": strip.gang.key, "members": len(strip.pods), "reason": strip.reason})
        results = await asyncio.gather(*(self._unreserve(p) for p in strip.pods),
                                       return_exceptions=True)
        self._raise_unexpected(results)

    @staticmethod
    def _raise_unexpected(results: Any) -> None:
        """API errors are expected (conflicts, deleted pods); anything else is a bug, and
        cancellation or fencing must propagate."""
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, ApiError):
                raise r

    # --- reporting --------------------------------------------------------------------------

    def _report_waits(self, waits: Sequence[Wait], now: float) -> None:
        # a waiting gang's timeout is reported when it falls, not at the next event
        self._next_timeout = min((w.gang.created + w.gang.timeout_seconds for w in waits
                                  if w.gang.timeout_seconds is not None and not w.timed_out),
                                 default=None)
        for w in waits:
            key = w.gang.key
            if w.kind in ("unplaceable", "blocked"):
                self._ready_since.setdefault(key, now)
            if w.kind in ("unplaceable", "invalid", "blocked"):
                last = self._last_event.get(key)
                if w.kind != "blocked":
                    self.metrics.placements.labels(w.kind).inc()
                # only a tried placement backs off. An invalid gang waits for its own objects
                # (claims the resourceclaim controller makes, its PodGroup): looked at every
                # cycle, placed in the first that finds it whole. A blocked one tried nothing.
                if w.kind == "unplaceable":
                    new = self.queue.failed(key, now, self._generation, w.reason, w.reserves)
                else:
                    new = w.kind == "invalid" and (last is None or last[0] != w.reason)
                if new or last is None or last[0] != w.reason or \
                        now - last[1] >= self.config.event_interval:
                    self._last_event[key] = (w.reason, now)
                    log.info("gang waits", extra={"gang": key, "kind": w.kind,
                                                  "reason": w.reason})
                    self._announce(w, "FailedScheduling",
                                   f"gang {key} cannot be placed: {w.reason}", new)
            if w.timed_out and self.queue.mark_timeout_reported(key, now):
                why = w.reason or "still waiting"
                log.warning("gang timed out", extra={"gang": key, "reason": why})
                self._announce(w, "GangScheduleTimeout",
                               f"gang {key} was not scheduled within "
                               f"{w.gang.timeout_seconds}s: {why}", True)

    def _announce(self, w: Wait, reason: str, message: str, condition: bool) -> None:
        for pod in w.gang.members:
            if pod.bound:
                continue
            raw = self._raw(pod)
            self._spawn(self.recorder.emit(raw or _ref(pod), "Warning", reason, message))
            if condition and raw is not None:
                self._spawn(self._set_unschedulable(pod, raw, message))

    async def _set_unschedulable(self, pod: PodInfo, raw: dict[str, Any], message: str) -> None:
        """PodScheduled=False reason Unschedulable, as kube-scheduler reports it."""
        conditions = [c for c in (raw.get("status") or {}).get("conditions") or ()
                      if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                           "message": message[:1024],
                           "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                               time.gmtime(self._clock()))})
        try:
            await self.api.patch(PODS, pod.name, {"status": {"conditions": conditions}},
                                 pod.namespace, subresource="status")
        except ApiError as exc:
            log.info("could not set PodScheduled condition",
                     extra={"pod": pod.key, "error": str(exc)})


def _ref(pod: PodInfo) -> dict[str, Any]:
    """The minimal object an Event can refer to, when the raw pod is not cached."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                         "resourceVersion": pod.resource_version}}
