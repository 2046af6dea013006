"""`muster topology parse` and `choose` as a user runs them: captures from a terminal, no made-up
UUIDs or link speeds, topology files, and the one figure minRingGBps is compared with."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import pytest

from webhook.cli import main
from webhook.topology import builtin, decode
from webhook.topology.gpu_choice import set_score

SAMPLES = Path(__file__).parent / "smi"
FIGURE = re.compile(r"ring bandwidth \(minRingGBps\): ([0-9.]+) GB/s")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["topology", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_parse_asks_for_the_link_speeds_topo_m_does_not_show(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "parse", str(SAMPLES / "dgx1v.txt"))
    assert rc == 2 and not out
    assert "--pcie-gen" in err and "--nvlink-gbps" in err and len(err.splitlines()) == 1
    pcie_only = str(SAMPLES / "pcie8-l40s.txt")
    rc, _, err = run(capsys, "parse", pcie_only)
    assert rc == 2 and "--pcie-gen" in err and "--nvlink-gbps" not in err
    rc, out, _ = run(capsys, "parse", pcie_only, "--pcie-gen", "4")
    assert rc == 0 and decode(out).pcie_gen == 4


def test_parse_reads_a_terminal_capture_on_stdin_with_uuids_from_a_gpu_list(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    capture = (SAMPLES / "dgxh100-tty.txt").read_bytes().decode()
    monkeypatch.setattr("sys.stdin", io.StringIO(capture))
    listing = SAMPLES / "dgxh100-list.txt"
    rc, out, _ = run(capsys, "parse", "-", "--pcie-gen", "5", "--nvlink-gbps", "25",
                     "--gpu-list", str(listing))
    assert rc == 0
    uuids = re.findall(r"UUID: (GPU-[0-9a-f-]+)", listing.read_text())
    assert [g.uuid for g in decode(out).gpus] == uuids and len(uuids) == 8


def test_parse_without_a_gpu_list_writes_null_uuids(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "parse", str(SAMPLES / "dgx1v.txt"), "--pcie-gen", "3",
                     "--nvlink-gbps", "25")
    assert rc == 0 and [g["uuid"] for g in json.loads(out)["gpus"]] == [None] * 8


def test_choose_takes_a_topology_file_as_well_as_a_name(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "node.json"
    rc, out, _ = run(capsys, "show", "hgx-h100")
    assert rc == 0
    f.write_text(out)
    for k in ("1", "3", "6"):
        by_name = run(capsys, "choose", "hgx-h100", "-k", k, "--free", "1,2,3,5,6,7")
        by_file = run(capsys, "choose", "--file", str(f), "-k", k, "--free", "1,2,3,5,6,7")
        assert by_name[0] == by_file[0] == 0 and by_name[1] == by_file[1]
    monkeypatch.setattr("sys.stdin", io.StringIO(f.read_text()))
    rc, out, _ = run(capsys, "choose", "--file", "-", "-k", "3")
    assert rc == 0 and " on hgx-h100\n" in out  # the node's own name
    nameless = json.loads(f.read_text()) | {"name": ""}
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(nameless)))
    rc, out, _ = run(capsys, "choose", "--file", "-", "-k", "3")
    assert rc == 0 and " on <stdin>\n" in out
    monkeypatch.setattr("sys.stdin", io.StringIO('{"v": 1}'))
    rc, _, err = run(capsys, "choose", "--file", "-", "-k", "2")
    assert rc == 2 and "<stdin>: bad topology" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"v": 1}')
    rc, _, err = run(capsys, "choose", "--file", str(bad), "-k", "2")
    assert rc == 2 and f"{bad}: bad topology" in err


def test_choose_on_a_parsed_capture(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, _ = run(capsys, "parse", str(SAMPLES / "dgx1v.txt"), "--pcie-gen", "3",
                     "--nvlink-gbps", "25")
    f = tmp_path / "parsed.json"
    f.write_text(out)
    rc, out, _ = run(capsys, "choose", "--file", str(f), "-k", "4")
    assert rc == 0 and "ring bandwidth (minRingGBps): 100 GB/s" in out


@pytest.mark.parametrize(("free", "k"), [("", 4), ("", 8), ("1,2,3,4,5,6", 4), ("0,2,3,4,7", 5),
                                         ("0,1,4,5", 3), ("0,5", 2)])
def test_choose_prints_the_figure_min_ring_is_compared_with(
        capsys: pytest.CaptureFixture[str], free: str, k: int) -> None:
    args = ["choose", "dgx1-v100", "-k", str(k), *(["--free", free] if free else [])]
    rc, out, _ = run(capsys, *args)
    assert rc == 0
    gpus = [int(i) for i in out.split()[1].split(",")]
    m = FIGURE.search(out)
    assert m is not None
    figure = float(m.group(1))
    assert figure == set_score(builtin("dgx1-v100"), gpus).allreduce_gbps
    rc, out, _ = run(capsys, *args, "--min-ring-gbps", m.group(1))
    assert rc == 0 and f"minRingGBps {m.group(1)}: met" in out
    above = math.nextafter(figure, math.inf)
    rc, out, err = run(capsys, *args, "--min-ring-gbps", repr(above))
    assert rc == 1 and not out
    assert err == (f"muster topology: --min-ring-gbps {above!r} not met: the best {k} free GPUs "
                   f"on dgx1-v100 (GPUs {','.join(map(str, gpus))}) give {m.group(1)} GB/s of "
                   "allreduce bus bandwidth; a pod with this minRingGBps is not placed on this "
                   "node\n")


def test_choose_one_gpu_has_no_ring_to_compare(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "choose", "dgx1-v100", "-k", "1", "--min-ring-gbps", "1000")
    assert rc == 0 and "one GPU runs no allreduce" in out and "met" in out


@pytest.mark.parametrize("argv", [
    ["parse", "x.txt", "--pcie-gen", "3", "--nvlink-gbps", "0"],
    ["parse", "x.txt", "--pcie-gen", "3", "--nvlink-gbps", "fast"],
    ["choose", "dgx1-v100", "-k", "2", "--min-ring-gbps", "nan"],
    ["choose", "dgx1-v100", "-k", "2", "--min-ring-gbps", "-5"],
])
def test_a_speed_must_be_a_positive_number(capsys: pytest.CaptureFixture[str],
                                           argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["topology", *argv])
    assert exit_.value.code == 2 and "give GB/s, a number > 0" in capsys.readouterr().err
