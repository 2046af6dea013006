"""Runs a whole single-node Kubernetes cluster inside the namespaces it was started in.

Started by `e2e.node.cluster.NodeCluster` as
`unshare --net --mount --pid --fork --mount-proc --propagation private python -m
e2e.node.launcher PLAN.json`, so this process is PID 1 of its own PID namespace: when it exits,
the kernel kills every process of the cluster (containerd shims and containers included), and
the network namespace with its addresses, bridges and iptables chains goes with them. It never
touches an address of the host's network.

It writes `ready` in the work directory once every component has started and the images are
imported, or `failed` with the reason. SIGTERM stops it; it then kills everything and removes the
kubelet's cgroups (cgroup v1 is not namespaced here).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

#: addresses, all inside this network namespace
NODE_IP = "10.255.0.1"
POD_CIDR = "10.244.0.0/24"
CLUSTER_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
#: overlayfs shares an image's layers between containers; the `native` snapshotter copied the
#: whole image into each container (gigabytes a tier, and slow container starts on 2 cores)
SNAPSHOTTER = "overlayfs"
#: the kubelet's root: its device-plugin socket directory is fixed at
#: /var/lib/kubelet/device-plugins whatever --root-dir says, so the real path, private (below)
KUBELET_ROOT = "/var/lib/kubelet"
#: where containerd reads CDI specs (its only cdi_spec_dirs entry): the chart's default
#: agent.dra.cdiDir, where the agent's DRA driver writes one spec per prepared claim
CDI_DIR = "/var/run/cdi"
#: host paths the kubelet, containerd and CNI write to no matter their flags: a tmpfs over each,
#: visible in this mount namespace only, so nothing is left on the host
PRIVATE_DIRS = ("/var/log/pods", "/var/log/containers", "/var/lib/cni", "/run/netns",
                "/run/containerd", "/var/lib/kubelet", "/etc/cni/net.d", CDI_DIR)


class Launcher:
    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.dir = Path(plan["dir"])
        self.bin: dict[str, str] = plan["binaries"]
        self.node = plan["node_name"]
        self.logs = self.dir / "logs"
        self.procs: dict[int, str] = {}
        self.order: list[int] = []
        self.stopping = False

    # --- helpers --------------------------------------------------------------------------

    def log(self, msg: str) -> None:
        with (self.logs / "launcher.log").open("a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {msg}\n")

    def run(self, *args: str) -> None:
        subprocess.run(args, check=True, capture_output=True, timeout=120)

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=self.dir, env=env)
        self.procs[proc.pid] = name
        self.order.append(proc.pid)
        self.log(f"started {name} (pid {proc.pid})")

    def reap(self) -> None:
        """PID 1 adopts every orphan (shims, containers): reap them all, and note ours."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            name = self.procs.pop(pid, None)
            if name is not None and not self.stopping:
                self.log(f"{name} exited: status {status}")
                (self.dir / "failed").write_text(f"{name} exited (status {status}): see "
                                                 f"{self.logs / (name + '.log')}\n")

    def wait_for(self, what: str, check: Any, within: float = 120.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            self.reap()
            if (self.dir / "failed").exists():
                raise RuntimeError((self.dir / "failed").read_text())
            try:
                if check():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {within:.0f}s waiting for {what}")

    def https_ok(self, url: str) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.dir / "pki" / "ca.crt"))
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.plan['token']}"})
        with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)

    # --- the cluster ------------------------------------------------------------------------

    def network(self) -> None:
        self.run("ip", "link", "set", "lo", "up")
        self.run("ip", "link", "add", "muster0", "type", "bridge")
        self.run("ip", "addr", "add", f"{NODE_IP}/32", "dev", "muster0")
        self.run("ip", "link", "set", "muster0", "up")
        self.run("ip", "route", "add", "default", "dev", "muster0")
        for d in PRIVATE_DIRS:
            Path(d).mkdir(parents=True, exist_ok=True)
            self.run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", d)

    def write_configs(self) -> None:
        d = self.dir
        (d / "cni").mkdir(exist_ok=True)
        (d / "cni" / "10-muster.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "muster-pods", "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "loopback"}]}))
        images, runtime = "plugins.'io.containerd.cri.v1.images'", \
            "plugins.'io.containerd.cri.v1.runtime'"
        # version 3: the format every containerd 2.x reads (2.4 migrates it to its own 4)
        (d / "containerd.toml").write_text(f"""version = 3
root = "{d}/containerd/root"
state = "{d}/containerd/state"
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[{images}]
  snapshotter = "{SNAPSHOTTER}"
[{images}.pinned_images]
  sandbox = "{self.plan['pause_image']}"
[{runtime}]
  restrict_oom_score_adj = true
  disable_apparmor = true
  cdi_spec_dirs = ["{CDI_DIR}"]
[{runtime}.containerd]
  default_runtime_name = "runc"
[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{runtime}.cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "{d}/cni"
""")
        (d / "kubelet.yaml").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            # this machine kind has cgroup v1: 1.35+ refuse it unless told (KEP-5573)
            "cgroupDriver": "cgroupfs", "failSwapOn": False, "failCgroupV1": False,
            "containerRuntimeEndpoint": f"unix://{d}/containerd.sock",
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "evictionHard": {"nodefs.available": "1%", "imagefs.available": "1%",
                             "memory.available": "100Mi"},
            "imageGCHighThresholdPercent": 100, "localStorageCapacityIsolation": False,
            "address": NODE_IP, "healthzBindAddress": "127.0.0.1", "readOnlyPort": 0,
            "resolvConf": "", "serializeImagePulls": False, "podCIDR": POD_CIDR,
            "nodeStatusUpdateFrequency": "2s", "syncFrequency": "10s",
            "fileCheckFrequency": "5s"}))

    def control_plane(self) -> None:
        pki, kc = self.dir / "pki", str(self.dir / "admin.kubeconfig")
        self.start("etcd", self.bin["etcd"], "--data-dir", str(self.dir / "etcd"),
                   "--listen-client-urls", "http://127.0.0.1:2379",
                   "--advertise-client-urls", "http://127.0.0.1:2379",
                   "--listen-peer-urls", "http://127.0.0.1:2380",
                   "--listen-metrics-urls", "http://127.0.0.1:2381",
                   "--unsafe-no-fsync", "--log-level", "warn")
        self.start("kube-apiserver", self.bin["kube-apiserver"],
                   "--etcd-servers", "http://127.0.0.1:2379",
                   "--bind-address", NODE_IP, "--advertise-address", NODE_IP,
                   "--secure-port", "6443",
                   "--tls-cert-file", str(pki / "apiserver.crt"),
                   "--tls-private-key-file", str(pki / "apiserver.key"),
                   "--client-ca-file", str(pki / "ca.crt"),
                   "--token-auth-file", str(pki / "tokens.csv"),
                   "--authorization-mode", "Node,RBAC",
                   "--service-account-issuer", "https://kubernetes.default.svc",
                   "--service-account-key-file", str(pki / "sa.pub"),
                   "--service-account-signing-key-file", str(pki / "sa.key"),
                   "--service-cluster-ip-range", SERVICE_CIDR,
                   "--enable-aggregator-routing=true",
                   "--kubelet-preferred-address-types", "InternalIP",
                   "--allow-privileged=true", "--profiling=false", "--v=1",
                   *self.gates(), *self.runtime_config())
        self.wait_for("kube-apiserver /readyz",
                      lambda: self.https_ok(f"https://{NODE_IP}:6443/readyz"))
        self.start("kube-controller-manager", self.bin["kube-controller-manager"],
                   "--kubeconfig", kc, "--controllers", "*,-nodeipam",
                   "--service-account-private-key-file", str(pki / "sa.key"),
                   "--root-ca-file", str(pki / "ca.crt"), "--leader-elect=false",
                   "--bind-address", "127.0.0.1", "--use-service-account-credentials=false",
                   "--concurrent-job-syncs", "10", "--v=1", *self.gates())
        self.start("kube-scheduler", self.bin["kube-scheduler"], "--kubeconfig", kc,
                   "--leader-elect=false", "--bind-address", "127.0.0.1", "--v=1",
                   *self.gates())

    def gates(self) -> list[str]:
        """--feature-gates for the control plane and the kubelet, when the plan turns any on or
        off."""
        gates = self.plan.get("feature_gates") or {}
        return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in
                                              sorted(gates.items()))] if gates else []

    def runtime_config(self) -> list[str]:
        config = self.plan.get("runtime_config") or []
        return ["--runtime-config=" + ",".join(config)] if config else []

    def node_components(self) -> None:
        d, kc = self.dir, str(self.dir / "admin.kubeconfig")
        sock = str(d / "containerd.sock")
        # its runc shim is found on PATH first: ours, before a distribution's older one
        path = f"{Path(self.bin['containerd']).parent}:{os.environ.get('PATH', '')}"
        self.start("containerd", self.bin["containerd"], "--config", str(d / "containerd.toml"),
                   env={**os.environ, "PATH": path})
        self.wait_for("containerd's socket", lambda: Path(sock).exists())
        for archive in self.plan["images"]:
            self.run(self.bin["ctr"], "--address", sock, "-n", "k8s.io", "images", "import",
                     "--snapshotter", SNAPSHOTTER, archive)
        self.start("kubelet", self.bin["kubelet"], "--config", str(d / "kubelet.yaml"),
                   "--kubeconfig", kc, "--node-ip", NODE_IP, "--hostname-override", self.node,
                   "--root-dir", KUBELET_ROOT, "--cert-dir", str(d / "kubelet-pki"),
                   "--node-labels", ",".join(f"{k}={v}" for k, v in
                                              self.plan["node_labels"].items()),
                   "--v=1", *self.gates())
        self.start("kube-proxy", self.bin["kube-proxy"], "--kubeconfig", kc,
                   "--proxy-mode", "iptables", "--cluster-cidr", CLUSTER_CIDR,
                   "--conntrack-max-per-core", "0", "--hostname-override", self.node,
                   "--metrics-bind-address", "127.0.0.1:10249",
                   "--healthz-bind-address", "127.0.0.1:10256", "--v=1")

    # --- lifecycle --------------------------------------------------------------------------

    def stop(self) -> None:
        self.stopping = True
        for pid in reversed(self.order):
            if pid in self.procs:
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while self.procs and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.1)
        os.kill(-1, signal.SIGKILL)  # every other process of this PID namespace
        time.sleep(0.5)
        self.reap()
        remove_kubepods_cgroups(self.log)
        self.log("stopped")

    def main(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(0)))
        try:
            self.network()
            self.write_configs()
            self.control_plane()
            self.node_components()
            (self.dir / "ready").write_text("ok\n")
            self.log("ready")
            while True:
                self.reap()
                time.sleep(0.5)
        except SystemExit:
            pass
        except BaseException as exc:
            self.log(f"failed: {exc!r}")
            (self.dir / "failed").write_text(f"{exc}\n")
        finally:
            self.stop()


def remove_kubepods_cgroups(log: Any, within: float = 15.0) -> None:
    """The kubelet's cgroupfs driver made /sys/fs/cgroup/<controller>/kubepods... in the host's
    cgroup tree; once every process is gone they are empty and can go (deepest first). Killed
    processes leave their cgroups a moment after SIGKILL: retry until then."""
    root = Path("/sys/fs/cgroup")
    tops = [c / "kubepods" for c in (root.iterdir() if root.is_dir() else ())
            if (c / "kubepods").is_dir() and not c.is_symlink()]
    deadline = time.monotonic() + within
    while tops:
        left = []
        for top in tops:
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()),
                          key=lambda p: -len(p.parts))
            for p in [*dirs, top]:
                with contextlib.suppress(OSError):
                    p.rmdir()
            if top.exists():
                left.append(top)
        tops = left
        if tops and time.monotonic() > deadline:
            log(f"cgroups left behind: {', '.join(map(str, tops))}")
            return
        time.sleep(0.2)


if __name__ == "__main__":
    Launcher(json.loads(Path(sys.argv[1]).read_text())).main()
