"""`muster simulate` (reference scenario within 10 %) and `muster topology ...`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from webhook.cli import main
from webhook.topology import builtin, decode
from webhook.topology.simulate import WORKLOADS, calibrate, run_reference

SAMPLES = Path(__file__).parent / "smi"


def test_reference_scenario_within_ten_percent() -> None:
    r = run_reference()
    aware, regular = r.outcomes
    assert {m.node for m in aware.placement.members} == {"node-a"}  # launcher too
    assert aware.bus_gbps == 100.0
    split = [m.node for m in regular.placement.members if m.gpus]
    assert sorted(split) == ["node-a", "node-a", "node-b", "node-b"]  # 2 + 2 over TCP
    for w in WORKLOADS:
        assert aware.images_per_s[w.name] == pytest.approx(w.reference_aware, rel=0.10)
        assert regular.images_per_s[w.name] == pytest.approx(w.reference_regular, rel=0.10)


def test_in_node_choice_matters() -> None:
    r = run_reference()
    (best, _, b_gbps, b_ips), (_, _, o_gbps, o_ips), (_, _, n_gbps, n_ips) = r.in_node
    assert b_gbps > o_gbps > n_gbps
    assert b_ips["vgg16"] > o_ips["vgg16"] > n_ips["vgg16"]
    assert best == "best set"


def test_calibration_is_a_fit_not_an_echo() -> None:
    cal = calibrate(100.0)
    assert 0.2 < cal.inter_node_gbps < 3.0  # a 10-25 Gb/s TCP network, not NVLink
    assert all(0.05 < c < 0.5 for c in cal.compute_s.values())
    # a worse in-node set under the same calibration must be slower: the model is not a table
    slow = calibrate(50.0)
    assert slow.compute_s["vgg16"] < cal.compute_s["vgg16"]


def test_cli_simulate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate"]) == 0
    out = capsys.readouterr().out
    assert "topology-aware" in out and "reference   991.92" in out
    assert main(["simulate", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["placements"]) == 2 and doc["calibration"]["nvlinkEfficiency"] == 0.3


def test_cli_topology_show_list_parse_choose(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    assert main(["topology", "show", "dgx1-v100"]) == 0
    s = capsys.readouterr().out.strip()
    assert decode(s) == builtin("dgx1-v100")
    f = tmp_path / "t.json"
    f.write_text(s)
    assert main(["topology", "show", "--file", str(f), "--pretty"]) == 0
    assert decode(capsys.readouterr().out) == builtin("dgx1-v100")
    assert main(["topology", "list"]) == 0
    assert "hgx-h100" in capsys.readouterr().out
    assert main(["topology", "parse", str(SAMPLES / "dgx1v.txt"), "--model", "V100",
                 "--pcie-gen", "3", "--nvlink-gbps", "25"]) == 0
    parsed = decode(capsys.readouterr().out)
    assert parsed.nvlinks == builtin("dgx1-v100").nvlinks and parsed.gpus[0].model == "V100"
    assert main(["topology", "choose", "dgx1-v100", "-k", "5"]) == 0
    assert "ring bandwidth (minRingGBps): 50 GB/s" in capsys.readouterr().out


def test_cli_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["topology", "show", "nope"]) == 2
    assert "unknown node type" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"v": 9}')
    assert main(["topology", "show", "--file", str(bad)]) == 2
    assert f"muster topology: {bad}: " in capsys.readouterr().err
    junk = tmp_path / "junk.txt"
    junk.write_text("nothing here")
    assert main(["topology", "parse", str(junk)]) == 2
    assert "header" in capsys.readouterr().err
    assert main(["topology", "choose", "dgx1-v100", "-k", "3", "--free", "0,1"]) == 1
