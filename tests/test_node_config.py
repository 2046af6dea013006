"""The containerd config the real tier's launcher writes: parsed as containerd would read it,
without starting anything."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from e2e.node.launcher import CDI_DIR, PRIVATE_DIRS, SNAPSHOTTER, Launcher


def _config(tmp_path: Path) -> dict[str, Any]:
    launcher = Launcher({"dir": str(tmp_path), "binaries": {}, "node_name": "n",
                         "pause_image": "registry.k8s.io/pause:3.10"})
    launcher.write_configs()
    return tomllib.loads((tmp_path / "containerd.toml").read_text())


def test_containerd_2_reads_cdi_specs_from_the_agents_directory(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert config["version"] == 3  # containerd 2.x's format (1.x's was 2)
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["cdi_spec_dirs"] == [CDI_DIR] == ["/var/run/cdi"]  # the chart's default
    assert CDI_DIR in PRIVATE_DIRS  # a tmpfs of the node's own, as /var/lib/kubelet


def test_the_images_and_the_sandbox_are_where_containerd_2_looks(tmp_path: Path) -> None:
    config = _config(tmp_path)
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["snapshotter"] == SNAPSHOTTER
    assert images["pinned_images"]["sandbox"] == "registry.k8s.io/pause:3.10"
    assert config["grpc"]["address"] == f"{tmp_path}/containerd.sock"
