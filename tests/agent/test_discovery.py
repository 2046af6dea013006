"""NVML discovery against the fake NVML: real DGX-1/HGX answers, and odd answers degrading."""

from __future__ import annotations

import re
from pathlib import Path

import pynvml
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from webhook.agent.discovery import discover
from webhook.agent.nvml import Nvml, RealNvml
from webhook.agent.nvmlrecord import Err, NvmlRecord, record_nvml
from webhook.doubles.fakenvml import FakeHandle, FakeNvml, profile_record
from webhook.topology import builtin, decode, encode, topology_class
from webhook.topology.model import PCIeLevel


def design_matrix(shared_dir: Path) -> list[list[int]]:
    """The DGX-1 V100 NVLink matrix as the shared reference writes it (independent of the
    fake's copy)."""
    return _matrix_in((shared_dir / "DESIGN.md").read_text())


def _matrix_in(text: str) -> list[list[int]]:
    rows = re.findall(r"^\s*([0-7])((?:\s+[-0-9]){8})\s*$", text, re.M)
    assert len(rows) == 8
    return [[0 if c == "-" else int(c) for c in cells.split()] for _, cells in rows]


def test_the_docs_copy_of_the_matrix_is_the_reference(shared_dir: Path) -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "design.md"
    assert _matrix_in(docs.read_text()) == design_matrix(shared_dir)


def test_dgx1_v100_matches_reference_facts(shared_dir: Path) -> None:
    nvml = FakeNvml.profile("dgx1-v100")
    found = discover(nvml)
    topo = found.topology
    assert topo is not None
    assert found.degradations == () and not found.degraded
    assert [list(r) for r in topo.nvlinks] == design_matrix(shared_dir)
    assert all(sum(row) == 6 for row in topo.nvlinks)  # six NVLinks per V100
    for i in range(8):
        for j in range(8):
            if i == j:
                want = PCIeLevel.INTERNAL
            elif i // 2 == j // 2:
                want = PCIeLevel.PIX
            elif i // 4 == j // 4:
                want = PCIeLevel.PHB
            else:
                want = PCIeLevel.SYS
            assert topo.pcie[i][j] == want, (i, j)
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {g.model for g in topo.gpus} == {"Tesla V100-SXM2-16GB"}
    assert {g.memory_mib for g in topo.gpus} == {16160}
    assert len({g.uuid for g in topo.gpus}) == 8 and all(g.healthy for g in topo.gpus)
    assert topo.gpus[4].pci_bus_id == "00000000:85:00.0"
    assert topo.nvswitch == frozenset() and topo.nvlink_gbps == 25.0
    assert nvml.initialised == 0  # nvmlShutdown balanced nvmlInit
    # the old driver has no remote device type call: the fallback through remote PCI ids was used
    assert "nvmlDeviceGetNvLinkRemotePciInfo" in nvml.calls


def test_current_driver_gives_the_same_topology() -> None:
    old = discover(FakeNvml.profile("dgx1-v100")).topology
    new = discover(FakeNvml.profile("dgx1-v100-r535")).topology
    assert old == new


def test_nvswitch_from_remote_device_type() -> None:
    topo = discover(FakeNvml.profile("hgx-a100")).topology
    assert topo is not None
    assert topo.nvswitch == frozenset(range(8)) and topo.nvswitch_links == 12
    assert all(n == 0 for row in topo.nvlinks for n in row)
    assert topo.pcie[0][1] == PCIeLevel.PXB and topo.pcie[0][2] == PCIeLevel.NODE
    assert topo.pcie_gen == 4


def test_nvswitch_fallback_when_remote_type_not_supported() -> None:
    record = profile_record("hgx-a100")
    for dev in record.devices:
        for link in dev.links:
            link.remote_type = Err(error=pynvml.NVML_ERROR_NOT_SUPPORTED)
    found = discover(FakeNvml(record))
    assert found.topology is not None and not found.degraded
    assert found.topology.nvswitch == frozenset(range(8))
    assert found.topology.nvswitch_links == 12


def test_numa_not_supported_is_a_fact_not_a_degradation() -> None:
    record = profile_record("dgx1-v100")
    for dev in record.devices:
        dev.memory_affinity = Err(error=pynvml.NVML_ERROR_NOT_SUPPORTED)
    found = discover(FakeNvml(record))
    assert found.topology is not None
    assert {g.numa_node for g in found.topology.gpus} == {None}
    assert not found.degraded


@pytest.mark.parametrize(("nodes", "want"), [([], None), ([0, 1], None), ([1], 1), ([70], 70),
                                             ([1023], 1023)])
def test_numa_is_the_one_node_of_the_memory_affinity(nodes: list[int], want: int | None) -> None:
    """A GPU near no node or several equally has no one NUMA node; bits past 64 are read."""
    record = profile_record("dgx1-v100")
    record.devices[0].memory_affinity = nodes
    found = discover(FakeNvml(record))
    assert found.topology is not None and not found.degraded
    assert found.topology.gpus[0].numa_node == want


def test_unknown_error_on_one_pair_degrades_only_that_pair() -> None:
    record = profile_record("dgx1-v100")
    record.devices[0].common_ancestor[1] = Err(error=pynvml.NVML_ERROR_UNKNOWN)
    found = discover(FakeNvml(record))
    topo = found.topology
    assert topo is not None and found.degraded
    assert [(d.field, d.code) for d in found.degradations] == [("pcie[0][1]", 999)]
    assert topo.pcie[0][1] == topo.pcie[1][0] == PCIeLevel.SYS  # conservative
    assert topo.pcie[2][3] == PCIeLevel.PIX
    assert all(g.healthy for g in topo.gpus)


def test_unknown_topology_level_is_degraded_to_sys() -> None:
    record = profile_record("dgx1-v100")
    record.devices[2].common_ancestor[3] = 35
    found = discover(FakeNvml(record))
    assert found.topology is not None and found.topology.pcie[2][3] == PCIeLevel.SYS
    assert [d.field for d in found.degradations] == ["pcie[2][3]"]


@pytest.mark.parametrize("calls", [3, 12, 30])
def test_gpu_lost_mid_discovery(calls: int) -> None:
    nvml = FakeNvml.profile("dgx1-v100")
    nvml.lose_gpu_after(5, calls)
    found = discover(nvml)
    topo = found.topology
    assert topo is not None and found.degraded
    assert [g.index for g in topo.gpus if not g.healthy] == [5]
    assert any(d.code == pynvml.NVML_ERROR_GPU_IS_LOST for d in found.degradations)
    # the healthy GPUs still see their links to GPU 5, and everything between them is intact
    assert topo.nvlinks[1][5] == 2 and topo.nvlinks[4][5] == 1 and topo.nvlinks[6][5] == 2
    assert topo.nvlinks[0][3] == 2 and topo.pcie[6][7] == PCIeLevel.PIX
    assert nvml.initialised == 0


def test_handle_failure_keeps_index_positions() -> None:
    record = profile_record("dgx1-v100")
    record.devices[3].handle_error = pynvml.NVML_ERROR_UNKNOWN
    found = discover(FakeNvml(record))
    topo = found.topology
    assert topo is not None and topo.size == 8
    assert topo.gpus[3].uuid == "unknown-gpu-3" and not topo.gpus[3].healthy
    assert topo.gpus[4].uuid == record.devices[4].uuid  # later GPUs keep their index
    # GPU 3's PCI id is unknown: links to it are not mistaken for an NVSwitch, they are degraded
    assert topo.nvlinks[0][3] == 0 and topo.nvswitch == frozenset()
    assert "gpu[0].nvlink[2].remotePci" in {d.field for d in found.degradations}
    assert topo.nvlinks[0][1] == 1 and topo.nvlinks[4][7] == 2


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                                  pynvml.NVML_ERROR_LIBRARY_NOT_FOUND])
def test_nvml_unusable_gives_no_topology(code: int) -> None:
    found = discover(FakeNvml(NvmlRecord(init_error=code, device_count=Err(error=code))))
    assert found.topology is None and found.degraded
    assert found.degradations[0].field == "nvml.init" and found.degradations[0].code == code


def test_device_count_failure_gives_no_topology_and_shuts_down() -> None:
    record = profile_record("dgx1-v100")
    record.device_count = Err(error=pynvml.NVML_ERROR_UNKNOWN)
    nvml = FakeNvml(record)
    found = discover(nvml)
    assert found.topology is None and found.degraded and nvml.initialised == 0


def test_nvlink_peer_not_listed_is_degraded() -> None:
    record = profile_record("dgx1-v100-r535")
    record.devices[0].links[0].remote_pci_bus_id = "00000000:3B:00.0"  # no such GPU
    found = discover(FakeNvml(record))
    assert found.topology is not None
    assert [d.field for d in found.degradations] == ["gpu[0].nvlink[0].remotePci"]
    assert found.topology.nvlinks[0][1] == 1  # seen from GPU 1's end


def test_fake_answers_with_real_pynvml_types() -> None:
    nvml = FakeNvml.profile("dgx1-v100")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(2)
    pci = nvml.nvmlDeviceGetPciInfo(handle)
    assert isinstance(pci, pynvml.nvmlPciInfo_t) and pci.bus == 0x0A and pci.domain == 0
    assert isinstance(nvml.nvmlDeviceGetMemoryInfo(handle), pynvml.c_nvmlMemory_t)
    assert isinstance(nvml.nvmlDeviceGetUUID(handle), str)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, 0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetNvLinkState(handle, 6)  # a V100 has links 0-5
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(8)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetUUID(object())  # type: ignore[arg-type]
    assert nvml.nvmlDeviceGetTopologyCommonAncestor(handle, FakeHandle(3)) == 10
    nvml.nvmlShutdown()


def test_real_and_fake_nvml_answer_every_call_of_the_interface() -> None:
    calls = {name for name in vars(Nvml) if name.startswith("nvml")}
    assert calls <= set(vars(RealNvml)) and calls <= set(vars(FakeNvml))


def test_real_nvml_answers_as_the_library_does() -> None:
    # with or without NVIDIA's driver here: the adapter changes nothing discovery sees
    assert discover(RealNvml()) == discover(pynvml)


def test_recorded_file_replays_to_the_same_discovery(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    path.write_text(record_nvml(FakeNvml.profile("dgx1-v100"), source="test").to_json())
    replay = FakeNvml.from_file(path)
    assert discover(replay) == discover(FakeNvml.profile("dgx1-v100"))
    # recording the replay gives the same record again: the format loses nothing discovery reads
    assert record_nvml(replay, source="test") == replay.record


def test_anonymised_record_keeps_everything_but_uuids() -> None:
    plain = record_nvml(FakeNvml.profile("dgx1-v100"))
    anon = record_nvml(FakeNvml.profile("dgx1-v100"), anonymise_salt="s")
    assert all(a.uuid != p.uuid for a, p in zip(anon.devices, plain.devices, strict=True))
    assert len({d.uuid for d in anon.devices}) == 8
    t_anon, t_plain = discover(FakeNvml(anon)).topology, discover(FakeNvml(plain)).topology
    assert t_anon is not None and t_plain is not None
    assert t_anon.nvlinks == t_plain.nvlinks and t_anon.pcie == t_plain.pcie


_FAULTS = st.sampled_from([pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_NOT_SUPPORTED,
                           pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_TIMEOUT])


@settings(max_examples=60, deadline=None)
@given(faults=st.lists(st.tuples(st.integers(0, 7), st.sampled_from(
    ["uuid", "name", "pci_bus_id", "memory_total", "link", "pair", "handle"]),
    st.integers(0, 7), _FAULTS), max_size=6))
@example(faults=[(0, "link", 0, pynvml.NVML_ERROR_UNKNOWN),
                 (0, "link", 0, pynvml.NVML_ERROR_NOT_SUPPORTED)])  # the second one counts
def test_any_mix_of_failures_degrades_but_never_raises(
        faults: list[tuple[int, str, int, int]]) -> None:
    record = profile_record("dgx1-v100")
    last: dict[tuple[int, str, int], int] = {}  # a later fault on the same target replaces one
    for gpu, what, other, code in faults:
        dev = record.devices[gpu]
        target = other % len(dev.links) if what == "link" else other if what == "pair" else 0
        last[gpu, what, target] = code
        if what == "handle":
            dev.handle_error = code
        elif what == "link":
            dev.links[other % len(dev.links)].state = Err(error=code)
        elif what == "pair":
            if other > gpu:  # discovery asks each pair once, lower index first
                dev.common_ancestor[other] = Err(error=code)
        else:
            setattr(dev, what, Err(error=code))
    found = discover(FakeNvml(record))
    topo = found.topology
    assert topo is not None and topo.size == 8
    for i in range(8):
        for j in range(8):
            assert topo.nvlinks[i][j] == topo.nvlinks[j][i] <= 2
            assert topo.pcie[i][j] == topo.pcie[j][i]
    assert all(sum(row) <= 6 for row in topo.nvlinks)
    # NotSupported on a link's state reads as "no such link"; every other fault must show
    if any(not (w == "pair" and g >= o) and not (w == "link" and c == 3)
           for (g, w, o), c in last.items()):
        assert found.degraded


@pytest.mark.parametrize("name", ["dgx1-v100", "dgx1-v100-r535", "hgx-a100", "hgx-h100"])
def test_discovered_fake_machine_is_the_builtin_node_type(name: str) -> None:
    node_type = name.removesuffix("-r535")
    found = discover(FakeNvml.profile(name)).topology
    assert found is not None
    want = builtin(node_type)
    assert topology_class(found) == topology_class(want)
    # everything but the built-in's name: the fake machine is that node type, GPU for GPU
    assert decode(encode(found)) == found
    assert found.gpus == want.gpus and found.nvlinks == want.nvlinks and found.pcie == want.pcie
    assert (found.nvswitch, found.nvswitch_links, found.nvlink_gbps, found.pcie_gen) == (
        want.nvswitch, want.nvswitch_links, want.nvlink_gbps, want.pcie_gen)


def test_a_profile_per_node_has_uuids_of_its_own_and_the_same_topology() -> None:
    """`--fake-nvml=dgx1-v100@$(NODE_NAME)`: the fake nodes of one cluster share no GPU UUID
    (the binder's assignments and the PodResources check key on UUIDs), and each node's
    interconnect is the profile's."""
    from webhook.doubles.fakenvml import fake_nvml  # noqa: PLC0415

    plain = discover(fake_nvml("dgx1-v100")).topology
    first = discover(fake_nvml("dgx1-v100@node-a")).topology
    second = discover(fake_nvml("dgx1-v100@b")).topology
    assert first is not None and second is not None and plain is not None
    uuids = [{g.uuid for g in t.gpus} for t in (plain, first, second)]
    assert all(len(u) == 8 for u in uuids)
    assert not (uuids[0] & uuids[1]) and not (uuids[1] & uuids[2]) and not (uuids[0] & uuids[2])
    assert discover(fake_nvml("dgx1-v100@node-a")).topology == first  # stable across restarts
    assert (first.nvlinks, first.pcie) == (plain.nvlinks, plain.pcie)
