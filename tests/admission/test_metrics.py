"""The webhook's lock-free request series expose exactly what prometheus_client's own Counter
and Histogram would for the same observations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from webhook.admission.metrics import _LATENCY_BUCKETS, Metrics

observations = st.lists(st.tuples(
    st.sampled_from(["mutate", "validate"]), st.sampled_from(["allowed", "patched", "denied"]),
    # bucket bounds themselves included: a value equal to a bound counts in that bucket
    st.sampled_from(_LATENCY_BUCKETS) | st.floats(0, 30, allow_nan=False)), max_size=40)


def _series(text: bytes, names: tuple[str, ...]) -> set[str]:
    return {line for line in text.decode().splitlines()
            if line.startswith(names) and "_created" not in line}


@settings(max_examples=100, deadline=None)
@given(seen=observations, decisions=st.lists(st.sampled_from(["a", "b", "mpi-volcano"])),
       audits=st.lists(st.tuples(st.sampled_from(["a", "mpi-volcano"]),
                                 st.sampled_from(["gang", "istio", "none"]))))
def test_same_exposition_as_prometheus_client(seen: list[tuple[str, str, float]],
                                              decisions: list[str],
                                              audits: list[tuple[str, str]]) -> None:
    ours = Metrics()
    registry = CollectorRegistry()
    requests = Counter("muster_admission_requests", "", ["endpoint", "outcome"],
                       registry=registry)
    latency = Histogram("muster_admission_request_duration_seconds", "",
                        ["endpoint", "outcome"], buckets=_LATENCY_BUCKETS, registry=registry)
    policies = Counter("muster_policy_decisions", "", ["policy"], registry=registry)
    audited = Counter("muster_policy_audit", "", ["policy", "action"], registry=registry)
    for endpoint, outcome, seconds in seen:
        ours.observe_request(endpoint, outcome, seconds)
        requests.labels(endpoint, outcome).inc()
        latency.labels(endpoint, outcome).observe(seconds)
    for name in decisions:
        ours.count_decision(name)
        policies.labels(name).inc()
    for name, action in audits:
        ours.count_audit(name, action)
        audited.labels(name, action).inc()
    names = ("muster_admission_request", "muster_policy_decisions", "muster_policy_audit")
    assert _series(ours.render(), names) == _series(generate_latest(registry), names)
