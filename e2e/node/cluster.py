"""A real single-node Kubernetes cluster (the release of `e2e.node.versions`) in namespaces of
its own, for the `real` test tier.

`NodeCluster.start()` makes the PKI and a plan, then runs `e2e.node.launcher` under
`unshare --net --mount --pid --fork --mount-proc --propagation private`: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, containerd, kubelet and kube-proxy, all addressed inside
the new network namespace (the API server at 10.255.0.1:6443, pods in 10.244.0.0/24, Services in
10.96.0.0/16). `stop()` ends the launcher, whose PID namespace takes every process with it.

The test process reaches that network by entering it: `netns()` switches the calling thread
(and the threads and processes it starts: helm, kubectl, asyncio's executor) into the cluster's
network namespace and back. Nothing is bound to or sent from the host's own addresses.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import dataclasses
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from e2e.node import versions
from e2e.node.assets import REPO, binaries
from e2e.node.gobuild import build_coredns
from e2e.node.image import PAUSE, Images
from e2e.node.kubenode import NodeSpec
from e2e.node.launcher import NODE_IP
from webhook.certs import pki

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
API_SERVER = f"https://{NODE_IP}:6443"
NODE_NAME = "muster-node"
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered(netns_fd: int) -> Iterator[None]:
    """The calling thread inside the network namespace `netns_fd`, and back after to the one it
    was in: a helper's use inside a test (which the tier's fixture already put there) leaves
    the test there, not in the host's network, where the cluster's addresses are not."""
    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _setns(netns_fd)
        try:
            yield
        finally:
            _setns(back)
    finally:
        os.close(back)


def die_with_parent() -> None:
    """In the child before exec: if the test process dies, unshare (and so the cluster) too."""
    # SIGKILL: unshare --fork ignores SIGTERM; its --kill-child then TERMs the launcher
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def write_pki(pki_dir: Path) -> None:
    """A CA, the API server's serving pair (node IP, ClusterIP and in-cluster names), made with
    Muster's own `webhook.certs.pki`, and the service-account signing key pair."""
    pki_dir.mkdir(parents=True)
    ca = pki.generate_ca("muster-test-ca", days=2)
    serving = pki.issue_serving_cert(
        ca, ["kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local", "localhost"],
        [NODE_IP, "10.96.0.1", "127.0.0.1"], days=2)
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (pki_dir / "ca.crt").write_bytes(ca.cert_pem)
    (pki_dir / "apiserver.crt").write_bytes(serving.cert_pem)
    (pki_dir / "apiserver.key").write_bytes(serving.key_pem)
    (pki_dir / "sa.key").write_bytes(sa.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    (pki_dir / "sa.pub").write_bytes(sa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def remove_in_background(path: Path) -> None:
    """Renames `path` at once, then deletes it in a process the caller does not wait for: a
    multi-node cluster's directory holds every node's unpacked images (about 120,000 files,
    55 s to delete on the CI machine)."""
    if not path.exists():
        return
    gone = path.with_name(f"{path.name}.removing")
    path.rename(gone)
    # sh exits at once; rm, orphaned, is nobody's child to reap
    subprocess.run(["sh", "-c", 'rm -rf -- "$1" >/dev/null 2>&1 &', "sh", str(gone)],
                   check=True, stdin=subprocess.DEVNULL)


class NodeCluster:
    """One node, everything real. Use `with cluster.netns():` around anything that talks to it."""

    def __init__(self, images: Images, node_labels: dict[str, str],
                 version: str | None = None, *, feature_gates: Mapping[str, bool] | None = None,
                 runtime_config: Sequence[str] = (),
                 nodes: Sequence[tuple[str, Mapping[str, str]]] = ()) -> None:
        # short: unix socket paths (containerd, device plugins) must fit in 108 bytes
        self.dir = Path(tempfile.mkdtemp(prefix="muster-k8s-"))
        self.images = images
        self.node_labels = node_labels
        #: the Kubernetes release it runs (default: this run's, `versions.kubernetes()`)
        self.version = version or versions.kubernetes()
        #: on the API server, controller manager, scheduler and kubelet (`versions.native_gangs`)
        self.feature_gates = dict(feature_gates or {})
        #: the API server's --runtime-config entries (an alpha or beta API version turned on)
        self.runtime_config = tuple(runtime_config)
        #: (name, labels) of each node of a multi-node cluster, each in namespaces of its own
        #: (`e2e.node.kubenode`); none: one node, `NODE_NAME`, beside the control plane
        self.nodes = [NodeSpec.numbered(i, name, dict(labels), self.dir.name)
                      for i, (name, labels) in enumerate(nodes, start=1)]
        self.kubeconfig = self.dir / "admin.kubeconfig"
        self.token = secrets.token_hex(16)
        self._proc: subprocess.Popen[bytes] | None = None
        self._netns_fd: int | None = None

    def _write_plan(self) -> Path:
        write_pki(self.dir / "pki")
        (self.dir / "pki" / "tokens.csv").write_text(
            f'{self.token},muster-test-admin,1,"system:masters"\n')
        ca = (self.dir / "pki" / "ca.crt").read_text()
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "muster-test",
            "clusters": [{"name": "muster-test", "cluster": {
                "server": API_SERVER,
                "certificate-authority-data": base64.b64encode(ca.encode()).decode()}}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "muster-test", "context": {"cluster": "muster-test",
                                                             "user": "admin"}}]}))
        plan = self.dir / "plan.json"
        found = {k: str(v) for k, v in binaries(self.version).items()}
        multi: dict[str, Any] = {}
        if self.nodes:
            found["coredns"] = str(build_coredns() / "coredns")
            multi = {"nodes": [dataclasses.asdict(n) for n in self.nodes],
                     "cluster_dns": NODE_IP,
                     # a node whose kubelet stopped is NotReady after 20 s, not 40-50
                     "controller_manager_flags": ["--node-monitor-grace-period=20s"]}
        plan.write_text(json.dumps({
            "dir": str(self.dir),
            "binaries": found, **multi,
            "node_name": NODE_NAME, "node_labels": self.node_labels, "token": self.token,
            "pause_image": PAUSE, "feature_gates": self.feature_gates,
            "runtime_config": list(self.runtime_config),
            "images": [str(self.images.pause), str(self.images.muster),
                       *map(str, self.images.extra)]}))
        return plan

    def start(self, within: float = 240.0) -> None:
        plan = self._write_plan()
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        self._proc = subprocess.Popen(
            ["unshare", "--net", "--mount", "--pid", "--fork", "--mount-proc",
             "--propagation", "private", "--kill-child=SIGTERM",
             sys.executable, "-m", "e2e.node.launcher", str(plan)],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL,
            stdout=(self.dir / "unshare.log").open("ab"), stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent)  # noqa: PLW1509 - only prctl, no locks taken
        deadline = time.monotonic() + within
        while not (self.dir / "ready").exists():
            failed = self.dir / "failed"
            if failed.exists() or self._proc.poll() is not None:
                reason = failed.read_text() if failed.exists() else "the launcher exited"
                raise RuntimeError(f"the cluster did not start: {reason}\n{self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not start within {within:.0f}s\n"
                                   f"{self.logs()}")
            time.sleep(0.2)
        self._netns_fd = os.open(f"/proc/{self._proc.pid}/ns/net", os.O_RDONLY)

    def netns(self) -> contextlib.AbstractContextManager[None]:
        """The calling thread inside the cluster's network namespace, and back after."""
        assert self._netns_fd is not None
        return entered(self._netns_fd)

    def alive(self) -> str | None:
        """Why the cluster is gone, or None while it runs."""
        failed = self.dir / "failed"
        if failed.exists():
            return failed.read_text()
        if self._proc is None or self._proc.poll() is not None:
            return "the launcher exited"
        return None

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            children = Path(f"/proc/{self._proc.pid}/task/{self._proc.pid}/children")
            with contextlib.suppress(OSError, ValueError):
                for pid in children.read_text().split():
                    os.kill(int(pid), signal.SIGTERM)
            try:
                self._proc.wait(40)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        if self._netns_fd is not None:
            os.close(self._netns_fd)
        self._netns_fd = None
        if os.environ.get("MUSTER_KEEP_CLUSTER_DIR"):
            return
        remove_in_background(self.dir)

    def kubelet(self, node: str, action: str, within: float = 30.0) -> None:
        """Stops (`stop`: a crashed kubelet, its containers still running) or starts again
        (`start`) the kubelet of `node` of a multi-node cluster."""
        work = self.dir / "nodes" / node
        line = f"kubelet {action}"
        asked = (work / "control").read_text().splitlines() if (work / "control").exists() \
            else []
        with (work / "control").open("a") as f:
            f.write(line + "\n")
        deadline = time.monotonic() + within
        while len((work / "control.ack").read_text().splitlines()
                  if (work / "control.ack").exists() else []) <= len(asked):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node}'s launcher did not act on {line!r} within "
                                   f"{within:.0f} s")
            time.sleep(0.2)

    def logs(self, lines: int = 40) -> str:
        out = []
        for log in sorted([*(self.dir / "logs").glob("*.log"),
                           *(self.dir / "nodes").glob("*/logs/*.log")]):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.relative_to(self.dir)}\n" + "\n".join(tail))
        return "\n".join(out)
