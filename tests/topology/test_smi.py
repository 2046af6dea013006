"""`nvidia-smi topo -m` parser, on pasted outputs of real machine types (tests/topology/smi/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.topology import PCIeLevel, TopologyFormatError, builtin, decode, encode
from webhook.topology import parse_nvidia_smi_topo as parse
from webhook.topology.inode import choose_gpus, set_score

SAMPLES = Path(__file__).parent / "smi"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def test_dgx1v_paste_gives_the_reference_links_and_sockets() -> None:
    t = parse(sample("dgx1v.txt"), model="Tesla V100-SXM2-16GB")
    ref = builtin("dgx1-v100")
    assert t.nvlinks == ref.nvlinks
    assert [g.numa_node for g in t.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]  # from CPU affinity
    assert t.pcie[0][5] == PCIeLevel.SYS and t.pcie[0][1] == PCIeLevel.NODE  # NV1 hides PIX
    assert not t.nvswitch
    # placement quality does not depend on the hidden PCIe levels here
    assert set_score(t, choose_gpus(t, range(8), 4) or ()).allreduce_gbps == 100.0
    assert decode(encode(t)) == t


def test_dgx_a100_paste_with_tabs_and_numa_column_is_an_nvswitch_node() -> None:
    t = parse(sample("dgxa100.txt"), model="NVIDIA A100-SXM4-80GB", pcie_gen=4)
    assert t.size == 8 and t.nvswitch == frozenset(range(8)) and t.nvswitch_links == 12
    assert all(x == 0 for row in t.nvlinks for x in row)
    assert [g.numa_node for g in t.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert t.pcie[0][1] == PCIeLevel.NODE and t.pcie[0][2] == PCIeLevel.SYS
    assert set_score(t, range(8)).allreduce_gbps == 300.0


def test_pcie_server_with_nic_legend_and_gpu_numa_id() -> None:
    t = parse(sample("pcie8-l40s.txt"), model="NVIDIA L40S", pcie_gen=4)
    assert t.size == 8 and not any(any(r) for r in t.nvlinks)
    assert t.pcie[0][3] == PCIeLevel.PIX and t.pcie[3][4] == PCIeLevel.SYS
    assert [g.numa_node for g in t.gpus] == [0] * 4 + [1] * 4
    assert choose_gpus(t, range(8), 4) == (0, 1, 2, 3)  # stays on one socket


def test_old_driver_soc_is_sys() -> None:
    t = parse(sample("old-soc-4gpu.txt"))
    assert t.pcie[0][2] == PCIeLevel.SYS and t.pcie[0][1] == PCIeLevel.PIX
    assert [g.numa_node for g in t.gpus] == [0, 0, 1, 1]


def test_h100_paste_with_bare_numa_header() -> None:
    rows = ["      GPU0  GPU1  GPU2  GPU3  CPU Affinity  NUMA"]
    for i in range(4):
        cells = ["X" if i == j else "NV18" for j in range(4)]
        rows.append(f"GPU{i}  {'  '.join(cells)}  {'0-51' if i < 2 else '52-103'}  {i // 2}")
    t = parse("\n".join(rows))
    assert t.nvswitch == frozenset(range(4)) and t.nvswitch_links == 18
    assert [g.numa_node for g in t.gpus] == [0, 0, 1, 1]


def test_nvlink_bridged_pairs_stay_direct_links() -> None:
    text = """\
        GPU0    GPU1    GPU2    GPU3    CPU Affinity    NUMA Affinity
GPU0     X      NV12    NODE    NODE    0-23    0
GPU1    NV12     X      NODE    NODE    0-23    0
GPU2    NODE    NODE     X      NV12    0-23    0
GPU3    NODE    NODE    NV12     X      0-23    0
"""
    t = parse(text)
    assert not t.nvswitch and t.nvlinks[0][1] == 12 and t.nvlinks[0][2] == 0
    assert choose_gpus(t, (0, 2, 3), 2) == (2, 3)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello\nworld\n", "no `nvidia-smi topo -m` header"),
        ("  GPU0 GPU1 CPU Affinity\nGPU0 X NV1 0-3\n", "rows missing for GPU1"),
        ("  GPU0 GPU1 CPU Affinity\nGPU0 X NV1 0-3\nGPU1 NV2 X 0-3\n", "symmetric"),
        ("  GPU0 GPU1 CPU Affinity\nGPU0 X FOO 0-3\nGPU1 FOO X 0-3\n", "unknown link 'FOO'"),
        ("  GPU0 GPU1 CPU Affinity\nGPU0 PIX PIX 0-3\nGPU1 PIX X 0-3\n", "must be X"),
        ("  GPU0 GPU2 CPU Affinity\nGPU0 X PIX 0-3\nGPU2 PIX X 0-3\n", "GPU0..GPU1"),
        ("  GPU0 GPU1 CPU Affinity\nGPU0 X\nGPU1 PIX X 0-3\n", "row GPU0 has 1 cells"),
    ],
)
def test_bad_pastes_get_clear_errors(text: str, message: str) -> None:
    with pytest.raises(TopologyFormatError, match=message):
        parse(text)
