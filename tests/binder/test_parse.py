from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
from binder_objects import node, pod

from webhook import keys
from webhook.binder.assignment import (
    Assigner,
    AssignmentError,
    build_assignment,
    decode_assignment,
    decode_record,
    encode_assignment,
    encode_record,
    shape_matches,
    uuids_of,
)
from webhook.binder.nodes import parse_node
from webhook.binder.pods import parse_pod
from webhook.quantity import QuantityError, cpu_milli, whole
from webhook.topology.builtin import builtin
from webhook.topology.model import ContainerGpus, GpuAssignment


@pytest.mark.parametrize(("text", "milli"), [("500m", 500), ("2", 2000), ("0.25", 250),
                                             ("1e3", 1_000_000), ("1k", 1_000_000),
                                             ("100u", 1), (3, 3000)])
def test_cpu_quantities(text: str, milli: int) -> None:
    assert cpu_milli(text) == milli


@pytest.mark.parametrize(("text", "value"), [("1Gi", 2**30), ("1G", 10**9),
                                             ("128974848", 128974848), ("129e6", 129_000_000),
                                             ("123Mi", 123 * 2**20)])
def test_byte_quantities(text: str, value: int) -> None:
    assert whole(text) == value


@pytest.mark.parametrize("bad", ["abc", "1Zi", "", "--1", "1.2.3"])
def test_bad_quantity_is_refused(bad: str) -> None:
    with pytest.raises(QuantityError):
        whole(bad)


def test_pod_requests_follow_scheduler_rules() -> None:
    obj = pod("p", gpus=2, cpu="2", memory="4Gi")
    obj["spec"]["containers"].append({"name": "side", "resources": {
        "requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {keys.GPU_RESOURCE: "1"}}})
    obj["spec"]["initContainers"] = [{"name": "init", "resources": {
        "requests": {"cpu": "8", "memory": "1Gi", keys.GPU_RESOURCE: "4"}}}]
    obj["spec"]["overhead"] = {"cpu": "100m", "memory": "1Mi"}
    info = parse_pod(obj)
    assert info.cpu_milli == 8000 + 100  # init container dominates CPU
    assert info.memory_bytes == 5 * 2**30 + 2**20  # app containers dominate memory
    assert info.gpus == 4  # max(app sum 3, init 4)
    assert info.container_gpus == (("init", 4), ("main", 2), ("side", 1))
    assert info.init_containers == 1


def test_bad_annotations_become_problems_not_exceptions() -> None:
    obj = pod("p", gang="g", gpus=1, topology="{not json")
    obj["metadata"]["annotations"][keys.ANN_GANG_MIN_MEMBER] = "many"
    obj["metadata"]["annotations"][keys.ANN_GPU_ASSIGNMENT] = "garbage"
    info = parse_pod(obj)
    assert any("gang-min-member must be an integer" in p for p in info.problems)
    assert any("gpu-topology is not JSON" in p for p in info.problems)
    assert info.assignment is None and info.assignment_raw == "garbage"


def test_topology_request_modes() -> None:
    info = parse_pod(pod("p", gpus=1, topology=json.dumps(
        {"v": 1, "mode": "preferred", "singleNode": False, "minRingGBps": 50})))
    assert info.topology is not None
    assert (info.topology.mode, info.topology.single_node, info.topology.min_ring_gbps) == (
        "preferred", False, 50.0)
    bad = parse_pod(pod("q", gpus=1, topology=json.dumps({"v": 1, "mode": "sometimes"})))
    assert bad.topology is None and "mode must be required or preferred" in bad.problems[0]


def test_node_parsing_and_bad_topology_annotation() -> None:
    n = parse_node(node("n1", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}]))
    assert n.topology is not None and n.topology.size == 8 and n.gpus == 8
    assert n.cpu_milli == 64000 and n.pods == 110 and n.taints[0].key == "k"
    broken = node("n2")
    broken["metadata"]["annotations"][keys.ANN_NODE_TOPOLOGY] = '{"v": 99}'
    b = parse_node(broken)
    assert b.topology is None and b.topology_error


def test_assignment_round_trip_and_container_order() -> None:
    topo = builtin("dgx1-v100")
    a = build_assignment("n1", topo, (0, 3, 2, 1, 7), [("init", 2), ("a", 0), ("b", 3), ("c", 2)],
                         init_containers=1)
    assert {n: c.indices for n, c in a.containers.items()} == {
        "init": (0, 3), "b": (0, 3, 2), "c": (1, 7)}
    assert a.containers["c"].uuids == (topo.gpus[1].uuid, topo.gpus[7].uuid)
    assert decode_assignment(encode_assignment(a)) == a
    assert json.loads(encode_assignment(a))["v"] == 1
    assert shape_matches(a, [("init", 2), ("a", 0), ("b", 3), ("c", 2)])
    assert not shape_matches(a, [("b", 3), ("c", 1)])
    with pytest.raises(AssignmentError):
        build_assignment("n1", topo, (0,), [("b", 2)])


def test_one_round_builds_each_pod_as_build_assignment_would() -> None:
    """The round's Assigner works out a shape's hand-out once: every pod still gets its own
    GPUs, and a pod of another shape (an init container, a sidecar, another count) its own."""
    topo = builtin("dgx1-v100")
    round_ = Assigner()
    cases = [
        ((0, 1, 2, 3), [("main", 4)], 0, ()),
        ((4, 5, 6, 7), [("main", 4)], 0, ()),
        ((5, 6, 7), [("init", 2), ("main", 1)], 1, ()),
        ((1, 2, 3), [("init", 2), ("main", 1)], 1, ("init",)),
        ((2, 1), [("main", 1), ("side", 1)], 0, ()),
        ((0, 2, 1), [("main", 1), ("side", 2)], 0, ()),
    ]
    for gpus, containers, init, sidecars in [*cases, *cases]:
        assert round_.build("n1", topo, gpus, containers, init, sidecars=sidecars) == \
            build_assignment("n1", topo, gpus, containers, init, sidecars=sidecars)
    with pytest.raises(AssignmentError):  # a shortage is refused every time, not remembered
        round_.build("n1", topo, (0,), [("main", 1), ("side", 1)])


def test_uuids_are_found_by_the_gpus_index_wherever_it_is_listed() -> None:
    """Nodes list their GPUs by index (the fast path); one listed otherwise, or an index it
    does not list, still gets the UUID of that index, or "" (the agent resolves it)."""
    topo = builtin("dgx1-v100")
    assert uuids_of(topo, (3, 0)) == (topo.gpus[3].uuid, topo.gpus[0].uuid)
    shuffled = replace(topo, gpus=tuple(reversed(topo.gpus)))
    assert uuids_of(shuffled, (3, 0)) == (topo.gpus[3].uuid, topo.gpus[0].uuid)
    assert uuids_of(topo, (9, 1)) == ("", topo.gpus[1].uuid)
    assert uuids_of(topo, (-1, 1)) == ("", topo.gpus[1].uuid)  # (not the last by position)
    assert uuids_of(None, (0, 1)) == ("", "")
    assert uuids_of(topo, ()) == ()
    # a GPU whose UUID its source did not give (a pasted nvidia-smi matrix): ""
    unnamed = replace(topo, gpus=(replace(topo.gpus[0], uuid=None), *topo.gpus[1:]))
    assert uuids_of(unnamed, (0, 1)) == ("", topo.gpus[1].uuid)


@pytest.mark.parametrize("text", ['{"v": 2, "node": "n", "containers": {}}', "[]",
                                  '{"v": 1, "node": "", "containers": {}}',
                                  '{"v": 1, "node": "n", "containers": {"a": {"indices": [1], '
                                  '"uuids": []}}}', "{"])
def test_bad_assignment_is_refused(text: str) -> None:
    with pytest.raises(AssignmentError):
        decode_assignment(text)


def test_gang_record_round_trip_and_only_a_bound_pods_counts() -> None:
    record = (("w-0", "n1", (0, 1)), ("w-1", "n2", (4,)), ("launcher", "n1", ()))
    text = encode_record(record)
    assert sorted(decode_record(text)) == sorted(record)
    bound = pod("w-0", node_name="n1")
    bound["metadata"]["annotations"][keys.ANN_GANG_PLACEMENT] = text
    assert sorted(parse_pod(bound).placement) == sorted(record)
    del bound["spec"]["nodeName"]  # a user's annotation on a pending pod reserves nothing
    assert parse_pod(bound).placement == ()


def test_records_and_assignments_count_only_on_the_binders_own_pods() -> None:
    """What a user wrote on a pod the binder did not bind (a gate + annotate + ungate forgery,
    or a pod created bound) is not the binder's: no assignment, no record, nothing reserved."""
    text = encode_record((("w-1", "n1", (0, 1)),))
    forged = encode_assignment(GpuAssignment("n1", {"main": ContainerGpus((2, 3), ("", ""))}))
    mine = pod("w-0", gpus=2, node_name="n1", assignment=forged)
    mine["metadata"]["annotations"][keys.ANN_GANG_PLACEMENT] = text
    ours = parse_pod(mine)
    assert ours.assignment is not None and ours.placement and ours.assignment_raw == forged
    for scheduler in ("default-scheduler", "volcano"):
        other = copy.deepcopy(mine)
        other["spec"]["schedulerName"] = scheduler
        info = parse_pod(other)
        assert (info.assignment, info.assignment_raw, info.placement) == (None, None, ())
    # the binder's own name, if it has another one
    assert parse_pod(mine, "gangs").assignment is None
    renamed = copy.deepcopy(mine)
    renamed["spec"]["schedulerName"] = "gangs"
    assert parse_pod(renamed, "gangs").assignment is not None
    # an assignment for another node than the pod is bound to: no Binding of ours wrote it
    moved = copy.deepcopy(mine)
    moved["spec"]["nodeName"] = "n2"
    info = parse_pod(moved)
    assert (info.assignment, info.assignment_raw, info.placement) == (None, None, ())


@pytest.mark.parametrize("text", ['{"v": 2, "members": {}}', "[]", "{",
                                  '{"v": 1, "members": {"a": {"node": "", "gpus": []}}}',
                                  '{"v": 1, "members": {"a": {"node": "n", "gpus": [true]}}}',
                                  '{"v": 1, "members": {"a": ["n", [0]]}}'])
def test_bad_gang_record_is_refused_and_reserves_nothing(text: str) -> None:
    with pytest.raises(AssignmentError):
        decode_record(text)
    bound = pod("w-0", node_name="n1")
    bound["metadata"]["annotations"][keys.ANN_GANG_PLACEMENT] = text
    assert parse_pod(bound).placement == () and not parse_pod(bound).problems
