"""`muster agent`: discovery → Node publisher, and the device plugin and/or the DRA driver
(webhook.agent.dra: its ResourceSlice follows each discovery), on one node.

Discovery runs every `rediscover_s` (NVML calls block, so in a thread); a changed result is
published on the Node and a changed device health is streamed to the kubelet. Between
discoveries, critical XID events (webhook.agent.health) mark a GPU unhealthy at once. Neither a
failed API call nor a failed NVML call stops the agent: it logs, marks the node degraded where it
can, and tries again on the next round.

The Node's `muster.io/gpu-allocation-ack=true` follows the device plugin's registration: set once
the kubelet has accepted it, removed when it has not been registered for `ack_grace_s` (no
kubelet, a kubelet gone or refusing it) and when the agent stops. The grace rides over a kubelet
restart (it deletes every socket; the plugin registers again within a second or so of the new
kubelet.sock): while the label is gone the binder no longer binds the node's GPU pods one at a
time, and pods that reach a restarted kubelet together are the case the label exists for.

Each registration also records this agent's pod on the Node (`muster.io/gpu-agent`), and
`/readyz` answers 200 only while the plugin is registered: the binder places GPU pods on the
node only while the pod recorded there is Ready, so not while a new agent replaces an old one
whose plugin the kubelet may still call.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from webhook import keys
from webhook.agent.deviceplugin.plugin import GpuDevicePlugin, PluginConfig
from webhook.agent.discovery import Discovery, discover, keep_identity
from webhook.agent.dra.driver import DraConfig, DraDriver, KubeClaims
from webhook.agent.dra.publisher import SlicePublisher, pcie_roots
from webhook.agent.health import XidEvent, XidWatcher, mark_unhealthy
from webhook.agent.nvml import Nvml
from webhook.agent.publisher import NodePublisher
from webhook.kube.api import PODS, ApiError, KubeApi
from webhook.kube.events import EventRecorder
from webhook.topology.builtin import builtin
from webhook.topology.codec import decode
from webhook.topology.model import Topology

log = logging.getLogger(__name__)

Discoverer = Callable[[], Discovery]


def nvml_discoverer(nvml: Nvml) -> Discoverer:
    return lambda: discover(nvml)


def static_discoverer(topology_file: str | None = None, node_type: str | None = None
                      ) -> Discoverer:
    """A topology file (the codec's JSON) or a built-in node type stands in for NVML."""
    if topology_file is not None:
        topology = decode(Path(topology_file).read_text())
    elif node_type is not None:
        topology = builtin(node_type)
    else:
        raise ValueError("a topology file or a node type is needed")
    unnamed = [g.index for g in topology.gpus if g.uuid is None]
    if unnamed:
        # the device plugin hands GPUs to containers by UUID
        raise ValueError(f"{topology_file}: GPUs {unnamed} have no UUID (a parsed `nvidia-smi "
                         "topo -m` has none); add them with `muster topology parse --gpu-list` "
                         "(the output of `nvidia-smi -L`), or run the agent with NVML")
    found = Discovery(topology)
    return lambda: found


class NodePods:
    """The device plugin's PodSource: pods bound to this node, listed fresh on each call (Allocate
    is rare; a field-selected LIST is exact and cheap)."""

    def __init__(self, api: KubeApi, node: str) -> None:
        self.api = api
        self.node = node
        self.recorder = EventRecorder(api, "muster-agent", node)

    async def pods(self) -> list[dict[str, Any]]:
        result = await self.api.list(PODS, field_selector=f"spec.nodeName={self.node}")
        items: list[dict[str, Any]] = result.get("items") or []
        return items

    async def acknowledge(self, pod: str, uid: str) -> None:
        namespace, name = pod.split("/", 1)
        path = "/metadata/annotations/" + keys.ANN_GPU_ALLOCATED.replace("/", "~1")
        # the uid test: a pod deleted and re-created under the same name is not this one
        await self.api.patch(PODS, name, [{"op": "test", "path": "/metadata/uid", "value": uid},
                                          {"op": "add", "path": path, "value": self.node}],
                             namespace, patch_type="json")

    async def report(self, pod: str, uid: str, reason: str, message: str) -> None:
        namespace, name = pod.split("/", 1)
        await self.recorder.emit({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "namespace": namespace, "name": name, "uid": uid}}, "Warning", reason, message)


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node: str
    plugin: PluginConfig
    rediscover_s: float = 60.0
    #: seconds the plugin may stay unregistered before the acknowledgement label goes
    ack_grace_s: float = 10.0
    #: seconds the label's removal may take when the agent stops
    shutdown_write_s: float = 5.0
    #: serve the GPUs through the device plugin (the default), DRA (`dra` set), or both
    device_plugin: bool = True
    dra: DraConfig | None = None
    #: /metrics (the device plugin's holding checks) and /healthz; None: not served
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"  # scraped from other pods
    #: this agent's pod (keys.gpu_agent: from the downward API), recorded on the Node at each
    #: registration; None: not recorded
    pod: str | None = None


class Agent:
    """Discovery → Node publisher and device plugin; `events_nvml` (real or fake) adds XID
    fault watching between discoveries."""

    def __init__(self, config: AgentConfig, discoverer: Discoverer, api: KubeApi,
                 events_nvml: Nvml | None = None) -> None:
        self.config = config
        self.discoverer = discoverer
        self.events_nvml = events_nvml
        self.publisher = NodePublisher(api, config.node, config.pod, plugin=config.device_plugin)
        self.pods = NodePods(api, config.node)
        self.plugin: GpuDevicePlugin | None = None
        self.dra = DraDriver(config.dra, KubeClaims(api)) if config.dra is not None else None
        self.slices = SlicePublisher(api, config.node)
        self.pcie_roots: dict[int, str] = {}  # from sysfs, for the ResourceSlice
        self._roots_of: tuple[str, ...] | None = None  # the bus IDs `pcie_roots` was read for
        self.topology: Topology | None = None  # as discovered, identities kept
        self.found = Discovery(None)
        self.faulty: set[str] = set()  # UUIDs of GPUs with a critical XID since start
        #: the device plugin is registered with the kubelet and serving (the acknowledgement
        #: label); None until the plugin loop knows, so a label a previous agent left is not
        #: flipped off and on at start
        self.serving: bool | None = None
        self._apply_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.rounds = 0

    async def step(self) -> Discovery:
        """One round: discover, then publish and update the device list."""
        found = await asyncio.to_thread(self.discoverer)
        if found.topology is not None:
            self.topology = keep_identity(self.topology, found.topology)
            found = Discovery(self.topology, found.degradations, found.driver_version)
            buses = tuple(g.pci_bus_id for g in self.topology.gpus)
            if self.dra is not None and buses != self._roots_of:
                # sysfs is walked when the GPUs' bus IDs change, not every round
                self.pcie_roots = await asyncio.to_thread(pcie_roots, self.topology)
                self._roots_of = buses
        self.found = found
        await self.apply()
        self.rounds += 1
        return found

    async def apply(self) -> None:
        """Publish the last discovery, with XID-faulty GPUs unhealthy, and hand the devices to
        the plugin. API errors are retried on the next round."""
        async with self._apply_lock:
            found = self.found
            if found.topology is not None:
                found = dataclasses.replace(found,
                                            topology=mark_unhealthy(found.topology, self.faulty))
            try:
                await self.publisher.publish(found, self.serving)
            except ApiError as exc:
                log.warning("publishing the node topology failed; retrying next round",
                            extra={"node": self.config.node, "error": str(exc)})
            if found.topology is None:
                return
            if self.config.device_plugin and self.plugin is None:
                self.plugin = GpuDevicePlugin(self.config.plugin, found.topology, self.pods)
            elif self.plugin is not None:
                await self.plugin.set_topology(found.topology)
            if self.dra is not None:
                self.dra.set_topology(found.topology)
                try:
                    await self.slices.publish(found.topology, self.pcie_roots)
                except ApiError as exc:
                    log.warning("publishing the ResourceSlice failed; retrying next round",
                                extra={"node": self.config.node, "error": str(exc)})

    async def set_serving(self, serving: bool) -> None:
        """The plugin's registration changed: publish the acknowledgement label (or its
        removal). A failed write is retried with the next round's publish."""
        if serving == self.serving:
            return
        self.serving = serving
        log.info("device plugin " + ("registered and serving: acknowledging served pods"
                                     if serving else "not registered: no acknowledgements"),
                 extra={"node": self.config.node})
        await self.apply()

    async def serve_plugin(self, plugin: GpuDevicePlugin) -> None:
        """Serve and (re-)register the plugin until cancelled, as `GpuDevicePlugin.run` does,
        and keep the acknowledgement label true to its registration."""
        loop = asyncio.get_running_loop()
        lost_at: float | None = None  # when the plugin was last seen unregistered, in a row
        audits = (asyncio.create_task(plugin.audit_loop())
                  if plugin.config.pod_resources is not None else None)
        try:
            while True:
                try:
                    registered = await plugin.ensure_registered()
                except Exception as exc:  # e.g. the socket directory is gone: retry
                    log.warning("device plugin could not serve; will retry",
                                extra={"error": str(exc)})
                    registered = False
                if registered:
                    lost_at = None
                    await self.set_serving(True)
                else:
                    lost_at = loop.time() if lost_at is None else lost_at
                    if loop.time() - lost_at >= self.config.ack_grace_s:
                        await self.set_serving(False)
                await asyncio.sleep(plugin.config.kubelet_check_s)
        finally:
            if audits is not None:
                audits.cancel()
                await asyncio.gather(audits, return_exceptions=True)
            await plugin.stop()
            with contextlib.suppress(FileNotFoundError):
                plugin.socket_path.unlink()

    async def _withdraw(self) -> None:
        """At shutdown: the plugin no longer serves, so the label goes (bounded: the kubelet
        kills the pod after its grace period)."""
        if self.serving is None and self.plugin is None:
            return  # never registered: whatever the label says was not this agent's
        self.serving = False
        try:
            async with asyncio.timeout(self.config.shutdown_write_s):
                await self.apply()
        except TimeoutError:
            log.warning("could not remove the acknowledgement label in time",
                        extra={"node": self.config.node})

    @property
    def ready(self) -> bool:
        """The pod's readiness: its device plugin is registered with the kubelet (an agent that
        serves only DRA is ready once it runs)."""
        return bool(self.serving) or not self.config.device_plugin

    async def _serve_metrics(self, port: int) -> web.AppRunner:
        """/metrics: the device plugin's holding checks (none before it exists); /healthz;
        /readyz: `ready`."""
        async def metrics(_: web.Request) -> web.Response:
            body = generate_latest(self.plugin.metrics) if self.plugin is not None else b""
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def readyz(_: web.Request) -> web.Response:
            if self.ready:
                return web.Response(text="ok")
            return web.Response(status=503, text="the device plugin is not registered")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self.config.metrics_host, port).start()
        log.info("metrics listening", extra={"port": port})
        return runner

    def _on_xid(self, event: XidEvent) -> None:
        if event.uuid not in self.faulty:
            self.faulty.add(event.uuid)
            task = asyncio.create_task(self.apply())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        watcher: asyncio.Future[None] | None = None
        if self.events_nvml is not None:
            def emit(event: XidEvent) -> None:  # called on the watcher's thread
                loop.call_soon_threadsafe(self._on_xid, event)

            watcher = loop.run_in_executor(None, XidWatcher(self.events_nvml).run, stop, emit)
        plugin_task: asyncio.Task[None] | None = None
        dra_task: asyncio.Task[None] | None = None
        metrics = (await self._serve_metrics(self.config.metrics_port)
                   if self.config.metrics_port is not None else None)
        try:
            while True:
                await self.step()
                if plugin_task is None and self.plugin is not None:
                    plugin_task = asyncio.create_task(self.serve_plugin(self.plugin))
                # registered once it knows the GPUs, so no prepare finds none
                if dra_task is None and self.dra is not None and self.dra.gpus:
                    dra_task = asyncio.create_task(self.dra.run())
                await asyncio.sleep(self.config.rediscover_s)
        finally:
            stop.set()
            for task in (plugin_task, dra_task):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            await self._withdraw()
            if metrics is not None:
                await metrics.cleanup()
            if watcher is not None:
                await asyncio.gather(watcher, return_exceptions=True)
