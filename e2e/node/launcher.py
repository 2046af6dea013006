"""Runs a whole Kubernetes cluster inside the namespaces it was started in: a single node beside
the control plane, or (a plan with `nodes`) several nodes, each in network and mount namespaces
of its own (`e2e.node.kubenode`) on the cluster's bridge, with CoreDNS for their pods.

Started by `e2e.node.cluster.NodeCluster` as
`unshare --net --mount --pid --fork --mount-proc --propagation private python -m
e2e.node.launcher PLAN.json`, so this process is PID 1 of its own PID namespace: when it exits,
the kernel kills every process of the cluster (containerd shims and containers included), and
the network namespace with its addresses, bridges and iptables chains goes with them. It never
touches an address of the host's network.

It writes `ready` in the work directory once every component has started and the images are
imported, or `failed` with the reason. SIGTERM stops it; it then kills everything and removes the
kubelet's cgroups (cgroup v1 is not namespaced here). A multi-node cluster is ready once every
node wrote its own `nodes/<name>/ready`; a node's `failed` fails the cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from e2e.node.kubenode import (
    CDI_DIR,
    CLUSTER_CIDR,
    CLUSTER_IP,
    KUBELET_ROOT,
    PRIVATE_DIRS,
    SNAPSHOTTER,
    NodeProcesses,
    NodeSpec,
    gates,
    node_specs,
    write_configs,
)
from e2e.node.supervisor import Supervisor

__all__ = ["CDI_DIR", "CLUSTER_CIDR", "KUBELET_ROOT", "NODE_IP", "POD_CIDR", "PRIVATE_DIRS",
           "SERVICE_CIDR", "SNAPSHOTTER", "Launcher"]

#: addresses, all inside this network namespace: a single node's, the API server's
NODE_IP = CLUSTER_IP
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.96.0.0/16"


class Launcher(Supervisor):
    """The cluster: its control plane, then its node beside it (a single-node plan) or each
    node in namespaces of its own (a plan with `nodes`, `e2e.node.kubenode`)."""

    def __init__(self, plan: dict[str, Any]) -> None:
        work = Path(plan["dir"])
        super().__init__(work, work / "logs")
        self.plan = plan
        self.bin: dict[str, str] = plan["binaries"]
        self.nodes = node_specs(plan)
        self.node = NodeSpec(plan["node_name"], NODE_IP, POD_CIDR,
                             dict(plan.get("node_labels") or {}))

    def https_ok(self, url: str) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.dir / "pki" / "ca.crt"))
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.plan['token']}"})
        with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)

    # --- the cluster ------------------------------------------------------------------------

    def network(self) -> None:
        """The cluster's bridge with its address; a single node's private directories, or the
        routes to each node's pods."""
        self.run("ip", "link", "set", "lo", "up")
        self.run("ip", "link", "add", "muster0", "type", "bridge")
        self.run("ip", "link", "set", "muster0", "up")
        if not self.nodes:
            self.run("ip", "addr", "add", f"{NODE_IP}/32", "dev", "muster0")
            self.run("ip", "route", "add", "default", "dev", "muster0")
            for d in PRIVATE_DIRS:
                Path(d).mkdir(parents=True, exist_ok=True)
                self.run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", d)
            return
        self.run("ip", "addr", "add", f"{NODE_IP}/24", "dev", "muster0")
        for node in self.nodes:
            # the API server dials webhooks at their pod's address (aggregator routing)
            self.run("ip", "route", "add", node.pod_cidr, "via", node.ip)

    def write_configs(self) -> None:
        write_configs(self.dir, self.node, self.plan["pause_image"],
                      cluster_dns=self.plan.get("cluster_dns"))

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
                   *gates(self.plan), *self.runtime_config())
        self.wait_for("kube-apiserver /readyz",
                      lambda: self.https_ok(f"https://{NODE_IP}:6443/readyz"))
        self.start("kube-controller-manager", self.bin["kube-controller-manager"],
                   "--kubeconfig", kc, "--controllers", "*,-nodeipam",
                   "--service-account-private-key-file", str(pki / "sa.key"),
                   "--root-ca-file", str(pki / "ca.crt"), "--leader-elect=false",
                   "--bind-address", "127.0.0.1", "--use-service-account-credentials=false",
                   "--concurrent-job-syncs", "10", "--v=1",
                   *self.plan.get("controller_manager_flags", []), *gates(self.plan))
        self.start("kube-scheduler", self.bin["kube-scheduler"], "--kubeconfig", kc,
                   "--leader-elect=false", "--bind-address", "127.0.0.1", "--v=1",
                   *gates(self.plan))
        if self.plan.get("cluster_dns"):
            self.dns()

    def dns(self) -> None:
        """CoreDNS on the cluster's address, serving cluster.local from the API server."""
        kc = self.dir / "admin.kubeconfig"
        corefile = self.dir / "Corefile"
        corefile.write_text(f""".:53 {{
    bind {self.plan['cluster_dns']}
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kc} muster-test
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
}}
""")
        self.start("coredns", self.bin["coredns"], "-conf", str(corefile))

    def runtime_config(self) -> list[str]:
        config = self.plan.get("runtime_config") or []
        return ["--runtime-config=" + ",".join(config)] if config else []

    def node_components(self) -> None:
        if not self.nodes:
            NodeProcesses(self, self.plan, self.node, self.dir).start()
            return
        for node in self.nodes:
            self.start_node(node)
        for node in self.nodes:
            ready = self.dir / "nodes" / node.name / "ready"
            self.wait_for(f"node {node.name}", ready.exists, within=600)

    def start_node(self, node: NodeSpec) -> None:
        """`node` in network and mount namespaces of its own, its link on the bridge."""
        (self.dir / "nodes" / node.name / "logs").mkdir(parents=True, exist_ok=True)
        make_cgroup_root(node.cgroup_root)
        pid = self.start(f"node-{node.name}", "unshare", "--net", "--mount", "--propagation",
                         "private", sys.executable, "-m", "e2e.node.kubenode",
                         str(self.dir / "plan.json"), node.name)
        own = os.readlink("/proc/self/ns/net")
        self.wait_for(f"{node.name}'s network namespace",
                      lambda: os.readlink(f"/proc/{pid}/ns/net") != own, 30)
        inside, outside = f"m-{node.name}"[:15], f"h-{node.name}"[:15]
        self.run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        self.run("ip", "link", "set", inside, "netns", str(pid))
        self.run("ip", "link", "set", outside, "master", "muster0")
        self.run("ip", "link", "set", outside, "up")

    def reap(self) -> None:
        super().reap()
        for failed in (self.dir / "nodes").glob("*/failed") if self.nodes else ():
            if not (self.dir / "failed").exists():
                (self.dir / "failed").write_text(failed.read_text())

    # --- lifecycle --------------------------------------------------------------------------

    def stop(self) -> None:
        """Kills every process of the cluster at once, then removes the kubelets' cgroups. The
        cluster is thrown away, so a graceful shutdown would save nothing: the API server alone
        spent 20 s in its own once etcd had gone."""
        self.stopping = True
        os.kill(-1, signal.SIGKILL)  # every other process of this PID namespace
        time.sleep(0.5)
        self.reap()
        roots = [n.cgroup_root for n in self.nodes] or ["/"]
        remove_kubepods_cgroups(self.log, roots)
        self.log("stopped")

    def setup(self) -> None:
        self.network()
        if not self.nodes:
            self.write_configs()
        self.control_plane()
        self.node_components()


def _v1_hierarchies() -> list[Path]:
    root = Path("/sys/fs/cgroup")
    return [c for c in (root.iterdir() if root.is_dir() else ())
            if c.is_dir() and not c.is_symlink() and c.name != "unified"
            and (c / "cgroup.procs").exists()]


def make_cgroup_root(root: str) -> None:
    """The kubelet refuses a --cgroup-root that does not exist in every hierarchy; a cpuset one
    needs its CPUs and memory nodes before a task can join."""
    if root == "/":
        return
    for hierarchy in _v1_hierarchies():
        made = hierarchy / root.strip("/")
        made.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":
            for name in ("cpuset.cpus", "cpuset.mems"):
                (made / name).write_text((hierarchy / name).read_text())


def remove_kubepods_cgroups(log: Any, roots: list[str], within: float = 15.0) -> None:
    """The kubelet's cgroupfs driver made /sys/fs/cgroup/<controller>/<root>/kubepods... in the
    host's cgroup tree (a node of its own also made <root>); once every process is gone they are
    empty and can go (deepest first). Killed processes leave their cgroups a moment after
    SIGKILL: retry until then."""
    tops = [h / root.strip("/") / "kubepods" if root == "/" else h / root.strip("/")
            for h in _v1_hierarchies() for root in roots]
    tops = [t for t in tops if t.is_dir()]
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
