"""The ResourceSlice (resource.k8s.io/v1) that publishes this node's GPUs to DRA: a pure function
of the discovered topology. One slice per node, pool named after the node, one device per healthy
GPU (`gpu-<index>`). Attribute names without a domain belong to the driver (gpu.muster.io);
`resource.kubernetes.io/pcieRoot` is the standard one (k8s.io/dynamic-resource-allocation's
deviceattribute, `pci<domain>:<bus>` of the root complex), so claims can matchAttribute a GPU
with a NIC of another driver under the same root.

NVLink in compact form (string values are limited to 64 characters):
- `nvlinkDomain` (int): the lowest GPU index of the NVLink-connected group the GPU is in (an
  NVSwitch joins all its GPUs); two devices of one node talk over NVLink iff it is equal.
- `nvlinkPeers` (string): one character per GPU of the node, in index order: the number of
  NVLink links to that GPU in base 36 (`0`-`9`, `a`-`z`), `-` for the GPU itself. DGX-1 V100
  GPU 0 is `-1122000`. Links through an NVSwitch are not in it: see `nvswitchLinks`.
- `nvswitchLinks` (int, only on GPUs on an NVSwitch): links' worth of bandwidth to every other
  GPU on the switch. `nvlinkGBps` (int): one link's GB/s per direction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook import keys
from webhook.topology.model import Topology

API_VERSION = "resource.k8s.io/v1"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"
device_name = keys.dra_device_name  # `gpu-<index>`, the binder's reading too


def slice_name(node: str) -> str:
    """One name per node and driver (a DNS subdomain: node names are too)."""
    return f"{node}-{keys.DRA_DRIVER}"


def nvlink_domains(topology: Topology) -> list[int]:
    """Per GPU, the lowest index of its NVLink-connected group (union-find over direct links
    and the NVSwitch)."""
    parent = list(range(topology.size))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(a: int, b: int) -> None:
        ra, rb = root(a), root(b)
        parent[max(ra, rb)] = min(ra, rb)

    for i in range(topology.size):
        for j in range(i + 1, topology.size):
            if topology.nvlinks[i][j] > 0:
                join(i, j)
    switched = sorted(topology.nvswitch)
    for other in switched[1:]:
        join(switched[0], other)
    return [root(i) for i in range(topology.size)]


def nvlink_peers(topology: Topology, i: int) -> str:
    return "".join("-" if j == i else _BASE36[min(topology.nvlinks[i][j], 35)]
                   for j in range(topology.size))


def devices(topology: Topology, pcie_roots: Mapping[int, str]) -> list[dict[str, Any]]:
    """The slice's devices: healthy GPUs with a UUID (a device is prepared by UUID), in index
    order. `pcie_roots`: GPU index → `pci<domain>:<bus>`, where the node's sysfs said it."""
    domains = nvlink_domains(topology)
    out = []
    for i, gpu in enumerate(topology.gpus):  # i: the position in the matrices
        if not gpu.healthy or gpu.uuid is None:
            continue
        attrs: dict[str, dict[str, Any]] = {
            "uuid": {"string": gpu.uuid},
            "index": {"int": gpu.index},
            "model": {"string": gpu.model},
            "nvlinkDomain": {"int": topology.gpus[domains[i]].index},
            "nvlinkPeers": {"string": nvlink_peers(topology, i)},
            "nvlinkGBps": {"int": round(topology.nvlink_gbps)},
        }
        if gpu.numa_node is not None and gpu.numa_node >= 0:
            attrs["numaNode"] = {"int": gpu.numa_node}
        if i in topology.nvswitch:
            attrs["nvswitchLinks"] = {"int": topology.nvswitch_links}
        if gpu.index in pcie_roots:
            attrs[PCIE_ROOT] = {"string": pcie_roots[gpu.index]}
        device: dict[str, Any] = {"name": device_name(gpu.index), "attributes": attrs}
        if gpu.memory_mib is not None:
            device["capacity"] = {"memory": {"value": f"{gpu.memory_mib}Mi"}}
        out.append(device)
    return out


def resource_slice(node: str, topology: Topology, generation: int,
                   pcie_roots: Mapping[int, str]) -> dict[str, Any]:
    """The whole ResourceSlice of this node, its pool at `generation`."""
    return {
        "apiVersion": API_VERSION, "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node)},
        "spec": {
            "driver": keys.DRA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices(topology, pcie_roots),
        },
    }


def same_devices(live: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a live slice already says what `wanted` says, generation aside."""
    a, b = live.get("spec") or {}, wanted.get("spec") or {}
    return (a.get("driver"), a.get("nodeName"), (a.get("pool") or {}).get("name"),
            (a.get("pool") or {}).get("resourceSliceCount"), a.get("devices") or []) == (
        b.get("driver"), b.get("nodeName"), (b.get("pool") or {}).get("name"),
        (b.get("pool") or {}).get("resourceSliceCount"), b.get("devices") or [])
