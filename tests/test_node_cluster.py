"""How the real tier's cluster leaves: its directory deleted without the test run waiting."""

from __future__ import annotations

import time
from pathlib import Path

from e2e.node.cluster import remove_in_background


def test_a_cluster_directory_is_gone_at_once_and_deleted_behind(tmp_path: Path) -> None:
    work = tmp_path / "muster-k8s-x"
    (work / "nodes" / "a").mkdir(parents=True)
    for i in range(200):
        (work / "nodes" / "a" / f"f{i}").write_text("x")
    remove_in_background(work)
    assert not work.exists()
    deadline = time.monotonic() + 30
    while any(tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(tmp_path.iterdir())  # the renamed copy too
    remove_in_background(work)  # a second stop: nothing left to do
