"""`muster agent`: discovery → Node publisher, and the device plugin, on one node.

Discovery runs every `rediscover_s` (NVML calls block, so in a thread); a changed result is
published on the Node and a changed device health is streamed to the kubelet. Neither a failed
API call nor a failed NVML call stops the agent: it logs, marks the node degraded where it can,
and tries again on the next round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from webhook.agent.deviceplugin.plugin import GpuDevicePlugin, PluginConfig
from webhook.agent.discovery import Discovery, discover, keep_identity
from webhook.agent.fakenvml import PROFILES, FakeNvml
from webhook.agent.publisher import NodePublisher
from webhook.kube.api import PODS, ApiError, KubeApi
from webhook.topology.builtin import builtin
from webhook.topology.codec import decode
from webhook.topology.model import Topology

log = logging.getLogger(__name__)

Discoverer = Callable[[], Discovery]


def nvml_source(fake: str | None = None) -> Any:
    """Real NVML (the pynvml module), or the fake NVML with a built-in profile or recorded file.
    libnvidia-ml itself is loaded on nvmlInit, not here."""
    if fake is None:
        return pynvml
    if fake in PROFILES:
        return FakeNvml.profile(fake)
    if Path(fake).is_file():
        return FakeNvml.from_file(fake)
    raise ValueError(f"--fake-nvml {fake!r}: neither a profile ({', '.join(PROFILES)}) "
                     "nor a recorded file")


def nvml_discoverer(fake: str | None = None) -> Discoverer:
    nvml = nvml_source(fake)
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
    found = Discovery(topology)
    return lambda: found


class NodePods:
    """The device plugin's PodSource: pods bound to this node, listed fresh on each call (Allocate
    is rare; a field-selected LIST is exact and cheap)."""

    def __init__(self, api: KubeApi, node: str) -> None:
        self.api = api
        self.node = node

    async def pods(self) -> list[dict[str, Any]]:
        result = await self.api.list(PODS, field_selector=f"spec.nodeName={self.node}")
        items: list[dict[str, Any]] = result.get("items") or []
        return items


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node: str
    plugin: PluginConfig
    rediscover_s: float = 60.0


class Agent:
    def __init__(self, config: AgentConfig, discoverer: Discoverer, api: KubeApi) -> None:
        self.config = config
        self.discoverer = discoverer
        self.publisher = NodePublisher(api, config.node)
        self.pods = NodePods(api, config.node)
        self.plugin: GpuDevicePlugin | None = None
        self.topology: Topology | None = None
        self.rounds = 0

    async def step(self) -> Discovery:
        """One round: discover, publish, update the device plugin's device list."""
        found = await asyncio.to_thread(self.discoverer)
        if found.topology is not None:
            topology = keep_identity(self.topology, found.topology)
            found = Discovery(topology, found.degradations, found.driver_version)
            self.topology = topology
        try:
            await self.publisher.publish(found)
        except ApiError as exc:
            log.warning("publishing the node topology failed; retrying next round",
                        extra={"node": self.config.node, "error": str(exc)})
        if self.topology is not None:
            if self.plugin is None:
                self.plugin = GpuDevicePlugin(self.config.plugin, self.topology, self.pods)
            else:
                await self.plugin.set_topology(self.topology)
        self.rounds += 1
        return found

    async def run(self) -> None:
        plugin_task: asyncio.Task[None] | None = None
        try:
            while True:
                await self.step()
                if plugin_task is None and self.plugin is not None:
                    plugin_task = asyncio.create_task(self.plugin.run())
                await asyncio.sleep(self.config.rediscover_s)
        finally:
            if plugin_task is not None:
                plugin_task.cancel()
                await asyncio.gather(plugin_task, return_exceptions=True)
