"""Prometheus metrics of the binder (a registry per binder: tests run several replicas)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

_BIND_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

#: fine at the low end: a placed gang's stages take milliseconds each
_STAGE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0, 30.0,
                  300.0)

#: per node: (GPUs assigned, GPUs total)
GpuCounts = Callable[[], Mapping[str, tuple[int, int]]]


class _NodeGpus(Collector):
    """GPUs assigned vs total per node, computed at scrape time from the latest cycle (setting
    10,000 gauge children on every cycle would cost more than the cycle on big clusters)."""

    def __init__(self, source: GpuCounts) -> None:
        self._source = source

    def collect(self) -> Iterable[GaugeMetricFamily]:
        assigned = GaugeMetricFamily("muster_binder_node_gpus_assigned",
                                     "GPUs held by live pods, per node", labels=["node"])
        total = GaugeMetricFamily("muster_binder_node_gpus",
                                  "Healthy GPUs of the node's published topology",
                                  labels=["node"])
        for node, (used, size) in sorted(self._source().items()):
            assigned.add_metric([node], used)
            total.add_metric([node], size)
        yield assigned
        yield total


class Metrics:
    def __init__(self, node_gpus: GpuCounts | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.pending_gangs = Gauge(
            "muster_binder_pending_gangs", "Gangs with unbound members, by state (waiting for "
            "members, unplaceable, invalid, queued)", ["state"], registry=r)
        self.bind_seconds = Histogram(
            "muster_binder_gang_bind_duration_seconds",
            "From the moment a gang had minMember members pending (as the binder saw it) to its "
            "last Binding", buckets=_BIND_BUCKETS, registry=r)
        self.stage_seconds = Histogram(
            "muster_binder_gang_stage_duration_seconds",
            "Where a placed gang's time goes, by stage: queued (the informer's update of its "
            "last member to the start of the cycle that placed it, waits for resources "
            "included), plan (that cycle's planning), bind (its Bindings, each carrying the "
            "member's assignment)", ["stage"], buckets=_STAGE_BUCKETS, registry=r)
        self.placements = Counter(
            "muster_binder_placements", "Placement attempts by outcome (placed, unplaceable, "
            "invalid, conflict: a Binding failed, error)", ["outcome"], registry=r)
        self.bindings = Counter(
            "muster_binder_bindings", "Pods bound, by path (placed, recovered)", ["path"],
            registry=r)
        self.stripped = Counter(
            "muster_binder_assignments_removed", "Assignment annotations removed from unbound "
            "pods during recovery (written by a binder that annotated before binding)", registry=r)
        self.cycle_seconds = Histogram(
            "muster_binder_cycle_duration_seconds", "Planning time of one scheduling cycle",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0), registry=r)
        self.allocation_timeouts = Counter(
            "muster_binder_allocation_wait_timeouts", "GPU pods the node agent did not "
            "acknowledge within --allocation-wait-seconds (the node's next pod was bound "
            "anyway)", registry=r)
        self.preemptions = Counter(
            "muster_binder_preemptions", "Preemptions by outcome (evicted: every victim gang "
            "evicted; refused: the API refused a victim's eviction, a PodDisruptionBudget)",
            ["outcome"], registry=r)
        self.preempted_gangs = Counter(
            "muster_binder_preempted_gangs", "Gangs evicted whole for a gang of higher priority",
            registry=r)
        self.is_leader = Gauge("muster_binder_leader", "1 while this replica leads", registry=r)
        if node_gpus is not None:
            r.register(_NodeGpus(node_gpus))

    def render(self) -> bytes:
        return generate_latest(self.registry)
