"""Muster's preemption on the bench's clusters: the binder's planning cycle
(`planner.plan_gangs` with the planner `webhook.binder.preemption.preempter`, which tests each
fit with that cycle and the binder's placement function; the binder's `--preemption
LowerPriority`) on the pods, nodes and node states the binder would read: Node objects with the
network labels and topology annotation, pods as the webhook annotates them, running ones bound
with their GPU assignment (imported by bench/bench_preemption.py and
tests/topology/test_preemption_sim.py; no timing here). `BinderCycle` is the controller's own
cycle on those pods: its Snapshot, Preemptions and node groups kept from cycle to cycle."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

from bench.bench_topology import node_object
from bench.preemption_sim import HIGH, Decision, saved_work
from bench.preemption_sim import Running as SimRunning
from bench.topology_sim import Cluster, ClusterSpec, Job, Placement, node_name
from webhook import keys
from webhook.binder.allocation import Allocation
from webhook.binder.assignment import assigned_indices, build_assignment, encode_assignment
from webhook.binder.evict import Evictor
from webhook.binder.fit import FitCache
from webhook.binder.gangs import Gang, assemble
from webhook.binder.metrics import Metrics
from webhook.binder.nodes import NodeInfo, parse_node
from webhook.binder.planner import Place, Plan, PlanConfig, plan_gangs
from webhook.binder.pods import parse_pod
from webhook.binder.preempting import Preemptions
from webhook.binder.preemption import Running, preempter
from webhook.binder.queue import GangQueue
from webhook.binder.snapshot import Snapshot
from webhook.kube.api import KubeApi
from webhook.kube.events import EventRecorder
from webhook.topology import codec
from webhook.topology.gpu_choice import TableCache
from webhook.topology.groups import NodeGroups
from webhook.topology.hierarchy import place_gang
from webhook.topology.network import Levels

#: the bench's minute 0, in seconds since the epoch (pods' creation times count from it)
EPOCH = 1795237200.0
NAMESPACE = "bench"


def stamp(minutes: float) -> str:
    return datetime.fromtimestamp(EPOCH + minutes * 60, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def topology_annotation(level: str, mode: str = "preferred") -> str:
    """A gang's request as the webhook annotates its pods: one domain of `level`."""
    return json.dumps({"v": 1, "mode": "preferred", "singleNode": False, "minRingGBps": None,
                       "network": {"level": level, "mode": mode}})


def pod_object(job: Job, index: int, priority: int, created: float, topology: str, *,
               bound: tuple[str, str] | None = None, started: float = 0.0,
               checkpointed: float | None = None) -> dict[str, Any]:
    """Member `index` of the job's gang: pending, or `bound` (node, assignment) and running
    since `started` (status.startTime, as the kubelet sets it), its job's last checkpoint at
    `checkpointed` (muster.io/last-checkpoint-time, as the job writes it; None: it says
    none), all in the bench's minutes."""
    ann = {keys.ANN_GANG_NAME: f"j{job.id}", keys.ANN_GANG_MIN_MEMBER: str(job.pods),
           keys.ANN_GPU_TOPOLOGY: topology}
    if checkpointed is not None:
        ann[keys.ANN_LAST_CHECKPOINT] = stamp(checkpointed)
    spec: dict[str, Any] = {
        "schedulerName": keys.DEFAULT_BINDER_SCHEDULER_NAME, "priority": priority,
        "containers": [{"name": "main", "image": "train:1", "resources": {
            "limits": {"cpu": "1", "memory": "1Gi", keys.GPU_RESOURCE: str(job.pod_gpus)}}}],
        "tolerations": [{"key": keys.TAINT_GPU_TOPOLOGY, "operator": "Exists",
                         "effect": "NoSchedule"}]}
    if bound is not None:
        spec["nodeName"], ann[keys.ANN_GPU_ASSIGNMENT] = bound
    name = f"j{job.id}-{index}"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"u-{name}",
                         "resourceVersion": "1", "creationTimestamp": stamp(created),
                         "annotations": ann, "labels": {}},
            "spec": spec, "status": {"phase": "Running", "startTime": stamp(started)} if bound
            else {"phase": "Pending"}}


def binder_nodes(spec: ClusterSpec) -> dict[str, NodeInfo]:
    """The cluster's nodes as the binder parses their Node objects."""
    c = Cluster(spec)
    return {name: parse_node(node_object(name, c.labels[name], codec.encode(t),
                                         gpus=spec.gpus_per_node))
            for name, t in zip(c.names, spec.node_topologies, strict=True)}


class MusterPreemption:
    """The `Preempt` of bench/preemption_sim.py that asks the binder's planner."""

    def __init__(self, spec: ClusterSpec, tables: TableCache, checkpoint: float = 0.0) -> None:
        self.spec = spec
        #: minutes between the checkpoints each job says it made (on its running pods,
        #: muster.io/last-checkpoint-time); 0: the jobs say none
        self.checkpoint = checkpoint
        self.nodes = binder_nodes(spec)
        self.index = {n: i for i, n in enumerate(self.nodes)}
        self.config = PlanConfig(keys.DEFAULT_BINDER_SCHEDULER_NAME, levels=Levels(spec.levels),
                                 preemption="LowerPriority")  # the binder's --preemption
        self.place = functools.partial(place_gang, tables=tables)  # as the controller
        self.fit = FitCache()
        self.request = topology_annotation(spec.leaf_label)
        #: running ones, by (job, start, last checkpoint said): a new word, new pods
        self._gangs: dict[tuple[int, float, float | None], Gang] = {}

    def gang(self, job: Job, priority: int, created: float,
             placement: Placement | None = None, started: float = 0.0, *,
             checkpointed: float | None = None) -> Gang:
        """The job's gang as `gangs.assemble` makes it of its pods: pending, or bound to
        `placement` and running since `started` (its last checkpoint at `checkpointed`)."""
        pods = []
        for k in range(job.pods):
            bound = None
            if placement is not None:
                i, gpus = placement[k]
                name = node_name(i)
                a = build_assignment(name, self.spec.node_topologies[i], gpus,
                                     [("main", len(gpus))])
                bound = (name, encode_assignment(a))
            pods.append(parse_pod(pod_object(job, k, priority, created, self.request, bound=bound,
                                             started=started, checkpointed=checkpointed)))
        return assemble(pods, self.config.scheduler_name, None)[f"{NAMESPACE}/j{job.id}"]

    def running(self, lower: Sequence[SimRunning], now: float = 0.0) -> list[Running]:
        keep = {(r.job.id, r.start, self.saved(r, now)): r for r in lower}
        self._gangs = {k: g for k, g in self._gangs.items() if k in keep}
        for k, r in keep.items():
            if k not in self._gangs:
                # created when it was submitted (its queue time is no work lost), started
                # when it was placed
                self._gangs[k] = self.gang(r.job, r.priority, r.job.arrival, r.placement,
                                           r.start, checkpointed=k[2])
        return [Running(self._gangs[k]) for k in keep]

    def saved(self, r: SimRunning, now: float) -> float | None:
        """When the gang's job last checkpointed by `now`, as it says (None: not yet, or the
        jobs say nothing): every `checkpoint` minutes of its run, as the sim saves it."""
        done = saved_work(r, now, self.checkpoint)
        return r.start + r.overhead + done if done > 0 else None

    def cycle(self, c: Cluster, preemptor: Gang, running: Sequence[Running], now: float
              ) -> Plan:
        """The binder's planning cycle for the waiting gang, preemption allowed: it places
        the gang, or has the planner's victims and the place it will then take in
        `Plan.preempts`."""
        at = EPOCH + now * 60
        states = dict(zip(c.names, c.states, strict=True))
        return plan_gangs({preemptor.key: preemptor}, Allocation({}), states, self.nodes,
                          config=self.config, queue=GangQueue(), fit=self.fit, place=self.place,
                          now=at, preempt=preempter(lambda: running, self.nodes,
                                                    config=self.config, place=self.place,
                                                    now=at, fit=self.fit))

    def __call__(self, c: Cluster, job: Job, lower: Sequence[SimRunning], free: int,
                 now: float) -> Decision | None:
        plan = self.cycle(c, self.gang(job, HIGH, job.arrival), self.running(lower, now), now)
        if plan.places:  # it fits after all (the sim's placement found none)
            return self.placement(plan.places[0]), []
        if not plan.preempts:
            return None
        by_key = {f"{NAMESPACE}/j{r.job.id}": r for r in lower}
        return (self.placement(plan.preempts[0].place),
                [by_key[v.key] for v in plan.preempts[0].victims])

    def placement(self, place: Place) -> Placement:
        return [(self.index[a.node], tuple(sorted(assigned_indices(a))))
                for _, a in place.assignments]


class BinderCycle:
    """`Controller.cycle`'s planning on pods the binder's informer would hold (the running
    gangs' and the preemptor's): the open gangs and node states from its Snapshot, the
    candidates from its Preemptions (`Snapshot.running_gangs`, every running gang), its node
    groups and FitCache kept across cycles. Nothing is written: the plan is returned."""

    def __init__(self, mp: MusterPreemption, running: Sequence[Running], preemptor: Gang
                 ) -> None:
        self.mp = mp
        self.snapshot = Snapshot(mp.config.scheduler_name)
        for r in running:
            for pod in r.gang.members:
                self.snapshot.put(pod)
        for pod in preemptor.members:
            self.snapshot.put(pod)
        # the bench evicts nothing: no API behind the evictor (Preemptions reads its refusals)
        self.preemptions = Preemptions(
            Evictor(cast(KubeApi, None), cast(EventRecorder, None), Metrics(),
                    lambda _pod: None, lambda: None), self.snapshot)
        self.groups = NodeGroups()

    def __call__(self, now: float) -> Plan:
        mp, snap, at = self.mp, self.snapshot, EPOCH + now * 60
        gangs = snap.open_gangs(None, mp.config.podgroup_default_timeout)
        return plan_gangs(gangs, snap.allocation, snap.node_states(mp.nodes), mp.nodes,
                          config=mp.config, queue=GangQueue(), fit=mp.fit, place=mp.place,
                          now=at, neighbours=snap.neighbours(mp.nodes, mp.fit.labels(mp.nodes)),
                          groups=self.groups,
                          preempt=self.preemptions.planner(mp.nodes, config=mp.config,
                                                           place=mp.place, fit=mp.fit, now=at,
                                                           pod_groups=None),
                          reserved=self.preemptions.reserved)
