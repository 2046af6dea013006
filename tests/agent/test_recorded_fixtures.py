"""Replay every recorded NVML fixture (tests/agent/fixtures/nvml/*.json) through the fake NVML.

Files recorded on real GPU nodes with `muster agent discover --record FILE` go in that
directory; each must replay to a valid topology and re-record identically. EXPECTED names the
built-in node type a fixture must equal (same class hash) where one applies.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.agent.discovery import discover
from webhook.agent.nvmlrecord import record_nvml
from webhook.doubles.fakenvml import FakeNvml
from webhook.topology import builtin, decode, encode, parse_nvidia_smi_topo, topology_class

#: `nvidia-smi topo -m` on the machines h200-vm.json and h100-vm.json were recorded on (the
#: same bytes on both), as the terminal showed it
SMI = Path(__file__).parents[1] / "topology" / "smi" / "h200-vm-tty.txt"
NVML = Path(__file__).parent / "fixtures" / "nvml"
FIXTURES = sorted(NVML.glob("*.json"))
EXPECTED = {
    "dgx1-v100-r418-fake.json": "dgx1-v100",
    "hgx-a100-fake.json": "hgx-a100",
}


def test_there_are_fixtures() -> None:
    assert {p.name for p in FIXTURES} >= set(EXPECTED)


@pytest.mark.parametrize("path", FIXTURES, ids=[p.name for p in FIXTURES])
def test_recorded_fixture_replays(path: Path) -> None:
    nvml = FakeNvml.from_file(path)
    found = discover(nvml)
    assert found.topology is not None, found.degradations
    assert decode(encode(found.topology)) == found.topology
    assert nvml.initialised == 0
    # the record format keeps everything discovery reads: re-recording the replay is lossless
    assert record_nvml(FakeNvml.from_file(path), source=nvml.record.source) == nvml.record
    if path.name in EXPECTED:
        assert topology_class(found.topology) == topology_class(builtin(EXPECTED[path.name]))
        assert not found.degraded


@pytest.mark.parametrize(("fixture", "model", "memory_mib"), [
    ("h200-vm.json", "NVIDIA H200", 143771),
    ("h100-vm.json", "NVIDIA H100 80GB HBM3", 81559),
])
def test_a_real_single_gpu_vm_recording(fixture: str, model: str, memory_mib: int) -> None:
    """Recorded on a real NVIDIA H200 (2026-11-26) and a real H100 (2026-11-27), each one GPU
    passed through to a Firecracker VM, driver 580.159.04: every NVLink call answers
    NotSupported, nvmlDeviceGetNumaNodeId does too (the GPU is no NUMA node of its own), and the
    memory affinity names node 0, as topo -m's NUMA Affinity column does. None of that is a
    degradation. Both machines printed the same `nvidia-smi topo -m`, byte for byte."""
    found = discover(FakeNvml.from_file(NVML / fixture))
    topo = found.topology
    assert topo is not None and not found.degraded and found.driver_version == "580.159.04"
    (gpu,) = topo.gpus
    assert (gpu.model, gpu.numa_node, gpu.memory_mib) == (model, 0, memory_mib)
    assert gpu.pci_bus_id == "00000000:00:06.0" and gpu.uuid and gpu.uuid.startswith("GPU-")
    assert topo.nvlinks == ((0,),) and topo.nvswitch == frozenset() and topo.pcie_gen == 5
    # what `nvidia-smi topo -m` printed on the same machine says the same about the node
    smi = parse_nvidia_smi_topo(SMI.read_text(), pcie_gen=5, nvlink_gbps=None, model=model)
    assert ([g.numa_node for g in smi.gpus], smi.nvlinks, smi.pcie, smi.nvswitch) == (
        [g.numa_node for g in topo.gpus], topo.nvlinks, topo.pcie, topo.nvswitch)
