"""How the real tier's cluster is reached, and how it leaves: its directory deleted without
the test run waiting."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from e2e.node.cluster import entered, remove_in_background


def _netns() -> str:
    return os.readlink("/proc/thread-self/ns/net")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="entering a network namespace takes root (CI runs as root)")
def test_a_nested_entry_returns_to_the_network_it_was_made_from() -> None:
    """The tier's fixture puts each test in the cluster's network; a helper's own entry inside
    the test must leave the test there, not in the host's network (where a cluster address is
    some other host's: the real tier once sent a request there after such a helper)."""
    holder = subprocess.Popen(["unshare", "--net", "sleep", "30"])
    try:
        host = _netns()
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{holder.pid}/ns/net") == host:  # until unshare has run
            assert time.monotonic() < deadline
            time.sleep(0.01)
        cluster = os.open(f"/proc/{holder.pid}/ns/net", os.O_RDONLY)
        try:
            with entered(cluster):
                inside = _netns()
                assert inside != host
                with entered(cluster):
                    assert _netns() == inside
                assert _netns() == inside  # not the host's
            assert _netns() == host
        finally:
            os.close(cluster)
    finally:
        holder.kill()
        holder.wait()


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
