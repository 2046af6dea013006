"""Must show: the reference job on two DGX-1 V100 nodes, against the emulator over real HTTP."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from binder_objects import best_ring_links, gpu_claims, job, node, pod
from binder_run import serving

from e2e.probes import eventually
from webhook import keys
from webhook.binder.assignment import build_assignment, encode_assignment
from webhook.binder.controller import Binder, BinderConfig
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi
from webhook.kube.api import PODS
from webhook.topology.builtin import builtin

TOPO = builtin("dgx1-v100")
#: the reference policy: one node, and an NVLink ring (so that while a finished job's pods are
#: being deleted one by one, the waiting job is not placed on a ringless set in between)
RING = json.dumps({"v": 1, "mode": "required", "singleNode": True, "minRingGBps": 25})
FAST = BinderConfig(backoff_initial=0.05, backoff_max=0.5, event_interval=0.0)


@pytest.fixture
async def binder(kube: KubeApi) -> AsyncIterator[Binder]:
    b = Binder(kube, FAST)
    async with serving(b):
        yield b


def pods_of(api: ApiServerEmulator, prefix: str) -> list[dict[str, Any]]:
    return [p for p in api.objects("pods", "team-a") if p["metadata"]["name"].startswith(prefix)]


def assignment(p: dict[str, Any]) -> dict[str, Any] | None:
    text = (p["metadata"].get("annotations") or {}).get(keys.ANN_GPU_ASSIGNMENT)
    return None if text is None else dict(json.loads(text))


def other_team_pod(node_name: str) -> dict[str, Any]:
    """A running 2-GPU pod of someone else on GPUs 0 and 5: the free six have exactly one
    4-GPU subset with an NVLink ring, {2, 3, 6, 7}."""
    a = build_assignment(node_name, TOPO, (0, 5), [("main", 2)])
    return pod(f"other-{node_name}", ns="team-a", gpus=2, node_name=node_name,
               assignment=encode_assignment(a), phase="Running")


async def test_reference_jobs_fill_nodes_and_a_third_waits(apiserver: ApiServerEmulator,
                                                           kube: KubeApi) -> None:
    for name in ("dgx-a", "dgx-b"):
        apiserver.seed(node(name))
        apiserver.seed(other_team_pod(name))
    b = Binder(kube, FAST)
    async with serving(b):
        first = job("vgg16-a", topology=RING)
        for p in first[:4]:
            await kube.create(PODS, p)
        await eventually(lambda: b.last_plan and any(
            w.kind == "members" for w in b.last_plan.waits))
        await asyncio.sleep(0.3)
        assert all(p["spec"].get("nodeName") is None and assignment(p) is None
                   for p in pods_of(apiserver, "vgg16-a")), "bound before minMember existed"
        await kube.create(PODS, first[4])
        bound = await eventually(lambda: all(p["spec"].get("nodeName")
                                             for p in pods_of(apiserver, "vgg16-a"))
                                 and pods_of(apiserver, "vgg16-a"))
        assert len(bound) == 5
        check_job(bound)
        node_a = workers_node(bound)

        for p in job("vgg16-b", topology=RING):
            await kube.create(PODS, p)
        second = await eventually(lambda: all(p["spec"].get("nodeName")
                                              for p in pods_of(apiserver, "vgg16-b"))
                                  and pods_of(apiserver, "vgg16-b"))
        check_job(second)
        assert workers_node(second) != node_a

        for p in job("vgg16-c", topology=RING):
            await kube.create(PODS, p)
        events = await eventually(lambda: [
            e for e in apiserver.objects("events", "team-a")
            if e["involvedObject"]["name"].startswith("vgg16-c")
            and e["reason"] == "FailedScheduling"])
        assert "needs 4" in events[0]["message"] and events[0]["type"] == "Warning"
        cond = await eventually(lambda: [c for p in pods_of(apiserver, "vgg16-c-worker-0")
                                         for c in (p.get("status") or {}).get("conditions")
                                         or () if c["type"] == "PodScheduled"])
        assert cond[0]["status"] == "False" and cond[0]["reason"] == "Unschedulable"
        assert not any(p["spec"].get("nodeName") for p in pods_of(apiserver, "vgg16-c"))

        for p in bound:
            await kube.delete(PODS, p["metadata"]["name"], "team-a")
        third = await eventually(lambda: all(p["spec"].get("nodeName")
                                             for p in pods_of(apiserver, "vgg16-c"))
                                 and pods_of(apiserver, "vgg16-c"))
        check_job(third)
        assert workers_node(third) == node_a
        claims = gpu_claims(apiserver.objects("pods"))
        assert len({(n, i) for n, i, _ in claims}) == len(claims), "a GPU assigned twice"


def workers_node(pods: list[dict[str, Any]]) -> str:
    return str(next(p for p in pods if "worker" in p["metadata"]["name"])["spec"]["nodeName"])


def check_job(pods: list[dict[str, Any]]) -> None:
    workers = [p for p in pods if "worker" in p["metadata"]["name"]]
    assert len(workers) == 4
    nodes = {p["spec"]["nodeName"] for p in workers}
    assert len(nodes) == 1, f"workers split over {nodes}"
    node_name = nodes.pop()
    gpus = []
    for p in workers:
        a = assignment(p)
        assert a is not None and a["node"] == node_name
        (c,) = a["containers"].values()
        assert len(c["indices"]) == 1
        assert c["uuids"] == [TOPO.gpus[c["indices"][0]].uuid]
        gpus.extend(c["indices"])
    assert len(set(gpus)) == 4
    free = [i for i in range(8) if i not in (0, 5)]
    best = max(best_ring_links(TOPO, s) for s in itertools.combinations(free, 4))
    assert best_ring_links(TOPO, gpus) == best > 0, f"{sorted(gpus)} is not an optimal ring"
    launcher = next(p for p in pods if "launcher" in p["metadata"]["name"])
    la = assignment(launcher)
    assert la is not None and la["containers"] == {} and launcher["spec"]["nodeName"]
