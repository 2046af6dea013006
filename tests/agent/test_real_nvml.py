"""Discovery on a real GPU node, through NVIDIA's own library: skipped where NVML does not start.

CI has no GPU, so these run where one is lent (docs/agent.md, "Seen on a real GPU"). They check
what the fake cannot: that the calls discovery makes exist and answer on this driver, that the
NUMA node agrees with the kernel's own record (sysfs), and that a recording replays to exactly the
topology the real library gave, which is what makes recorded fixtures worth replaying.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pynvml
import pytest

from webhook.agent.discovery import discover
from webhook.agent.dra.publisher import SYSFS_PCI, pcie_roots, sysfs_bus_id
from webhook.agent.dra.slices import PCIE_ROOT, devices
from webhook.agent.health import XidWatcher
from webhook.agent.nvml import RealNvml
from webhook.agent.nvmlrecord import NvmlRecord, record_nvml
from webhook.doubles.fakenvml import FakeNvml

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


def _kernel_agrees(bus_id: str, numa: int | None) -> bool:
    """The kernel's view of the GPU's NUMA node: its numa_node where it names one (a VM's
    passed-through GPU may say -1), and in any case the GPU's local CPUs all belong to it."""
    device = SYSFS_PCI / sysfs_bus_id(bus_id)
    kernel = int((device / "numa_node").read_text())
    if numa is None:
        return kernel < 0
    node_cpus = _cpus(Path(f"/sys/devices/system/node/node{numa}/cpulist").read_text())
    local = _cpus((device / "local_cpulist").read_text())
    return kernel in (-1, numa) and bool(local) and local <= node_cpus


def test_every_gpu_is_discovered_whole() -> None:
    found = discover(RealNvml())
    assert found.topology is not None, found.degradations
    assert not found.degraded, found.degradations
    assert found.driver_version
    for gpu in found.topology.gpus:
        assert gpu.uuid and gpu.uuid.startswith("GPU-") and gpu.healthy
        assert gpu.model and gpu.pci_bus_id and gpu.memory_mib
        assert _kernel_agrees(gpu.pci_bus_id, gpu.numa_node), gpu


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
