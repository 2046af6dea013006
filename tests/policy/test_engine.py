"""Engine on the real captured requests: gang per backend, Istio opt-out, MPI semantics."""

from __future__ import annotations

import json
from typing import Any

import pytest

from webhook import keys
from webhook.jsonpatch import apply_patch
from webhook.policy import (
    Decision,
    Override,
    PolicySet,
    evaluate,
    explain,
    podgroup_manifest,
    render_patch,
)
from webhook.policy.workload import Priorities

from .conftest import MPIJOB_UID, Policies, deep, policy

GANG = {
    "volcano": "gang:\n  backend: volcano\n  queue: training",
    "coscheduling": "gang:\n  backend: coscheduling\n  scheduleTimeoutSeconds: 120",
    "muster": "gang:\n  backend: muster\ntopology:\n  mode: required\n  singleNode: true\n"
              "  allowedModels: [Tesla V100-SXM2-16GB]",
}
ISTIO = policy("istio", "match:\n  ownerKinds: [batch/Job]\nistio:\n  optOut: true")


def run(pod: dict[str, Any], owners: list[dict[str, Any]], ps: PolicySet,
        ns_labels: dict[str, str] | None = None) -> tuple[Decision, Any]:
    decision = evaluate(pod, namespace_labels=ns_labels or {}, owners=owners, policies=ps)
    mutated = apply_patch(pod, render_patch(pod, decision))
    again = evaluate(mutated, namespace_labels=ns_labels or {}, owners=owners, policies=ps)
    assert render_patch(mutated, again) == [], "patch must be idempotent"
    assert again.pod_group == decision.pod_group
    return decision, mutated


@pytest.mark.parametrize("backend", ["volcano", "coscheduling", "muster"])
def test_fixture_worker_gets_min_member_5_and_join_key(
        backend: str, worker_pod: dict[str, Any], mpijob: dict[str, Any],
        policies: Policies) -> None:
    ps = policies(policy("mpi", "match:\n  ownerKinds: [kubeflow.org/MPIJob]\n" + GANG[backend]))
    decision, pod = run(worker_pod, [mpijob], ps)
    group = decision.pod_group
    assert group is not None and group.min_member == 5 and group.name == "tensorflow-topo-4-vgg16"
    assert group.owner is not None and group.owner.uid == MPIJOB_UID
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["annotations"][keys.ANN_POLICY] == "mpi"
    if backend == "volcano":
        assert meta["annotations"][keys.VOLCANO_GROUP_ANNOTATION] == "tensorflow-topo-4-vgg16"
        # the MPIJob's own queue annotation beats the policy's queue
        assert meta["annotations"][keys.VOLCANO_QUEUE_ANNOTATION] == "research"
        assert spec["schedulerName"] == "volcano"
        assert keys.COSCHEDULING_GROUP_LABEL not in meta["labels"]
        assert podgroup_manifest(group)["spec"]["queue"] == "research"  # type: ignore[index]
    elif backend == "coscheduling":
        assert meta["labels"][keys.COSCHEDULING_GROUP_LABEL] == "tensorflow-topo-4-vgg16"
        assert keys.VOLCANO_GROUP_ANNOTATION not in meta.get("annotations", {})
        assert spec["schedulerName"] == "default-scheduler"  # unchanged unless the policy says
        assert group.timeout_seconds == 120
    else:
        ann = meta["annotations"]
        assert ann[keys.ANN_GANG_NAME] == "tensorflow-topo-4-vgg16"
        assert ann[keys.ANN_GANG_MIN_MEMBER] == "5"
        assert json.loads(ann[keys.ANN_GPU_TOPOLOGY]) == {
            "v": 1, "mode": "required", "singleNode": True, "minRingGBps": None}
        assert spec["schedulerName"] == keys.DEFAULT_BINDER_SCHEDULER_NAME
        assert {"key": keys.TAINT_GPU_TOPOLOGY, "operator": "Exists",
                "effect": "NoSchedule"} in spec["tolerations"]
        assert len(spec["tolerations"]) == 3  # the two defaults kept
        terms = spec["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [{"key": keys.LABEL_GPU_MODEL, "operator": "In",
                                                "values": ["Tesla-V100-SXM2-16GB"]}]}]
        assert podgroup_manifest(group) is None
    assert "priorityClassName" not in spec


@pytest.mark.parametrize(("field", "written"), [
    ("\n  preemption: LowerPriority", "LowerPriority"), ("\n  preemption: Never", "Never"),
    ("", None)])
def test_the_policys_preemption_reaches_the_binder_and_only_the_policys(
        field: str, written: str | None, worker_pod: dict[str, Any], mpijob: dict[str, Any],
        policies: Policies) -> None:
    """A value the pod was created with never survives a policy that puts it in a gang of the
    binder's: the binder honours only what the policy set (and its own default)."""
    ps = policies(policy("mpi", "match:\n  ownerKinds: [kubeflow.org/MPIJob]\n"
                                "gang:\n  backend: muster" + field))
    forged = deep(worker_pod)
    forged["metadata"].setdefault("annotations", {})[keys.ANN_GANG_PREEMPTION] = "LowerPriority"
    for pod in (worker_pod, forged):
        decision, mutated = run(pod, [mpijob], ps)
        assert decision.pod_group is not None and decision.pod_group.preemption == written
        assert mutated["metadata"]["annotations"].get(keys.ANN_GANG_PREEMPTION) == written


def test_launcher_and_worker_share_group(worker_pod: dict[str, Any], launcher_pod: dict[str, Any],
                                         mpijob: dict[str, Any], launcher_job: dict[str, Any],
                                         policies: Policies) -> None:
    ps = policies(policy("mpi", "match:\n  ownerKinds: [kubeflow.org/MPIJob]\n"
                                + GANG["volcano"]), ISTIO)
    w, _ = run(worker_pod, [mpijob], ps)
    launcher, _ = run(launcher_pod, [launcher_job, mpijob], ps)
    assert w.pod_group == launcher.pod_group
    assert w.pod_group is not None and w.pod_group.min_resources == {
        "cpu": "16500m", "memory": "65Gi", "nvidia.com/gpu": "4"}


def test_generatename_launcher_gets_istio_label_and_annotation_false(
        launcher_pod: dict[str, Any], launcher_job: dict[str, Any], mpijob: dict[str, Any],
        policies: Policies) -> None:
    assert "name" not in launcher_pod["metadata"]
    assert launcher_pod["metadata"]["annotations"][keys.ISTIO_INJECT] == "true"
    _, pod = run(launcher_pod, [launcher_job, mpijob], policies(ISTIO))
    assert pod["metadata"]["labels"][keys.ISTIO_INJECT] == "false"
    assert pod["metadata"]["annotations"][keys.ISTIO_INJECT] == "false"


@pytest.mark.parametrize(("opt_out", "wanted"), [
    # opt-out → (sidecar.istio.io/inject annotation, istio.io/dataplane-mode label)
    ("true", ("false", None)),       # the spelling from before ambient mode: sidecar only
    ("sidecar", ("false", None)),
    ("ambient", ("true", "none")),   # the template's own sidecar choice stays
    ("both", ("false", "none")),
    ("none", ("true", None)),
    ("false", ("true", None)),
])
def test_each_istio_opt_out_writes_its_own_keys(
        opt_out: str, wanted: tuple[str, str | None], launcher_pod: dict[str, Any],
        policies: Policies) -> None:
    sidecar, ambient = wanted
    ps = policies(policy("istio", f"istio:\n  optOut: {opt_out}"))
    _, pod = run(launcher_pod, [], ps)
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert annotations[keys.ISTIO_INJECT] == sidecar
    assert labels.get(keys.ISTIO_INJECT) == (None if sidecar == "true" else "false")
    assert labels.get(keys.ISTIO_DATAPLANE_MODE) == ambient


def test_a_higher_priority_policy_chooses_the_opt_out(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    ps = policies(policy("all", "istio: {optOut: both}"),
                  policy("mpi", "priority: 5\nmatch: {ownerKinds: [kubeflow.org/MPIJob]}\n"
                                "istio: {optOut: ambient}"))
    d, pod = run(worker_pod, [mpijob], ps)
    assert d.policies == ("mpi", "all")
    assert pod["metadata"]["labels"][keys.ISTIO_DATAPLANE_MODE] == "none"
    assert keys.ISTIO_INJECT not in pod["metadata"]["labels"]
    assert d.overrides == (Override("all", "istio.optOut", "mpi"),)
    assert d.overrides[0].describe() == "all: istio.optOut overridden by mpi (higher precedence)"


def test_degraded_owners_still_consistent(worker_pod: dict[str, Any],
                                          launcher_pod: dict[str, Any],
                                          policies: Policies) -> None:
    ps = policies(policy("mpi", "match:\n  ownerKinds: [kubeflow.org/MPIJob]\ngang:\n"
                                "  backend: coscheduling\n  minAvailable: 5"))
    w, worker = run(worker_pod, [], ps)
    launcher, launcher_mutated = run(launcher_pod, [], ps)
    # the worker's ownerReference carries the MPIJob's uid: it can create an owned PodGroup
    assert w.pod_group is not None and w.pod_group.owner is not None
    assert (w.pod_group.name, w.pod_group.min_member) == ("tensorflow-topo-4-vgg16", 5)
    assert any("not available" in m for m in w.warnings)
    # the launcher (owner: a Job) finds the MPIJob's name in its labels but not its uid: it
    # joins the same group and leaves creating the PodGroup to the workers
    group = keys.COSCHEDULING_GROUP_LABEL
    assert launcher_mutated["metadata"]["labels"][group] == worker["metadata"]["labels"][group]
    assert launcher.pod_group is None
    assert any("not available to own it" in m for m in launcher.warnings)
    # minAvailable auto cannot be counted without the MPIJob: no gang, a warning, pod admitted
    auto = policies(policy("mpi", "match:\n  ownerKinds: [kubeflow.org/MPIJob]\ngang:\n"
                                  "  backend: coscheduling"))
    d, _ = run(worker_pod, [], auto)
    assert d.pod_group is None and any("needs the kubeflow.org/MPIJob object" in m
                                       for m in d.warnings)


def test_job_scheduling_policy_beats_the_policy(worker_pod: dict[str, Any],
                                                mpijob: dict[str, Any],
                                                policies: Policies) -> None:
    mpijob["spec"]["runPolicy"]["schedulingPolicy"] = {
        "minAvailable": 3, "queue": "urgent", "priorityClass": "high",
        "scheduleTimeoutSeconds": 99}
    ps = policies(policy("v", "gang:\n  backend: volcano\n  queue: training\n  minAvailable: 2"))
    d, _ = run(worker_pod, [mpijob], ps)
    assert d.pod_group is not None
    assert (d.pod_group.min_member, d.pod_group.queue, d.pod_group.priority_class) == \
        (3, "urgent", "high")
    # launcher + the 2 workers minMember 3 needs
    assert d.pod_group.min_resources == {"cpu": "8500m", "memory": "33Gi", "nvidia.com/gpu": "2"}


def test_min_resources_count_the_higher_priority_replicas_first(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    """As mpi-operator's calPGMinResource: replicas sorted by their PriorityClass value."""
    mpijob["spec"]["runPolicy"]["schedulingPolicy"] = {"minAvailable": 3}
    specs = mpijob["spec"]["mpiReplicaSpecs"]
    specs["Worker"]["template"]["spec"]["priorityClassName"] = "train-high"
    ps = policies(policy("v", "gang:\n  backend: volcano"))
    equal = evaluate(worker_pod, namespace_labels={}, owners=[mpijob], policies=ps)
    assert equal.pod_group is not None  # the class is unknown: 0 like the launcher's
    assert equal.pod_group.min_resources == {"cpu": "8500m", "memory": "33Gi",
                                             "nvidia.com/gpu": "2"}  # launcher first
    ranked = evaluate(worker_pod, namespace_labels={}, owners=[mpijob], policies=ps,
                      priorities=Priorities({"train-high": 1000}))
    assert ranked.pod_group is not None
    assert ranked.pod_group.min_resources == {"cpu": "12", "memory": "48Gi",
                                              "nvidia.com/gpu": "3"}  # three workers


def test_min_resources_count_each_pod_as_the_scheduler_does(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    """A sidecar runs beside the app containers and adds to them; pod-level resources replace
    the containers' cpu and memory (never GPUs); the larger init container is not added."""
    mpijob["spec"]["runPolicy"]["schedulingPolicy"] = {"minAvailable": 3}
    specs = mpijob["spec"]["mpiReplicaSpecs"]
    specs["Worker"]["template"]["spec"]["initContainers"] = [
        {"name": "fetch", "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}},
        {"name": "proxy", "restartPolicy": "Always", "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": "1"}}}]
    specs["Launcher"]["template"]["spec"]["resources"] = {
        "requests": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}}
    d, _ = run(worker_pod, [mpijob], policies(policy("v", "gang:\n  backend: volcano")))
    assert d.pod_group is not None
    # launcher (2, 4Gi) + 2 workers of (4 + 1, 16Gi + 1Gi, 1 + 1 GPU)
    assert d.pod_group.min_resources == {"cpu": "12", "memory": "38Gi", "nvidia.com/gpu": "4"}


@pytest.mark.parametrize("backend", ["volcano", "coscheduling"])
def test_explicit_zeros_on_the_job_are_honoured_as_the_operator_does(
        backend: str, worker_pod: dict[str, Any], mpijob: dict[str, Any],
        policies: Policies) -> None:
    """mpi-operator (pkg/controller/podgroup.go): a set minAvailable is used even when 0, and
    then minResources is left out; a set minResources {} stays empty; scheduleTimeoutSeconds 0
    is written as 0. The policy's own values never replace them."""
    ps = policies(policy("p", f"gang:\n  backend: {backend}\n  minAvailable: 3\n"
                         "  minResources: {nvidia.com/gpu: '9'}"
                         + ("\n  scheduleTimeoutSeconds: 120" if backend != "volcano" else "")))
    sp = mpijob["spec"]["runPolicy"]["schedulingPolicy"] = {"minAvailable": 0}
    d, _ = run(worker_pod, [mpijob], ps)
    assert d.pod_group is not None
    assert (d.pod_group.min_member, d.pod_group.min_resources) == (0, None)
    assert podgroup_manifest(d.pod_group)["spec"]["minMember"] == 0  # type: ignore[index]
    sp.update(minAvailable=2, minResources={}, scheduleTimeoutSeconds=0)
    d, _ = run(worker_pod, [mpijob], ps)
    assert d.pod_group is not None
    body = podgroup_manifest(d.pod_group)["spec"]  # type: ignore[index]
    assert body["minMember"] == 2 and body["minResources"] == {}
    if backend == "coscheduling":
        assert body["scheduleTimeoutSeconds"] == 0


@pytest.mark.parametrize(("wanted", "expected"), [("auto", 5), (3, 3), (9, 5), ("50%", 3),
                                                  ("100%", 5), ("1%", 1)])
def test_min_available_forms(wanted: object, expected: int, worker_pod: dict[str, Any],
                             mpijob: dict[str, Any], policies: Policies) -> None:
    value = f"'{wanted}'" if isinstance(wanted, str) else wanted
    ps = policies(policy("v", f"gang:\n  backend: coscheduling\n  minAvailable: {value}"))
    d, _ = run(worker_pod, [mpijob], ps)
    assert d.pod_group is not None and d.pod_group.min_member == expected


def test_foreign_group_key_is_left_alone(worker_pod: dict[str, Any], mpijob: dict[str, Any],
                                         policies: Policies) -> None:
    """The MPI operator run with --gang-scheduling already set the Volcano annotation."""
    worker_pod["metadata"]["annotations"] = {keys.VOLCANO_GROUP_ANNOTATION: "other"}
    ps = policies(policy("v", "gang:\n  backend: coscheduling"), ISTIO)
    d, pod = run(worker_pod, [mpijob], ps)
    assert d.pod_group is None
    assert keys.COSCHEDULING_GROUP_LABEL not in pod["metadata"]["labels"]
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert any("already joins gang 'other'" in w for w in d.warnings)
    worker_pod["metadata"]["annotations"] = {}
    worker_pod["metadata"]["labels"][keys.LEGACY_COSCHEDULING_GROUP_LABEL] = "x"
    assert evaluate(worker_pod, namespace_labels={}, owners=[mpijob],
                    policies=ps).pod_group is None


def test_pytorchjob_batch_job_and_bare_pod(worker_pod: dict[str, Any],
                                           policies: Policies) -> None:
    ps = policies(policy("g", "gang:\n  backend: volcano"))
    pod = deep(worker_pod)
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                           "name": "pt", "uid": "u1", "controller": True}]
    pt = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
          "metadata": {"name": "pt", "uid": "u1"},
          "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1},
                                           "Worker": {"replicas": 3}}}}
    d, _ = run(pod, [pt], ps)
    assert d.pod_group is not None and (d.pod_group.name, d.pod_group.min_member) == ("pt", 4)
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job",
                                           "name": "j", "uid": "u2", "controller": True}]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "uid": "u2"},
           "spec": {"parallelism": 6, "completions": 4}}
    d, _ = run(pod, [job], ps)
    assert d.pod_group is not None and d.pod_group.min_member == 4
    del pod["metadata"]["ownerReferences"]
    # a bare pod: no gang (Volcano's own controller makes and owns the pod's PodGroup)
    d, bare = run(pod, [], policies(policy("g", "gang:\n  backend: volcano\n  queue: q1")))
    assert d.pod_group is None
    assert bare["spec"]["schedulerName"] == "volcano"
    assert bare["metadata"]["annotations"] == {keys.VOLCANO_QUEUE_ANNOTATION: "q1",
                                               keys.ANN_POLICY: "g"}
    d, bare = run(pod, [], policies(policy("c", "gang:\n  backend: coscheduling")))
    assert d.pod_group is None and keys.COSCHEDULING_GROUP_LABEL not in bare["metadata"]["labels"]


def test_priority_merge_per_field(worker_pod: dict[str, Any], mpijob: dict[str, Any],
                                  policies: Policies) -> None:
    low = policy("low", "gang:\n  backend: coscheduling\n  scheduleTimeoutSeconds: 60\n"
                        "labels:\n  team: vision")
    high = policy("high", "priority: 5\ngang:\n  backend: coscheduling\n  minAvailable: 2\n"
                          "labels:\n  team: nlp")
    d, pod = run(worker_pod, [mpijob], policies(low, high))
    assert d.policies == ("high", "low")
    assert d.pod_group is not None
    assert (d.pod_group.min_member, d.pod_group.timeout_seconds) == (2, 60)
    assert pod["metadata"]["labels"]["team"] == "nlp"
    assert pod["metadata"]["annotations"][keys.ANN_POLICY] == "high,low"
    # the backend both ask for is no override; the label they disagree on is
    assert d.overrides == (Override("low", "labels.team", "high"),)


def test_a_gang_backend_overridden_is_recorded_with_its_winner(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    low = policy("volcano", "gang:\n  backend: volcano\n  queue: training")
    high = policy("binder", "priority: 10\n" + GANG["muster"])
    d, _ = run(worker_pod, [mpijob], policies(low, high))
    assert d.pod_group is not None and d.pod_group.backend == "muster"
    assert d.overrides == (Override("volcano", "gang.backend", "binder"),)
    # the loser's Volcano settings go unused with its backend: the override says so, and the
    # user who creates the pod gets no warning about the admins' policy set
    assert d.warnings == ()


def test_user_gpu_assignment_is_stripped(worker_pod: dict[str, Any], policies: Policies) -> None:
    worker_pod["metadata"]["annotations"] = {keys.ANN_GPU_ASSIGNMENT: '{"v":1}',
                                             keys.ANN_GANG_PLACEMENT: '{"v":1}',
                                             keys.ANN_GPU_ALLOCATED: "n1", "keep": "me"}
    d, pod = run(worker_pod, [], policies())
    assert pod["metadata"]["annotations"] == {"keep": "me"}
    assert len(d.warnings) == 3 and not d.policies


def test_no_match_no_patch(worker_pod: dict[str, Any], policies: Policies) -> None:
    ps = policies(policy("elsewhere", "match:\n  namespaces: [team-z]\nistio: {optOut: true}"))
    d = evaluate(worker_pod, namespace_labels={}, owners=[], policies=ps)
    assert render_patch(worker_pod, d) == []
    assert d.matches == ()  # skipped by the namespace index
    [m] = explain(worker_pod, namespace_labels={}, owners=[], policies=ps)
    assert m.reasons == ("✗ namespace team-a not in ['team-z']",)
    other = policies(policy("other", "match:\n  podSelector: {matchLabels: {a: b}}\n"
                                     "istio: {optOut: true}"))
    d = evaluate(worker_pod, namespace_labels={}, owners=[], policies=other)
    assert d.matches[0].reasons == ("✗ podSelector does not match",)


def test_affinity_is_anded_into_every_existing_term(worker_pod: dict[str, Any],
                                                    policies: Policies) -> None:
    worker_pod["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}
    del worker_pod["metadata"]["ownerReferences"]  # a bare pod: a gang of one
    d, pod = run(worker_pod, [], policies(policy("t", GANG["muster"])))
    assert d.pod_group is not None and d.pod_group.min_member == 1
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    model = {"key": keys.LABEL_GPU_MODEL, "operator": "In", "values": ["Tesla-V100-SXM2-16GB"]}
    assert all(model in t["matchExpressions"] for t in terms)
    assert terms[0]["matchExpressions"][0]["key"] == "zone"


PREFERRING = ("gang:\n  backend: muster\ntopology:\n  mode: required\n"
              "  allowedModels: [NVIDIA H100 80GB HBM3, NVIDIA A100-SXM4-80GB, Tesla V100]\n"
              "  preferredModels: [NVIDIA H100 80GB HBM3, NVIDIA A100-SXM4-80GB]")


def _prefers(model: str, weight: int) -> dict[str, Any]:
    return {"weight": weight, "preference": {"matchExpressions": [
        {"key": keys.LABEL_GPU_MODEL, "operator": "In", "values": [model]}]}}


def test_preferred_models_become_preferred_node_affinity_first_weighing_most(
        worker_pod: dict[str, Any], policies: Policies) -> None:
    """Beside the required models, one preferred term per preferred model, 100 then 90: the
    binder weighs them as kube-scheduler's NodeAffinity score does, after the topology."""
    del worker_pod["metadata"]["ownerReferences"]
    d, pod = run(worker_pod, [], policies(policy("t", PREFERRING)))
    node = pod["spec"]["affinity"]["nodeAffinity"]
    assert node["preferredDuringSchedulingIgnoredDuringExecution"] == [
        _prefers("NVIDIA-H100-80GB-HBM3", 100), _prefers("NVIDIA-A100-SXM4-80GB", 90)]
    assert node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"][0]["values"] == [
        "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "Tesla-V100"]
    assert d.warnings == ()


def test_preferred_models_go_beside_the_pod_s_own_preferences_once(
        worker_pod: dict[str, Any], policies: Policies) -> None:
    own = {"weight": 5, "preference": {"matchExpressions": [
        {"key": "zone", "operator": "In", "values": ["a"]}]}}
    worker_pod["spec"]["affinity"] = {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [own]}}
    del worker_pod["metadata"]["ownerReferences"]
    _, pod = run(worker_pod, [], policies(policy("t", PREFERRING)))  # run: idempotent
    node = pod["spec"]["affinity"]["nodeAffinity"]
    assert node["preferredDuringSchedulingIgnoredDuringExecution"] == [
        own, _prefers("NVIDIA-H100-80GB-HBM3", 100), _prefers("NVIDIA-A100-SXM4-80GB", 90)]
    assert "nodeSelectorTerms" in node["requiredDuringSchedulingIgnoredDuringExecution"]


def test_a_preferred_model_another_policy_does_not_allow_is_dropped_and_said(
        worker_pod: dict[str, Any], policies: Policies) -> None:
    del worker_pod["metadata"]["ownerReferences"]
    allows = policy("allows", "priority: 5\ngang:\n  backend: muster\ntopology:\n"
                              "  mode: required\n  allowedModels: [NVIDIA A100-SXM4-80GB]")
    prefers = policy("prefers", "gang:\n  backend: muster\ntopology:\n  mode: required\n"
                                "  preferredModels: [NVIDIA H100 80GB HBM3, NVIDIA A100-SXM4-80GB]")
    d, pod = run(worker_pod, [], policies(allows, prefers))
    assert pod["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"] == [
        _prefers("NVIDIA-A100-SXM4-80GB", 100)]
    assert "preferredModels of policy prefers: NVIDIA-H100-80GB-HBM3 not in allowedModels, " \
        "not preferred" in d.warnings


def test_custom_scheduler_replaced_with_warning(worker_pod: dict[str, Any],
                                                mpijob: dict[str, Any],
                                                policies: Policies) -> None:
    worker_pod["spec"]["schedulerName"] = "my-scheduler"
    d, pod = run(worker_pod, [mpijob], policies(policy("v", "gang:\n  backend: volcano")))
    assert pod["spec"]["schedulerName"] == "volcano"
    assert "schedulerName 'my-scheduler' replaced by 'volcano' for backend volcano" in d.warnings


def test_namespace_index_keeps_priority_order(worker_pod: dict[str, Any], mpijob: dict[str, Any],
                                              policies: Policies) -> None:
    """A namespaced policy and an unscoped one interleave by priority in the index."""
    ps = policies(policy("scoped-low", "match: {namespaces: [team-a]}\nlabels: {tier: low}"),
                  policy("unscoped-high", "priority: 3\nlabels: {tier: high}"),
                  policy("scoped-top", "priority: 9\nmatch: {namespaces: [team-a]}\n"
                                       "annotations: {example.com/x: y}"))
    d, pod = run(worker_pod, [mpijob], ps)
    assert d.policies == ("scoped-top", "unscoped-high", "scoped-low")
    assert pod["metadata"]["labels"]["tier"] == "high"
    other = deep(worker_pod)
    other["metadata"]["namespace"] = "team-q"
    assert evaluate(other, namespace_labels={}, owners=[], policies=ps).policies == (
        "unscoped-high",)
