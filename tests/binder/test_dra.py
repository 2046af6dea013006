"""Must show: the pure side of DRA in the binder: claims parsed, pods resolved from them, the
plan turned into each claim's status, and GPUs held by claims whoever allocated them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from binder_objects import SCHED, claim, dra_pod, node, resource_slice

from webhook import keys
from webhook.binder.allocation import Allocation
from webhook.binder.assignment import encode_record
from webhook.binder.claims import ClaimInfo, allocated_status, parse_claim, released_status
from webhook.binder.dra import claim_devices, resolve
from webhook.binder.fit import FitCache
from webhook.binder.nodes import NodeInfo, parse_node, slice_gpus
from webhook.binder.planner import Finish, Plan, PlanConfig, Strip, plan
from webhook.binder.pods import PodInfo, parse_pod
from webhook.binder.queue import GangQueue
from webhook.topology.hierarchy import place_gang
from webhook.topology.model import ContainerGpus, GpuAssignment


def allocated(name: str, node_name: str, gpus: list[int], pod: str = "p",
              pod_uid: str = "uid-team-a-p") -> dict[str, Any]:
    return claim(name, count=len(gpus), status=allocated_status(
        {}, node_name, [("gpus", i) for i in gpus], pod, pod_uid))


def lookup(*objs: dict[str, Any]) -> Any:
    claims = {c.key: c for c in map(parse_claim, objs)}
    return claims.get


def dra_node(name: str = "dgx-a", gpus: range = range(8)) -> NodeInfo:
    found = slice_gpus(resource_slice(name, gpus))
    assert found is not None
    return replace(parse_node(node(name, gpus=0)), dra_gpus=found[1])


def test_a_claim_is_read_for_its_gpus_and_what_it_cannot_ask() -> None:
    ok = parse_claim(claim("a", count=3))
    assert ok.requests == (("gpus", 3),) and ok.gpus == 3 and not ok.problem
    assert not ok.allocated and ok.node is None
    other = parse_claim(claim("b", device_class="nic.example.com"))
    assert "device class 'nic.example.com'" in other.problem
    every = claim("c")
    every["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] = "All"
    assert "ExactCount" in parse_claim(every).problem
    alternatives = claim("d")
    alternatives["spec"]["devices"]["requests"] = [{"name": "x", "firstAvailable": []}]
    assert "firstAvailable" in parse_claim(alternatives).problem
    selected = claim("e")
    selected["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {}}]
    assert "selectors" in parse_claim(selected).problem


def test_the_status_names_the_devices_the_node_and_the_pod() -> None:
    status = allocated_status({"devices": []}, "dgx-a", [("gpus", 3), ("gpus", 5)], "w-0",
                              "uid-w-0")
    assert status["allocation"]["devices"]["results"] == [
        {"request": "gpus", "driver": keys.DRA_DRIVER, "pool": "dgx-a", "device": "gpu-3"},
        {"request": "gpus", "driver": keys.DRA_DRIVER, "pool": "dgx-a", "device": "gpu-5"}]
    assert status["allocation"]["nodeSelector"] == {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["dgx-a"]}]}]}
    assert status["reservedFor"] == [{"resource": "pods", "name": "w-0", "uid": "uid-w-0"}]
    info = parse_claim(claim("a", count=2, status=status))
    assert info.node == "dgx-a" and info.devices == (("gpus", 3), ("gpus", 5))
    assert info.reserved_only_for("uid-w-0") and not info.reserved_only_for("uid-other")
    assert released_status(status) == {}
    workload = parse_claim(claim("w", status={**status, "reservedFor": [
        {"apiGroup": "scheduling.k8s.io", "resource": "workloads", "name": "x", "uid": "u"}]}))
    assert workload.consumers == 1 and not workload.reserved_only_for("uid-w-0")


def resolved(obj: dict[str, Any], *claims: dict[str, Any]) -> PodInfo:
    return resolve(parse_pod(obj, SCHED), lookup(*claims))


def test_a_pods_gpus_come_from_its_claims() -> None:
    pod = resolved(dra_pod("p", ["a", "b"]), claim("a", count=2), claim("b", count=1))
    assert pod.dra and pod.gpus == 3 and pod.container_gpus == (("main", 3),)
    assert not pod.claim_problems and pod.assignment is None and pod.assignment_raw is None
    missing = resolved(dra_pod("p", ["a", "b"]), claim("a"))
    assert any("ResourceClaim b of pod claim 'c1' does not exist yet" in p
               for p in missing.claim_problems)
    assert resolve(missing, lookup(claim("a"))) == missing  # idempotent


def test_a_template_claim_is_found_through_the_pods_status() -> None:
    obj = dra_pod("p", ["ignored"])
    del obj["spec"]["resourceClaims"][0]["resourceClaimName"]
    obj["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "gpu-template"
    assert "(from a template)" in resolved(obj, claim("p-c0-x")).claim_problems[0]
    obj["status"]["resourceClaimStatuses"] = [{"name": "c0", "resourceClaimName": "p-c0-x"}]
    assert resolved(obj, claim("p-c0-x", count=2)).gpus == 2


def test_a_claim_someone_else_allocated_is_not_reused() -> None:
    theirs = allocated("a", "dgx-a", [0], pod="other", pod_uid="uid-other")
    assert any("already allocated" in p for p in resolved(dra_pod("p", ["a"]), theirs)
               .claim_problems)
    unreserved = claim("a", status={**allocated_status({}, "dgx-a", [("gpus", 0)], "x", "y"),
                                    "reservedFor": []})
    assert any("already allocated" in p for p in resolved(dra_pod("p", ["a"]), unreserved)
               .claim_problems)


def test_claims_reserved_for_the_pod_are_its_reservation() -> None:
    pod = resolved(dra_pod("p", ["a", "b"]), allocated("a", "dgx-a", [2, 3]),
                   allocated("b", "dgx-a", [6]))
    assert not pod.claim_problems and pod.held_claims == ("team-a/a", "team-a/b")
    assert pod.assignment == GpuAssignment("dgx-a", {"main": ContainerGpus((2, 3, 6),
                                                                           ("", "", ""))})
    partial = resolved(dra_pod("p", ["a", "b"]), allocated("a", "dgx-a", [2]), claim("b"))
    assert partial.held_claims == ("team-a/a",) and partial.assignment is None
    assert partial.assignment_raw == ""  # reserved, but not bindable: the planner strips it
    split = resolved(dra_pod("p", ["a", "b"]), allocated("a", "dgx-a", [2]),
                     allocated("b", "dgx-b", [2]))
    assert split.assignment is None and split.assignment_raw == ""


def test_a_containers_gpus_go_to_its_claims_in_order() -> None:
    obj = dra_pod("p", ["a", "b"])
    obj["spec"]["containers"].append({"name": "side", "image": "x", "resources": {
        "claims": [{"name": "c1"}]}})
    obj["spec"]["containers"][0]["resources"]["claims"] = [{"name": "c0"}]
    claims = lookup(claim("a", count=2), claim("b", count=1))
    pod = resolve(parse_pod(obj, SCHED), claims)
    assert pod.container_gpus == (("main", 2), ("side", 1))
    a = GpuAssignment("dgx-a", {"main": ContainerGpus((4, 5), ("", "")),
                                "side": ContainerGpus((7,), ("",))})
    assert [(c.name, d) for c, d in claim_devices(pod, a, claims)] == [
        ("a", (("gpus", 4), ("gpus", 5))), ("b", (("gpus", 7),))]


def test_unsupported_pod_shapes_are_problems_not_crashes() -> None:
    shared = dra_pod("p", ["a"])
    shared["spec"]["containers"].append({"name": "two", "image": "x", "resources": {
        "claims": [{"name": "c0"}]}})
    assert any("used by 2 containers" in p for p in resolved(shared, claim("a")).claim_problems)
    both = dra_pod("p", ["a"], gpus=1)
    assert any("one or the other" in p for p in parse_pod(both, SCHED).problems)
    init = dra_pod("p", ["a"])
    init["spec"]["initContainers"] = [{"name": "setup", "image": "x", "resources": {
        "claims": [{"name": "c0"}]}}]
    assert any("init containers setup" in p for p in resolved(init, claim("a")).claim_problems)


def test_a_forged_assignment_annotation_on_a_dra_pod_is_ignored() -> None:
    obj = dra_pod("p", ["a"])
    obj["metadata"]["annotations"][keys.ANN_GPU_ASSIGNMENT] = (
        '{"v":1,"node":"dgx-a","containers":{"main":{"indices":[0],"uuids":[""]}}}')
    pod = resolved(obj, claim("a"))
    assert pod.assignment is None and pod.assignment_raw is None


def test_claims_hold_gpus_whoever_allocated_them_and_dra_pods_hold_none_themselves() -> None:
    by_kube_scheduler = parse_claim(allocated("k", "dgx-a", [0, 1], pod="x", pod_uid="ux"))
    ours = allocated("a", "dgx-a", [5], pod="p", pod_uid="uid-team-a-p")
    bound = resolve(parse_pod(dra_pod("p", ["a"], node_name="dgx-a"), SCHED), lookup(ours))
    alloc = Allocation.from_pods([bound], [by_kube_scheduler, parse_claim(ours)])
    assert sorted(alloc.usage["dgx-a"].gpus) == [0, 1, 5]
    assert alloc.usage["dgx-a"].unknown_gpus == 0 and alloc.usage["dgx-a"].pods == 1
    state = alloc.node_state(dra_node())
    assert state.free_gpus == frozenset({2, 3, 4, 6, 7})
    alloc.remove_claim(by_kube_scheduler)
    assert sorted(alloc.usage["dgx-a"].gpus) == [5]


def planned(pods: list[PodInfo], nodes: list[NodeInfo], claims: list[ClaimInfo]) -> Plan:
    return plan(pods, {n.name: n for n in nodes}, None, config=PlanConfig(SCHED),
                queue=GangQueue(), fit=FitCache(), place=place_gang, now=1000.0,
                claims=claims)


def gang(count: int, *, claims: dict[str, dict[str, Any]] | None = None) -> list[PodInfo]:
    objs = {f"w{i}": claims.get(f"w{i}") if claims else None for i in range(count)}
    found = lookup(*(c if c is not None else claim(f"w{i}-gpu")
                     for i, c in enumerate(objs.values())))
    return [resolve(parse_pod(dra_pod(name, [f"{name}-gpu"], gang="g", min_member=count),
                              SCHED), found) for name in objs]


def test_eight_one_gpu_dra_pods_fill_one_node_with_distinct_gpus() -> None:
    result = planned(gang(8), [dra_node()], [])
    (place,) = result.places
    gpus = [i for _, a in place.assignments for c in a.containers.values() for i in c.indices]
    assert sorted(gpus) == list(range(8))
    assert {a.node for _, a in place.assignments} == {"dgx-a"}


def test_dra_pods_need_a_node_that_serves_dra_and_its_free_gpus() -> None:
    plain = parse_node(node("dgx-a"))  # device plugin only
    (wait,) = planned(gang(2), [plain], []).waits
    assert wait.kind == "unplaceable" and "no ResourceSlice of the DRA driver" in wait.reason
    taken = parse_claim(allocated("k", "dgx-a", list(range(7)), pod="x", pod_uid="ux"))
    (wait,) = planned(gang(2), [dra_node()], [taken]).waits
    assert wait.kind == "unplaceable"


def test_a_gang_reserved_by_its_claims_is_bound_and_a_partial_one_released() -> None:
    claims = {f"w{i}": allocated(f"w{i}-gpu", "dgx-a", [i], pod=f"w{i}",
                                 pod_uid=f"uid-team-a-w{i}") for i in range(2)}
    objs = list(claims.values())
    pods = gang(2, claims=claims)
    (finish,) = planned(pods, [dra_node()], [parse_claim(c) for c in objs]).finishes
    assert isinstance(finish, Finish) and len(finish.assignments) == 2
    pods = gang(2, claims={"w0": claims["w0"]})  # w1's claim not written: crash mid-gang
    result = planned(pods, [dra_node()], [parse_claim(claims["w0"])])
    (strip,) = result.strips
    assert isinstance(strip, Strip) and [p.name for p in strip.pods] == ["w0"]
    assert not result.places and not result.finishes


def test_a_dra_member_a_record_names_is_placed_with_its_claims_not_bound_from_the_record(
        ) -> None:
    """A worker recreated under its name (as the MPI operator does) has new, unallocated
    claims: binding it to its recorded slot would leave them unallocated."""
    record = encode_record((("w0", "dgx-a", (0,)), ("w1", "dgx-a", (1,))))
    ours = allocated("w0-gpu", "dgx-a", [0], pod="w0", pod_uid="uid-team-a-w0")
    claims = lookup(ours, claim("w1-gpu"))
    w0 = dra_pod("w0", ["w0-gpu"], gang="g", min_member=2, node_name="dgx-a")
    w0["metadata"]["annotations"][keys.ANN_GANG_PLACEMENT] = record
    pods = [resolve(parse_pod(w0, SCHED), claims),
            resolve(parse_pod(dra_pod("w1", ["w1-gpu"], gang="g", min_member=2), SCHED), claims)]
    result = planned(pods, [dra_node()], [parse_claim(ours)])
    assert not result.finishes
    (place,) = result.places
    [(pod, a)] = place.assignments
    assert pod.name == "w1" and 0 not in a.containers["main"].indices


def test_a_dra_only_node_hands_out_only_the_gpus_its_slice_publishes() -> None:
    (wait,) = planned(gang(8), [dra_node(gpus=range(2, 8))], []).waits
    assert wait.kind == "unplaceable"
    (place,) = planned(gang(6), [dra_node(gpus=range(2, 8))], []).places
    assert sorted(i for _, a in place.assignments for i in a.containers["main"].indices) == [
        2, 3, 4, 5, 6, 7]
