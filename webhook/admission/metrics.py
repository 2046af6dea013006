"""Prometheus metrics of the admission server (a registry per server: tests run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._request_children: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        self._decision_children: dict[str, Counter] = {}
        self.requests = Counter(
            "muster_admission_requests", "Admission requests answered, by endpoint and outcome "
            "(allowed, patched, denied, fail_open, bad_request, too_large, unsupported_media)",
            ["endpoint", "outcome"], registry=r)
        self.latency = Histogram(
            "muster_admission_request_duration_seconds", "Time to answer an admission request",
            ["endpoint", "outcome"], buckets=_LATENCY_BUCKETS, registry=r)
        self.fail_open = Counter(
            "muster_admission_fail_open", "Requests admitted without the full decision, by reason "
            "(deadline, error, podgroup, not_ready)", ["reason"], registry=r)
        self.decisions = Counter(
            "muster_policy_decisions", "Pods mutated, by policy applied", ["policy"], registry=r)
        self.reloads = Counter(
            "muster_policy_reloads", "Policy loads from the mounted directory, by result "
            "(success, error)", ["result"], registry=r)
        self.policies_loaded = Gauge(
            "muster_policies_loaded", "Policies in the active set", registry=r)
        self.policy_set_info = Gauge(
            "muster_policy_last_reload_success_timestamp_seconds",
            "When the active policy set was loaded", registry=r)
        self.podgroup_writes = Counter(
            "muster_podgroup_writes", "PodGroup writes, by result (created, exists, updated, "
            "dry_run, error)", ["result"], registry=r)
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
        children = self._request_children.get((endpoint, outcome))
        if children is None:  # labels() takes a lock and builds a key: resolve once per pair
            children = (self.requests.labels(endpoint, outcome),
                        self.latency.labels(endpoint, outcome))
            self._request_children[(endpoint, outcome)] = children
        children[0].inc()
        children[1].observe(seconds)

    def count_decision(self, policy: str) -> None:
        child = self._decision_children.get(policy)
        if child is None:  # resolved once per policy name, as above
            child = self._decision_children[policy] = self.decisions.labels(policy)
        child.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
