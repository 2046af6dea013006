"""Gang backend kubernetes: the native Workload API's shapes per release, checked against the
`k8s.io/api` types of that release, and the engine's decision for a job's pods."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from webhook import keys
from webhook.jsonpatch import apply_patch
from webhook.policy import PolicyError, evaluate, native, render_patch
from webhook.policy.decision import OwnerRef, PodGroupSpec
from webhook.policy.podgroup import gang_objects

from .conftest import MPIJOB_UID, Policies, policy

NATIVE = "match:\n  ownerKinds: [kubeflow.org/MPIJob]\ngang:\n  backend: kubernetes\n"
OWNER = OwnerRef("kubeflow.org/v2beta1", "MPIJob", "job", "uid-1")
#: the release of k8s.io/api that first serves each version's shape
RELEASES = {"v1alpha1": "v0.35.0", "v1alpha2": "v0.36.0", "v1beta1": "v0.37.2"}


@pytest.mark.parametrize(("served", "api"), [
    ({"v1": ["priorityclasses"]}, None),  # 1.34, or a gate left off
    ({"v1": ["priorityclasses"], "v1alpha1": ["priorityclasses"]}, None),  # before 1.22
    ({"v1alpha1": ["workloads"]}, "scheduling.k8s.io/v1alpha1"),
    ({"v1alpha2": ["podgroups", "workloads"]}, "scheduling.k8s.io/v1alpha2"),
    ({"v1alpha3": ["podgroups", "workloads"], "v1beta1": ["workloads", "podgroups"]},
     "scheduling.k8s.io/v1beta1"),
    ({"v1alpha3": ["podgroups", "workloads", "compositepodgroups"]},
     "scheduling.k8s.io/v1alpha3"),
    ({"v1alpha2": ["workloads"]}, None),  # a shape without its PodGroups is not usable
])
def test_discovery_picks_the_newest_shape_served(served: dict[str, list[str]],
                                                  api: str | None) -> None:
    assert native.pick_api(served) == api


def _json_fields(go_source: str, type_name: str) -> set[str]:
    """The json names of a Go struct's fields in k8s.io/api's types.go."""
    body = re.search(rf"^type {type_name} struct {{\n(.*?)^}}", go_source, re.M | re.S)
    assert body is not None, f"type {type_name} not found"
    return set(re.findall(r'json:"([A-Za-z]+)', body.group(1)))


def _module_dir(release: str) -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.skip("no Go toolchain to read k8s.io/api from the module proxy")
    out = subprocess.run([go, "mod", "download", "-json", f"k8s.io/api@{release}"],
                         capture_output=True, text=True, timeout=300, check=False)
    if out.returncode != 0:
        pytest.skip(f"k8s.io/api@{release} not available: {out.stdout[-300:]}{out.stderr[-300:]}")
    return Path(json.loads(out.stdout)["Dir"])


#: (object kind, path of nested keys) -> the Go type whose fields that level holds
_TYPES = {
    ("Workload", ()): "WorkloadSpec",
    ("Workload", ("controllerRef",)): "TypedLocalObjectReference",
    ("Workload", ("podGroupTemplates",)): "PodGroupTemplate",
    ("Workload", ("podGroups",)): "PodGroup",
    ("Workload", ("podGroups", "policy")): "PodGroupPolicy",
    ("Workload", ("podGroupTemplates", "schedulingPolicy")): "PodGroupSchedulingPolicy",
    ("Workload", ("podGroupTemplates", "schedulingPolicy", "gang")): "GangSchedulingPolicy",
    ("Workload", ("podGroups", "policy", "gang")): "GangSchedulingPolicy",
    ("PodGroup", ()): "PodGroupSpec",
    ("PodGroup", ("schedulingPolicy",)): "PodGroupSchedulingPolicy",
    ("PodGroup", ("schedulingPolicy", "gang")): "GangSchedulingPolicy",
    ("PodGroup", ("workloadRef",)): "WorkloadReference",
    ("PodGroup", ("podGroupTemplateRef",)): "PodGroupTemplateReference",
    ("PodGroup", ("podGroupTemplateRef", "workload")): "WorkloadPodGroupTemplateReference",
}


def _check(source: str, kind: str, path: tuple[str, ...], value: Any) -> None:
    if isinstance(value, list):
        for item in value:
            _check(source, kind, path, item)
        return
    if not isinstance(value, dict):
        return
    fields = _json_fields(source, _TYPES[(kind, path)])
    assert set(value) <= fields, f"{kind} {'.'.join(path) or 'spec'}: {set(value) - fields}"
    for key, inner in value.items():
        if isinstance(inner, dict | list):
            _check(source, kind, (*path, key), inner)


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_objects_and_pod_reference_use_the_fields_of_that_release(version: str) -> None:
    root = _module_dir(RELEASES[version])
    source = (root / "scheduling" / version / "types.go").read_text()
    spec = PodGroupSpec("kubernetes", "job", "ns", 5, owner=OWNER,
                        api_version=f"scheduling.k8s.io/{version}")
    objs = gang_objects(spec)
    assert [o["kind"] for o in objs] == (["Workload"] if version == "v1alpha1"
                                         else ["Workload", "PodGroup"])
    for obj in objs:
        assert re.search(rf"^type {obj['kind']} struct", source, re.M), obj["kind"]
        _check(source, obj["kind"], (), obj["spec"])
    field, value = native.pod_reference(spec)
    core = (root / "core" / "v1" / "types.go").read_text()
    assert field in _json_fields(core, "PodSpec")
    go_type = "PodSchedulingGroup" if field == "schedulingGroup" else "WorkloadReference"
    assert set(value) <= _json_fields(core, go_type)


def test_a_job_pod_joins_the_native_gang_and_its_patch_is_idempotent(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    ps = policies(policy("mpi", NATIVE))
    decision = evaluate(worker_pod, namespace_labels={}, owners=[mpijob], policies=ps)
    group = decision.pod_group
    assert group is not None and group.backend == "kubernetes" and group.min_member == 5
    assert group.owner is not None and group.owner.uid == MPIJOB_UID
    assert decision.scheduler_name is None
    ops = render_patch(worker_pod, decision)
    assert {"op": "add", "path": "/spec/schedulingGroup",
            "value": {"podGroupName": group.name}} in ops
    pod = apply_patch(worker_pod, ops)
    assert keys.VOLCANO_GROUP_ANNOTATION not in pod["metadata"].get("annotations", {})
    again = evaluate(pod, namespace_labels={}, owners=[mpijob], policies=ps)
    assert again.pod_group == group and render_patch(pod, again) == []
    # on 1.35 the reference is spec.workloadRef
    old = native.with_api(decision, "scheduling.k8s.io/v1alpha1")
    assert {"op": "add", "path": "/spec/workloadRef",
            "value": {"name": group.name, "podGroup": native.TEMPLATE}} in render_patch(
                worker_pod, old)


def test_a_pod_in_someone_elses_native_gang_stays_there(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    pod = {**worker_pod, "spec": {**worker_pod["spec"],
                                  "schedulingGroup": {"podGroupName": "theirs"}}}
    decision = evaluate(pod, namespace_labels={}, owners=[mpijob],
                        policies=policies(policy("mpi", NATIVE)))
    assert decision.pod_group is None
    assert any("already joins a native gang through spec.schedulingGroup" in w
               for w in decision.warnings)
    assert not any(op["path"].startswith("/spec/schedulingGroup")
                   for op in render_patch(pod, decision))


@pytest.mark.parametrize(("extra", "problem"), [
    ("  scheduleTimeoutSeconds: 60\n", "the native Workload API has no schedule timeout"),
    ("  minResources: {cpu: '1'}\n", "the native Workload API has no minResources"),
    ("  queue: training\n", "queue is a Volcano setting; backend kubernetes has no queues"),
])
def test_settings_the_native_api_has_no_place_for_are_policy_errors(
        extra: str, problem: str, policies: Policies) -> None:
    with pytest.raises(PolicyError, match=re.escape(problem)):
        policies(policy("mpi", NATIVE + extra))


def test_unavailable_api_belongs_to_backend_kubernetes(policies: Policies) -> None:
    with pytest.raises(PolicyError, match="unavailableApi is a setting of backend kubernetes"):
        policies(policy("mpi", "gang:\n  backend: volcano\n  unavailableApi: WithoutGang\n"))


@pytest.mark.parametrize(("choice", "refuse"), [("Refuse", True), ("WithoutGang", False)])
def test_an_unserved_api_refuses_or_drops_the_gang_as_the_policy_says(
        choice: str, refuse: bool) -> None:
    spec = PodGroupSpec("kubernetes", "job", "ns", 5, unavailable_api=choice)
    verdict = native.check_served(spec, {"v1": ["priorityclasses"]})
    assert verdict.api is None and verdict.refuse is refuse
    assert "GenericWorkload" in verdict.reason
    assert native.check_served(spec, {"v1beta1": ["workloads", "podgroups"]}).api == \
        native.DEFAULT_API
