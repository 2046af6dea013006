"""`nvidia-smi topo -m` parser, on pasted outputs of real machine types (tests/topology/smi/)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from webhook.topology import (
    PCIeLevel,
    TopologyFormatError,
    builtin,
    decode,
    encode,
    topology_class,
)
from webhook.topology import parse_nvidia_smi_topo as parse
from webhook.topology.gpu_choice import choose_gpus, set_score
from webhook.topology.smi import read_gpu_list, read_topo_matrix

SAMPLES = Path(__file__).parent / "smi"


V100 = {"pcie_gen": 3, "nvlink_gbps": 25.0}


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def test_dgx1v_paste_gives_the_reference_links_and_sockets() -> None:
    t = parse(sample("dgx1v.txt"), model="Tesla V100-SXM2-16GB", **V100)
    ref = builtin("dgx1-v100")
    assert t.nvlinks == ref.nvlinks
    assert [g.numa_node for g in t.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]  # from CPU affinity
    assert t.pcie[0][5] == PCIeLevel.SYS and t.pcie[0][1] == PCIeLevel.NODE  # NV1 hides PIX
    assert not t.nvswitch
    # placement quality does not depend on the hidden PCIe levels here
    assert set_score(t, choose_gpus(t, range(8), 4) or ()).allreduce_gbps == 100.0
    assert decode(encode(t)) == t


def test_dgx_a100_paste_with_tabs_and_numa_column_is_an_nvswitch_node() -> None:
    t = parse(sample("dgxa100.txt"), model="NVIDIA A100-SXM4-80GB", pcie_gen=4, nvlink_gbps=25)
    assert t.size == 8 and t.nvswitch == frozenset(range(8)) and t.nvswitch_links == 12
    assert all(x == 0 for row in t.nvlinks for x in row)
    assert [g.numa_node for g in t.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert t.pcie[0][1] == PCIeLevel.NODE and t.pcie[0][2] == PCIeLevel.SYS
    assert set_score(t, range(8)).allreduce_gbps == 300.0


def test_pcie_server_with_nic_legend_and_gpu_numa_id() -> None:
    t = parse(sample("pcie8-l40s.txt"), model="NVIDIA L40S", pcie_gen=4, nvlink_gbps=None)
    assert t.size == 8 and not any(any(r) for r in t.nvlinks)
    assert t.pcie[0][3] == PCIeLevel.PIX and t.pcie[3][4] == PCIeLevel.SYS
    assert [g.numa_node for g in t.gpus] == [0] * 4 + [1] * 4
    assert choose_gpus(t, range(8), 4) == (0, 1, 2, 3)  # stays on one socket


def test_old_driver_soc_is_sys() -> None:
    t = parse(sample("old-soc-4gpu.txt"), **V100)
    assert t.pcie[0][2] == PCIeLevel.SYS and t.pcie[0][1] == PCIeLevel.PIX
    assert [g.numa_node for g in t.gpus] == [0, 0, 1, 1]


def test_h100_paste_with_bare_numa_header() -> None:
    rows = ["      GPU0  GPU1  GPU2  GPU3  CPU Affinity  NUMA"]
    for i in range(4):
        cells = ["X" if i == j else "NV18" for j in range(4)]
        rows.append(f"GPU{i}  {'  '.join(cells)}  {'0-51' if i < 2 else '52-103'}  {i // 2}")
    t = parse("\n".join(rows), pcie_gen=5, nvlink_gbps=25)
    assert t.nvswitch == frozenset(range(4)) and t.nvswitch_links == 18
    assert [g.numa_node for g in t.gpus] == [0, 0, 1, 1]
    # a NUMA cell that is no ASCII number ("²" is a digit to str.isdigit) is unknown, and the
    # pair whose one NUMA node is unknown is compared by CPU affinity both ways (it was SYS one
    # way and NODE the other, refused as asymmetric)
    t = parse("\n".join(rows).replace("  1\n", "  \u00b2\n", 1), pcie_gen=5, nvlink_gbps=25)
    assert [g.numa_node for g in t.gpus] == [0, 0, None, 1]


def test_nvlink_bridged_pairs_stay_direct_links() -> None:
    text = """\
        GPU0    GPU1    GPU2    GPU3    CPU Affinity    NUMA Affinity
GPU0     X      NV12    NODE    NODE    0-23    0
GPU1    NV12     X      NODE    NODE    0-23    0
GPU2    NODE    NODE     X      NV12    0-23    0
GPU3    NODE    NODE    NV12     X      0-23    0
"""
    t = parse(text, pcie_gen=4, nvlink_gbps=25)
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
        parse(text, **V100)


# --- terminal captures, UUIDs, link speeds ------------------------------------------------------


def raw(name: str) -> str:
    """A sample byte for byte: CRs and escape sequences kept (read_text would drop the CRs)."""
    return (SAMPLES / name).read_bytes().decode()


def test_a_terminal_capture_of_a_dgx_h100_parses() -> None:
    text = raw("dgxh100-tty.txt")  # `script` capture: prompt, underlined header, CRLF, NICs
    assert "\x1b[4mGPU0" in text and "\r\n" in text
    t = parse(text, pcie_gen=5, nvlink_gbps=25)
    assert t.size == 8 and t.nvswitch == frozenset(range(8)) and t.nvswitch_links == 18
    assert [g.numa_node for g in t.gpus] == [0] * 4 + [1] * 4
    assert t.pcie[0][3] == PCIeLevel.NODE and t.pcie[3][4] == PCIeLevel.SYS
    assert set_score(t, range(8)).allreduce_gbps == 18 * 25


def test_escapes_and_crlf_change_nothing() -> None:
    plain = sample("dgx1v.txt")
    lines = plain.splitlines()
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("GPU0"))
    lines[header] = lines[header].replace("GPU0", "\x1b[4mGPU0", 1) + "\x1b[0m"
    lines[header + 1] = lines[header + 1].replace("NV2", "\x1b[1mNV2\x1b[22m")  # bold cells
    captured = "\x1b]0;node: ~\x07" + "\r\n".join(lines) + "\r\n"
    assert parse(captured, **V100) == parse(plain, **V100)


def test_no_uuid_is_made_up() -> None:
    t = parse(sample("dgx1v.txt"), **V100)
    assert [g.uuid for g in t.gpus] == [None] * 8
    doc = json.loads(encode(t))
    assert [g["uuid"] for g in doc["gpus"]] == [None] * 8
    assert decode(encode(t)) == t


def test_nvidia_smi_list_gives_uuids_and_models() -> None:
    listing = sample("dgxh100-list.txt")
    t = parse(raw("dgxh100-tty.txt"), pcie_gen=5, nvlink_gbps=25, gpu_list=listing)
    expected = [line.split("(UUID: ")[1].rstrip(")") for line in listing.splitlines()]
    assert [g.uuid for g in t.gpus] == expected
    assert {g.model for g in t.gpus} == {listing.split(": ")[1].split(" (")[0]}
    assert decode(encode(t)) == t  # nvlink_gbps given as an int: the class hash is the same
    # with the inputs topo -m lacks, a DGX H100 capture is the built-in HGX H100 class
    assert topology_class(t) == topology_class(builtin("hgx-h100"))
    gen4 = parse(raw("dgxh100-tty.txt"), pcie_gen=4, nvlink_gbps=25, gpu_list=listing)
    assert topology_class(gen4) != topology_class(t)


def test_nvidia_smi_list_skips_mig_devices() -> None:
    listing = ("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-aaaaaaaa-0000-0000-0000-000000000000)\n"
               "  MIG 3g.20gb     Device  0: (UUID: MIG-bbbbbbbb-0000-0000-0000-000000000000)\n"
               "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-cccccccc-0000-0000-0000-000000000000)\n")
    assert [g.uuid for g in read_gpu_list(listing)] == [
        "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-cccccccc-0000-0000-0000-000000000000"]


@pytest.mark.parametrize(
    ("listing", "model", "message"),
    [
        ("GPU 0: V100 (UUID: GPU-1)\n", "", "lists 1 GPUs but topo -m shows 8"),
        ("".join(f"GPU {i}: V100 (UUID: GPU-{i})\n" for i in range(8)), "A100",
         "differs from nvidia-smi -L's"),
        ("GPU 0: V100 (S/N: 123)\n", "", "expected `GPU 0: <model> (UUID: GPU-...)`"),
        ("GPU 1: V100 (UUID: GPU-1)\n", "", "GPU 0..GPU 0 in order"),
        ("nothing\n", "", "no `GPU 0: <model>"),
        ("".join(f"GPU {i}: V100 (UUID: GPU-1)\n" for i in range(8)), "", "must be unique"),
    ],
)
def test_a_gpu_list_that_does_not_fit_is_refused(listing: str, model: str, message: str) -> None:
    with pytest.raises(TopologyFormatError, match=re.escape(message)):
        parse(sample("dgx1v.txt"), **V100, gpu_list=listing, model=model)


def test_the_pcie_generation_given_is_the_one_used() -> None:
    text = sample("pcie8-l40s.txt")
    gen4 = parse(text, pcie_gen=4, nvlink_gbps=None)
    gen5 = parse(text, pcie_gen=5, nvlink_gbps=None)
    assert (gen4.pcie_gen, gen5.pcie_gen) == (4, 5)
    across = (0, 4)  # SYS: no NVLink, one PCIe hop
    assert set_score(gen5, across).allreduce_gbps == 2 * set_score(gen4, across).allreduce_gbps


def test_an_nvlink_matrix_needs_its_link_speed() -> None:
    with pytest.raises(ValueError, match="speed is needed"):
        parse(sample("dgx1v.txt"), pcie_gen=3, nvlink_gbps=None)
    assert read_topo_matrix(sample("dgx1v.txt")).shows_nvlink
    assert not read_topo_matrix(sample("pcie8-l40s.txt")).shows_nvlink
    p100 = parse(sample("dgx1v.txt"), pcie_gen=3, nvlink_gbps=20)
    assert set_score(p100, (0, 1, 2, 3)).allreduce_gbps == 80.0  # two rings each way x 20
