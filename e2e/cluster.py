"""The system under test: every Muster component as its own process, wired as in a cluster.

`LocalCluster` (CI): the API server emulator as a process (real HTTP, watches, and admission
webhooks called over HTTPS), `muster serve`, `muster bind`, and per node `muster agent` (fake
NVML) with a fake kubelet (real gRPC on unix sockets). The chart is installed with the real
`helm install` (client-side apply, hooks off: the emulator runs no Jobs nor pods), then the
certificate hook Job's own command makes the CA, the serving Secret and the caBundles; the
webhook serves that Secret's pair and the policies ConfigMap projected to files as the kubelet
would. Only the webhook Service is mapped to the local port (there is no cluster DNS here).

`RealCluster` (`pytest e2e --real-cluster`, KUBECONFIG set): the Helm chart installed on a real
cluster; the tests then use the same Kubernetes API calls.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from e2e.probes import eventually, open_volcano_queues
from e2e.procs import REPO, Proc, https_ok, wait_for
from e2e.projection import project
from webhook import keys
from webhook.demo import EXAMPLE_POLICIES
from webhook.kube import (
    NAMESPACES,
    NODES,
    SECRETS,
    KubeApi,
    make_api_client,
)

NAMESPACE = "muster-system"
RELEASE = "muster"
POLICIES_CONFIGMAP = f"{RELEASE}-policies"
NODE_NAMES = ("node-a", "node-b")


def helm() -> str:
    found = shutil.which("helm") or str(REPO / ".cache" / "bin" / "helm")
    if not Path(found).exists():
        raise RuntimeError("helm not found: run scripts/install-helm (scripts/test does)")
    return found


def chart_values(policies_dir: Path) -> dict[str, Any]:
    """Chart values carrying the shipped example policies, as an admin would set them."""
    texts = {p.name: p.read_text() for p in sorted(policies_dir.glob("*.yaml"))}
    return {"policies": texts}


def render_chart(values_file: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [helm(), "template", RELEASE, str(REPO / "charts" / "muster"), "--namespace", NAMESPACE,
         "--values", str(values_file)], capture_output=True, text=True, check=True, timeout=60)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def run_helm(*args: str) -> None:
    proc = subprocess.run([helm(), *args], capture_output=True, text=True, timeout=360,
                          check=False)
    if proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def node(name: str) -> dict[str, Any]:
    alloc = {"cpu": "80", "memory": "512Gi", keys.GPU_RESOURCE: "8", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name,
                keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED}},
            "status": {"allocatable": alloc, "capacity": alloc,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


class LocalCluster:
    real = False

    def __init__(self, tmp: Path, shared: Path) -> None:
        self.tmp, self.shared = tmp, shared
        self.kubeconfig = tmp / "kubeconfig"
        self.certs = tmp / "certs"
        self.policies_dir = tmp / "policies"
        self.webhook_port = free_port()
        self.procs: dict[str, Proc] = {}
        self.kube: KubeApi
        self._client: Any = None
        self._projection: asyncio.Task[None] | None = None

    # --- processes ----------------------------------------------------------------------------

    def _proc(self, name: str, *args: str, module: str = "webhook") -> Proc:
        proc = Proc(name, [*args], self.tmp / f"{name}.log", module=module).start()
        self.procs[name] = proc
        return proc

    def start_webhook(self) -> None:
        """`muster serve` as the chart runs it, on the serving Secret's pair (written to files
        once at start, as the kubelet mounts it)."""
        proc = self._proc(
            "webhook", "serve", "--host", "127.0.0.1", "--port", str(self.webhook_port),
            "--tls-cert-file", str(self.certs / "tls.crt"),
            "--tls-key-file", str(self.certs / "tls.key"),
            "--policies", str(self.policies_dir), "--kubeconfig", str(self.kubeconfig),
            "--namespace", NAMESPACE, "--service-name", f"{RELEASE}-webhook",
            "--policies-configmap", POLICIES_CONFIGMAP)
        wait_for("the webhook's /readyz", lambda: https_ok(
            f"https://127.0.0.1:{self.webhook_port}/readyz", self.certs / "ca.crt"),
            procs=[proc])

    def start_binder(self) -> None:
        self._proc("binder", "bind", "--kubeconfig", str(self.kubeconfig),
                   "--backoff-max", "1")

    def start_agent(self, node_name: str) -> None:
        self._proc(f"agent-{node_name}", "agent", "--node-name", node_name,
                   "--kubeconfig", str(self.kubeconfig), "--fake-nvml", "dgx1-v100",
                   "--kubelet-dir", str(self.tmp / node_name), "--rediscover-seconds", "60",
                   # the fake kubelet serves PodResources beside its kubelet.sock
                   "--pod-resources-socket", str(self.tmp / node_name / "pod-resources.sock"))

    def kill(self, name: str) -> None:
        self.procs[name].kill()

    def start_kubelet(self, node_name: str) -> None:
        """The node's fake kubelet: it starts each pod bound to the node, as a kubelet does,
        and logs one JSON line per pod started."""
        self._proc(f"kubelet-{node_name}", "--dir", str(self.tmp / node_name),
                   "--kubeconfig", str(self.kubeconfig), "--node", node_name,
                   module="webhook.doubles.fakekubelet")

    def restart_kubelet(self, node_name: str) -> None:
        """A kubelet restart: the device plugin must notice and register again."""
        self.procs[f"kubelet-{node_name}"].stop()
        self.start_kubelet(node_name)

    async def kubelet_started(self, node_name: str, count: int) -> list[dict[str, Any]]:
        """The first `count` pods the node's kubelet started or refused (across restarts)."""
        log_path = self.tmp / f"kubelet-{node_name}.log"
        events: list[dict[str, Any]] = []

        async def enough() -> bool:
            events[:] = [e for e in map(_json_line, log_path.read_text().splitlines())
                         if e.get("event") in ("started", "refused")]
            return len(events) >= count
        await _while_running(enough, what=f"{count} pods started on {node_name}",
                             procs=list(self.procs.values()), within=60)
        return events[:count]

    # --- lifecycle ----------------------------------------------------------------------------

    def _values_file(self, values: dict[str, Any]) -> Path:
        path = self.tmp / f"values-{len(list(self.tmp.glob('values-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(values))
        return path

    def _helm(self, command: str, values_file: Path) -> None:
        run_helm(command, RELEASE, str(REPO / "charts" / "muster"), "--namespace", NAMESPACE,
                 "--kubeconfig", str(self.kubeconfig), "--server-side=false", "--no-hooks",
                 "--values", str(values_file))

    async def helm_upgrade(self, values: dict[str, Any]) -> None:
        await asyncio.to_thread(self._helm, "upgrade", self._values_file(values))

    def _certificates(self, values_file: Path) -> None:
        """The chart's certificate hook Job, run as its own command with its own arguments:
        CA and serving Secrets, caBundle in both webhook configurations."""
        job = next(d for d in render_chart(values_file) if d["kind"] == "Job"
                   and d["metadata"]["name"] == f"{RELEASE}-webhook-certs")
        args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        subprocess.run([sys.executable, "-m", "webhook", *args, "--kubeconfig",
                        str(self.kubeconfig)], cwd=REPO, check=True, timeout=60,
                       capture_output=True)

    async def start(self) -> None:
        values = chart_values(EXAMPLE_POLICIES)
        emulator = Proc("apiserver", [
            "--kubeconfig", str(self.kubeconfig), "--crds", str(self.shared / "crds"),
            "--service-host", f"{NAMESPACE}/{RELEASE}-webhook=127.0.0.1:{self.webhook_port}"],
            self.tmp / "apiserver.log", module="webhook.doubles.emulator",
            capture_stdout=True).start()
        self.procs["apiserver"] = emulator
        assert emulator.popen is not None and emulator.popen.stdout is not None
        url = await asyncio.wait_for(asyncio.to_thread(emulator.popen.stdout.readline), 30)
        if not url:
            raise AssertionError(f"the API server emulator did not start:\n{emulator.tail()}")
        self._client = await make_api_client(str(self.kubeconfig))
        self.kube = KubeApi(self._client)
        await self.kube.create(NAMESPACES, namespace(NAMESPACE))
        for name in NODE_NAMES:
            await self.kube.create(NODES, node(name))
        await open_volcano_queues(self.kube)

        values_file = self._values_file(values)
        await asyncio.to_thread(self._helm, "install", values_file)
        await asyncio.to_thread(self._certificates, values_file)
        tls = await self.kube.get(SECRETS, f"{RELEASE}-webhook-tls", namespace=NAMESPACE)
        self.certs.mkdir()
        for name in ("tls.crt", "tls.key", "ca.crt"):
            (self.certs / name).write_bytes(base64.b64decode(tls["data"][name]))
        self._projection = asyncio.create_task(
            project(self.kube, NAMESPACE, POLICIES_CONFIGMAP, self.policies_dir))
        await eventually(lambda: any(self.policies_dir.glob("*.yaml")), within=30,
                         what="the policies projected from their ConfigMap")
        await asyncio.to_thread(self.start_webhook)

        for name in NODE_NAMES:
            (self.tmp / name).mkdir()
            self.start_kubelet(name)
            self.start_agent(name)
        self.start_binder()

        async def published() -> bool:
            nodes = (await self.kube.list(NODES))["items"]
            return all(keys.ANN_NODE_TOPOLOGY in (n["metadata"].get("annotations") or {})
                       for n in nodes)
        await _while_running(published, what="the agents to publish node topologies",
                             procs=list(self.procs.values()))

    async def stop(self) -> None:
        if self._projection is not None:
            self._projection.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._projection
        for name, proc in reversed(self.procs.items()):
            if name != "apiserver":
                proc.stop()
        if self._client is not None:
            await self._client.close()
        self.procs["apiserver"].stop()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ({p.log_path})\n{p.tail(60)}" for p in self.procs.values())


class RealCluster:
    """The Helm chart on the cluster KUBECONFIG points to. Component restarts go through
    Deployments, as an operator would do them."""

    real = True

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.kubeconfig = Path(os.environ["KUBECONFIG"])
        self.kube: KubeApi
        self._client: Any = None

    def _kubectl(self, *args: str) -> None:
        subprocess.run(["kubectl", "--namespace", NAMESPACE, *args], check=True, timeout=300)

    async def start(self) -> None:
        values = self.tmp / "values.yaml"
        values.write_text(yaml.safe_dump(chart_values(EXAMPLE_POLICIES)))
        await asyncio.to_thread(
            subprocess.run, [helm(), "upgrade", "--install", RELEASE,
                             str(REPO / "charts" / "muster"), "--namespace", NAMESPACE,
                             "--create-namespace", "--values", str(values), "--wait",
                             "--timeout", "5m"], check=True, timeout=360)
        self._client = await make_api_client(str(self.kubeconfig))
        self.kube = KubeApi(self._client)

    async def helm_upgrade(self, values: dict[str, Any]) -> None:
        path = self.tmp / "values-upgrade.yaml"
        path.write_text(yaml.safe_dump(values))
        await asyncio.to_thread(
            subprocess.run, [helm(), "upgrade", RELEASE, str(REPO / "charts" / "muster"),
                             "--namespace", NAMESPACE, "--values", str(path), "--wait",
                             "--timeout", "5m"], check=True, timeout=360)

    def kill(self, name: str) -> None:
        self._kubectl("scale", f"deployment/{RELEASE}-{name}", "--replicas=0")
        self._kubectl("rollout", "status", f"deployment/{RELEASE}-{name}")

    def start_webhook(self) -> None:
        self._kubectl("scale", f"deployment/{RELEASE}-webhook", "--replicas=2")
        self._kubectl("rollout", "status", f"deployment/{RELEASE}-webhook")

    def start_binder(self) -> None:
        self._kubectl("scale", f"deployment/{RELEASE}-binder", "--replicas=2")
        self._kubectl("rollout", "status", f"deployment/{RELEASE}-binder")

    async def stop(self) -> None:
        await asyncio.to_thread(
            subprocess.run, [helm(), "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait"],
            check=False, timeout=300)
        if self._client is not None:
            await self._client.close()

    def logs(self) -> str:
        return "see `kubectl logs -n muster-system` for the components' logs"


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels or {}}}


def _json_line(line: str) -> dict[str, Any]:
    """A JSON event line of a process log; {} for a log line."""
    if not line.startswith("{"):
        return {}
    try:
        doc = json.loads(line)
    except json.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}




async def _while_running(check: Any, *, what: str, procs: list[Proc], within: float = 60.0
                         ) -> None:
    """`eventually`, failing at once with its log when one of `procs` exits, and with every
    process's log when the time is up."""
    async def alive_and_done() -> bool:
        for p in procs:
            if not p.running:
                raise AssertionError(f"{p.name} exited while waiting for {what}:\n{p.tail()}")
        return bool(await check())
    try:
        await eventually(alive_and_done, within, what=what, interval=0.1)
    except AssertionError as exc:
        if "exited while waiting" in str(exc):
            raise
        raise AssertionError(f"{exc}\n" + "\n".join(
            f"--- {p.name}\n{p.tail()}" for p in procs)) from None
