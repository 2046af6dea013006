"""Must show (pure): which DeviceClass serves a plain extended resource; the special claim, its
requests and the pod status shaped as kube-scheduler shapes them; pods and claims read back from
them; and the planner sending such pods to DRA-only nodes, with a clear reason where it cannot."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from binder_objects import node, pod, resource_slice

from webhook import keys
from webhook.binder.claims import allocated_status, parse_claim
from webhook.binder.dra import claim_devices, resolve
from webhook.binder.extended import (
    POD_CLAIM,
    class_resources,
    extended_requests,
    pod_claims,
    pod_status,
    special_claim,
    status_claims,
)
from webhook.binder.fit import extended_on, gpu_serving
from webhook.binder.nodes import parse_node, slice_gpus
from webhook.binder.pods import parse_pod
from webhook.topology.model import ContainerGpus, GpuAssignment


def device_class(name: str, extended: str | None = None,
                 created: str = "2026-11-26T05:00:00Z") -> dict[str, Any]:
    spec = {"extendedResourceName": extended} if extended else {}
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def test_a_class_serves_its_extended_resource_name_and_its_implicit_one() -> None:
    classes = class_resources([device_class(keys.DRA_DRIVER, keys.GPU_RESOURCE),
                               device_class("nic.example.com")])
    assert classes == {keys.GPU_RESOURCE: keys.DRA_DRIVER,
                       "deviceclass.resource.kubernetes.io/gpu.muster.io": keys.DRA_DRIVER,
                       "deviceclass.resource.kubernetes.io/nic.example.com": "nic.example.com"}


def test_of_two_classes_naming_one_resource_the_later_wins_then_the_name_sorted_first() -> None:
    older = device_class("a-old", keys.GPU_RESOURCE, "2026-11-26T04:00:00Z")
    newer = device_class("z-new", keys.GPU_RESOURCE, "2026-11-26T05:00:00Z")
    assert class_resources([newer, older])[keys.GPU_RESOURCE] == "z-new"
    assert class_resources([older, newer])[keys.GPU_RESOURCE] == "z-new"
    twin = device_class("b-twin", keys.GPU_RESOURCE, "2026-11-26T05:00:00Z")
    assert class_resources([newer, twin])[keys.GPU_RESOURCE] == "b-twin"
    assert class_resources([twin, newer])[keys.GPU_RESOURCE] == "b-twin"


def two_containers() -> dict[str, Any]:
    return {"initContainers": [{"name": "setup", "resources": {"limits": {"cpu": "1"}}}],
            "containers": [
                {"name": "a", "resources": {"requests": {keys.GPU_RESOURCE: "2", "cpu": "1",
                                                         "memory": "1Gi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "1"}}},
                {"name": "c", "resources": {"limits": {keys.GPU_RESOURCE: "1"},
                                            "requests": {"memory": "1Gi"}}}]}


def test_each_container_asking_for_gpus_gets_a_request_named_as_kube_scheduler_names_it() -> None:
    # container index among init + app containers; the resource's index among sorted names
    assert extended_requests(two_containers()) == (("a", "container-1-request-2", 2),
                                                   ("c", "container-3-request-1", 1))


def test_init_containers_asking_for_gpus_keep_a_pod_off_the_dra_path() -> None:
    spec = {"initContainers": [{"name": "i", "resources": {"limits": {keys.GPU_RESOURCE: "1"}}}],
            "containers": [{"name": "a", "resources": {"limits": {keys.GPU_RESOURCE: "1"}}}]}
    assert extended_requests(spec) == "init containers ask for GPUs"


def test_the_special_claim_is_owned_by_the_pod_annotated_and_asks_per_container() -> None:
    body = special_claim("team-a", "p", "uid-p", extended_requests(two_containers()))
    meta = body["metadata"]
    assert meta["generateName"] == "p-extended-resources-" and "name" not in meta
    assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "p",
                                        "uid": "uid-p", "controller": True}]
    assert meta["annotations"] == {"resource.kubernetes.io/extended-resource-claim": "true"}
    assert body["spec"]["devices"]["requests"] == [
        {"name": "container-1-request-2", "exactly": {
            "deviceClassName": keys.DRA_DRIVER, "allocationMode": "ExactCount", "count": 2}},
        {"name": "container-3-request-1", "exactly": {
            "deviceClassName": keys.DRA_DRIVER, "allocationMode": "ExactCount", "count": 1}}]
    created = parse_claim({**body, "metadata": {**meta, "name": "p-extended-resources-x1"}})
    assert created.extended_for == ("p", "uid-p") and created.problem == ""
    assert created.requests == (("container-1-request-2", 2), ("container-3-request-1", 1))


def test_a_claim_is_special_only_with_the_annotation_and_the_pod_as_controller() -> None:
    body = special_claim("team-a", "p", "uid-p", (("a", "r", 1),))
    body["metadata"]["name"] = "x"
    body["metadata"]["ownerReferences"][0]["controller"] = False
    assert parse_claim(body).extended_for is None
    body = special_claim("team-a", "p", "uid-p", (("a", "r", 1),))
    body["metadata"]["annotations"] = {}
    assert parse_claim(body).extended_for is None


def test_the_pod_status_names_the_claim_and_maps_containers_and_reads_back() -> None:
    requests = extended_requests(two_containers())
    assert isinstance(requests, tuple)
    patch = pod_status("uid-p", "p-extended-resources-x1", requests)
    assert patch["metadata"] == {"uid": "uid-p"}
    status = patch["status"]
    assert status["extendedResourceClaimStatus"] == {
        "resourceClaimName": "p-extended-resources-x1",
        "requestMappings": [
            {"containerName": "a", "resourceName": keys.GPU_RESOURCE,
             "requestName": "container-1-request-2"},
            {"containerName": "c", "resourceName": keys.GPU_RESOURCE,
             "requestName": "container-3-request-1"}]}
    read = status_claims(two_containers(), status)
    assert read == pod_claims(requests, "p-extended-resources-x1", ["a", "b", "c"])
    assert read is not None and read.extended
    assert read.containers == (("a", ((POD_CLAIM, "container-1-request-2"),)), ("b", ()),
                               ("c", ((POD_CLAIM, "container-3-request-1"),)))


def bound_pod_with_status(claim_name: str) -> dict[str, Any]:
    obj = pod("p", gpus=1, node_name="dgx-a", scheduler="default-scheduler")
    obj["status"] = pod_status("uid-p", claim_name,
                               (("main", "container-0-request-2", 1),))["status"]
    return obj


def test_a_pod_whose_status_names_its_special_claim_holds_no_gpus_itself() -> None:
    info = parse_pod(bound_pod_with_status("p-er-1"))
    assert info.dra and info.extended_status == "p-er-1"
    assert info.claims is not None and info.claims.names == ((POD_CLAIM, "p-er-1"),)
    assert not info.problems  # plain requests and a special claim: not "one or the other"


def claim_for(requests: tuple[tuple[str, str, int], ...], name: str = "p-er-1",
              uid: str = "uid-team-a-p") -> dict[str, Any]:
    body = special_claim("team-a", "p", uid, requests)
    body["metadata"].update(name=name, uid="uid-claim", resourceVersion="5")
    return body


def test_one_special_claim_shared_by_two_containers_gives_each_its_request() -> None:
    spec = two_containers()
    requests = extended_requests(spec)
    assert isinstance(requests, tuple)
    raw = pod("p", gpus=1)
    raw["spec"].update(spec)
    plain = parse_pod(raw)
    attached = resolve(replace(plain, claims=pod_claims(requests, "p-er-1", ["a", "b", "c"])),
                       lambda key: parse_claim(claim_for(requests))
                       if key == "team-a/p-er-1" else None)
    assert attached.dra and not attached.claim_problems
    assert attached.container_gpus == (("a", 2), ("b", 0), ("c", 1))
    a = GpuAssignment("dgx-a", {"a": ContainerGpus((4, 5), ("", "")),
                                "c": ContainerGpus((7,), ("",))})
    ((info, devices),) = claim_devices(attached, a, lambda key: parse_claim(claim_for(requests)))
    assert info.name == "p-er-1"
    assert devices == (("container-1-request-2", 4), ("container-1-request-2", 5),
                       ("container-3-request-1", 7))
    # read back once allocated for the pod: the pod is reserved there, container by container
    allocated = claim_for(requests)
    allocated["status"] = allocated_status({}, "dgx-a", devices, "p", attached.uid)
    held = resolve(attached, lambda key: parse_claim(allocated))
    assert held.held_claims == ("team-a/p-er-1",) and held.assignment is not None
    assert held.assignment.node == "dgx-a"
    assert {n: c.indices for n, c in held.assignment.containers.items()} == {
        "a": (4, 5), "c": (7,)}


def test_a_request_two_containers_share_is_a_problem() -> None:
    requests = (("main", "r", 1),)
    pc = pod_claims(requests, "p-er-1", ["main"])
    shared = replace(pc, containers=(("main", ((POD_CLAIM, "r"),)),
                                     ("side", ((POD_CLAIM, "r"),))))
    plain = parse_pod(pod("p", gpus=1))
    info = resolve(replace(plain, claims=shared), lambda key: parse_claim(claim_for(requests)))
    assert any("not each used by exactly one container" in p for p in info.claim_problems)


def test_plain_gpu_pods_go_to_dra_only_nodes_only_where_our_class_serves_them() -> None:
    plain = parse_pod(pod("p", gpus=1))
    published = slice_gpus(resource_slice("dgx-a", range(8)))
    assert published is not None
    dra_only = replace(parse_node(node("dgx-a", gpus=0)), dra_gpus=published[1])
    both = replace(dra_only, gpus=8)
    assert gpu_serving(plain) == "devicePlugin" and not extended_on(plain, dra_only)
    ours = replace(plain, gpu_class=keys.DRA_DRIVER)
    assert gpu_serving(ours) == "either"
    assert extended_on(ours, dra_only)
    assert not extended_on(ours, both)  # allocatable nvidia.com/gpu: the device plugin's
