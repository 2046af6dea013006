"""Typed data of GPU topology and placement, kept apart from the engines that use them.

Contracts shared by the placement engine (webhook.topology), the binder (webhook.binder) and the
node agent (webhook.agent). Fields are part of the contract: extend, do not rename.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Literal


class PCIeLevel(enum.IntEnum):
    """Closest common PCIe ancestor of two GPUs, as NVML's nvmlGpuTopologyLevel_t."""

    INTERNAL = 0  # same board (multi-GPU boards)
    PIX = 10  # single PCIe switch
    PXB = 20  # multiple PCIe switches, no host bridge
    PHB = 30  # same PCIe host bridge
    NODE = 40  # same NUMA node, different host bridges
    SYS = 50  # across the CPU interconnect (QPI/UPI)


@dataclass(frozen=True, slots=True)
class GPU:
    """One GPU. `uuid` is None when the source does not say it (a pasted `nvidia-smi topo -m`):
    such a GPU is known by its index only; nothing makes one up."""

    index: int
    uuid: str | None
    pci_bus_id: str
    model: str
    numa_node: int | None = None
    memory_mib: int | None = None
    healthy: bool = True


@dataclass(frozen=True, slots=True, weakref_slot=True)  # weak: caches follow the nodes
class Topology:
    """One node's GPUs and how they are connected.

    `nvlinks[i][j]` is the number of NVLink links directly between GPU i and GPU j (symmetric,
    0 on the diagonal). GPUs in `nvswitch` hang off an NVSwitch fabric: every pair of them is
    connected with `nvswitch_links` links' worth of bandwidth. `pcie[i][j]` is the PCIe level.
    `nvlink_gbps` is the unidirectional bandwidth of one NVLink link in GB/s for this generation.
    `pcie_gen` is the GPUs' PCIe generation (x16 assumed); it scales the PCIe-only hop bandwidths.
    """

    gpus: tuple[GPU, ...]
    nvlinks: tuple[tuple[int, ...], ...]
    pcie: tuple[tuple[PCIeLevel, ...], ...]
    nvlink_gbps: float = 25.0
    nvswitch: frozenset[int] = frozenset()
    nvswitch_links: int = 0
    name: str = ""  # built-in node type name, or "" for discovered ones
    pcie_gen: int = 3

    @property
    def size(self) -> int:
        return len(self.gpus)


# --- what a pod asks for (pod annotation muster.io/gpu-topology) ------------------------------

TopologyMode = Literal["required", "preferred"]


@dataclass(frozen=True, slots=True)
class NetworkRequest:
    """Where a gang's nodes must be, or should be, in the cluster's network (docs/topology.md,
    "Network levels"). Levels are named by their node label, as Kueue and KAI name them.

    `level`: the gang within one domain of this level (None: anywhere); `mode` required (or it
    waits) or preferred (the narrowest domain that fits, level by level wider, no wider than
    one domain of `max_level` when it is given: KAI's required level beside its preferred one).
    `slice_level` and `slice_size`: each run of `slice_size` GPU members (in member order)
    within one domain of `slice_level`; `slice_mode` preferred: the slices when they fit, else
    the gang placed without them. `unconstrained` (Kueue's unconstrained pod set; no level, no
    slices): each member on the node that fits it best alone, filling the gaps, not on the
    fewest nodes. `topology`: the Topology object whose levels name these levels ("kai:NAME",
    from KAI's `kai.scheduler/topology`), where the binder reads that API's Topologies; None:
    the binder's own levels.
    """

    level: str | None = None
    mode: TopologyMode = "required"
    slice_level: str | None = None
    slice_size: int = 0
    slice_mode: TopologyMode = "required"
    max_level: str | None = None
    unconstrained: bool = False
    topology: str | None = None


@dataclass(frozen=True, slots=True)
class TopologyRequest:
    """Written by the webhook from the policy, read by the binder.

    JSON form: {"v": 1, "mode": "required", "singleNode": true, "minRingGBps": 50.0,
    "network": {"level": "example.com/rack", "mode": "required",
    "sliceLevel": "nvidia.com/gpu.clique", "sliceSize": 4}}
    (`network` may also carry "maxLevel", "sliceMode" and "topology", or be
    {"unconstrained": true})
    (`minRingGBps` may be null/absent; what it is compared with: `webhook.topology.ringfloor`;
    `network` may be absent).
    """

    mode: TopologyMode = "required"
    single_node: bool = False
    min_ring_gbps: float | None = None
    network: NetworkRequest | None = None


# --- what the binder decided (pod annotation muster.io/gpu-assignment) ------------------------


@dataclass(frozen=True, slots=True)
class ContainerGpus:
    indices: tuple[int, ...]
    uuids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GpuAssignment:
    """Written only by the binder, read by the node agent's device plugin.

    JSON form: {"v": 1, "node": "node-a", "containers": {"name": {"indices": [0, 2],
    "uuids": ["GPU-...", "GPU-..."]}}}
    """

    node: str
    containers: Mapping[str, ContainerGpus]


# --- placement engine input / output ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node as the placement engine sees it: what is free right now."""

    name: str
    topology: Topology | None  # None: a node without published topology (GPUs unknown)
    free_gpus: frozenset[int]
    free_cpu_milli: int
    free_memory_bytes: int
    free_pods: int = 110
    #: the multi-node NVLink domain it is in (a GB200 NVL72 rack: `network.nvlink_domain` of
    #: its labels), None when none: its GPUs reach other nodes' only through its NICs
    nvlink_domain: str | None = None

    def less(self, gpus: Collection[int], cpu_milli: int, memory_bytes: int) -> NodeState:
        """The node once one more pod takes these GPUs, CPU and memory."""
        # every field anew, so the constructor, not `replace` (a member of a 256-pod gang each)
        return NodeState(self.name, self.topology, self.free_gpus.difference(gpus),
                         self.free_cpu_milli - cpu_milli, self.free_memory_bytes - memory_bytes,
                         self.free_pods - 1, self.nvlink_domain)


@dataclass(frozen=True, slots=True)
class MemberRequest:
    """One pod of a gang. `eligible_nodes` None means every node passes the binder's fit filters
    (selectors, affinity, taints); otherwise only the named nodes may host it."""

    key: str  # "namespace/name"
    gpus: int
    cpu_milli: int = 0
    memory_bytes: int = 0
    eligible_nodes: frozenset[str] | None = None
    #: its rank in its job where its operator's labels say it, else (): slices and the order
    #: of a gang's members follow it, then the names (worker-2 before worker-10)
    rank: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GangRequest:
    name: str
    members: tuple[MemberRequest, ...]
    mode: TopologyMode = "required"
    single_node: bool = False
    min_ring_gbps: float | None = None
    network: NetworkRequest | None = None


@dataclass(frozen=True, slots=True)
class MemberPlacement:
    key: str
    node: str
    gpus: tuple[int, ...]  # GPU indices on that node, empty for 0-GPU members


@dataclass(frozen=True, slots=True)
class GangPlacement:
    members: tuple[MemberPlacement, ...]
    nodes_used: int
    #: per node: allreduce bus bandwidth (GB/s) of the GPU set chosen on that node
    ring_gbps: Mapping[str, float] = field(default_factory=dict)
    #: the gang's allreduce bus bandwidth, the figure minRingGBps is compared with
    #: (`ringfloor.gang_gbps`)
    gang_gbps: float = 0.0


@dataclass(frozen=True, slots=True)
class Unplaceable:
    """Why a gang cannot be placed now, in words an ML engineer understands."""

    reason: str
