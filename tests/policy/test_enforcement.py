"""spec.enforcement: a policy in audit or warn mode matches and decides, changes nothing, never
overrides an enforced policy, and says what it would have done; enforce is unchanged."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from webhook import keys
from webhook.policy import Decision, PolicyError, PolicySet, evaluate, render_patch

from .conftest import Policies, deep, policy

GROUP = "tensorflow-topo-4-vgg16"
MPI = "match:\n  ownerKinds: [kubeflow.org/MPIJob]\n"
GANG = {
    "volcano": MPI + "gang: {backend: volcano, queue: training}",
    "coscheduling": MPI + "gang: {backend: coscheduling, scheduleTimeoutSeconds: 120}",
    "muster": MPI + "gang: {backend: muster}\ntopology: {mode: required, singleNode: true, "
                    "allowedModels: [Tesla V100-SXM2-16GB]}",
}
ISTIO = MPI + "istio: {optOut: both}"
LABELS = MPI + "labels: {team: vision}\nannotations: {example.com/owner: ml}"


def _in(mode: str, spec: str) -> str:
    return f"enforcement: {mode}\n{spec}"


def _decide(pod: dict[str, Any], owners: list[dict[str, Any]], ps: PolicySet
            ) -> tuple[Decision, list[dict[str, Any]]]:
    decision = evaluate(pod, namespace_labels={}, owners=owners, policies=ps)
    return decision, render_patch(pod, decision)


def _applied(decision: Decision) -> Decision:
    """The decision without what only records (examined policies, audits)."""
    return dataclasses.replace(decision, matches=(), audits=())


@pytest.mark.parametrize("mode", ["audit", "warn"])
@pytest.mark.parametrize("spec", [*GANG.values(), ISTIO, LABELS],
                         ids=[*GANG, "istio", "labels"])
def test_a_policy_not_enforced_changes_nothing(
        mode: str, spec: str, worker_pod: dict[str, Any], mpijob: dict[str, Any],
        policies: Policies) -> None:
    enforced = policy("base", "match: {namespaces: [team-a]}\nlabels: {base: 'yes'}")
    without, ops_without = _decide(worker_pod, [mpijob], policies(enforced))
    decision, ops = _decide(worker_pod, [mpijob],
                            policies(enforced, policy("new", _in(mode, spec))))
    assert ops == ops_without
    warned = [w for w in decision.warnings if w not in without.warnings]
    assert _applied(dataclasses.replace(decision, warnings=without.warnings)) == \
        _applied(without)
    assert decision.policies == ("base",)  # muster.io/policy names only what applied
    (audit,) = decision.audits
    assert (audit.policy, audit.mode) == ("new", mode)
    assert audit.actions and audit.changes
    # warn: the same record, shown to the user who creates the pod
    assert warned == ([f"muster: {audit.summary}"] if mode == "warn" else [])


def test_what_an_audit_policy_would_do_per_kind(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    def audit_of(spec: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        (audit,) = _decide(worker_pod, [mpijob], policies(policy("p", _in("audit", spec))))[
            0].audits
        return audit.actions, audit.changes

    assert audit_of(GANG["volcano"]) == (("gang",), (
        f"PodGroup team-a/{GROUP} (volcano, minMember 5, queue research)",  # the job's queue
        "schedulerName volcano"))
    assert audit_of(GANG["coscheduling"]) == (("gang",), (
        f"PodGroup team-a/{GROUP} (coscheduling, minMember 5)",))
    actions, changes = audit_of(GANG["muster"])
    assert actions == ("gang", "topology")
    assert changes[:3] == (f"binder gang team-a/{GROUP} (muster, minMember 5)",
                           "schedulerName muster-binder",
                           f"toleration {keys.TAINT_GPU_TOPOLOGY}")
    assert f"node affinity {keys.LABEL_GPU_MODEL} in ['Tesla-V100-SXM2-16GB']" in changes
    assert any(c.startswith(f"annotation {keys.ANN_GPU_TOPOLOGY}=") for c in changes)
    # the gang's own keys follow from the gang: said once
    assert not any(keys.ANN_GANG_NAME in c for c in changes)
    assert audit_of(ISTIO) == (("istio",), (
        f"label {keys.ISTIO_INJECT}=false", f"label {keys.ISTIO_DATAPLANE_MODE}=none",
        f"annotation {keys.ISTIO_INJECT}=false"))
    assert audit_of(LABELS) == (("labels", "annotations"), (
        "label team=vision", "annotation example.com/owner=ml"))


def test_an_audit_policy_never_overrides_an_enforced_one(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    """Higher priority or not, it decides nothing: the enforced policies decide as if it were
    not loaded, and it is told what it would change were it enforced beside them."""
    enforced = policy("enforced", GANG["volcano"])
    higher = policy("higher", "priority: 10\n" + _in("audit", GANG["coscheduling"]))
    alone, _ = _decide(worker_pod, [mpijob], policies(enforced))
    decision, _ = _decide(worker_pod, [mpijob], policies(enforced, higher))
    assert _applied(decision) == _applied(alone)
    assert decision.pod_group is not None and decision.pod_group.backend == "volcano"
    (audit,) = decision.audits
    # coscheduling leaves the pod's schedulerName alone; Volcano's keys go with its gang
    assert audit.changes == (f"PodGroup team-a/{GROUP} (coscheduling, minMember 5)",
                             "schedulerName default-scheduler")
    # the other way round, the enforced policy wins every field: nothing would change
    lower = policy("lower", "priority: -1\n" + _in("warn", GANG["coscheduling"]))
    decision, _ = _decide(worker_pod, [mpijob], policies(enforced, lower))
    (audit,) = decision.audits
    assert (audit.actions, audit.changes) == ((), ())
    assert audit.summary == "policy lower (warn) matches but would change nothing"
    assert decision.warnings[-1] == f"muster: {audit.summary}"


def test_what_the_pod_already_has_is_not_a_change(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    pod = deep(worker_pod)
    pod["metadata"]["labels"]["team"] = "vision"
    (audit,) = _decide(pod, [mpijob], policies(policy("p", _in("audit", LABELS))))[0].audits
    assert audit.changes == ("annotation example.com/owner=ml",)


def test_each_audit_policy_is_judged_alone_beside_the_enforced_ones(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    first = policy("first", "priority: 5\n" + _in("audit", GANG["volcano"]))
    second = policy("second", _in("warn", GANG["coscheduling"]))
    decision, ops = _decide(worker_pod, [mpijob], policies(first, second))
    assert [(a.policy, a.changes[0].split(" (")[0]) for a in decision.audits] == [
        ("first", f"PodGroup team-a/{GROUP}"), ("second", f"PodGroup team-a/{GROUP}")]
    assert decision.pod_group is None and decision.policies == ()
    assert [op["path"] for op in ops] == []  # not even muster.io/policy


def test_enforce_is_the_default_and_decides_as_before(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    implicit = policies(policy("p", GANG["volcano"]))
    explicit = policies(policy("p", _in("enforce", GANG["volcano"])))
    assert not implicit.index.rehearsed and not explicit.index.rehearsed
    assert _decide(worker_pod, [mpijob], implicit) == _decide(worker_pod, [mpijob], explicit)
    assert _decide(worker_pod, [mpijob], implicit)[0].audits == ()


def test_the_mode_is_checked_and_loading_does_not_depend_on_it(policies: Policies) -> None:
    with pytest.raises(PolicyError) as bad:
        policies(policy("p", "enforcement: Audit\n" + ISTIO))
    assert "spec.enforcement: Input should be 'enforce', 'warn' or 'audit'" in str(bad.value)
    # a conflict with an audit policy is refused too: switching it to enforce must not fail
    with pytest.raises(PolicyError, match="conflicts with policy a"):
        policies(policy("a", GANG["volcano"]), policy("b", _in("audit", GANG["coscheduling"])))
