"""`muster agent`: discovery → Node publisher, and the device plugin, on one node.

Discovery runs every `rediscover_s` (NVML calls block, so in a thread); a changed result is
published on the Node and a changed device health is streamed to the kubelet. Between
discoveries, critical XID events (webhook.agent.health) mark a GPU unhealthy at once. Neither a
failed API call nor a failed NVML call stops the agent: it logs, marks the node degraded where it
can, and tries again on the next round.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from webhook import keys
from webhook.agent.deviceplugin.plugin import GpuDevicePlugin, PluginConfig
from webhook.agent.discovery import Discovery, discover, keep_identity
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


class Agent:
    """Discovery → Node publisher and device plugin; `events_nvml` (real or fake) adds XID
    fault watching between discoveries."""

    def __init__(self, config: AgentConfig, discoverer: Discoverer, api: KubeApi,
                 events_nvml: Nvml | None = None) -> None:
        self.config = config
        self.discoverer = discoverer
        self.events_nvml = events_nvml
        self.publisher = NodePublisher(api, config.node)
        self.pods = NodePods(api, config.node)
        self.plugin: GpuDevicePlugin | None = None
        self.topology: Topology | None = None  # as discovered, identities kept
        self.found = Discovery(None)
        self.faulty: set[str] = set()  # UUIDs of GPUs with a critical XID since start
        self._apply_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.rounds = 0

    async def step(self) -> Discovery:
        """One round: discover, then publish and update the device list."""
        found = await asyncio.to_thread(self.discoverer)
        if found.topology is not None:
            self.topology = keep_identity(self.topology, found.topology)
            found = Discovery(self.topology, found.degradations, found.driver_version)
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
                await self.publisher.publish(found)
            except ApiError as exc:
                log.warning("publishing the node topology failed; retrying next round",
                            extra={"node": self.config.node, "error": str(exc)})
            if found.topology is not None:
                if self.plugin is None:
                    self.plugin = GpuDevicePlugin(self.config.plugin, found.topology, self.pods)
                else:
                    await self.plugin.set_topology(found.topology)

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
        try:
            while True:
                await self.step()
                if plugin_task is None and self.plugin is not None:
                    plugin_task = asyncio.create_task(self.plugin.run())
                await asyncio.sleep(self.config.rediscover_s)
        finally:
            stop.set()
            if plugin_task is not None:
                plugin_task.cancel()
                await asyncio.gather(plugin_task, return_exceptions=True)
            if watcher is not None:
                await asyncio.gather(watcher, return_exceptions=True)
