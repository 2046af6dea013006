"""Gang backend kubernetes through `muster serve` on the API server emulator serving the native
Workload API in each release's shape, and not at all: objects before the pod, owned by the job,
the pod's reference, dry run, a foreign PodGroup, and the policy's answer to a missing API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from admission_helpers import (
    JOB,
    Tls,
    client,
    controller_ref,
    decode_patch,
    load_fixture,
    metric,
    mpijob_in,
    owned_by,
    review,
    running,
    worker_review,
)

from e2e.probes import eventually
from webhook import jsonpatch
from webhook.admission.cleanup import PodGroupJanitor
from webhook.admission.metrics import Metrics
from webhook.admission.podgroups import covers
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi, make_api_client
from webhook.policy.decision import OwnerRef, PodGroupSpec
from webhook.policy.podgroup import gang_objects

NATIVE = """\
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata:
  name: mpi-native
spec:
  match:
    namespaces: [team-a]
    podSelector:
      matchLabels:
        training.kubeflow.org/operator-name: mpi-operator
  gang:
    backend: kubernetes
"""


def _policies(tmp_path: Path, extra: str = "") -> Path:
    d = tmp_path / "native-policies"
    d.mkdir()
    (d / "native.yaml").write_text(NATIVE + extra)
    return d


async def _emulator(crds: list[dict[str, Any]], version: str | None
                    ) -> AsyncIterator[ApiServerEmulator]:
    api = ApiServerEmulator(crds=crds, workload_api=version)
    api.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    async with api:
        yield api


@pytest.fixture
async def v1beta1(shared_crds: list[dict[str, Any]]) -> AsyncIterator[ApiServerEmulator]:
    async for api in _emulator(shared_crds, "v1beta1"):
        yield api


@pytest.fixture
async def v1alpha1(shared_crds: list[dict[str, Any]]) -> AsyncIterator[ApiServerEmulator]:
    async for api in _emulator(shared_crds, "v1alpha1"):
        yield api


@pytest.fixture
async def unserved(shared_crds: list[dict[str, Any]]) -> AsyncIterator[ApiServerEmulator]:
    async for api in _emulator(shared_crds, None):
        yield api


async def test_the_workload_and_podgroup_exist_before_the_pod_and_the_pod_joins(
        tls: Tls, tmp_path: Path, v1beta1: ApiServerEmulator, shared_dir: Path) -> None:
    api = v1beta1
    job = await mpijob_in(api, shared_dir)
    worker = owned_by(load_fixture(shared_dir, "pod-create-worker.json"), job)
    dry = owned_by(load_fixture(shared_dir, "pod-create-worker-dryrun.json"), job)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    async with running(tls, [_policies(tmp_path)], kubeconfig=str(kubeconfig)) as srv, \
            client(tls) as s:
        url = f"{srv.url}/mutate/pods"
        resp = await review(s, url, dry)
        assert resp["allowed"] is True
        assert api.objects("workloads.scheduling.k8s.io", namespace="team-a") == []  # dry run
        pod = jsonpatch.apply_patch(dry["request"]["object"], decode_patch(resp))
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": JOB}

        resp = await review(s, url, worker)
        assert resp["allowed"] is True and "warnings" not in resp, resp.get("warnings")
        [workload] = api.objects("workloads.scheduling.k8s.io", namespace="team-a")
        [group] = api.objects("podgroups.scheduling.k8s.io", namespace="team-a")
        assert workload["apiVersion"] == group["apiVersion"] == "scheduling.k8s.io/v1beta1"
        for obj in (workload, group):
            assert obj["metadata"]["name"] == JOB
            assert obj["metadata"]["ownerReferences"] == [controller_ref(job)]
        assert workload["spec"] == {
            "controllerRef": {"apiGroup": "kubeflow.org", "kind": "MPIJob", "name": JOB},
            "podGroupTemplates": [{"name": "members",
                                   "schedulingPolicy": {"gang": {"minCount": 5}}}]}
        assert group["spec"] == {"workloadRef": {"workloadName": JOB, "templateName": "members"},
                                 "schedulingPolicy": {"gang": {"minCount": 5}}}
        pod = jsonpatch.apply_patch(worker["request"]["object"], decode_patch(resp))
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": JOB}
        # kube-scheduler gangs it: schedulerName is left as it was
        assert not any(op["path"] == "/spec/schedulerName" for op in decode_patch(resp))

        created = metric(srv, "muster_podgroup_writes_total", result="created")
        assert created == 2
        for i in range(1, 4):  # the other workers find both objects in place: no write
            resp = await review(s, url, worker_review(worker, i))
            assert resp["allowed"] is True and "warnings" not in resp, resp.get("warnings")
        assert metric(srv, "muster_podgroup_writes_total", result="created") == created
        assert metric(srv, "muster_podgroup_writes_total", result="exists") == 0


async def test_release_1_35_gets_a_workload_and_the_pod_a_workload_ref(
        tls: Tls, tmp_path: Path, v1alpha1: ApiServerEmulator, shared_dir: Path) -> None:
    api = v1alpha1
    job = await mpijob_in(api, shared_dir)
    worker = owned_by(load_fixture(shared_dir, "pod-create-worker.json"), job)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    async with running(tls, [_policies(tmp_path)], kubeconfig=str(kubeconfig)) as srv, \
            client(tls) as s:
        resp = await review(s, f"{srv.url}/mutate/pods", worker)
        assert resp["allowed"] is True and "warnings" not in resp, resp.get("warnings")
    [workload] = api.objects("workloads.scheduling.k8s.io", namespace="team-a")
    assert workload["apiVersion"] == "scheduling.k8s.io/v1alpha1"
    assert workload["spec"]["podGroups"] == [{"name": "members",
                                              "policy": {"gang": {"minCount": 5}}}]
    pod = jsonpatch.apply_patch(worker["request"]["object"], decode_patch(resp))
    assert pod["spec"]["workloadRef"] == {"name": JOB, "podGroup": "members"}
    assert "schedulingGroup" not in pod["spec"]


async def test_a_podgroup_another_live_object_controls_refuses_the_pods(
        tls: Tls, tmp_path: Path, v1beta1: ApiServerEmulator, shared_dir: Path) -> None:
    api = v1beta1
    job = await mpijob_in(api, shared_dir)
    other = await api.create("jobs.batch", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "other",
                                                             "namespace": "team-a"},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
                                       "containers": [{"name": "c", "image": "i"}]}}}},
        namespace="team-a")
    await api.create("podgroups.scheduling.k8s.io", {
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
        "metadata": {"name": JOB, "namespace": "team-a",
                     "ownerReferences": [controller_ref(other)]},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}}, namespace="team-a")
    worker = owned_by(load_fixture(shared_dir, "pod-create-worker.json"), job)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    async with running(tls, [_policies(tmp_path)], kubeconfig=str(kubeconfig)) as srv, \
            client(tls) as s:
        resp = await review(s, f"{srv.url}/mutate/pods", worker)
    assert resp["allowed"] is False
    assert resp["status"]["code"] == 409
    assert "PodGroup team-a/" + JOB in resp["status"]["message"]
    assert "controlled by Job other" in resp["status"]["message"]
    [group] = api.objects("podgroups.scheduling.k8s.io", namespace="team-a")
    assert group["spec"]["schedulingPolicy"]["gang"]["minCount"] == 2  # not taken over


async def test_a_cluster_without_the_api_refuses_the_pods_with_the_reason(
        tls: Tls, tmp_path: Path, unserved: ApiServerEmulator, shared_dir: Path) -> None:
    api = unserved
    job = await mpijob_in(api, shared_dir)
    worker = owned_by(load_fixture(shared_dir, "pod-create-worker.json"), job)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    async with running(tls, [_policies(tmp_path)], kubeconfig=str(kubeconfig)) as srv, \
            client(tls) as s:
        resp = await review(s, f"{srv.url}/mutate/pods", worker)
        assert resp["allowed"] is False and resp["status"]["code"] == 503
        message = resp["status"]["message"]
        assert "serves no Workload API" in message and "GenericWorkload" in message
        assert "gang.unavailableApi: WithoutGang" in message
        assert metric(srv, "muster_gang_interventions_total",
                      reason="native_api_denied") == 1
    await eventually(lambda: any(
        e.get("reason") == "GangApiUnavailable"
        for e in api.objects("events", namespace="team-a")))


async def test_without_gang_admits_the_pods_without_a_reference(
        tls: Tls, tmp_path: Path, unserved: ApiServerEmulator, shared_dir: Path) -> None:
    api = unserved
    job = await mpijob_in(api, shared_dir)
    worker = owned_by(load_fixture(shared_dir, "pod-create-worker.json"), job)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    policies = _policies(tmp_path, "    unavailableApi: WithoutGang\n")
    async with running(tls, [policies], kubeconfig=str(kubeconfig)) as srv, client(tls) as s:
        resp = await review(s, f"{srv.url}/mutate/pods", worker)
        assert resp["allowed"] is True
        assert any("admitted without gang" in w for w in resp["warnings"]), resp
        pod = jsonpatch.apply_patch(worker["request"]["object"], decode_patch(resp))
        assert "schedulingGroup" not in pod["spec"] and "workloadRef" not in pod["spec"]
        assert metric(srv, "muster_gang_interventions_total",
                      reason="native_api_without_gang") == 1


async def test_the_janitor_deletes_a_finished_jobs_native_objects(
        v1beta1: ApiServerEmulator, tmp_path: Path) -> None:
    api = v1beta1
    job = api.seed({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "done", "namespace": "team-a"},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
                                       "containers": [{"name": "c", "image": "i"}]}}},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    spec = PodGroupSpec("kubernetes", "done", "team-a", 2, owner=OwnerRef(
        "batch/v1", "Job", "done", job["metadata"]["uid"]))
    for obj in gang_objects(spec):
        plural = "workloads" if obj["kind"] == "Workload" else "podgroups"
        await api.create(f"{plural}.scheduling.k8s.io", obj, namespace="team-a")
    client_ = await make_api_client(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    try:
        janitor = PodGroupJanitor(KubeApi(client_), Metrics(), None)
        assert await janitor.sweep() == 2
    finally:
        await client_.close()
    assert api.objects("workloads.scheduling.k8s.io", namespace="team-a") == []
    assert api.objects("podgroups.scheduling.k8s.io", namespace="team-a") == []


@pytest.mark.parametrize("case", [
    (None, "", False), (None, "    unavailableApi: WithoutGang\n", True), ("v1beta1", "", True)])
async def test_a_policy_set_whose_native_gangs_would_refuse_every_pod_is_refused(
        case: tuple[str | None, str, bool], shared_crds: list[dict[str, Any]], tls: Tls,
        tmp_path: Path, shared_dir: Path) -> None:
    served, extra, allowed = case
    body = load_fixture(shared_dir, "configmap-update-policies.json")
    body["request"]["object"]["data"] = {"native.yaml": NATIVE + extra}
    async for api in _emulator(shared_crds, served):
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        async with running(tls, [_policies(tmp_path)], kubeconfig=str(kubeconfig)) as srv, \
                client(tls) as s:
            resp = await review(s, f"{srv.url}/validate/policies", body)
    assert resp["allowed"] is allowed, resp
    if not allowed:
        assert resp["status"]["code"] == 422
        message = resp["status"]["message"]
        assert message.startswith("invalid Muster policies for this cluster:\npolicies "
                                  "mpi-native: gang backend kubernetes, but this cluster serves "
                                  "no Workload API")
        assert "gang.unavailableApi: WithoutGang" in message


def test_a_spec_is_covered_field_by_field_and_a_map_of_values_whole() -> None:
    wanted = {"podGroupTemplates": [{"name": "members",
                                     "schedulingPolicy": {"gang": {"minCount": 5}}}]}
    defaulted = {"podGroupTemplates": [{"name": "members", "disruptionMode": {"single": {}},
                                        "schedulingPolicy": {"gang": {"minCount": 5}}}]}
    assert covers(defaulted, wanted)
    assert not covers(defaulted, {"podGroupTemplates": [
        {"name": "members", "schedulingPolicy": {"gang": {"minCount": 6}}}]})
    assert not covers({"podGroupTemplates": []}, wanted)
    # Volcano's minResources: a resource no longer wanted must go
    assert not covers({"minMember": 2, "minResources": {"cpu": "2", "nvidia.com/gpu": "4"}},
                      {"minMember": 2, "minResources": {"cpu": "2"}})
    assert covers({"minMember": 2, "queue": "q", "minResources": {"cpu": "2"}},
                  {"minMember": 2, "minResources": {"cpu": "2"}})
    # top level: fields others default (Volcano's queue) are left alone
    assert covers({"minMember": 5, "queue": "default"}, {"minMember": 5})
