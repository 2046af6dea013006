"""The network between nodes, as the throughput model sees it: NICs, switch tiers with their
oversubscription, and multi-node NVLink domains (GB200/GB300 NVL72 cliques).

A gang's allreduce is NCCL's ring over every GPU it has (`simulate.step_seconds`); its bus
bandwidth is that of the slowest level the ring crosses (`ringfloor.gang_gbps`):
- inside a node, the gang's GPU set there (`scoring.allreduce_gbps`: NVLink rings, else PCIe);
- between nodes of one NVLink clique, the clique's NVLink bandwidth per GPU;
- otherwise the network: NCCL runs one channel per GPU and NIC (rail), so a node with k of the
  gang's GPUs sends over min(k, rails) NICs, and the slowest node bounds the ring. Each switch
  tier the gang crosses above its leaves divides that by the tier's uplink oversubscription
  (the worst case, every node under the switch sending up at once).
Figures are GB/s per direction. Defaults and their sources: docs/topology.md, "Network model".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from webhook.topology.ringfloor import gang_gbps


@dataclass(frozen=True, slots=True)
class Fabric:
    """How nodes are connected beyond their own GPUs."""

    #: GB/s per direction of one NIC (one 400 Gb/s ConnectX-7 per GPU, as on a DGX H100)
    rail_gbps: float = 50.0
    #: NICs (rails) per node that the gang's GPUs can use, one per GPU at most
    rails: int = 8
    #: uplink oversubscription of each switch tier above the leaf, narrowest first
    #: (leaf -> spine, spine -> core); a tier left out is non-blocking (1:1)
    oversubscription: tuple[float, ...] = ()
    #: GB/s per direction per GPU between nodes of one NVLink clique (NVLink 5: 18 x 50)
    clique_gbps: float = 900.0

    def check(self) -> None:
        """ValueError naming the first input that cannot be modelled."""
        if not self.rail_gbps > 0 or self.rails < 1:
            raise ValueError("a fabric needs NIC GB/s above 0 and at least one NIC per node")
        if any(not r >= 1 for r in self.oversubscription):
            raise ValueError("oversubscription ratios are 1 (non-blocking) or more")
        if not self.clique_gbps > 0:
            raise ValueError("clique NVLink GB/s must be above 0")


@dataclass(frozen=True, slots=True)
class Where:
    """Where a node sits: its network domains widest first (say block, then leaf switch), all
    nodes of a fabric with the same number of them, and its NVLink clique if it has one."""

    domains: tuple[str, ...] = ()
    clique: str | None = None


def tiers_crossed(wheres: list[Where]) -> int:
    """How many switch tiers above the leaf the nodes' traffic crosses: 0 within one leaf
    (or one node), 1 across leaves under one spine, and so on."""
    if len(wheres) < 2:
        return 0
    depth = len(wheres[0].domains)
    if any(len(w.domains) != depth for w in wheres):
        raise ValueError("nodes of one fabric must name the same number of network domains")
    shared = 0
    while shared < depth and len({w.domains[shared] for w in wheres}) == 1:
        shared += 1
    return depth - shared


def network_gbps(fabric: Fabric, gpus_per_node: Mapping[str, int],
                 where: Mapping[str, Where]) -> float:
    """Per-direction bandwidth of the links between the gang's nodes, for a ring over them:
    the clique's NVLink when they all share one, else the slowest node's NICs over the
    oversubscription of every tier crossed. inf for one node (no link between nodes)."""
    if len(gpus_per_node) < 2:
        return math.inf
    wheres = [where[n] for n in gpus_per_node]
    cliques = {w.clique for w in wheres}
    if len(cliques) == 1 and None not in cliques:
        return fabric.clique_gbps
    nics = min(min(k, fabric.rails) for k in gpus_per_node.values())
    tiers = tiers_crossed(wheres)
    ratio = math.prod(fabric.oversubscription[:tiers])
    return max(nics, 1) * fabric.rail_gbps / ratio


def bus_gbps(node_set_gbps: Mapping[str, float], gpus_per_node: Mapping[str, int],
             where: Mapping[str, Where], fabric: Fabric) -> float:
    """The gang's allreduce bus bandwidth: the slowest of each node's GPU set (0 for a node with
    one GPU) and, when it spans nodes, the links between them."""
    net = network_gbps(fabric, gpus_per_node, where)
    return gang_gbps(list(node_set_gbps.values()), net)
