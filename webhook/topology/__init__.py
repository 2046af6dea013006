"""GPU topology model, built-in node types, codec, scoring and placement (pure, no I/O).

Loaded lazily: `webhook.binder.cli` and `webhook.topology.cli` are imported by every `muster`
command, so the model, the codec and the placement code load only with a command that uses them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from webhook.lazy import lazy_getattr

# eager: `builtin` is also its module's name, which the import system sets on this package
# once any code imports the module, hiding a lazy `builtin`
from webhook.topology.builtin import NAMES, builtin

if TYPE_CHECKING:
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

_EXPORTS = {
    "TopologyFormatError": "webhook.topology.codec",
    "decode": "webhook.topology.codec",
    "encode": "webhook.topology.codec",
    "topology_class": "webhook.topology.codec",
    "choose_gpus": "webhook.topology.gpu_choice",
    "set_score": "webhook.topology.gpu_choice",
    "place_gang": "webhook.topology.hierarchy",
    "GPU": "webhook.topology.model",
    "ContainerGpus": "webhook.topology.model",
    "GangPlacement": "webhook.topology.model",
    "GangRequest": "webhook.topology.model",
    "GpuAssignment": "webhook.topology.model",
    "MemberPlacement": "webhook.topology.model",
    "MemberRequest": "webhook.topology.model",
    "NetworkRequest": "webhook.topology.model",
    "NodeState": "webhook.topology.model",
    "PCIeLevel": "webhook.topology.model",
    "Topology": "webhook.topology.model",
    "TopologyRequest": "webhook.topology.model",
    "Unplaceable": "webhook.topology.model",
    "Levels": "webhook.topology.network",
    "LevelsError": "webhook.topology.network",
    "Network": "webhook.topology.network",
    "parse_levels": "webhook.topology.network",
    "SetScore": "webhook.topology.scoring",
    "allreduce_gbps": "webhook.topology.scoring",
    "bisection_gbps": "webhook.topology.scoring",
    "ring_gbps": "webhook.topology.scoring",
    "parse_nvidia_smi_topo": "webhook.topology.smi",
}

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

__getattr__ = lazy_getattr(__name__, _EXPORTS)
