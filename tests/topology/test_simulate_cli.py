"""`muster topology ...` (`muster simulate`: test_simulate.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.cli import main
from webhook.topology import builtin, decode

SAMPLES = Path(__file__).parent / "smi"


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
