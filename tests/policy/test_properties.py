"""Hypothesis: random pods and policies never crash the engine, and the patch is idempotent."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from webhook import keys
from webhook.demo import EXAMPLE_POLICIES
from webhook.jsonpatch import apply_patch
from webhook.policy import (
    PolicyError,
    PolicySet,
    evaluate,
    explain,
    load_policy_texts,
    render_patch,
)

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
WORKER = yaml.safe_load((EXAMPLE_POLICIES / "tests/objects/worker-team-a.yaml").read_text())
LAUNCHER = yaml.safe_load((EXAMPLE_POLICIES / "tests/objects/launcher-team-a.yaml").read_text())
MPIJOB = yaml.safe_load((EXAMPLE_POLICIES / "tests/objects/mpijob-team-a.yaml").read_text())
JOB = yaml.safe_load((EXAMPLE_POLICIES / "tests/objects/launcher-job.yaml").read_text())

label_values = st.sampled_from(["a", "b", "launcher", "worker", "true", "false"])
selector = st.fixed_dictionaries({}, optional={
    "matchLabels": st.dictionaries(st.sampled_from(["role", "tier"]), label_values, max_size=2),
    "matchExpressions": st.lists(st.one_of(
        st.builds(lambda k, o, v: {"key": k, "operator": o, "values": v},
                  st.sampled_from(["role", "tier"]), st.sampled_from(["In", "NotIn"]),
                  st.lists(label_values, min_size=1, max_size=2)),
        st.builds(lambda k, o: {"key": k, "operator": o}, st.sampled_from(["role", "tier"]),
                  st.sampled_from(["Exists", "DoesNotExist"]))), max_size=2)})
match = st.fixed_dictionaries({}, optional={
    "namespaces": st.lists(st.sampled_from(["team-a", "team-b"]), min_size=1, max_size=2),
    "namespaceSelector": selector,
    "podSelector": selector,
    "ownerKinds": st.lists(st.sampled_from(["kubeflow.org/MPIJob", "batch/Job", "Pod"]),
                           min_size=1, max_size=2),
    "gpus": st.fixed_dictionaries({}, optional={"min": st.integers(0, 2),
                                                "max": st.integers(2, 8)})})
min_available = st.sampled_from(["auto", 1, 2, 5, 9, "50%", "100%"])


@st.composite
def spec(draw: st.DrawFn, priority: int) -> dict[str, Any]:
    out: dict[str, Any] = {"priority": priority, "match": draw(match)}
    backend = draw(st.sampled_from([None, "volcano", "coscheduling", "muster"]))
    if backend:
        gang: dict[str, Any] = {"backend": backend, "minAvailable": draw(min_available)}
        if backend == "volcano" and draw(st.booleans()):
            gang["queue"] = draw(st.sampled_from(["q1", "q2"]))
        if backend != "volcano" and draw(st.booleans()):
            gang["scheduleTimeoutSeconds"] = draw(st.integers(1, 900))
        if draw(st.booleans()):
            gang["minResources"] = draw(st.sampled_from(["auto", "none", {"cpu": "2"}]))
        out["gang"] = gang
        if backend == "muster" and draw(st.booleans()):
            allowed = draw(st.lists(st.sampled_from(["Tesla V100-SXM2-16GB", "NVIDIA A100"]),
                                    max_size=2))
            out["topology"] = {"mode": draw(st.sampled_from(["required", "preferred"])),
                               "singleNode": draw(st.booleans()), "allowedModels": allowed,
                               # a subset of the allowed ones (any other is an error)
                               "preferredModels": draw(st.lists(st.sampled_from(
                                   allowed or ["NVIDIA H100", "NVIDIA A100"]), max_size=2,
                                   unique=True))}
    if draw(st.booleans()):
        out["istio"] = {"optOut": draw(st.sampled_from(
            [True, False, "none", "sidecar", "ambient", "both"]))}
    if draw(st.booleans()):
        out["labels"] = {"team": draw(label_values)}
    if draw(st.booleans()):
        out["annotations"] = {"example.com/note": draw(st.text(max_size=5))}
    if draw(st.integers(0, 2)) == 0:
        out["enforcement"] = draw(st.sampled_from(["enforce", "warn", "audit"]))
    return out


@st.composite
def policy_sets(draw: st.DrawFn) -> PolicySet:
    n = draw(st.integers(0, 5))
    docs = [{"apiVersion": "muster.io/v1alpha1", "kind": "SchedulingPolicy",
             "metadata": {"name": f"p{i}"}, "spec": draw(spec(i))} for i in range(n)]
    try:
        return load_policy_texts({"p.yaml": yaml.safe_dump_all(docs)})
    except PolicyError:
        assume(False)
        raise


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    pod: dict[str, Any] = copy.deepcopy(draw(st.sampled_from([WORKER, LAUNCHER])))
    meta = pod["metadata"]
    meta["namespace"] = draw(st.sampled_from(["team-a", "team-b"]))
    if draw(st.booleans()):
        meta.setdefault("labels", {}).update(draw(st.dictionaries(
            st.sampled_from(["role", "tier", keys.ISTIO_INJECT, keys.ISTIO_DATAPLANE_MODE]),
            label_values, max_size=3)))
    if draw(st.booleans()):
        meta["annotations"] = draw(st.dictionaries(st.sampled_from(
            [keys.ANN_GPU_ASSIGNMENT, keys.ISTIO_INJECT, "x"]), label_values, max_size=2))
    if draw(st.booleans()):
        meta["labels"].pop("training.kubeflow.org/operator-name", None)
    if draw(st.integers(0, 5)) == 0:
        meta.pop("ownerReferences", None)
    spec = pod["spec"]
    if draw(st.booleans()):
        spec.pop("tolerations", None)
    if draw(st.booleans()):
        spec["affinity"] = draw(st.sampled_from([
            {}, {"nodeAffinity": {}},
            {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": []}, {"matchExpressions": []}]}}},
            {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": []}}]}}]))
    spec["containers"][0]["resources"] = {"limits": {keys.GPU_RESOURCE: str(draw(
        st.integers(0, 8)))}}
    return pod


owners_for = st.sampled_from([[], [MPIJOB], [JOB, MPIJOB], [JOB]])


@SETTINGS
@given(pods(), policy_sets(), owners_for,
       st.dictionaries(st.sampled_from(["role", "tier", "kubernetes.io/metadata.name"]),
                       label_values, max_size=2))
def test_patch_applies_and_is_idempotent(pod: dict[str, Any], ps: PolicySet,
                                         owners: list[dict[str, Any]],
                                         ns_labels: dict[str, str]) -> None:
    decision = evaluate(pod, namespace_labels=ns_labels, owners=owners, policies=ps)
    mutated = apply_patch(pod, render_patch(pod, decision))
    again = evaluate(mutated, namespace_labels=ns_labels, owners=owners, policies=ps)
    assert render_patch(mutated, again) == []
    assert again.pod_group == decision.pod_group
    assert again.policies == decision.policies
    assert keys.ANN_GPU_ASSIGNMENT not in mutated["metadata"].get("annotations", {})
    if decision.pod_group is not None:
        assert decision.pod_group.min_member >= 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["metadata", "spec", "labels", "annotations", "ownerReferences", "kind",
                         "apiVersion", "name", "uid", "controller", "containers", "resources",
                         "limits", "replicas", "mpiReplicaSpecs", "Worker", "runPolicy",
                         "schedulingPolicy", "minAvailable", "tolerations", "affinity"]),
        inner, max_size=5),
    max_leaves=25)


@SETTINGS
@given(json_values, st.lists(json_values, max_size=3) | json_values, json_values, policy_sets())
def test_engine_never_crashes_on_any_json(pod: Any, owners: Any, ns_labels: Any,
                                          ps: PolicySet) -> None:
    decision = evaluate(pod, namespace_labels=ns_labels, owners=owners, policies=ps)
    render_patch(pod, decision)


@SETTINGS
@given(json_values, json_values, json_values, policy_sets())
def test_explain_never_crashes(pod: Any, owners: Any, ns_labels: Any, ps: PolicySet) -> None:
    matches = explain(pod, namespace_labels=ns_labels, owners=owners, policies=ps)
    assert [m.policy for m in matches] == list(ps.names)


#: the condition each Decision record names, and how explain's narration starts for it
_CONDITION_WORDS = {"namespace not": "✗ namespace ", "namespaceSelector": "✗ namespaceSelector:",
                    "podSelector": "✗ podSelector:", "no owner": "✗ owner kinds",
                    "GPU count": ("✗ job requests", "✗ pod requests")}


@SETTINGS
@given(pods(), policy_sets(), owners_for,
       st.dictionaries(st.sampled_from(["role", "tier", "kubernetes.io/metadata.name"]),
                       label_values, max_size=2))
def test_explain_narrates_exactly_what_evaluate_decides(
        pod: dict[str, Any], ps: PolicySet, owners: list[dict[str, Any]],
        ns_labels: dict[str, str]) -> None:
    decision = evaluate(pod, namespace_labels=ns_labels, owners=owners, policies=ps)
    narrated = {m.policy: m for m in explain(pod, namespace_labels=ns_labels, owners=owners,
                                             policies=ps)}
    assert list(narrated) == list(ps.names)
    # the policies that apply, and those that would in audit or warn mode: the same sets, in
    # the same (priority) order
    modes = {p.name: p.spec.enforcement for p in ps}
    assert tuple(n for n, m in narrated.items() if m.matched and modes[n] == "enforce") == \
        decision.policies
    assert tuple(n for n, m in narrated.items() if m.matched and modes[n] != "enforce") == \
        tuple(a.policy for a in decision.audits)
    for record in decision.matches:  # those evaluate examined, each with its first failure
        told = narrated[record.policy]
        assert told.matched == record.matched
        if not record.matched:
            (why,) = record.reasons
            first_unmet = next(r for r in told.reasons if r.startswith("✗"))
            start = next(v for k, v in _CONDITION_WORDS.items() if k in why)
            assert first_unmet.startswith(start), (why, told.reasons)
