"""bench/plots.py draws docs/benchmarks.md's PNGs from the JSON the benches recorded
(docs/img/data, written by `--json FILE`), and refuses a file that is not that bench's output."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from bench import plots

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "docs" / "img" / "data"


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_every_recorded_bench_is_drawn(tmp_path: Path) -> None:
    assert plots.main(["--data", str(RECORDED), "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{b}.png" for b in plots.PLOTS)
    for png in tmp_path.iterdir():
        width, height = png_size(png)
        assert width >= 700 and height >= 400


def test_the_committed_pngs_are_the_recorded_benches() -> None:
    """Each JSON in docs/img/data has its PNG in docs/img, and no PNG lacks its JSON."""
    assert {p.stem for p in RECORDED.glob("*.json")} == \
        {p.stem for p in (REPO / "docs" / "img").glob("*.png")} == set(plots.PLOTS)


def test_a_missing_bench_is_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(RECORDED / "placement.json", data)
    assert plots.main(["--data", str(data), "--out", str(tmp_path / "out")]) == 0
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["placement.png"]
    assert "skipped topology" in capsys.readouterr().out


def test_another_bench_output_is_one_line_error(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads((RECORDED / "placement.json").read_text())
    (tmp_path / "abuse.json").write_text(json.dumps(doc))
    assert plots.main(["--data", str(tmp_path), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "written by bench 'placement', not 'abuse'" in err
    assert not (tmp_path / "abuse.png").exists()


def test_a_truncated_output_is_one_line_error(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads((RECORDED / "topology.json").read_text())
    del doc["offered_load"]
    (tmp_path / "topology.json").write_text(json.dumps(doc))
    assert plots.main(["--data", str(tmp_path), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not topology's --json output (KeyError" in err


def test_no_data_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert plots.main(["--data", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert "no bench JSON" in capsys.readouterr().err
