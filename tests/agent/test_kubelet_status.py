"""The fake kubelet reports the pods it starts as a kubelet does: Running with status.startTime
(what the binder prices a preemption victim by), or Failed with UnexpectedAdmissionError where
its device manager refused the pod; through the API server's status subresource, never onto a
later pod of the same name, and again on the next pass when a write was not taken."""

from __future__ import annotations

import asyncio
import calendar
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from webhook import keys
from webhook.doubles.fakekubelet import Admission, FakeKubelet, PodRecord, node_io, pod_status
from webhook.kube import ApiError, KubeApi
from webhook.kube.api import PODS

NODE = "node-a"


def pod(name: str, gpus: int = 0) -> dict[str, Any]:
    limits = {keys.GPU_RESOURCE: str(gpus)} if gpus else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"nodeName": NODE, "containers": [
                {"name": "main", "image": "x", "resources": {"limits": limits}}]}}


async def statuses(kube: KubeApi) -> dict[str, dict[str, Any]]:
    items = (await kube.list(PODS, "team-a"))["items"]
    return {p["metadata"]["name"]: p.get("status") or {} for p in items}


async def run_until(kubelet: FakeKubelet, kube: KubeApi, done: Any, writer: Any = None) -> None:
    pods, write = node_io(kube, NODE)

    async def loop() -> None:
        async for _ in kubelet.start_pods(pods, keys.GPU_RESOURCE, poll_s=0.01,
                                          write_status=writer or write):
            pass
    task = asyncio.create_task(loop())
    try:
        for _ in range(300):
            if done(await statuses(kube)):
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"not reported: {await statuses(kube)}")
    finally:
        task.cancel()


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[FakeKubelet]:
    k = FakeKubelet(tmp_path)  # no plugin: the GPU pods below were admitted before
    yield k


async def test_started_and_refused_pods_are_reported_as_a_kubelet_reports_them(
        kubelet: FakeKubelet, kube: KubeApi) -> None:
    made = {name: await kube.create(PODS, pod(name, gpus), namespace="team-a")
            for name, gpus in (("launcher", 0), ("worker", 1), ("refused", 1))}
    kubelet.checkpoint.pods[made["worker"]["metadata"]["uid"]] = PodRecord(
        [Admission(["GPU-1"], {"NVIDIA_VISIBLE_DEVICES": "GPU-1"}, [])], started=True)
    kubelet.checkpoint.pods[made["refused"]["metadata"]["uid"]] = PodRecord(
        started=True, refusal="no free devices")
    before = time.time()
    await run_until(kubelet, kube, lambda s: all(v.get("phase") != "Pending" for v in s.values()))
    got = await statuses(kube)
    for name in ("launcher", "worker"):
        assert got[name]["phase"] == "Running"
        started = calendar.timegm(time.strptime(got[name]["startTime"], "%Y-%m-%dT%H:%M:%SZ"))
        assert before - 1 <= started <= time.time()
        ready = {c["type"]: c["status"] for c in got[name]["conditions"]}
        assert ready["Ready"] == ready["ContainersReady"] == ready["Initialized"] == "True"
    assert got["refused"]["phase"] == "Failed"
    assert got["refused"]["reason"] == "UnexpectedAdmissionError"
    assert "no free devices" in got["refused"]["message"]
    assert "startTime" not in got["refused"]


async def test_a_status_write_not_taken_is_made_again(kubelet: FakeKubelet,
                                                      kube: KubeApi) -> None:
    await kube.create(PODS, pod("launcher"), namespace="team-a")
    _, write = node_io(kube, NODE)
    calls: list[str] = []

    async def flaky(p: dict[str, Any], status: dict[str, Any]) -> None:
        calls.append(p["metadata"]["name"])
        if len(calls) == 1:
            raise ApiError(503, "ServiceUnavailable", "the API server is restarting")
        await write(p, status)
    await run_until(kubelet, kube, lambda s: s["launcher"].get("phase") == "Running", flaky)
    assert calls[:2] == ["launcher", "launcher"]


async def test_a_status_is_never_written_onto_a_later_pod_of_the_same_name(
        kube: KubeApi) -> None:
    # (not bound: the API server deletes such a pod at once, with no kubelet to confirm it)
    unbound = pod("worker")
    del unbound["spec"]["nodeName"]
    listed = await kube.create(PODS, unbound, namespace="team-a")
    await kube.delete(PODS, "worker", "team-a")
    await kube.create(PODS, unbound, namespace="team-a")
    _, write = node_io(kube, NODE)
    with pytest.raises(ApiError):
        await write(listed, pod_status(listed, None, time.time()))
    assert (await statuses(kube))["worker"].get("phase", "Pending") == "Pending"


async def test_the_devices_of_a_pod_that_left_the_node_or_ended_are_let_go(
        kubelet: FakeKubelet, kube: KubeApi) -> None:
    """As the device manager does once a pod's containers stopped: an evicted pod's GPUs are
    the next pod's. An API outage (no listing) lets nothing go."""
    made = {name: await kube.create(PODS, pod(name, 1), namespace="team-a")
            for name in ("stays", "evicted", "ended")}
    for i, name in enumerate(made):
        kubelet.checkpoint.pods[made[name]["metadata"]["uid"]] = PodRecord(
            [Admission([f"GPU-{i}"], {}, [])], started=True)
    kubelet.checkpoint.allocated[keys.GPU_RESOURCE] = {"GPU-0", "GPU-1", "GPU-2"}
    await kube.patch(PODS, "ended", {"status": {"phase": "Succeeded"}}, "team-a",
                     subresource="status")
    await kube.delete(PODS, "evicted", "team-a")
    await run_until(kubelet, kube, lambda s: s["stays"].get("phase") == "Running")
    assert kubelet.checkpoint.allocated[keys.GPU_RESOURCE] == {"GPU-0"}
    assert set(kubelet.checkpoint.pods) == {made["stays"]["metadata"]["uid"]}

    async def down() -> list[dict[str, Any]]:
        raise ApiError(503, "ServiceUnavailable", "the API server is restarting")

    async def one_pass() -> None:
        async for _ in kubelet.start_pods(down, keys.GPU_RESOURCE, poll_s=0.01):
            pass
    task = asyncio.create_task(one_pass())
    await asyncio.sleep(0.05)
    task.cancel()
    assert kubelet.checkpoint.allocated[keys.GPU_RESOURCE] == {"GPU-0"}


async def test_a_kubelet_stopped_while_reporting_a_start_has_printed_it(
        kubelet: FakeKubelet, kube: KubeApi) -> None:
    """The started line is out before the status write: a kubelet stopped at that write (a
    restart) has printed it. (The restarted one reads `started` in the checkpoint and prints
    none: the e2e flow's restart counted the line of neither, and timed out.)"""
    made = await kube.create(PODS, pod("worker", 1), namespace="team-a")
    # allocated before the restart, not yet started: no plugin needed to start it
    kubelet.checkpoint.pods[made["metadata"]["uid"]] = PodRecord(
        [Admission(["GPU-1"], {"NVIDIA_VISIBLE_DEVICES": "GPU-1"}, [])])
    pods, _ = node_io(kube, NODE)
    writing = asyncio.Event()

    async def hangs(p: dict[str, Any], status: dict[str, Any]) -> None:
        writing.set()
        await asyncio.Event().wait()
    printed: list[dict[str, Any]] = []

    async def loop() -> None:
        async for event in kubelet.start_pods(pods, keys.GPU_RESOURCE, poll_s=0.01,
                                              write_status=hangs):
            printed.append(event)
    task = asyncio.create_task(loop())
    await asyncio.wait_for(writing.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [(e["event"], e["pod"], e["devices"]) for e in printed] == [
        ("started", "team-a/worker", [["GPU-1"]])]
