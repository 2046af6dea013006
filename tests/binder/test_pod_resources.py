"""The binder counts a pod as kube-scheduler does: sidecars, pod-level resources, and scheduling
gates (a gated pod is not scheduled, nor counted in its gang, until its last gate goes)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from binder_objects import job, node, pod
from binder_run import serving
from test_planner import placed, run

from e2e.probes import eventually
from webhook import keys
from webhook.binder.controller import Binder, BinderConfig
from webhook.binder.pods import parse_pod
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi
from webhook.kube.api import PODS

GATES = {"schedulingGates": [{"name": "example.com/quota"}]}


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


def test_a_gated_pod_is_neither_placed_nor_a_present_member() -> None:
    alone = pod("alone", gpus=1, extra_spec=GATES)
    assert not run([alone], [node("n1")]).places
    pods = job("j1")
    pods[0]["spec"].update(GATES)
    p = run([alone, *pods], [node("n1")])
    assert not p.places
    assert [(w.gang.key, w.kind) for w in p.waits] == [("team-a/j1", "members")]
    assert "4 of minMember 5" in p.waits[0].reason
    del pods[0]["spec"]["schedulingGates"]
    assert set(placed(run(pods, [node("n1")]))) == {p["metadata"]["name"] for p in pods}


@pytest.fixture
async def binder(kube: KubeApi) -> AsyncIterator[Binder]:
    b = Binder(kube, BinderConfig(backoff_initial=0.05, backoff_max=0.5, event_interval=0.0))
    async with serving(b):
        yield b


async def test_a_gated_member_is_bound_once_its_gates_are_removed(
        apiserver: ApiServerEmulator, kube: KubeApi, binder: Binder) -> None:
    apiserver.seed(node("n1"))
    pods = job("j1")
    pods[0]["spec"].update(GATES)
    for p in pods:
        await kube.create(PODS, p)
    await eventually(lambda: binder.last_plan and any(
        w.kind == "members" and "4 of minMember 5" in w.reason for w in binder.last_plan.waits))
    await asyncio.sleep(0.3)
    assert not any(p["spec"].get("nodeName") for p in apiserver.objects("pods", "team-a"))
    await kube.patch(PODS, pods[0]["metadata"]["name"],
                     [{"op": "remove", "path": "/spec/schedulingGates"}], "team-a",
                     patch_type="json")
    bound = await eventually(lambda: all(p["spec"].get("nodeName")
                                         for p in apiserver.objects("pods", "team-a"))
                             and apiserver.objects("pods", "team-a"))
    assert len(bound) == 5
    gpus = [i for p in bound for c in json.loads(
        p["metadata"]["annotations"][keys.ANN_GPU_ASSIGNMENT])["containers"].values()
        for i in c["indices"]]
    assert len(gpus) == len(set(gpus)) == 4
