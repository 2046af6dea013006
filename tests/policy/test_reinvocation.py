"""The API server may call the webhook again for the same pod (reinvocationPolicy: another
mutating webhook, e.g. JobSet's, changed it after Muster), each pass on the pod as the earlier
passes patched it. A gang Muster joined the pod to stays Muster's; a gang key the job's own
controller wrote stays that controller's, even when it names the job as Muster's would and
Muster has written muster.io/policy beside it."""

from __future__ import annotations

from typing import Any

import pytest

from webhook import keys
from webhook.jsonpatch import apply_patch
from webhook.policy import Decision, PolicySet, evaluate, render_patch

from .conftest import Policies, deep, policy

JOB = "tensorflow-topo-4-vgg16"  # the worker's MPIJob: the gang Muster would make
PASSES = 3
GANG = {backend: f"match:\n  ownerKinds: [kubeflow.org/MPIJob]\ngang:\n  backend: {backend}\n"
        for backend in ("volcano", "coscheduling", "muster", "kubernetes")}


def passes(pod: dict[str, Any], owners: list[dict[str, Any]], ps: PolicySet
           ) -> list[tuple[Decision, list[dict[str, Any]], dict[str, Any]]]:
    """(decision, patch, pod after it) of each pass, each on the pod the previous one left."""
    out = []
    for _ in range(PASSES):
        decision = evaluate(pod, namespace_labels={}, owners=owners, policies=ps)
        ops = render_patch(pod, decision)
        pod = apply_patch(pod, ops)
        out.append((decision, ops, pod))
    return out


def with_foreign_gang(pod: dict[str, Any], backend: str) -> dict[str, Any]:
    """The pod as the job's own controller made it: in the job's gang of `backend`."""
    pod = deep(pod)
    meta = pod["metadata"]
    if backend == "volcano":
        meta.setdefault("annotations", {})[keys.VOLCANO_GROUP_ANNOTATION] = JOB
    elif backend == "coscheduling":
        meta.setdefault("labels", {})[keys.COSCHEDULING_GROUP_LABEL] = JOB
    elif backend == "muster":
        meta.setdefault("annotations", {})[keys.ANN_GANG_NAME] = JOB
    else:  # the Job controller's WorkloadWithJob
        pod["spec"]["schedulingGroup"] = {"podGroupName": JOB}
    return pod


@pytest.mark.parametrize("backend", GANG)
def test_a_gang_muster_joined_stays_muster_s_on_every_pass(
        backend: str, worker_pod: dict[str, Any], mpijob: dict[str, Any],
        policies: Policies) -> None:
    (first, ops, pod), *later = passes(worker_pod, [mpijob],
                                       policies(policy("gang", GANG[backend])))
    assert first.pod_group is not None and first.pod_group.name == JOB and ops
    assert pod["metadata"]["annotations"][keys.ANN_JOINED_GANG] == f"{backend}/{JOB}"
    for decision, again, _ in later:
        assert decision.pod_group == first.pod_group
        assert decision.gang_blocked is None and not any(
            "already joins" in w for w in decision.warnings)
        assert again == []


@pytest.mark.parametrize("backend", GANG)
def test_a_controller_s_gang_of_the_job_s_name_stays_the_controller_s_on_every_pass(
        backend: str, worker_pod: dict[str, Any], mpijob: dict[str, Any],
        policies: Policies) -> None:
    made = with_foreign_gang(worker_pod, backend)
    (first, _, pod), *later = passes(made, [mpijob], policies(policy("gang", GANG[backend])))
    assert pod["metadata"]["annotations"][keys.ANN_POLICY] == "gang"  # the audit trail
    assert keys.ANN_JOINED_GANG not in pod["metadata"]["annotations"]
    for decision in [first, *(d for d, _, _ in later)]:
        assert decision.pod_group is None
        assert any("already joins" in w for w in decision.warnings), decision.warnings
    assert [ops for _, ops, _ in later] == [[]] * (PASSES - 1)
    # nothing of the controller's gang changed, nor the scheduler it picked
    assert pod["spec"].get("schedulingGroup") == made["spec"].get("schedulingGroup")
    assert pod["spec"].get("schedulerName") == made["spec"].get("schedulerName")
    for where in ("labels", "annotations"):
        for key in (keys.COSCHEDULING_GROUP_LABEL, keys.VOLCANO_GROUP_ANNOTATION,
                    keys.ANN_GANG_NAME, keys.ANN_GANG_MIN_MEMBER):
            assert pod["metadata"].get(where, {}).get(key) == made["metadata"].get(
                where, {}).get(key)


@pytest.mark.parametrize("marker", [f"volcano/{JOB}", "coscheduling/other", JOB, ""])
def test_a_marker_that_names_another_gang_is_not_muster_s(
        marker: str, worker_pod: dict[str, Any], mpijob: dict[str, Any],
        policies: Policies) -> None:
    """Only the marker of exactly this backend's gang of this job counts as Muster's own."""
    pod = with_foreign_gang(worker_pod, "coscheduling")
    pod["metadata"].setdefault("annotations", {})[keys.ANN_JOINED_GANG] = marker
    decision = evaluate(pod, namespace_labels={}, owners=[mpijob],
                        policies=policies(policy("gang", GANG["coscheduling"])))
    assert decision.pod_group is None
    assert any("already joins gang" in w for w in decision.warnings)
