"""The binder counts a pod as kube-scheduler does: sidecars and pod-level resources."""

from __future__ import annotations

from typing import Any

from binder_objects import node, pod
from test_planner import run

from webhook import keys
from webhook.binder.pods import parse_pod


def sidecar_pod(name: str) -> dict[str, Any]:
    """An app container with 2 GPUs after an init container with 2 and a sidecar with 1."""
    return pod(name, gpus=2, extra_spec={"initContainers": [
        {"name": "warmup", "resources": {"limits": {keys.GPU_RESOURCE: "2"}}},
        {"name": "proxy", "restartPolicy": "Always",
         "resources": {"requests": {"cpu": "2", "memory": "1Gi"},
                       "limits": {keys.GPU_RESOURCE: "1"}}}]})


def test_a_sidecar_is_counted_beside_the_app_containers() -> None:
    info = parse_pod(sidecar_pod("p"))
    assert (info.gpus, info.cpu_milli, info.memory_bytes) == (3, 3000, 2 * 2**30)
    assert info.container_gpus == (("warmup", 2), ("proxy", 1), ("main", 2))
    assert (info.init_containers, info.sidecars) == (2, frozenset({"proxy"}))


def test_pod_level_resources_replace_the_containers_cpu_and_memory() -> None:
    info = parse_pod(pod("p", gpus=1, cpu="1", memory="1Gi", extra_spec={
        "resources": {"requests": {"cpu": "6", "memory": "3Gi"}},
        "overhead": {"cpu": "100m"}}))
    assert (info.gpus, info.cpu_milli, info.memory_bytes) == (1, 6100, 3 * 2**30)


def test_app_containers_never_get_a_sidecars_gpus() -> None:
    p = run([sidecar_pod("p")], [node("n1")])
    (place,) = p.places
    ((_, a),) = place.assignments
    got = {name: set(c.indices) for name, c in a.containers.items()}
    assert len(got["warmup"]) == 2 and len(got["proxy"]) == 1 and len(got["main"]) == 2
    assert not got["proxy"] & got["main"], "the sidecar runs on beside the app container"
    assert got["warmup"] <= got["proxy"] | got["main"], "a finished init container's GPUs reused"
    assert len(place.placement.members[0].gpus) == 3
