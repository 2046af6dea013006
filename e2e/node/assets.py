"""What a real single-node cluster needs on this machine, found, built or installed.

- Kubernetes server binaries: `MUSTER_K8S_BIN` (a directory holding kube-apiserver, kubelet...,
  as envtest's KUBEBUILDER_ASSETS), else built from the Go module proxy at the pinned release
  (`e2e.node.versions`) into `~/.cache/muster/k8s/<version>/` by `e2e.node.gobuild`.
- etcd: in `MUSTER_K8S_BIN` if there, else built from the proxy (`go.etcd.io/etcd/server/v3`) into
  `~/.cache/muster/etcd/<version>/`.
- containerd 2.x (the daemon, its runc shim and ctr; CDI, which the agent's DRA driver needs):
  in `MUSTER_K8S_BIN` if there, else built from the proxy (`github.com/containerd/containerd/v2`)
  into `~/.cache/muster/containerd/<version>/`.
- runc, CNI plugins, iptables, conntrack, buildah, mmdebstrap: Debian packages, installed with
  apt when missing (root only).

`missing_prerequisites()` says, in words, why this machine cannot run the tier at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from e2e.node import versions
from e2e.node.gobuild import (
    CONTAINERD_BINARIES,
    SERVER_BINARIES,
    build_containerd,
    build_etcd,
    build_kubernetes,
)

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache"
#: Debian package -> a command it provides
DEBIAN = {"runc": "runc", "containernetworking-plugins":
          "/usr/lib/cni/bridge", "iptables": "iptables", "conntrack": "conntrack",
          "buildah": "buildah", "mmdebstrap": "mmdebstrap"}


def missing_prerequisites() -> str | None:
    """Why the real tier cannot run here, or None."""
    if sys.platform != "linux":
        return f"the real-cluster tier needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the real-cluster tier needs root (namespaces, containerd, kubelet, apt)"
    if shutil.which("unshare") is None:
        return "the real-cluster tier needs `unshare` (util-linux)"
    if not os.environ.get("MUSTER_K8S_BIN") and shutil.which("go") is None:
        return (f"no Kubernetes server binaries: install Go 1.26+ (they are built from the Go "
                f"module proxy), or set MUSTER_K8S_BIN to a directory holding "
                f"{', '.join(SERVER_BINARIES)} and etcd")
    return None


def _have(thing: str) -> bool:
    return Path(thing).exists() if thing.startswith("/") else shutil.which(thing) is not None


def ensure_debian_packages() -> None:
    missing = [pkg for pkg, thing in DEBIAN.items() if not _have(thing)]
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, capture_output=True,
                   timeout=600)
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
                   check=True, env=env, capture_output=True, timeout=900)


def binaries(version: str | None = None,
             names: tuple[str, ...] = SERVER_BINARIES) -> dict[str, Path]:
    """Name -> path of each of `names`, etcd and containerd's binaries: from `MUSTER_K8S_BIN`,
    else built once from the Go module proxy at `version` (default: this run's,
    `versions.kubernetes()`)."""
    user = os.environ.get("MUSTER_K8S_BIN")
    where = Path(user) if user else build_kubernetes(version or versions.kubernetes(), names)
    found = {n: where / n for n in names}
    # a user's directory may hold no etcd (envtest's does): ours is built then
    found["etcd"] = where / "etcd" if (where / "etcd").exists() else build_etcd()
    runtime = where if all((where / n).exists() for n in CONTAINERD_BINARIES) else \
        build_containerd()
    found |= {n: runtime / n for n in CONTAINERD_BINARIES}
    absent = [str(p) for p in found.values() if not os.access(p, os.X_OK)]
    if absent:
        raise RuntimeError(f"Kubernetes binaries missing or not executable: {', '.join(absent)}")
    return found
