"""Files written whole, through a temporary name nobody can plant a file or symlink at."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from webhook import atomicfile


def test_a_symlink_at_the_old_predictable_name_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / ".tls.key.tmp").symlink_to(victim)
    atomicfile.write(tmp_path / "tls.key", b"secret", 0o600)
    assert victim.read_bytes() == b"keep"
    target = tmp_path / "tls.key"
    assert not target.is_symlink() and target.read_bytes() == b"secret"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    # only what was there and the file written: no temporary file left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tls.key.tmp", "tls.key", "victim"]


def test_each_write_uses_a_fresh_name_and_replaces_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names: list[str] = []
    real_replace = os.replace

    def replace(src: str, dst: Path) -> None:
        names.append(Path(src).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    for text in (b"one", b"two"):
        atomicfile.write(tmp_path / "ca.crt", text)
    assert (tmp_path / "ca.crt").read_bytes() == b"two"
    assert len(set(names)) == 2 and all(n.startswith(".ca.crt.") for n in names)


def test_a_failed_write_leaves_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="No space"):
        atomicfile.write(tmp_path / "ca.crt", b"x")
    assert list(tmp_path.iterdir()) == []
