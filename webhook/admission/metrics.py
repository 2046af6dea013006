"""Prometheus metrics of the admission server (a registry per server: tests run several).

The per-request series (request count and latency, policy decisions) are plain integers that a
collector turns into metric families when /metrics is scraped: prometheus_client's own
counters take a lock on every increment, which showed in the webhook's per-request profile.
Everything runs on the event loop thread, so no lock is needed.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _Series:
    """One (endpoint, outcome): requests answered, their total seconds, count per bucket."""

    __slots__ = ("buckets", "count", "seconds")

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self.buckets = [0] * (len(_LATENCY_BUCKETS) + 1)  # the last one: +Inf


class _RequestStats(Collector):
    """Requests by (endpoint, outcome) with their latency histogram, and decisions by policy."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str], _Series] = {}
        self.decisions: dict[str, int] = {}
        self.audits: dict[tuple[str, str], int] = {}

    def observe(self, endpoint: str, outcome: str, seconds: float) -> None:
        series = self.requests.get((endpoint, outcome))
        if series is None:
            series = self.requests[(endpoint, outcome)] = _Series()
        series.count += 1
        series.seconds += seconds
        # a bucket counts values <= its bound: bisect_left finds the first bound >= seconds
        series.buckets[bisect_left(_LATENCY_BUCKETS, seconds)] += 1

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "muster_admission_requests", "Admission requests answered, by endpoint and outcome "
            "(allowed, patched, denied, fail_open, bad_request, too_large, body_timeout, "
            "disconnected, unsupported_media)",
            labels=["endpoint", "outcome"])
        latency = HistogramMetricFamily(
            "muster_admission_request_duration_seconds", "Time to answer an admission request",
            labels=["endpoint", "outcome"])
        bounds = [*map(str, _LATENCY_BUCKETS), "+Inf"]
        for (endpoint, outcome), series in self.requests.items():
            requests.add_metric([endpoint, outcome], series.count)
            cumulative = accumulate(series.buckets)
            latency.add_metric([endpoint, outcome], list(zip(bounds, cumulative, strict=True)),
                               series.seconds)
        decisions = CounterMetricFamily(
            "muster_policy_decisions", "Pods mutated, by policy applied", labels=["policy"])
        for policy, count in self.decisions.items():
            decisions.add_metric([policy], count)
        audits = CounterMetricFamily(
            "muster_policy_audit", "Pods a policy in audit or warn mode matched without changing "
            "them, by policy and what it would have changed (gang, istio, topology, labels, "
            "annotations; none: nothing)", labels=["policy", "action"])
        for (policy, action), count in self.audits.items():
            audits.add_metric([policy, action], count)
        yield requests
        yield latency
        yield decisions
        yield audits


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._stats = _RequestStats()
        r.register(self._stats)
        self.fail_open = Counter(
            "muster_admission_fail_open", "Requests admitted without the full decision, by reason "
            "(deadline, error, podgroup, owner: the job's object not read, namespace: its "
            "labels not known, not_ready)",
            ["reason"], registry=r)
        self.fail_closed = Counter(
            "muster_admission_fail_closed", "Pods of fail-closed namespaces refused where others "
            "are admitted failing open, by the same reasons", ["reason"], registry=r)
        self.bad_requests = Counter(
            "muster_admission_bad_requests", "Requests refused with HTTP 400 (outcome "
            "bad_request), by reason (invalid_json, not_utf8, too_deep, invalid_review, "
            "unsupported_version)", ["reason"], registry=r)
        self.connections_closed = Counter(
            "muster_admission_connections_closed", "Connections the server refused or closed "
            "early, by listener (admission, metrics) and reason (limit: every slot serving a "
            "request; per_source: every slot of the source serving a request; header_timeout: "
            "TLS handshake and first request headers not done within --header-timeout; "
            "pending_evicted, idle_evicted: closed to make room for a new connection)",
            ["listener", "reason"], registry=r)
        self.open_connections = Gauge(
            "muster_admission_open_connections", "Connections open, TLS handshakes included, "
            "by listener (admission, metrics)", ["listener"], registry=r)
        self.reloads = Counter(
            "muster_policy_reloads", "Policy loads from the mounted directory, by result "
            "(success, error)", ["result"], registry=r)
        self.policies_loaded = Gauge(
            "muster_policies_loaded", "Policies in the active set", registry=r)
        self.policy_loaded_at = Gauge(
            "muster_policy_last_reload_success_timestamp_seconds",
            "When the active policy set was loaded", registry=r)
        self.policy_set = Gauge(
            "muster_policy_set_info", "The active policy set, by digest (of the mounted files' "
            "names and contents): replicas that show the same digest serve the same policies",
            ["digest"], registry=r)
        self.podgroup_writes = Counter(
            "muster_podgroup_writes", "PodGroup writes, by result (created, exists, updated, "
            "replaced: a deleted job's; foreign: another controller's, left alone; kept: the "
            "job's, made by someone else, taken as it is; withdrawn: deleted, no pod joins it "
            "since Muster stood aside; dry_run, error)", ["result"], registry=r)
        self.podgroup_cleanups = Counter(
            "muster_podgroup_cleanups", "PodGroups Muster made, deleted because their job "
            "finished or was suspended (as its operator would)", registry=r)
        self.gang_interventions = Counter(
            "muster_gang_interventions", "Gangs Muster changed or held so that none waits "
            "forever, by reason (queue_fallback, queue_without_gang, owner_unavailable_denied, "
            "owner_unavailable_admitted, podgroup_foreign_denied, podgroup_owner_unreadable, "
            "podgroup_replaced, "
            "native_api_denied, native_api_without_gang, stood_aside: a later webhook put the "
            "pod in another gang)",
            ["reason"], registry=r)
        self.cert_expiry = Gauge(
            "muster_certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate in use", registry=r)
        self.cache_objects = Gauge(
            "muster_cache_objects", "Objects held in the cluster caches (namespaces, owners, "
            "podgroups)", ["cache"], registry=r)
        self.cert_reloads = Counter(
            "muster_certificate_reloads", "Serving certificate reloads, by result",
            ["result"], registry=r)

    def observe_request(self, endpoint: str, outcome: str, seconds: float) -> None:
        self._stats.observe(endpoint, outcome, seconds)

    def count_decision(self, policy: str) -> None:
        self._stats.decisions[policy] = self._stats.decisions.get(policy, 0) + 1

    def count_audit(self, policy: str, action: str) -> None:
        key = (policy, action)
        self._stats.audits[key] = self._stats.audits.get(key, 0) + 1

    def render(self) -> bytes:
        return generate_latest(self.registry)
