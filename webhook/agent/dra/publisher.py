"""Keep this node's ResourceSlice true to the discovered GPUs: create it, replace it (with the
live resourceVersion, pool generation + 1) when its devices change, and delete any other slice
of this driver on this node (a renamed slice of an earlier agent). Also reads the PCIe root
complex of each GPU from sysfs, for the standard pcieRoot attribute."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from webhook import keys
from webhook.agent.dra.slices import resource_slice, same_devices, slice_name
from webhook.kube.api import RESOURCE_SLICES, ApiError, KubeApi
from webhook.topology.model import Topology

log = logging.getLogger(__name__)

SYSFS_PCI = Path("/sys/bus/pci/devices")
_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's `00000000:06:00.0` as sysfs names it: `0000:06:00.0` (lower case)."""
    domain, _, rest = nvml_bus_id.lower().partition(":")
    return f"{domain[-4:]:0>4}:{rest}"


def pcie_roots(topology: Topology, sysfs: Path = SYSFS_PCI) -> dict[int, str]:
    """GPU index → `pci<domain>:<bus>` of its root complex: the `pci…` directory its sysfs
    device resolves under (/sys/devices/pci0000:00/…/0000:06:00.0). GPUs sysfs does not know
    (no driver here, a fake NVML) are left out, so the attribute is never made up."""
    roots = {}
    for gpu in topology.gpus:
        path = sysfs / sysfs_bus_id(gpu.pci_bus_id)
        if not path.exists():
            continue
        for part in Path(os.path.realpath(path)).parts:
            if _ROOT.match(part):
                roots[gpu.index] = part
                break
    return roots


class SlicePublisher:
    def __init__(self, api: KubeApi, node: str, *, sweep_every: int = 5) -> None:
        self.api = api
        self.node = node
        #: every `sweep_every`-th round (the first included) lists this node's slices of the
        #: driver and deletes all but its own (an earlier or overlapping agent's); the rounds
        #: between read its own slice by name (a GET, as the Node publisher's)
        self.sweep_every = sweep_every
        self._rounds = 0

    async def publish(self, topology: Topology, roots: dict[int, str]) -> bool:
        """Bring the node's slices up to date; True when something was written. ApiError
        propagates (the runner retries on its next round)."""
        name = slice_name(self.node)
        wrote = False
        sweep = self._rounds % self.sweep_every == 0
        self._rounds += 1
        if sweep:
            live, last, wrote = await self._sweep(name)
        else:
            live = await self._get(name)
            last = _generation(live) if live is not None else 0
        wanted = resource_slice(self.node, topology, last + 1, roots)
        if live is None:
            await self.api.create(RESOURCE_SLICES, wanted)
            log.info("ResourceSlice created", extra={"slice": name, "generation": last + 1})
            return True
        if same_devices(live, wanted):
            return wrote
        wanted["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
        await self.api.replace(RESOURCE_SLICES, name, wanted)
        log.info("ResourceSlice updated", extra={"slice": name, "generation": last + 1})
        return True

    async def _sweep(self, name: str) -> tuple[dict[str, Any] | None, int, bool]:
        """List this node's slices of the driver, delete all but `name`: (the live one, the
        highest pool generation seen, whether any was deleted)."""
        listed = await self.api.list(
            RESOURCE_SLICES,
            field_selector=f"spec.nodeName={self.node},spec.driver={keys.DRA_DRIVER}")
        items: list[dict[str, Any]] = listed.get("items") or []
        live = next((i for i in items if i["metadata"]["name"] == name), None)
        others = [i for i in items if i is not live]
        for item in others:
            await self._delete(item["metadata"]["name"])
        return live, max(map(_generation, items), default=0), bool(others)

    async def _get(self, name: str) -> dict[str, Any] | None:
        try:
            return await self.api.get(RESOURCE_SLICES, name)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    async def _delete(self, name: str) -> None:
        try:
            await self.api.delete(RESOURCE_SLICES, name)
        except ApiError as exc:
            if not exc.not_found:
                raise
        log.info("stale ResourceSlice deleted", extra={"slice": name})



def _generation(item: dict[str, Any]) -> int:
    generation: int = ((item.get("spec") or {}).get("pool") or {}).get("generation", 0)
    return generation
