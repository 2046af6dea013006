"""One Kubernetes node: containerd 2 (CDI on), the kubelet and kube-proxy, with their
configuration files, started in the namespaces of the calling process.

A single-node cluster runs its node beside the control plane (`e2e.node.launcher`). A
multi-node cluster runs each node as `python -m e2e.node.kubenode PLAN NAME` under
`unshare --net --mount --propagation private`, started by the cluster's launcher, which moves one
end of a veth pair into the node's network namespace (the other end on the cluster's bridge):

- the node's address on that link and routes to every other node's pod range through that node,
  so pods talk across nodes with no overlay, as the bridge CNI plugin with host-local ranges
  and plain routes do on a flat network;
- a tmpfs of its own over every host path a kubelet, containerd or CNI writes to no matter
  their flags (`PRIVATE_DIRS`): each node has its own device-plugin sockets, CDI specs, pod logs;
- its kubelet's cgroups below a root of its own (`/<cluster>-<name>`, the cluster's directory
  name first), so the kubelets' QoS trees do not meet, nor those of another cluster's node of
  the same name, starting or stopping beside it.

The node writes `ready` in its directory once its kubelet and kube-proxy run and the images are
imported. A line in its `control` file stops (`kubelet stop`) or starts again (`kubelet start`)
its kubelet: what a test does to take a node NotReady and back; `done <line>` in `control.ack`
answers it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.node.supervisor import Supervisor

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
#: visible in the node's mount namespace only, so nothing is left on the host
#: (/run/nri: each containerd binds its NRI socket there; shared, the nodes' containerds raced
#: for one path and one exited "bind: address already in use")
PRIVATE_DIRS = ("/var/log/pods", "/var/log/containers", "/var/lib/cni", "/run/netns",
                "/run/containerd", "/run/nri", "/var/lib/kubelet", "/etc/cni/net.d", CDI_DIR)
CLUSTER_CIDR = "10.244.0.0/16"
#: the cluster's own address on its bridge: API server, DNS, the nodes' default gateway
CLUSTER_IP = "10.255.0.1"


@dataclass(frozen=True)
class NodeSpec:
    """Where one node lives and what it says of itself."""

    name: str
    ip: str
    pod_cidr: str
    labels: dict[str, str] = field(default_factory=dict)
    #: the kubelet's cgroup root ("/" on a single node; one of its own beside others)
    cgroup_root: str = "/"

    @classmethod
    def numbered(cls, index: int, name: str, labels: dict[str, str], cluster: str) -> NodeSpec:
        """Node `index` (1-based) of multi-node cluster `cluster` (a name no other cluster on
        the machine has: its cgroups are the host's): 10.255.0.(10 + index), pods in
        10.244.<index>.0/24, cgroups under /<cluster>-<name>."""
        return cls(name, f"10.255.0.{10 + index}", f"10.244.{index}.0/24", dict(labels),
                   f"/{cluster}-{name}")


def write_configs(work: Path, node: NodeSpec, pause_image: str, *,
                  cluster_dns: str | None = None) -> None:
    """containerd.toml, kubelet.yaml and the CNI conflist of `node`, in `work`."""
    (work / "cni").mkdir(parents=True, exist_ok=True)
    (work / "cni" / "10-muster.conflist").write_text(json.dumps({
        "cniVersion": "0.4.0", "name": "muster-pods", "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": node.pod_cidr}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "loopback"}]}))
    (work / "containerd.toml").write_text(_containerd_toml(work, pause_image))
    (work / "kubelet.yaml").write_text(json.dumps(_kubelet_config(work, node, cluster_dns)))


def _containerd_toml(work: Path, pause_image: str) -> str:
    images, runtime = "plugins.'io.containerd.cri.v1.images'", \
        "plugins.'io.containerd.cri.v1.runtime'"
    # version 3: the format every containerd 2.x reads (2.4 migrates it to its own 4)
    return f"""version = 3
root = "{work}/containerd/root"
state = "{work}/containerd/state"
[grpc]
  address = "{work}/containerd.sock"
[ttrpc]
  address = "{work}/containerd.sock.ttrpc"
[{images}]
  snapshotter = "{SNAPSHOTTER}"
[{images}.pinned_images]
  sandbox = "{pause_image}"
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
  conf_dir = "{work}/cni"
"""


def _kubelet_config(work: Path, node: NodeSpec, cluster_dns: str | None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        # this machine kind has cgroup v1: 1.35+ refuse it unless told (KEP-5573)
        "cgroupDriver": "cgroupfs", "failSwapOn": False, "failCgroupV1": False,
        "cgroupRoot": node.cgroup_root,
        "containerRuntimeEndpoint": f"unix://{work}/containerd.sock",
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "evictionHard": {"nodefs.available": "1%", "imagefs.available": "1%",
                         "memory.available": "100Mi"},
        "imageGCHighThresholdPercent": 100, "localStorageCapacityIsolation": False,
        "address": node.ip, "healthzBindAddress": "127.0.0.1", "readOnlyPort": 0,
        "resolvConf": "", "serializeImagePulls": False, "podCIDR": node.pod_cidr,
        "nodeStatusUpdateFrequency": "2s", "syncFrequency": "10s",
        "fileCheckFrequency": "5s"}
    if cluster_dns:
        # mpirun's hostfile and a PyTorchJob's MASTER_ADDR name Services: pods need DNS
        config |= {"clusterDNS": [cluster_dns], "clusterDomain": "cluster.local"}
    return config


def gates(plan: dict[str, Any]) -> list[str]:
    """--feature-gates for the control plane and the kubelet, when the plan turns any on or
    off."""
    turned = plan.get("feature_gates") or {}
    return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in
                                          sorted(turned.items()))] if turned else []


class NodeProcesses:
    """Starts a node's containerd (importing the plan's images), kubelet and kube-proxy through
    `sup`, in the caller's namespaces."""

    def __init__(self, sup: Supervisor, plan: dict[str, Any], node: NodeSpec, work: Path
                 ) -> None:
        self.sup, self.plan, self.node, self.work = sup, plan, node, work
        self.bin: dict[str, str] = plan["binaries"]
        self.kubelet_pid: int | None = None

    def start(self) -> None:
        sock = str(self.work / "containerd.sock")
        # its runc shim is found on PATH first: ours, before a distribution's older one
        path = f"{Path(self.bin['containerd']).parent}:{os.environ.get('PATH', '')}"
        self.sup.start("containerd", self.bin["containerd"], "--config",
                       str(self.work / "containerd.toml"), env={**os.environ, "PATH": path})
        self.sup.wait_for("containerd's socket", lambda: Path(sock).exists())
        for archive in self.plan["images"]:
            subprocess.run([self.bin["ctr"], "--address", sock, "-n", "k8s.io", "images",
                            "import", "--snapshotter", SNAPSHOTTER, archive],
                           check=True, capture_output=True, timeout=900)
        self.start_kubelet()
        kc = str(Path(self.plan["dir"]) / "admin.kubeconfig")
        self.sup.start("kube-proxy", self.bin["kube-proxy"], "--kubeconfig", kc,
                       "--proxy-mode", "iptables", "--cluster-cidr", CLUSTER_CIDR,
                       "--conntrack-max-per-core", "0", "--hostname-override", self.node.name,
                       "--metrics-bind-address", "127.0.0.1:10249",
                       "--healthz-bind-address", "127.0.0.1:10256", "--v=1")

    def start_kubelet(self) -> None:
        kc = str(Path(self.plan["dir"]) / "admin.kubeconfig")
        self.kubelet_pid = self.sup.start(
            "kubelet", self.bin["kubelet"], "--config", str(self.work / "kubelet.yaml"),
            "--kubeconfig", kc, "--node-ip", self.node.ip,
            "--hostname-override", self.node.name, "--root-dir", KUBELET_ROOT,
            "--cert-dir", str(self.work / "kubelet-pki"),
            "--node-labels", ",".join(f"{k}={v}" for k, v in self.node.labels.items()),
            "--v=1", *gates(self.plan))

    def stop_kubelet(self) -> None:
        """As a crashed kubelet: its containers keep running, the node goes NotReady."""
        if self.kubelet_pid is not None:
            self.sup.terminate(self.kubelet_pid)
            self.kubelet_pid = None


class NodeRunner(Supervisor):
    """`python -m e2e.node.kubenode PLAN NAME`: one node of a multi-node cluster, in the network
    and mount namespaces its `unshare` made; the cluster's launcher moves its link in."""

    def __init__(self, plan: dict[str, Any], node: NodeSpec, peers: list[NodeSpec]) -> None:
        work = Path(plan["dir"]) / "nodes" / node.name
        super().__init__(work, work / "logs")
        self.plan, self.node, self.peers = plan, node, peers
        self.processes = NodeProcesses(self, plan, node, work)

    def network(self) -> None:
        link = f"m-{self.node.name}"[:15]
        # not /sys/class/net: this mount namespace's sysfs still shows the cluster's network
        self.wait_for(f"the link {link}", lambda: subprocess.run(
            ["ip", "link", "show", link], capture_output=True, check=False).returncode == 0, 30)
        self.run("ip", "link", "set", "lo", "up")
        self.run("ip", "link", "set", link, "name", "eth0")
        self.run("ip", "addr", "add", f"{self.node.ip}/24", "dev", "eth0")
        self.run("ip", "link", "set", "eth0", "up")
        self.run("ip", "route", "add", "default", "via", CLUSTER_IP)
        for peer in self.peers:
            if peer.name != self.node.name:
                self.run("ip", "route", "add", peer.pod_cidr, "via", peer.ip)
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
        for d in PRIVATE_DIRS:
            Path(d).mkdir(parents=True, exist_ok=True)
            self.run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", d)

    def tick(self) -> None:
        """Acts on each new line of `control` (`kubelet stop|start`)."""
        control, ack = self.dir / "control", self.dir / "control.ack"
        done = ack.read_text().splitlines() if ack.exists() else []
        asked = control.read_text().splitlines() if control.exists() else []
        for line in asked[len(done):]:
            if line == "kubelet stop":
                self.processes.stop_kubelet()
            elif line == "kubelet start" and self.processes.kubelet_pid is None:
                self.processes.start_kubelet()
            self.log(f"control: {line}")
            with ack.open("a") as f:
                f.write(line + "\n")

    def setup(self) -> None:
        self.network()
        write_configs(self.dir, self.node, self.plan["pause_image"],
                      cluster_dns=self.plan.get("cluster_dns"))
        self.processes.start()

    def failure(self, exc: BaseException) -> str:
        return f"{self.node.name}: {exc}"


def node_specs(plan: dict[str, Any]) -> list[NodeSpec]:
    return [NodeSpec(n["name"], n["ip"], n["pod_cidr"], n["labels"], n["cgroup_root"])
            for n in plan.get("nodes") or []]


if __name__ == "__main__":
    _plan = json.loads(Path(sys.argv[1]).read_text())
    _nodes = node_specs(_plan)
    [_node] = [n for n in _nodes if n.name == sys.argv[2]]
    NodeRunner(_plan, _node, _nodes).main()
