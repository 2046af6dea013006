from __future__ import annotations

from binder_objects import node, pod

from webhook.binder.allocation import Allocation
from webhook.binder.assignment import build_assignment, encode_assignment
from webhook.binder.nodes import parse_node
from webhook.binder.pods import parse_pod
from webhook.topology.builtin import builtin

TOPO = builtin("dgx1-v100")


def assigned(node_name: str, *gpus: int) -> str:
    return encode_assignment(build_assignment(node_name, TOPO, gpus, [("main", len(gpus))]))


def test_bound_and_reserved_pods_hold_resources_terminated_do_not() -> None:
    pods = [parse_pod(p) for p in (
        pod("bound", gpus=2, cpu="4", node_name="n1", assignment=assigned("n1", 0, 1)),
        pod("reserved", gpus=1, cpu="2", assignment=assigned("n1", 5)),
        pod("done", gpus=1, cpu="8", node_name="n1", assignment=assigned("n1", 7),
            phase="Succeeded"),
        pod("pending", gpus=1, cpu="16"),
    )]
    state = Allocation.from_pods(pods).node_state(parse_node(node("n1")))
    assert state.free_gpus == {2, 3, 4, 6, 7} and isinstance(state.free_gpus, frozenset)
    assert state.free_cpu_milli == 64000 - 6000
    assert state.free_pods == 108


def test_gpus_of_pods_without_assignment_are_held_back() -> None:
    pods = [parse_pod(pod("other", gpus=3, node_name="n1", scheduler="default-scheduler"))]
    alloc = Allocation.from_pods(pods)
    state = alloc.node_state(parse_node(node("n1")))
    assert len(state.free_gpus) == 5
    assert alloc.assigned_gpus("n1") == 3


def test_allocatable_below_topology_caps_free_gpus() -> None:
    state = Allocation({}).node_state(parse_node(node("n1", gpus=6)))
    assert len(state.free_gpus) == 6


def test_double_assignment_is_detected() -> None:
    pods = [parse_pod(pod("a", gpus=1, node_name="n1", assignment=assigned("n1", 3))),
            parse_pod(pod("b", gpus=1, assignment=assigned("n1", 3)))]
    assert Allocation.from_pods(pods).conflicts() == {"n1": {3: ["team-a/a", "team-a/b"]}}
