"""Critical XID events mark GPUs unhealthy: the watcher thread, and the agent end to end."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import pynvml
from agent_helpers import NODE

from webhook import keys
from webhook.agent.deviceplugin.plugin import PluginConfig
from webhook.agent.health import XidEvent, XidWatcher, mark_unhealthy
from webhook.agent.nvmlrecord import Err, NvmlRecord
from webhook.agent.runner import Agent, AgentConfig, nvml_discoverer
from webhook.doubles.emulator import ApiServerEmulator
from webhook.doubles.fakekubelet import FakeKubelet
from webhook.doubles.fakenvml import FakeNvml
from webhook.kube.api import KubeApi
from webhook.topology import builtin, decode


def test_watcher_reports_gpu_faults_and_skips_application_xids() -> None:
    nvml = FakeNvml.profile("dgx1-v100")
    got: list[XidEvent] = []
    stop = threading.Event()
    thread = threading.Thread(target=XidWatcher(nvml, wait_ms=20).run, args=(stop, got.append))
    thread.start()
    try:
        for _ in range(200):  # until the watcher has registered its devices
            if nvml.calls.count("nvmlDeviceRegisterEvents") == 8:
                break
            threading.Event().wait(0.01)
        nvml.inject_xid(3, 13)  # graphics engine exception: the application's fault
        nvml.inject_xid(3, 79)  # fallen off the bus: the GPU's
        nvml.inject_xid(6, 48)  # double-bit ECC error
        for _ in range(200):
            if len(got) == 2:
                break
            threading.Event().wait(0.01)
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()
    uuids = builtin("dgx1-v100").gpus
    assert got == [XidEvent(uuids[3].uuid, 79), XidEvent(uuids[6].uuid, 48)]
    assert nvml.initialised == 0  # the watcher's nvmlInit was balanced


def test_watcher_without_nvml_returns_at_once() -> None:
    code = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    nvml = FakeNvml(NvmlRecord(init_error=code, device_count=Err(error=code)))
    got: list[XidEvent] = []
    XidWatcher(nvml).run(threading.Event(), got.append)
    assert got == []


def test_mark_unhealthy() -> None:
    topo = builtin("dgx1-v100")
    marked = mark_unhealthy(topo, {topo.gpus[2].uuid, "GPU-elsewhere"})
    assert [g.healthy for g in marked.gpus] == [i != 2 for i in range(8)]
    assert mark_unhealthy(topo, {"GPU-elsewhere"}) is topo


async def test_agent_streams_an_xid_fault_without_waiting_for_rediscovery(
        apiserver: ApiServerEmulator, kube: KubeApi, sock_dir: Path,
        kubelet: FakeKubelet) -> None:
    apiserver.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    nvml = FakeNvml.profile("dgx1-v100")
    config = AgentConfig(node=NODE, rediscover_s=30, plugin=PluginConfig(
        node=NODE, kubelet_dir=sock_dir, kubelet_check_s=0.05))
    agent = Agent(config, nvml_discoverer(nvml), kube, events_nvml=nvml)
    run = asyncio.create_task(agent.run())
    gpu5 = builtin("dgx1-v100").gpus[5].uuid
    try:
        ep = await kubelet.wait_for("nvidia.com/gpu", count=8)
        assert set(ep.devices.values()) == {"Healthy"}
        for _ in range(500):  # until the watcher thread has registered its devices
            if nvml.calls.count("nvmlDeviceRegisterEvents") == 8:
                break
            await asyncio.sleep(0.01)
        nvml.inject_xid(5, 79)
        ep = await kubelet.wait_for("nvidia.com/gpu", min_updates=2, within=5)
        assert ep.devices[gpu5] == "Unhealthy"
        assert sum(h == "Healthy" for h in ep.devices.values()) == 7
        for _ in range(100):
            node = apiserver.get("nodes", NODE) or {}
            if (node["metadata"].get("labels") or {}).get(keys.LABEL_GPU_DEGRADED) == "true":
                break
            await asyncio.sleep(0.02)
        topo = decode(node["metadata"]["annotations"][keys.ANN_NODE_TOPOLOGY])
        assert [g.index for g in topo.gpus if not g.healthy] == [5]
        assert agent.rounds == 1  # no re-discovery was needed
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    assert nvml.initialised == 0  # the watcher thread ended and shut NVML down
