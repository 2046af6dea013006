"""Discovery on a real GPU node, through NVIDIA's own library: skipped where NVML does not start.

CI has no GPU, so these run where one is lent (docs/agent.md, "Seen on a real GPU"). They check
what the fake cannot: that the calls discovery makes exist and answer on this driver, that the
NUMA node agrees with the kernel's own record (sysfs), and that a recording replays to exactly the
topology the real library gave, which is what makes recorded fixtures worth replaying.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from pathlib import Path

import pynvml
import pytest

from e2e.probes import eventually
from webhook import keys
from webhook.agent.deviceplugin.plugin import PluginConfig
from webhook.agent.discovery import discover
from webhook.agent.dra.publisher import SYSFS_PCI, pcie_roots, sysfs_bus_id
from webhook.agent.dra.slices import PCIE_ROOT, devices
from webhook.agent.health import XidWatcher
from webhook.agent.nvml import RealNvml
from webhook.agent.nvmlrecord import NvmlRecord, record_nvml
from webhook.agent.publisher import identify
from webhook.agent.runner import Agent, AgentConfig, nvml_discoverer
from webhook.doubles.emulator import ApiServerEmulator
from webhook.doubles.fakekubelet import FakeKubelet
from webhook.doubles.fakenvml import FakeNvml
from webhook.kube.api import KubeApi
from webhook.topology import decode

try:
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
except pynvml.NVMLError as exc:  # no driver or no GPU: nothing real to ask
    pytest.skip(f"no NVML here ({exc})", allow_module_level=True)

pytestmark = pytest.mark.gpu


def _cpus(cpulist: str) -> set[int]:
    """A kernel cpulist ("0-15,32-47") as a set."""
    out: set[int] = set()
    for part in filter(None, cpulist.strip().split(",")):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def _kernel_numa(bus_id: str) -> int | None:
    """The GPU's NUMA node as the kernel has it: the PCI device's numa_node, or where that is
    -1 (a VM's passed-through GPU) the one node whose CPUs include all the GPU's local CPUs."""
    device = SYSFS_PCI / sysfs_bus_id(bus_id)
    node = int((device / "numa_node").read_text())
    if node >= 0:
        return node
    local = _cpus((device / "local_cpulist").read_text())
    holding = [int(p.name[4:]) for p in Path("/sys/devices/system/node").glob("node[0-9]*")
               if local and local <= _cpus((p / "cpulist").read_text())]
    return holding[0] if len(holding) == 1 else None


def test_every_gpu_is_discovered_whole() -> None:
    found = discover(RealNvml())
    assert found.topology is not None, found.degradations
    assert not found.degraded, found.degradations
    assert found.driver_version
    for gpu in found.topology.gpus:
        assert gpu.uuid and gpu.uuid.startswith("GPU-") and gpu.healthy
        assert gpu.model and gpu.pci_bus_id and gpu.memory_mib
        assert gpu.numa_node == _kernel_numa(gpu.pci_bus_id), gpu


def test_the_dra_slice_names_each_gpus_numa_node_and_pcie_root() -> None:
    topology = discover(RealNvml()).topology
    assert topology is not None
    roots = pcie_roots(topology)
    assert sorted(roots) == [g.index for g in topology.gpus]  # sysfs knows every real GPU
    for gpu, device in zip(topology.gpus, devices(topology, roots), strict=True):
        attributes = device["attributes"]
        assert attributes[PCIE_ROOT] == {"string": roots[gpu.index]}
        assert attributes.get("numaNode") == (
            None if gpu.numa_node is None else {"int": gpu.numa_node})


def test_a_recording_replays_to_the_same_topology() -> None:
    live = discover(RealNvml()).topology
    record = record_nvml(RealNvml(), source="test")
    assert discover(FakeNvml(record)).topology == live
    # and through the file's JSON, as `--fake-nvml FILE` reads it
    assert discover(FakeNvml(NvmlRecord.from_json(record.to_json(), "test"))).topology == live


def test_xid_events_are_watched_on_every_gpu(caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    faults: list[object] = []
    watcher = XidWatcher(RealNvml(), wait_ms=200)
    thread = threading.Thread(target=watcher.run, args=(stop, faults.append))
    with caplog.at_level(logging.WARNING, logger="webhook.agent.health"):
        thread.start()
        stop.wait(1.0)
        stop.set()
        thread.join(5)
    assert not thread.is_alive()
    assert [r.getMessage() for r in caplog.records] == []
    assert faults == []


async def test_the_agent_serves_the_real_gpus(apiserver: ApiServerEmulator, kube: KubeApi,
                                              sock_dir: Path) -> None:
    """The whole agent on the real NVML, XID watch included: the Node's annotation is the
    live topology, and the kubelet is offered each real GPU by UUID with its NUMA node."""
    node = "gpu-node"
    apiserver.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    live = discover(RealNvml()).topology
    assert live is not None
    config = AgentConfig(node=node, rediscover_s=0.2, ack_grace_s=5, plugin=PluginConfig(
        node=node, kubelet_dir=sock_dir, poll_s=0.05, kubelet_check_s=0.05))
    agent = Agent(config, nvml_discoverer(RealNvml()), kube, RealNvml())
    kubelet = FakeKubelet(sock_dir)
    await kubelet.start()
    run = asyncio.create_task(agent.run())
    try:
        ep = await kubelet.wait_for("nvidia.com/gpu", count=live.size, within=20)
        assert ep.devices == {g.uuid: "Healthy" for g in live.gpus}
        assert ep.numa == {g.uuid: [] if g.numa_node is None else [g.numa_node] for g in live.gpus}

        def labels() -> dict[str, str]:
            found = apiserver.get("nodes", node)
            return (found or {}).get("metadata", {}).get("labels") or {}

        await eventually(lambda: labels().get(keys.LABEL_GPU_ALLOCATION_ACK) == "true",
                         within=10, what="the kubelet to take the plugin")
        published = apiserver.get("nodes", node)
        assert published is not None
        annotation = published["metadata"]["annotations"][keys.ANN_NODE_TOPOLOGY]
        assert decode(annotation) == identify(live)  # named when it is a built-in type
        assert keys.LABEL_GPU_DEGRADED not in labels()
        writes = agent.publisher.writes
        await asyncio.sleep(0.6)  # rediscoveries of the same GPUs write nothing
        assert agent.publisher.writes == writes
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await kubelet.stop()
