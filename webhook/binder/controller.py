"""The binder controller: informers in, Bindings out.

Each cycle plans from the informer caches (webhook.binder.planner, pure) and starts the I/O of
the plan as tasks, one per gang (webhook.binder.writes). The Binder only coordinates: its
informer handlers keep the pods' view (webhook.binder.podview, our writes assumed over it) and
DRA's view (webhook.binder.draview) current, its loop runs a cycle when they changed or a
backoff or gang timeout falls, and webhook.binder.reports tells of waiting and bound gangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

from webhook import keys
from webhook.binder.agents import AgentIndex, AgentPod, agent_wait
from webhook.binder.assignment import RECORD_LIMIT, Record, encode_assignment, encode_record
from webhook.binder.claimstate import ClaimState
from webhook.binder.dra import claim_devices
from webhook.binder.draview import DraView
from webhook.binder.evict import Evictor
from webhook.binder.fit import FitCache, extended_on
from webhook.binder.gangs import PodGroupInfo
from webhook.binder.gate import AllocationGate
from webhook.binder.hypernodes import HyperNodeView
from webhook.binder.metrics import Metrics
from webhook.binder.nodes import NodeInfo, parse_node
from webhook.binder.planner import Place, PlaceFn, Plan, PlanConfig, plan_gangs
from webhook.binder.pods import PodInfo, parse_pod
from webhook.binder.podview import PodView
from webhook.binder.preempting import Preemptions
from webhook.binder.queue import GangQueue
from webhook.binder.reports import Reporter, Timeline
from webhook.binder.snapshot import Snapshot
from webhook.binder.sources import Source, Sources
from webhook.binder.topologies import TopologyView, listed
from webhook.binder.writes import Writer, fence_check
from webhook.kube.api import (
    COSCHEDULING_PODGROUPS,
    DEVICE_CLASSES,
    NODES,
    PDBS,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    TOPOLOGIES,
    VOLCANO_HYPERNODES,
    KubeApi,
)
from webhook.kube.events import EventRecorder
from webhook.kube.informer import Informer
from webhook.topology.gpu_choice import TableCache
from webhook.topology.groups import NodeGroups
from webhook.topology.hierarchy import place_gang
from webhook.topology.network import Levels

log = logging.getLogger(__name__)


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
    #: a gang short of members says so once it is this old (its pods come over a few seconds)
    members_event_after: float = 10.0
    #: component name on Events
    component: str = "muster-binder"
    #: the longest a node's next GPU pod waits for the agent to acknowledge the previous one
    allocation_wait_seconds: float = 30.0
    #: Events and status conditions written at once, at most (see webhook.binder.reports)
    report_concurrency: int = 8
    #: the cluster's network levels, node labels widest first, and their aliases, or Volcano's
    #: HyperNode tiers (`--network-levels`)
    network_levels: Levels = field(default_factory=Levels)
    #: whether a gang whose policy does not say may preempt gangs of lower priority
    #: (`--preemption`: "Never" or "LowerPriority")
    preemption: str = "Never"
    #: how often a CRD not served is looked for again (webhook.binder.sources)
    crd_probe_seconds: float = 60.0


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
        self._clock = clock
        scheduler = self.config.scheduler_name
        self.plan_config = PlanConfig(scheduler, self.config.starvation_seconds,
                                      self.config.podgroup_default_timeout,
                                      self.config.network_levels,
                                      preemption=self.config.preemption)
        self.queue = GangQueue(self.config.backoff_initial, self.config.backoff_max)
        self.fit = FitCache()
        self._hypernodes = HyperNodeView() if self.config.network_levels.hypernodes else None
        ref = self.config.network_levels.topology
        self._topology = TopologyView(ref) if ref is not None else None
        if ref is not None:
            self.plan_config = replace(self.plan_config, topology_api=ref.api)
        #: the levels last read from Topograph's labels (logged as they change)
        self._topograph: tuple[str, ...] | None = None
        #: the nodes grouped for the engine, kept across cycles (each cycle regroups only the
        #: nodes whose state changed)
        self.groups = NodeGroups()
        self.gate = AllocationGate(
            self.config.allocation_wait_seconds,
            on_timeout=lambda _node, _pod: self.metrics.allocation_timeouts.inc(),
            acks=self._acks_allocation)
        self.synced = asyncio.Event()
        self.last_plan: Plan | None = None
        self._nodes: dict[str, NodeInfo] = {}
        #: the nodes whose record names each agent pod (webhook.binder.agents)
        self._agents = AgentIndex()
        self._pod_groups: dict[str, PodGroupInfo] | None = None
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._generation = 0
        self._last_cycle = 0.0
        self._dirty = asyncio.Event()
        check_fence = fence_check(fence)
        self.claims = ClaimState(api, changed=self._on_claim_changed, check_fence=check_fence)
        self.snapshot = Snapshot(scheduler)
        self._dra = DraView(scheduler)
        self._pods = PodView(scheduler, self.snapshot, self._dra, self.claims)
        self._reports = Reporter(api, self.recorder, self.metrics, self.queue,
                                 raw=self._pods.raw, event_interval=self.config.event_interval,
                                 members_event_after=self.config.members_event_after,
                                 concurrency=self.config.report_concurrency, clock=clock)
        self._writes = Writer(api, scheduler_name=scheduler, claims=self.claims, gate=self.gate,
                              pods=self._pods, dra=self._dra, reports=self._reports,
                              metrics=self.metrics, queue=self.queue, check_fence=check_fence,
                              acks_allocation=self._acks_allocation, freed=self._freed)
        self.sources = Sources(api, self.config.crd_probe_seconds)
        self.preemptions = Preemptions(
            Evictor(api, self.recorder, self.metrics, self._pods.raw, check_fence),
            self.snapshot)

    # --- informer handlers ----------------------------------------------------------------

    def _on_pod(self, event: str, obj: dict[str, Any], _old: dict[str, Any] | None) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if event == "DELETED":
            self._pods.remove(key)
            self._dra.index_claims(key, None)
            self.gate.release(key)
            self._agent_changed(key)
            self._changed()
            return
        prev = self._pods.get(key)
        pod = parse_pod(obj, self.config.scheduler_name)
        self._dra.index_claims(key, pod)
        self.gate.observe(pod)
        seen_new = self._pods.observe(key, obj, pod)
        self._agent_changed(key)
        freed = _frees(prev, pod)
        if freed:
            self._freed()
        # the echo of our own write (the snapshot showed it already) plans nothing new; such
        # echoes started about a fifth of an arrival run's cycles
        if (prev is None or freed or pod.node_name != prev.node_name
                or (pod.scheduler_name == self.config.scheduler_name and seen_new)):
            self._dirty.set()

    def _agent_changed(self, key: str) -> None:
        """The pod `key` changed: re-decide whether the nodes whose record names it as their
        GPU agent serve GPU pods."""
        for name in self._agents.naming(key):
            node = self._nodes[name]  # (the index holds only nodes the binder has)
            updated = self._with_agent(node)
            if updated != node:
                self._nodes[name] = updated
                self._say_agent(updated)
                self._nodes_changed()

    def _with_agent(self, node: NodeInfo) -> NodeInfo:
        """The node with whether its GPU pods wait for its agent decided."""
        record = node.agent
        pod = self._pods.get(record.key) if isinstance(record, AgentPod) else None
        return replace(node, agent_wait=agent_wait(record, pod, node.name))

    def _say_agent(self, node: NodeInfo) -> None:
        """Log a node's agent coming and going (not while the informers fill up)."""
        if not self.synced.is_set():
            return
        if node.agent_wait is None:
            log.info("node's GPU agent serves: placing GPU pods there", extra={"node": node.name})
        else:
            log.info("node's GPU agent is restarting: no GPU pods placed there",
                     extra={"node": node.name, "why": node.agent_wait})

    def _acks_allocation(self, node: str) -> bool:
        """Its agent's device plugin serves the kubelet and marks the pods it served (label)."""
        info = self._nodes.get(node)
        return info is not None and info.acks_allocation

    def _on_node(self, event: str, obj: dict[str, Any], _old: dict[str, Any] | None) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        before = self._nodes.get(name)
        if event == "DELETED":
            self._nodes.pop(name, None)
            self._agents.put(name, None)
            self.gate.release_node(name)
            node = None
        else:
            node = self._with_agent(replace(parse_node(obj), dra_gpus=self._dra.gpus_on(name)))
            if before == node:
                return  # heartbeat-only change: nothing the binder reads
            self._nodes[name] = node
            self._agents.put(name, node.agent)
            if before is not None and before.agent_wait != node.agent_wait:
                self._say_agent(node)
            if before is not None and before.acks_allocation and not node.acks_allocation:
                # its agent's plugin is no longer registered: no acknowledgement will come
                self.gate.release_node(name)
            if self._tables is not None and node.topology is not None:
                # a new node type's tables (88 ms for a DGX-1) are made as it is seen, not
                # during the first placement on it, which would wait that long
                self._tables.tables(node.topology)
        if self._hypernodes is not None and (before is None or node is None
                                             or before.labels != node.labels):
            self._hypernodes.nodes_changed(name)
        self._nodes_changed()

    def _on_slice(self, event: str, obj: dict[str, Any], _old: dict[str, Any] | None) -> None:
        for node in self._dra.on_slice(event, obj) & self._nodes.keys():
            self._nodes[node] = replace(self._nodes[node], dra_gpus=self._dra.gpus_on(node))
        self._nodes_changed()

    def _on_claim_changed(self, key: str) -> None:
        """A claim's view changed (informer or our write): what it holds, and its users."""
        info = self.claims.get(key)
        held = self.snapshot.remove_claim(key) if info is None else self.snapshot.put_claim(info)
        users = self._dra.on_claim(key, info)
        for user in users:
            self._pods.refresh(user)
        if held or users:  # GPUs let go, or a pod's claim appeared or changed
            self._changed()

    def _on_device_class(self, event: str, obj: dict[str, Any],
                         _old: dict[str, Any] | None) -> None:
        if self._dra.on_device_class(event, obj):
            for key in self._pods.pending():
                self._pods.refresh(key)
            self._nodes_changed()

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

    def _on_hypernode(self, event: str, obj: dict[str, Any],
                      _old: dict[str, Any] | None) -> None:
        assert self._hypernodes is not None
        self._hypernodes.on_event(event, obj)
        self._changed()

    def _on_topology(self, event: str, obj: dict[str, Any],
                     _old: dict[str, Any] | None) -> None:
        view = self._topology
        assert view is not None
        read = view.on_event(event, obj)
        if read.problem:
            log.warning("%s: the binder keeps the levels last read (%s)", read.problem,
                        listed(read.levels))
        if read.changed:
            self.plan_config = replace(self.plan_config, levels=view.levels,
                                       topologies=view.named())
            log.info("network levels from %s%s: %s", read.ref.says,
                     " (the binder's own)" if read.ref == view.ref else "", listed(read.levels))
            self._changed()

    def _levels(self) -> PlanConfig:
        """The plan's config with the HyperNodes' tiers as its levels, where they are read;
        what they left out is logged once per change."""
        if self._hypernodes is None:
            return self.plan_config
        tiers, remade = self._hypernodes.tiers(self._nodes)
        if remade:
            self.plan_config = replace(self.plan_config, levels=tiers.levels,
                                       domains=tiers.domains)
            log.info("network levels from HyperNodes", extra={
                "tiers": list(tiers.levels.tiers), "nodes": len(tiers.domains)})
            for problem in tiers.problems:
                log.warning("HyperNode left out: %s", problem)
        return self.plan_config

    def _say_topograph(self) -> None:
        """The levels read from Topograph's labels, logged when they change (an admin sees what
        `--network-levels topograph` became on these nodes)."""
        net = self.fit.made_network
        if net is None or not net.asked.topograph or net.levels == self._topograph:
            return
        self._topograph = net.levels
        if net.levels:
            log.info("network levels from Topograph's labels", extra={"levels": list(net.levels)})
        else:
            log.warning("network levels: no node carries Topograph's labels; a gang that names "
                        "a level is placed by that label alone")

    def _freed(self) -> None:
        """Resources were let go: a gang that backs off may fit now."""
        self._generation += 1

    def _changed(self) -> None:
        self._generation += 1
        self._dirty.set()

    def _nodes_changed(self) -> None:
        """What nodes offer (a node, its slices, the class serving plain GPU requests) changed:
        the cached fit answers are stale."""
        self.fit.clear()
        self._changed()

    # --- main loop --------------------------------------------------------------------------

    async def run(self) -> None:
        """Watch and bind until cancelled; cancels its own writes on the way out."""
        informers = await self._informers()
        tasks: list[asyncio.Task[None]] = []

        def start(informer: Informer) -> None:  # also for a CRD installed since
            tasks.append(asyncio.create_task(informer.run(),
                                             name=f"informer:{informer.resource.plural}"))
        for informer in informers:
            start(informer)
        try:
            for informer in informers:
                await informer.synced.wait()
            self.synced.set()
            tasks.append(asyncio.create_task(self.sources.await_late(start), name="late-crds"))
            if self._topology is not None and not self._topology.seen:
                log.warning("%s not found: no network levels until it is created (a gang that "
                            "names a level is placed by that label alone)",
                            self._topology.ref.says)
            log.info("binder synced", extra={"pods": len(self._pods),
                                             "nodes": len(self._nodes),
                                             "scheduler": self.config.scheduler_name})
            await self._loop()
        finally:
            pending: list[asyncio.Task[Any]] = [*tasks, *self._inflight.values()]
            for task in pending:
                task.cancel()
            pending += self._reports.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            self._inflight.clear()

    async def _informers(self) -> list[Informer]:
        """An informer, with its handler, for each resource the binder reads and is served (the
        CRDs that are not are awaited: webhook.binder.sources)."""
        informers = [Informer(self.api, PODS), Informer(self.api, NODES),
                     Informer(self.api, PDBS)]
        informers[0].add_handler(self._on_pod)
        informers[1].add_handler(self._on_node)
        informers[2].add_handler(self.preemptions.on_pdb)
        dra = "resource not served: no DRA claims are allocated"
        optional = [
            Source((RESOURCE_SLICES,), self._on_slice, dra, late=False),
            Source((RESOURCE_CLAIMS,), self.claims.on_event, dra, late=False),
            Source((DEVICE_CLASSES,), self._on_device_class, dra, late=False),
            Source((COSCHEDULING_PODGROUPS,), self._on_pod_group,
                   "coscheduling PodGroup CRD not installed: only muster.io gang annotations "
                   "until it is", found=self._pod_groups_served)]
        if self._hypernodes is not None:  # (asked for: its absence is worth a warning)
            optional.append(Source((VOLCANO_HYPERNODES,), self._on_hypernode,
                                   "Volcano's HyperNode CRD not installed: no network levels "
                                   "until it is", logging.WARNING))
        if self._topology is not None:
            optional.append(Source(TOPOLOGIES[self._topology.ref.api], self._on_topology,
                                   f"{self._topology.ref.says}: the Topology CRD is not "
                                   "installed: no network levels until it is", logging.WARNING))
        return informers + await self.sources.informers(optional)

    def _pod_groups_served(self) -> None:
        if self._pod_groups is None:
            self._pod_groups = {}

    async def _loop(self) -> None:
        while True:
            deadline = min((d for d in (self.queue.next_deadline(after=self._last_cycle),
                                        self._reports.next_timeout) if d is not None),
                           default=None)
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
                self.groups = NodeGroups()  # (a cycle cut short may have left them half-kept)
                self.metrics.placements.labels("error").inc()
                await asyncio.sleep(1.0)
                self._dirty.set()
            await asyncio.sleep(0)  # let handlers and writes run between cycles

    def cycle(self) -> Plan:
        """Plan once from the caches and start the plan's writes."""
        started = time.perf_counter()
        now = self._last_cycle = self._clock()
        gangs = self.snapshot.open_gangs(self._pod_groups,
                                         self.plan_config.podgroup_default_timeout)
        config = self._levels()
        self.preemptions.prune(gangs, now)
        result = plan_gangs(gangs, self.snapshot.allocation,
                            self.snapshot.node_states(self._nodes), self._nodes,
                            config=config, queue=self.queue, fit=self.fit,
                            place=self._place, now=now, generation=self._generation,
                            inflight=self._inflight.keys(),
                            neighbours=self.snapshot.neighbours(
                                self._nodes, self.fit.labels(self._nodes)),
                            groups=self.groups,
                            preempt=self.preemptions.planner(
                                self._nodes, config=config, place=self._place, fit=self.fit,
                                now=now, pod_groups=self._pod_groups),
                            reserved=self.preemptions.reserved)
        planned = time.perf_counter()
        self.metrics.cycle_seconds.observe(planned - started)
        self.last_plan = result
        self._say_topograph()
        for place in result.places:
            arrived = self._pods.arrived((p.key for p, _ in place.assignments), started)
            self._start_place(place, now, Timeline(arrived, started, planned))
        for finish in result.finishes:
            for pod, assignment in finish.assignments:
                self._pods.assume(replace(pod, node_name=assignment.node, assignment=assignment,
                                          assignment_raw=encode_assignment(assignment)),
                                  0, True)
            self._start(finish.gang.key, self._writes.finish(finish))
        for strip in result.strips:
            self._start(strip.gang.key, self._writes.strip(strip))
        for pe in result.preempts:
            self._start(pe.gang.key, self.preemptions.begin(pe, now))
        self._reports.waits(result.waits, now, self._generation)
        live = set(result.gangs) | set(self._inflight)  # a gang being bound looks bound
        self.queue.retain(live)
        self._reports.retain(live)
        self._reports.gauge_waits(result.waits)
        return result

    def _start_place(self, place: Place, now: float, timeline: Timeline) -> None:
        """Assume a placed gang's writes (its claims', its pods') and start them."""
        self._reports.ready(place.gang.key, now)
        record, text = _record(place)
        writes = [(pod, a.node, claim, devices) for pod, a in place.assignments if pod.dra
                  for claim, devices in claim_devices(pod, a, self.claims.get)]
        self.claims.assume_allocated(writes)
        # plain requests a DRA-only node serves: their claims are made before the Binding
        special = [(pod, a) for pod, a in place.assignments
                   if extended_on(pod, self._nodes[a.node])]
        for pod, assignment in place.assignments:
            self._pods.assume(replace(pod, assignment=assignment,
                                      assignment_raw=encode_assignment(assignment),
                                      node_name=assignment.node, placement=record), 0, True)
        self._start(place.gang.key,
                    self._writes.bind_gang(place, text, writes, special, timeline))

    @property
    def writing(self) -> bool:
        """True while some gang's writes are in flight."""
        return bool(self._inflight)

    def gpu_counts(self) -> dict[str, tuple[int, int]]:
        """Per node with a topology: (GPUs held by live pods, healthy GPUs)."""
        alloc = self.last_plan.allocation if self.last_plan else None
        return {name: (alloc.assigned_gpus(name) if alloc else 0, len(node.healthy_gpus))
                for name, node in self._nodes.items() if node.topology is not None}

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


def _frees(prev: PodInfo | None, pod: PodInfo) -> bool:
    """Whether a pod's update let go of what it held: it ended, or lost its assignment."""
    return prev is not None and (
        (pod.terminated and not prev.terminated)
        or (prev.assignment_raw is not None and pod.assignment_raw is None))


def _record(place: Place) -> tuple[Record, str]:
    """The gang's placement record and its text; none when it is too large to annotate."""
    record = place.record
    text = encode_record(record)
    if len(text) <= RECORD_LIMIT:
        return record, text
    log.warning("gang placement too large to record: a member a crash leaves unbound is "
                "placed afresh", extra={"gang": place.gang.key, "bytes": len(text)})
    return (), ""
