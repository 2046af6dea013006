"""The containerd config the real tier's launcher writes: parsed as containerd would read it,
without starting anything."""

from __future__ import annotations

import json
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


def test_each_node_of_each_cluster_has_cgroups_of_its_own(tmp_path: Path) -> None:
    """cgroup v1 is not namespaced: two kubelets on one root would share QoS trees, and a
    cluster stopping beside another would remove the other's (seen: a node of the same name
    lost its root while starting)."""
    from e2e.node.kubenode import NodeSpec, write_configs  # noqa: PLC0415

    first = [NodeSpec.numbered(i, n, {}, "muster-k8s-aaaa") for i, n in enumerate("xy", 1)]
    again = NodeSpec.numbered(1, "x", {}, "muster-k8s-bbbb")
    roots = {n.cgroup_root for n in first} | {again.cgroup_root}
    assert len(roots) == 3 and "/" not in roots
    assert [n.ip for n in first] == ["10.255.0.11", "10.255.0.12"]
    write_configs(tmp_path, first[0], "registry.k8s.io/pause:3.10", cluster_dns="10.255.0.1")
    kubelet = json.loads((tmp_path / "kubelet.yaml").read_text())
    assert kubelet["cgroupRoot"] == "/muster-k8s-aaaa-x"
    assert kubelet["clusterDNS"] == ["10.255.0.1"] and kubelet["podCIDR"] == "10.244.1.0/24"
