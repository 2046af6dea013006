"""What a policy's `minRingGBps` means: one figure, one comparison, used by every reader.

The figure is the **allreduce bus bandwidth** of the GPUs a gang gets, in GB/s, as nccl-tests
reports `busbw` (docs/topology.md, "Scoring"):
- on one node, `scoring.allreduce_gbps` of the gang's GPU set there (DGX-1 V100: any NVLink ring
  50, the best quad 100, all eight 150; a set without NVLink ring its slowest PCIe hop, 6-12);
- split over nodes, the lowest of each node's set (nodes where the gang has 2 GPUs or more) and
  the bandwidth between its nodes (`link_gbps`): the NVLink of one multi-node NVLink domain
  when they all share one (a GB200 NVL72 rack), else the network's.
A gang meets `minRingGBps` when its figure is at least that. A gang with fewer than 2 GPUs runs
no allreduce and always meets it. The placement engine (and so the binder) and
`muster topology choose` decide with these functions and nothing else.
"""

from __future__ import annotations

from collections.abc import Collection

from webhook.topology.model import NodeState


def gang_gbps(node_gbps: Collection[float], between_gbps: float) -> float:
    """The gang's figure from each GPU node's set figure (0 for a node with one GPU) and the
    bandwidth between its nodes (`link_gbps`)."""
    local = [g for g in node_gbps if g > 0]
    if len(node_gbps) > 1:  # the allreduce crosses the links between nodes too
        return min([between_gbps, *local])
    return max(local, default=0.0)


def link_gbps(nodes: Collection[NodeState], inter_node_gbps: float) -> float:
    """The bandwidth between a gang's GPU nodes: where they all share one multi-node NVLink
    domain and their GPUs hang off NVSwitches, each GPU's switch links (NCCL's ring crosses
    the rack's NVLink switches, as inside a tray: GB200 18 x 50 GB/s), the slowest node's;
    else `inter_node_gbps`, the network's."""
    domains = {n.nvlink_domain for n in nodes}
    if len(nodes) < 2 or len(domains) != 1 or None in domains:
        return inter_node_gbps
    switch = [t.nvswitch_links * t.nvlink_gbps for n in nodes
              if (t := n.topology) is not None and t.nvswitch]
    return min(switch) if len(switch) == len(nodes) else inter_node_gbps


def meets_min_ring(gbps: float, min_ring_gbps: float | None, gpus: int) -> bool:
    """Does a gang of `gpus` GPUs whose figure is `gbps` meet `minRingGBps`?"""
    return min_ring_gbps is None or gpus < 2 or gbps >= min_ring_gbps
