"""The API server may call the webhook again for the same pod (reinvocationPolicy: another
mutating webhook, e.g. JobSet's, changed it after Muster), each pass on the pod as the earlier
passes patched it. A gang Muster joined the pod to stays Muster's; a gang key the job's own
controller wrote stays that controller's, even when it names the job as Muster's would and
Muster has written muster.io/policy beside it. When a later webhook replaces the key Muster
wrote (LeaderWorkerSet's Volcano provider), Muster stands aside on the next pass."""

from __future__ import annotations

from typing import Any

import pytest

from webhook import keys
from webhook.jsonpatch import apply_patch
from webhook.policy import Decision, PolicySet, evaluate, render_patch
from webhook.policy.decision import OwnerRef, Withdrawal
from webhook.policy.podgroup import MANAGED_BY, left_behind

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


#: where each backend's group key lives, as a later webhook would overwrite it
GROUP_KEY = {"volcano": ("annotations", keys.VOLCANO_GROUP_ANNOTATION),
             "coscheduling": ("labels", keys.COSCHEDULING_GROUP_LABEL),
             "muster": ("annotations", keys.ANN_GANG_NAME)}


@pytest.mark.parametrize("backend", GROUP_KEY)
def test_muster_stands_aside_when_a_later_webhook_replaces_its_group_key(
        backend: str, worker_pod: dict[str, Any], mpijob: dict[str, Any],
        policies: Policies) -> None:
    """Pass 1 joins the pod to Muster's gang; a later webhook (LWS's Volcano provider) writes
    its own gang's name into the same key; pass 2 withdraws: only Muster's record goes, the
    other controller's key and everything else stay; pass 3 changes nothing."""
    ps = policies(policy("gang", GANG[backend]))
    first = evaluate(worker_pod, namespace_labels={}, owners=[mpijob], policies=ps)
    assert first.pod_group is not None and first.withdrawn is None
    pod = apply_patch(worker_pod, render_patch(worker_pod, first))
    where, key = GROUP_KEY[backend]
    assert pod["metadata"][where][key] == JOB
    pod["metadata"][where][key] = f"{JOB}-0-5d8f"  # the later webhook's gang
    (second, ops, after), (third, again, _) = passes(pod, [mpijob], ps)[:2]
    assert second.pod_group is None
    assert second.withdrawn == Withdrawal(
        backend, JOB, first.pod_group.namespace, first.pod_group.owner,
        f"gang '{JOB}-0-5d8f' ({where[:-1]} {key})")
    assert ops == [{"op": "remove", "path": "/metadata/annotations/muster.io~1joined-gang"}]
    assert after["metadata"][where][key] == f"{JOB}-0-5d8f"
    assert after["spec"] == pod["spec"]
    assert third.withdrawn is None and third.pod_group is None and again == []


@pytest.mark.parametrize("change", ["removed", "same name", "another backend's key"])
def test_muster_keeps_its_gang_when_its_own_key_still_names_it_or_is_gone(
        change: str, worker_pod: dict[str, Any], mpijob: dict[str, Any],
        policies: Policies) -> None:
    """Only a replaced key of the gang's own backend is a takeover: a key removed, rewritten
    with the same name, or another backend's key beside Muster's (the pod would still join
    Muster's PodGroup) withdraws nothing."""
    ps = policies(policy("gang", GANG["volcano"]))
    first = evaluate(worker_pod, namespace_labels={}, owners=[mpijob], policies=ps)
    pod = apply_patch(worker_pod, render_patch(worker_pod, first))
    ann = pod["metadata"]["annotations"]
    if change == "removed":
        del ann[keys.VOLCANO_GROUP_ANNOTATION]
    elif change == "same name":
        ann[keys.VOLCANO_GROUP_ANNOTATION] = JOB
    else:
        pod["metadata"].setdefault("labels", {})[keys.COSCHEDULING_GROUP_LABEL] = "theirs"
    decision = evaluate(pod, namespace_labels={}, owners=[mpijob], policies=ps)
    assert decision.withdrawn is None
    assert keys.ANN_JOINED_GANG not in decision.annotations or \
        decision.annotations[keys.ANN_JOINED_GANG] is not None


OWNER = OwnerRef("kubeflow.org/v2beta1", "MPIJob", JOB, "job-uid")
GONE = Withdrawal("volcano", JOB, "team-a", OWNER, f"gang '{JOB}-0-5d8f'")


def podgroup(*, managed: bool = True, controller: str = "job-uid") -> dict[str, Any]:
    return {"metadata": {"name": JOB, "namespace": "team-a",
                         "labels": dict(MANAGED_BY) if managed else {},
                         "ownerReferences": [{"uid": controller, "controller": True}]}}


def member(name: str = JOB, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "annotations": {keys.VOLCANO_GROUP_ANNOTATION: name},
                         **extra.pop("metadata", {})}, **extra}


def test_a_podgroup_muster_made_that_no_pod_joins_is_left_behind() -> None:
    pods = [member(f"{JOB}-0-5d8f"), member(JOB, status={"phase": "Succeeded"}),
            member(JOB, metadata={"deletionTimestamp": "2026-01-01T00:00:00Z"})]
    why = left_behind(podgroup(), GONE, pods)
    assert why is not None and f"gang '{JOB}-0-5d8f'" in why


@pytest.mark.parametrize(("group", "pods"), [
    (podgroup(managed=False), []),  # the operator's own, or anyone's: never Muster's to delete
    (podgroup(controller="other-uid"), []),  # another job's of the same name
    (podgroup(), [member(JOB, status={"phase": "Running"})]),  # a pod still joins it
], ids=["not-made-by-muster", "another-controller", "still-joined"])
def test_a_podgroup_is_kept_unless_it_is_muster_s_for_the_job_and_unjoined(
        group: dict[str, Any], pods: list[dict[str, Any]]) -> None:
    assert left_behind(group, GONE, pods) is None
