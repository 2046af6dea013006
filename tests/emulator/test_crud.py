"""CRUD, errors and subresources over HTTP, through kubernetes-asyncio's typed APIs and the
raw KubeApi, against the emulator (wire format: Status bodies, codes, reasons)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from webhook.doubles.emulator import ApiServerEmulator
from webhook.doubles.webhooks import make_certs
from webhook.kube import (
    CONFIGMAPS,
    DEPLOYMENTS,
    MPIJOBS,
    NAMESPACES,
    NODES,
    PDBS,
    PODS,
    SERVICES,
    VOLCANO_PODGROUPS,
    ApiError,
    KubeApi,
    make_api_client,
)


def pod(name: str | None = None, gpus: int = 1, labels: dict[str, str] | None = None,
        generate: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": labels or {}}
    if name:
        meta["name"] = name
    if generate:
        meta["generateName"] = generate
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [
        {"name": "main", "image": "busybox:1.36",
         "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


async def test_typed_core_api_create_get_list(kubeconfig: Path) -> None:
    api_client = await make_api_client(str(kubeconfig))
    try:
        core = client.CoreV1Api(api_client)
        created = await core.create_namespaced_pod("team-a", pod("w-0"))
        assert created.metadata.uid and int(created.metadata.resource_version) > 0
        assert created.metadata.creation_timestamp is not None
        # apiserver defaulting the real captured requests show
        assert created.spec.scheduler_name == "default-scheduler"
        assert created.spec.containers[0].resources.requests == {"nvidia.com/gpu": "1"}
        assert created.status.phase == "Pending"
        got = await core.read_namespaced_pod("w-0", "team-a")
        assert got.metadata.uid == created.metadata.uid
        listed = await core.list_namespaced_pod("team-a")
        assert [p.metadata.name for p in listed.items] == ["w-0"]
        assert int(listed.metadata.resource_version) >= int(created.metadata.resource_version)
        nodes = await core.list_node()
        assert nodes.items == []
        with pytest.raises(ApiException) as err:
            await core.read_namespaced_pod("missing", "team-a")
        assert err.value.status == 404
    finally:
        await api_client.close()


async def test_custom_objects_api_and_crd_discovery(kubeconfig: Path) -> None:
    api_client = await make_api_client(str(kubeconfig))
    try:
        custom = client.CustomObjectsApi(api_client)
        body = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                "metadata": {"name": "job-1"}, "spec": {"minMember": 5, "queue": "default"}}
        await custom.create_namespaced_custom_object(
            "scheduling.volcano.sh", "v1beta1", "team-a", "podgroups", body)
        listed = await custom.list_namespaced_custom_object(
            "scheduling.volcano.sh", "v1beta1", "team-a", "podgroups")
        assert [i["spec"]["minMember"] for i in listed["items"]] == [5]
        groups = await client.ApisApi(api_client).get_api_versions()
        names = {g.name for g in groups.groups}
        assert {"scheduling.volcano.sh", "scheduling.x-k8s.io", "kubeflow.org"} <= names
    finally:
        await api_client.close()


async def test_status_errors_have_the_apiserver_shape(kube: KubeApi) -> None:
    await kube.create(PODS, pod("a"), "team-a")
    with pytest.raises(ApiError) as err:
        await kube.create(PODS, pod("a"), "team-a")
    assert (err.value.status, err.value.reason) == (409, "AlreadyExists")
    assert err.value.message == 'pods "a" already exists'
    assert err.value.body["details"] == {"name": "a", "kind": "pods"}
    with pytest.raises(ApiError) as err:
        await kube.get(VOLCANO_PODGROUPS, "nope", "team-a")
    assert err.value.message == 'podgroups.scheduling.volcano.sh "nope" not found'
    assert err.value.body["details"]["group"] == "scheduling.volcano.sh"
    with pytest.raises(ApiError) as err:
        await kube.create(PODS, pod(), "team-a")
    assert (err.value.status, err.value.reason) == (422, "Invalid")
    assert "name or generateName is required" in err.value.message
    with pytest.raises(ApiError) as err:
        await kube.create(PODS, pod("x"), "no-such-namespace")
    assert err.value.status == 404
    assert err.value.message == 'namespaces "no-such-namespace" not found'
    for method, path in (("PUT", "/api/v1/namespaces/team-a/pods"),
                         ("GET", "/api/v1/namespaces/team-a/pods/a/binding"),
                         ("POST", "/api/v1/namespaces/team-a/pods/a")):
        with pytest.raises(ApiError) as err:
            await kube.request(method, path, body={} if method != "GET" else None)
        assert (err.value.status, err.value.reason) == (405, "MethodNotAllowed")


async def test_generate_name(kube: KubeApi) -> None:
    names = set()
    for _ in range(5):
        obj = await kube.create(PODS, pod(generate="launcher-"), "team-a")
        assert obj["metadata"]["generateName"] == "launcher-"
        suffix = obj["metadata"]["name"].removeprefix("launcher-")
        assert len(suffix) == 5 and suffix.isalnum()
        names.add(obj["metadata"]["name"])
    assert len(names) == 5


async def test_a_generate_name_is_checked_before_the_name_made_from_it(kube: KubeApi) -> None:
    """As ValidateObjectMeta (tests/real/test_parity.py runs the real server's messages): a
    trailing '-' is taken as a letter, a bad prefix is named even beside a good name, and its
    cause comes before the generated name's."""
    assert (await kube.create(PODS, pod(generate="a-"), "team-a", dry_run=True)
            )["metadata"]["name"].startswith("a-")
    for meta, fields in (({"generateName": "-"}, ["metadata.generateName", "metadata.name"]),
                         ({"generateName": "A.", "name": "ok"}, ["metadata.generateName"])):
        with pytest.raises(ApiError) as err:
            await kube.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                                           "metadata": meta}, "team-a", dry_run=True)
        assert [c["field"] for c in err.value.body["details"]["causes"]] == fields


async def test_a_service_is_named_by_a_dns_label(kube: KubeApi) -> None:
    """1.37's RelaxedServiceNameValidation: a leading digit is fine, a dot is not."""
    def service(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                "spec": {"ports": [{"port": 80}]}}

    await kube.create(SERVICES, service("1abc"), "team-a", dry_run=True)
    with pytest.raises(ApiError) as err:
        await kube.create(SERVICES, service("a.b"), "team-a", dry_run=True)
    assert err.value.body["details"]["causes"] == [{
        "reason": "FieldValueInvalid", "field": "metadata.name",
        "message": 'Invalid value: "a.b": must not contain dots'}]


async def test_optimistic_concurrency_on_replace(kube: KubeApi) -> None:
    cm = await kube.create(CONFIGMAPS, {"metadata": {"name": "c"}, "data": {"k": "1"}}, "team-a")
    fresh = {**cm, "data": {"k": "2"}}
    updated = await kube.replace(CONFIGMAPS, "c", fresh, "team-a")
    assert int(updated["metadata"]["resourceVersion"]) > int(cm["metadata"]["resourceVersion"])
    stale = {**cm, "data": {"k": "3"}}  # still carries the old resourceVersion
    with pytest.raises(ApiError) as err:
        await kube.replace(CONFIGMAPS, "c", stale, "team-a")
    assert (err.value.status, err.value.reason) == (409, "Conflict")
    assert "the object has been modified" in err.value.message
    assert (await kube.get(CONFIGMAPS, "c", "team-a"))["data"] == {"k": "2"}


async def test_noop_update_keeps_resource_version(kube: KubeApi) -> None:
    cm = await kube.create(CONFIGMAPS, {"metadata": {"name": "c"}, "data": {"k": "1"}}, "team-a")
    same = await kube.patch(CONFIGMAPS, "c", {"data": {"k": "1"}}, "team-a")
    assert same["metadata"]["resourceVersion"] == cm["metadata"]["resourceVersion"]


async def test_patch_types(kube: KubeApi) -> None:
    await kube.create(PODS, pod("p", labels={"a": "1", "b": "2"}), "team-a")
    merged = await kube.patch(PODS, "p", {"metadata": {"labels": {"a": None, "c": "3"}}},
                              "team-a")
    assert merged["metadata"]["labels"] == {"b": "2", "c": "3"}
    patched = await kube.patch(PODS, "p", [{"op": "add", "path": "/metadata/annotations",
                                            "value": {"x/y": "z"}}], "team-a", patch_type="json")
    assert patched["metadata"]["annotations"] == {"x/y": "z"}
    with pytest.raises(ApiError) as err:
        await kube.patch(PODS, "p", [{"op": "remove", "path": "/metadata/nothing"}], "team-a",
                         patch_type="json")
    assert err.value.status == 422
    smp = await kube.patch(PODS, "p", {"spec": {"containers": [
        {"name": "main", "image": "busybox:1.37"}]}}, "team-a", patch_type="strategic")
    container = smp["spec"]["containers"][0]
    assert container["image"] == "busybox:1.37"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}  # merged by name
    with pytest.raises(ApiError) as err:
        await kube.patch(VOLCANO_PODGROUPS, "x", {"spec": {}}, "team-a", patch_type="strategic")
    assert err.value.status in (404, 415)


async def test_pod_spec_is_immutable_but_binding_sets_node(kube: KubeApi) -> None:
    created = await kube.create(PODS, pod("p"), "team-a")
    with pytest.raises(ApiError) as err:
        await kube.patch(PODS, "p", {"spec": {"nodeName": "n1"}}, "team-a")
    assert err.value.status == 422 and "pod updates may not change" in err.value.message
    status = await kube.bind("team-a", "p", "n1", uid=created["metadata"]["uid"],
                             annotations={"muster.io/gpu-assignment": "{}"})
    assert status == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                      "status": "Success", "code": 201}
    bound = await kube.get(PODS, "p", "team-a")
    assert bound["spec"]["nodeName"] == "n1"
    assert bound["metadata"]["annotations"]["muster.io/gpu-assignment"] == "{}"
    assert {"type": "PodScheduled", "status": "True"}.items() <= \
        bound["status"]["conditions"][0].items()
    with pytest.raises(ApiError) as err:
        await kube.bind("team-a", "p", "n2")
    assert (err.value.status, err.value.reason) == (409, "Conflict")
    assert err.value.message == ('Operation cannot be fulfilled on pods/binding "p": '
                                 'pod p is already assigned to node "n1"')


async def test_scheduling_gates_may_only_be_removed_and_hold_off_a_binding(
        kube: KubeApi) -> None:
    """As kube-apiserver: a gated pod's Binding is refused (409), a gate cannot be added after
    creation, nor created beside a node name (422)."""
    gated = pod("g")
    gated["spec"]["schedulingGates"] = [{"name": "example.com/a"}, {"name": "example.com/b"}]
    created = await kube.create(PODS, gated, "team-a")
    cond = created["status"]["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "PodScheduled", "False", "SchedulingGated")
    with pytest.raises(ApiError) as err:
        await kube.bind("team-a", "g", "n1", uid=created["metadata"]["uid"])
    assert (err.value.status, err.value.message) == (
        409, 'Operation cannot be fulfilled on pods/binding "g": '
             "pod g has non-empty .spec.schedulingGates")
    with pytest.raises(ApiError) as err:
        await kube.patch(PODS, "g", {"spec": {"schedulingGates": [
            {"name": "example.com/b"}, {"name": "example.com/c"}]}}, "team-a")
    assert err.value.status == 422
    assert err.value.body["details"]["causes"] == [{
        "reason": "FieldValueForbidden", "field": "spec.schedulingGates[1].name",
        "message": "Forbidden: only deletion is allowed, but found new scheduling gate "
                   "'example.com/c'"}]
    one = await kube.patch(PODS, "g", {"spec": {"schedulingGates": [{"name": "example.com/b"}]}},
                           "team-a")
    assert one["spec"]["schedulingGates"] == [{"name": "example.com/b"}]
    await kube.patch(PODS, "g", [{"op": "remove", "path": "/spec/schedulingGates"}], "team-a",
                     patch_type="json")
    await kube.bind("team-a", "g", "n1")
    assert (await kube.get(PODS, "g", "team-a"))["spec"]["nodeName"] == "n1"
    pinned = pod("h")
    pinned["spec"].update(nodeName="n1", schedulingGates=[{"name": "example.com/a"}])
    with pytest.raises(ApiError) as err:
        await kube.create(PODS, pinned, "team-a")
    assert err.value.status == 422 and err.value.message.endswith(
        "spec.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared")


async def test_a_write_naming_another_uid_is_refused_as_immutable(kube: KubeApi) -> None:
    """A patch (status included) carrying the uid of an earlier pod of the same name fails, as
    the API server's metadata validation fails it: the binder's status writes rely on it."""
    made = await kube.create(PODS, pod("u"), "team-a")
    for sub in (None, "status"):
        with pytest.raises(ApiError) as err:
            await kube.patch(PODS, "u", {"metadata": {"uid": "not-its-uid"},
                                         "status": {"phase": "Pending"}}, "team-a",
                             subresource=sub)
        assert err.value.status == 422 and "metadata.uid" in err.value.message
    same = await kube.patch(PODS, "u", {"metadata": {"uid": made["metadata"]["uid"]},
                                        "status": {"message": "ok"}}, "team-a",
                            subresource="status")
    assert same["status"]["message"] == "ok"


async def test_status_subresource_separates_spec_and_status(kube: KubeApi) -> None:
    job = await kube.create(MPIJOBS, {
        "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "j"},
        "spec": {"mpiReplicaSpecs": {}}, "status": {"conditions": []}}, "team-a")
    assert job["metadata"]["generation"] == 1
    upd = await kube.patch(MPIJOBS, "j", {"status": {"startTime": "2026-01-01T00:00:00Z"}},
                           "team-a", subresource="status")
    assert upd["status"]["startTime"] == "2026-01-01T00:00:00Z"
    assert upd["metadata"]["generation"] == 1
    ignored = await kube.patch(MPIJOBS, "j", {"status": {"startTime": None}}, "team-a")
    assert ignored["status"]["startTime"] == "2026-01-01T00:00:00Z"  # main resource: no status
    spec = await kube.patch(MPIJOBS, "j", {"spec": {"slotsPerWorker": 2}}, "team-a")
    assert spec["metadata"]["generation"] == 2


async def test_crd_schema_prunes_and_validates(kube: KubeApi) -> None:
    pg = await kube.create(VOLCANO_PODGROUPS, {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "g"}, "spec": {"minMember": 2, "unknownField": 1}}, "team-a")
    assert pg["spec"] == {"minMember": 2, "queue": "default"}  # pruned, and the CRD's default
    with pytest.raises(ApiError) as err:
        await kube.create(VOLCANO_PODGROUPS, {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "h"}, "spec": {"minMember": "two"}}, "team-a")
    assert err.value.status == 422
    assert err.value.body["details"]["causes"][0]["field"] == "spec.minMember"
    assert "must be of type integer" in err.value.message


async def test_cluster_scoped_and_namespace_labels(kube: KubeApi) -> None:
    node = await kube.create(NODES, {"metadata": {"name": "n1", "labels": {"a": "b"}}})
    assert "namespace" not in node["metadata"]
    ns = await kube.create(NAMESPACES, {"metadata": {"name": "team-b"}})
    assert ns["metadata"]["labels"]["kubernetes.io/metadata.name"] == "team-b"
    assert ns["status"]["phase"] == "Active"


async def test_delete_returns_object_and_dry_run_persists_nothing(
        kube: KubeApi, apiserver: ApiServerEmulator) -> None:
    dry = await kube.create(PODS, pod("d"), "team-a", dry_run=True)
    assert dry["metadata"]["name"] == "d"
    assert apiserver.get("pods", "d", "team-a") is None
    await kube.create(PODS, pod("d"), "team-a")
    gone = await kube.delete(PODS, "d", "team-a")
    assert gone["kind"] == "Pod"
    assert apiserver.get("pods", "d", "team-a") is None
    await kube.create(CONFIGMAPS, {"metadata": {"name": "c"}}, "team-a")
    status = await kube.delete(CONFIGMAPS, "c", "team-a")
    assert status["kind"] in ("Status", "ConfigMap")


async def test_garbage_collection_of_dependents(kube: KubeApi,
                                                apiserver: ApiServerEmulator) -> None:
    job = await kube.create(MPIJOBS, {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                                      "metadata": {"name": "j"}, "spec": {"mpiReplicaSpecs": {}}},
                            "team-a")
    owner = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "name": "j",
             "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    await kube.create(VOLCANO_PODGROUPS, {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "j", "ownerReferences": [owner]}, "spec": {"minMember": 5}},
        "team-a")
    await kube.create(PODS, {**pod("j-worker-0"), "metadata": {"name": "j-worker-0",
                                                              "ownerReferences": [owner]}},
                      "team-a")
    await kube.create(PODS, pod("unrelated"), "team-a")
    await kube.delete(MPIJOBS, "j", "team-a")
    assert apiserver.get(VOLCANO_PODGROUPS.plural + ".scheduling.volcano.sh", "j",
                         "team-a") is None
    assert [p["metadata"]["name"] for p in apiserver.objects("pods", "team-a")] == ["unrelated"]


async def test_finalizers_delay_deletion(kube: KubeApi, apiserver: ApiServerEmulator) -> None:
    await kube.create(CONFIGMAPS, {"metadata": {"name": "f", "finalizers": ["x/y"]}}, "team-a")
    marked = await kube.delete(CONFIGMAPS, "f", "team-a")
    assert marked["metadata"]["deletionTimestamp"]
    assert apiserver.get("configmaps", "f", "team-a") is not None
    await kube.patch(CONFIGMAPS, "f", {"metadata": {"finalizers": None}}, "team-a")
    assert apiserver.get("configmaps", "f", "team-a") is None


async def test_in_process_helpers_share_the_store(apiserver: ApiServerEmulator,
                                                  kube: KubeApi) -> None:
    made = await apiserver.create("pods", pod("inproc"), "team-a")
    over_http = await kube.get(PODS, "inproc", "team-a")
    assert over_http["metadata"]["uid"] == made["metadata"]["uid"]
    assert [o["metadata"]["name"] for o in apiserver.objects("PodGroup")] == []


async def test_field_validation_modes_for_custom_resources(apiserver: ApiServerEmulator) -> None:
    body = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "g"}, "spec": {"minMember": 2, "typo": 1}}
    url = f"{apiserver.url}/apis/scheduling.x-k8s.io/v1alpha1/namespaces/team-a/podgroups"
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "?fieldValidation=Strict", json=body) as resp:
            status = await resp.json()
            assert resp.status == 400
            assert status["message"].endswith('strict decoding error: unknown field "spec.typo"')
        async with http.post(url, json=body) as resp:  # default: Warn
            assert resp.status == 201
            assert resp.headers.getall("Warning") == ['299 - "unknown field \\"spec.typo\\""']
            assert (await resp.json())["spec"] == {"minMember": 2}


async def test_serves_https_with_its_ca_in_the_kubeconfig(tmp_path: Path) -> None:
    certs = make_certs(["localhost"])
    ctx = certs.server_context(tmp_path)
    async with ApiServerEmulator(ssl_context=ctx, ca_pem=certs.ca_pem) as api:
        assert api.url.startswith("https://")
        api_client = await make_api_client(str(api.write_kubeconfig(tmp_path / "kc")))
        try:
            nss = await KubeApi(api_client).list(NAMESPACES)
            assert "default" in [n["metadata"]["name"] for n in nss["items"]]
        finally:
            await api_client.close()


async def test_protobuf_bodies_get_a_clear_415(apiserver: ApiServerEmulator) -> None:
    async with aiohttp.ClientSession() as http, http.post(
            f"{apiserver.url}/api/v1/namespaces", data=b"k8s\x00\x0a",
            headers={"Content-Type": "application/vnd.kubernetes.protobuf"}) as resp:
        assert resp.status == 415
        assert (await resp.json())["reason"] == "UnsupportedMediaType"


async def test_stored_revisions_are_never_changed_in_place(kube: KubeApi,
                                                           apiserver: ApiServerEmulator) -> None:
    for patch_type in ("merge", "strategic"):
        name = f"d-{patch_type}"
        await kube.create(DEPLOYMENTS, {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "metadata": {"name": name}, "spec": {"replicas": 1}},
                          "team-a")
        before = apiserver.store.get(("apps", "deployments"), "team-a", name)
        assert before is not None
        snapshot = json.loads(before.raw)
        after = await kube.patch(DEPLOYMENTS, name, {"spec": {"replicas": 2}}, "team-a",
                                 patch_type=patch_type)
        assert after["metadata"]["generation"] == 2
        assert before.obj == snapshot  # the previous revision, as watchers and history hold it


async def test_label_and_annotation_rules_of_the_real_server(kube: KubeApi) -> None:
    long_job = "tensorflow-topology-aware-" + "x" * 40  # a fine name, too long for a label
    with pytest.raises(ApiError) as err:
        await kube.create(PODS, pod("p", labels={"scheduling.x-k8s.io/pod-group": long_job}),
                          "team-a")
    assert err.value.status == 422
    assert "must be no more than 63 characters" in err.value.message
    for labels in ({"bad key!": "x"}, {"a": "-x"}, {"Muster.IO/x": "y"}):
        with pytest.raises(ApiError) as err:
            await kube.create(PODS, pod("p", labels=labels), "team-a")
        assert err.value.body["details"]["causes"][0]["field"] == "metadata.labels"
    big = {"metadata": {"name": "c", "annotations": {"muster.io/gpu-topology": "x" * 300_000}}}
    with pytest.raises(ApiError) as err:
        await kube.create(CONFIGMAPS, big, "team-a")
    assert "Too long: must have at most 262144 bytes" in err.value.message
    ok = await kube.create(PODS, pod("p", labels={"muster.io/gpu-model": "Tesla-V100-SXM2-16GB",
                                                  "empty": ""}), "team-a")
    assert ok["metadata"]["labels"]["empty"] == ""


async def test_eviction_keeps_a_running_pods_budget_and_ignores_it_for_a_pending_one(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    """As kube-apiserver's pods/eviction: 429 where a covering budget allows no disruption
    (a budget not observed yet allows none); a Pending pod goes whatever its budgets say; an
    eviction takes one disruption from each covering budget."""
    budget = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
              "metadata": {"name": "keep", "namespace": "team-a", "generation": 1},
              "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "a"}}},
              "status": {"observedGeneration": 1, "disruptionsAllowed": 1}}
    apiserver.seed(budget)
    for name in ("run-0", "run-1", "wait"):
        p = pod(name, labels={"app": "a"}) | {"status": {"phase": "Pending" if name == "wait"
                                                          else "Running"}}
        apiserver.seed({**p, "metadata": {**p["metadata"], "namespace": "team-a"}})
    evict = {"apiVersion": "policy/v1", "kind": "Eviction"}
    await kube.create_subresource(PODS, "run-0", "eviction", evict, "team-a")
    assert await kube.list(PDBS, "team-a") and \
        (await kube.get(PDBS, "keep", "team-a"))["status"]["disruptionsAllowed"] == 0
    with pytest.raises(ApiError) as err:
        await kube.create_subresource(PODS, "run-1", "eviction", evict, "team-a")
    assert (err.value.status, err.value.reason) == (429, "TooManyRequests")
    assert "violate the pod's disruption budget" in err.value.message
    await kube.create_subresource(PODS, "wait", "eviction", evict, "team-a")
    names = {p["metadata"]["name"] for p in (await kube.list(PODS, "team-a"))["items"]}
    assert names == {"run-1"}
