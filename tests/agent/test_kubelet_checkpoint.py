"""The fake kubelet's checkpoint: what e2e's kubelet restarts rely on, as the real device manager's
`kubelet_internal_checkpoint` does. A restarted kubelet never starts a pod twice, starts a pod
allocated before the restart on its checkpointed devices, and records an Allocate it sent even
when it is stopped while waiting for the answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import NODE, ListedPods, make_pod

from webhook import keys
from webhook.agent.deviceplugin import api_pb2
from webhook.agent.deviceplugin.plugin import GpuDevicePlugin, PluginConfig
from webhook.doubles.fakekubelet import CHECKPOINT, Admission, FakeKubelet, PodRecord
from webhook.topology.model import Topology


class SlowAllocate(ListedPods):
    """Pods whose listing blocks from the `block_from`-th call until `release` is set: the
    agent is then inside Allocate, the kubelet waiting for its answer."""

    def __init__(self, block_from: int) -> None:
        super().__init__()
        self.block_from = block_from
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def pods(self) -> list[dict[str, Any]]:
        if self.lists + 1 >= self.block_from:
            self.entered.set()
            await self.release.wait()
        return await super().pods()


async def _events(kubelet: FakeKubelet, pods: ListedPods, count: int) -> list[dict[str, Any]]:
    async def listed() -> list[dict[str, Any]]:
        return await pods.pods()
    got: list[dict[str, Any]] = []
    async for event in kubelet.start_pods(listed, keys.GPU_RESOURCE, poll_s=0.01):
        got.append(event)
        if len(got) == count:
            break
    return got


@pytest.fixture
def slow() -> SlowAllocate:
    return SlowAllocate(block_from=2)  # 1: the kubelet's, 2: Allocate


@pytest.fixture
async def plugin(sock_dir: Path, dgx1: Topology, slow: SlowAllocate
                 ) -> AsyncIterator[GpuDevicePlugin]:
    p = GpuDevicePlugin(PluginConfig(node=NODE, kubelet_dir=sock_dir, assignment_wait_s=5,
                                     poll_s=0.05, kubelet_check_s=0.05), dgx1, slow)
    yield p
    await p.stop()


async def test_restarted_kubelet_starts_checkpointed_pods_once_without_asking_again(
        sock_dir: Path, dgx1: Topology) -> None:
    before = FakeKubelet(sock_dir)
    given = Admission([dgx1.gpus[3].uuid], {"NVIDIA_VISIBLE_DEVICES": dgx1.gpus[3].uuid}, [])
    before.checkpoint.allocated["nvidia.com/gpu"] = {dgx1.gpus[3].uuid, dgx1.gpus[5].uuid}
    before.checkpoint.pods["uid-allocated"] = PodRecord([given])
    before.checkpoint.pods["uid-started"] = PodRecord(
        [Admission([dgx1.gpus[5].uuid], {}, [])], started=True)
    before.checkpoint.save()

    after = FakeKubelet(sock_dir)  # a new process: everything it knows is in the file
    await after.start()
    try:
        pods = ListedPods()
        pods.items = [make_pod("started", assign={"main": [5]}, topology=dgx1),
                      make_pod("allocated", assign={"main": [3]}, topology=dgx1)]
        # no plugin is registered: an Allocate would fail, so the pod is started from the file
        events = await asyncio.wait_for(_events(after, pods, 1), 5)
        assert events == [{"event": "started", "pod": "ml/allocated",
                           "envs": [given.envs], "devices": [given.devices]}]
        await asyncio.sleep(0.1)  # more polls: neither pod is started again
        assert json.loads((sock_dir / CHECKPOINT).read_text())["pods"]["uid-allocated"][
            "started"] is True
    finally:
        await after.stop()


async def test_stopped_kubelet_still_records_the_allocate_it_sent(
        plugin: GpuDevicePlugin, kubelet: FakeKubelet, dgx1: Topology, slow: SlowAllocate,
        sock_dir: Path) -> None:
    # a kubelet that asks no preference takes the first free device (by ID): the binder
    # assigned that one, or the agent would refuse the container
    first = min(range(dgx1.size), key=lambda i: dgx1.gpus[i].uuid or "")
    slow.items.append(make_pod("worker-0", assign={"main": [first]}, topology=dgx1))
    await plugin.ensure_registered()
    ep = await kubelet.wait_for("nvidia.com/gpu", count=8)
    # no preference asked: Allocate itself lists the pods (and waits there)
    ep.options = api_pb2.DevicePluginOptions(get_preferred_allocation_available=False)
    starting = asyncio.create_task(_events(kubelet, slow, 1))
    await asyncio.wait_for(slow.entered.wait(), 5)
    starting.cancel()  # SIGTERM while the agent answers Allocate
    await asyncio.sleep(0.05)
    slow.release.set()  # the agent serves the pod and marks it served
    with contextlib.suppress(asyncio.CancelledError):
        await starting
    assert starting.cancelled()
    record = json.loads((sock_dir / CHECKPOINT).read_text())["pods"]["uid-worker-0"]
    assert record["admissions"][0]["envs"] == {"NVIDIA_VISIBLE_DEVICES": dgx1.gpus[first].uuid}
    assert record["started"] is False  # the restarted kubelet starts it from the checkpoint
    for _ in range(100):  # the agent acknowledges in the background
        if keys.ANN_GPU_ALLOCATED in slow.items[0]["metadata"]["annotations"]:
            break
        await asyncio.sleep(0.01)
    assert keys.ANN_GPU_ALLOCATED in slow.items[0]["metadata"]["annotations"]


async def test_a_kubelet_that_lost_its_checkpoint_gets_the_same_gpus_again(
        sock_dir: Path, dgx1: Topology) -> None:
    """SIGKILL between the agent's answer and the checkpoint: the restarted kubelet asks for the
    served pod again and the agent gives it the same GPUs, not a refusal."""
    pods = ListedPods()
    pods.items.append(make_pod("worker-0", assign={"main": [4, 5]}, topology=dgx1))
    plugin = GpuDevicePlugin(PluginConfig(node=NODE, kubelet_dir=sock_dir, assignment_wait_s=1,
                                          poll_s=0.05, kubelet_check_s=0.05), dgx1, pods)
    run = asyncio.create_task(plugin.run())
    first = FakeKubelet(sock_dir)
    await first.start()
    try:
        await first.wait_for("nvidia.com/gpu", count=8)
        [started] = await asyncio.wait_for(_events(first, pods, 1), 10)
        for _ in range(100):  # the agent acknowledges in the background
            if keys.ANN_GPU_ALLOCATED in pods.items[0]["metadata"]["annotations"]:
                break
            await asyncio.sleep(0.01)
        await first.stop()
        (sock_dir / CHECKPOINT).unlink()  # what it had not written when it was killed
        second = FakeKubelet(sock_dir)
        await second.start()
        try:
            await second.wait_for("nvidia.com/gpu", count=8, within=10)
            [again] = await asyncio.wait_for(_events(second, pods, 1), 10)
        finally:
            await second.stop()
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await plugin.stop()
    assert keys.ANN_GPU_ALLOCATED in pods.items[0]["metadata"]["annotations"]
    assert started["event"] == again["event"] == "started"
    assert again["envs"] == started["envs"] == [
        {"NVIDIA_VISIBLE_DEVICES": f"{dgx1.gpus[4].uuid},{dgx1.gpus[5].uuid}"}]
