"""GPU topology model, built-in node types, codec, scoring and placement (pure, no I/O)."""

from webhook.topology.builtin import NAMES, builtin
from webhook.topology.codec import TopologyFormatError, decode, encode, topology_class
from webhook.topology.gpu_choice import choose_gpus, set_score
from webhook.topology.hierarchy import place_gang
from webhook.topology.model import (
    GPU,
    ContainerGpus,
    GangPlacement,
    GangRequest,
    GpuAssignment,
    MemberPlacement,
    MemberRequest,
    NetworkRequest,
    NodeState,
    PCIeLevel,
    Topology,
    TopologyRequest,
    Unplaceable,
)
from webhook.topology.network import Levels, LevelsError, Network, parse_levels
from webhook.topology.scoring import SetScore, allreduce_gbps, bisection_gbps, ring_gbps
from webhook.topology.smi import parse_nvidia_smi_topo

__all__ = [
    "GPU",
    "NAMES",
    "ContainerGpus",
    "GangPlacement",
    "GangRequest",
    "GpuAssignment",
    "Levels",
    "LevelsError",
    "MemberPlacement",
    "MemberRequest",
    "Network",
    "NetworkRequest",
    "NodeState",
    "PCIeLevel",
    "SetScore",
    "Topology",
    "TopologyFormatError",
    "TopologyRequest",
    "Unplaceable",
    "allreduce_gbps",
    "bisection_gbps",
    "builtin",
    "choose_gpus",
    "decode",
    "encode",
    "parse_levels",
    "parse_nvidia_smi_topo",
    "place_gang",
    "ring_gbps",
    "set_score",
    "topology_class",
]
