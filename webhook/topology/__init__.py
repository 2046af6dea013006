"""GPU topology model, built-in node types, codec, scoring and placement (pure, no I/O)."""

from webhook.topology.builtin import NAMES, builtin
from webhook.topology.codec import TopologyFormatError, decode, encode, topology_class
from webhook.topology.model import (
    GPU,
    ContainerGpus,
    GangPlacement,
    GangRequest,
    GpuAssignment,
    MemberPlacement,
    MemberRequest,
    NodeState,
    PCIeLevel,
    Topology,
    TopologyRequest,
    Unplaceable,
)

__all__ = [
    "GPU",
    "NAMES",
    "ContainerGpus",
    "GangPlacement",
    "GangRequest",
    "GpuAssignment",
    "MemberPlacement",
    "MemberRequest",
    "NodeState",
    "PCIeLevel",
    "Topology",
    "TopologyFormatError",
    "TopologyRequest",
    "Unplaceable",
    "builtin",
    "decode",
    "encode",
    "topology_class",
]
