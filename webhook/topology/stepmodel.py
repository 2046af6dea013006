"""A gang's modelled step time for a given placement across the hierarchy (`muster simulate
--placement`, bench/bench_topology.py and its exact optimum).

The step is `simulate.step_seconds` (compute, then a ring allreduce of fp32 gradients at the
gang's bus bandwidth); the bus bandwidth is `fabric.bus_gbps` of the placement: each node's GPU
set, the clique's NVLink, the NICs and each oversubscribed switch tier the ring crosses.

A placement file (YAML or JSON) names the fabric, the levels and, per node, its type, its
labels and the gang's GPUs there:

    fabric: {railGBps: 50, rails: 8, oversubscription: [2, 2], cliqueGBps: 900}
    levels: [network.topology.nvidia.com/spine, network.topology.nvidia.com/leaf]
    nodes:
      - {name: n1, nodeType: hgx-h100, gpus: [0, 1, 2, 3],
         labels: {network.topology.nvidia.com/spine: s1, network.topology.nvidia.com/leaf: l1}}

`levels` are node labels widest first (default: Topograph's core, spine, leaf, those that some
node carries); a node in an NVLink clique carries GPU feature discovery's `nvidia.com/gpu.clique`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.topology.builtin import builtin
from webhook.topology.fabric import Fabric, Where, bus_gbps, network_gbps, tiers_crossed
from webhook.topology.gpu_choice import TableCache, set_score
from webhook.topology.model import Topology
from webhook.topology.network import CLIQUE, topograph_fabric
from webhook.topology.simulate import Links, Model, step_seconds


class PlacementError(ValueError):
    """The placement file cannot be modelled; the message says where and why."""


@dataclass(frozen=True, slots=True)
class GangOnFabric:
    """A gang's GPUs on each node, and what the model needs to know of those nodes."""

    gpus: Mapping[str, tuple[int, ...]]  # node -> GPU indices
    topologies: Mapping[str, Topology]
    where: Mapping[str, Where]
    fabric: Fabric

    @property
    def size(self) -> int:
        return sum(len(g) for g in self.gpus.values())


@dataclass(frozen=True, slots=True)
class Step:
    """The modelled figures of one placement."""

    gpus: int
    bus_gbps: float  # 0 for one GPU (no allreduce)
    bottleneck: str  # "node <name>", "clique NVLink", "network", or "none"
    network_gbps: float  # inf on one node
    tiers_crossed: int
    step_seconds: Mapping[str, float]  # per model


def node_sets(g: GangOnFabric, tables: TableCache | None = None) -> dict[str, float]:
    """Each node's GPU-set allreduce bandwidth (0 where the gang has one GPU)."""
    return {n: set_score(g.topologies[n], gpus, tables).allreduce_gbps if len(gpus) > 1 else 0.0
            for n, gpus in g.gpus.items()}


def gang_bus_gbps(g: GangOnFabric, tables: TableCache | None = None) -> float:
    return bus_gbps(node_sets(g, tables), {n: len(x) for n, x in g.gpus.items()}, g.where,
                    g.fabric)


def model_step(g: GangOnFabric, models: tuple[Model, ...], links: Links,
               tables: TableCache | None = None) -> Step:
    """Step time of each model on this placement (links.network_gbps is not used: the fabric
    says what the network is)."""
    sets = node_sets(g, tables)
    counts = {n: len(x) for n, x in g.gpus.items()}
    net = network_gbps(g.fabric, counts, g.where)
    bus = bus_gbps(sets, counts, g.where, g.fabric)
    if g.size < 2:
        why = "none"
    elif len(counts) > 1 and bus == net:
        cliques = {g.where[n].clique for n in counts}
        why = "clique NVLink" if len(cliques) == 1 and None not in cliques else "network"
    else:
        why = "node " + min((n for n in sets if sets[n] == bus), default="?")
    return Step(g.size, bus, why, net, tiers_crossed([g.where[n] for n in counts]),
                {m.name: step_seconds(m, g.size, bus, links) for m in models})


# --- the placement file ----------------------------------------------------------------------


def _float(v: object, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise PlacementError(f"{where}: expected a number, got {v!r}")
    return float(v)


def _fabric(doc: object) -> Fabric:
    if doc is None:
        return Fabric()
    if not isinstance(doc, dict):
        raise PlacementError("fabric: expected a mapping")
    unknown = set(doc) - {"railGBps", "rails", "oversubscription", "cliqueGBps"}
    if unknown:
        raise PlacementError(f"fabric: unknown field(s) {', '.join(sorted(unknown))}")
    over = doc.get("oversubscription", [])
    if not isinstance(over, list):
        raise PlacementError("fabric.oversubscription: expected a list, narrowest tier first")
    rails = doc.get("rails", 8)
    if isinstance(rails, bool) or not isinstance(rails, int):
        raise PlacementError(f"fabric.rails: expected a whole number, got {rails!r}")
    f = Fabric(rail_gbps=_float(doc.get("railGBps", 50.0), "fabric.railGBps"), rails=rails,
               oversubscription=tuple(_float(r, "fabric.oversubscription") for r in over),
               clique_gbps=_float(doc.get("cliqueGBps", 900.0), "fabric.cliqueGBps"))
    try:
        f.check()
    except ValueError as exc:
        raise PlacementError(f"fabric: {exc}") from exc
    return f


def parse_placement(doc: Any, topologies: Mapping[str, Topology] | None = None
                    ) -> GangOnFabric:
    """The gang of a placement file (already read as YAML/JSON). `topologies`: node name ->
    topology for nodes that name none (`nodeType` names a built-in type)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or not doc["nodes"]:
        raise PlacementError("a placement needs `nodes`: a list of {name, nodeType, gpus, "
                             "labels}")
    fabric = _fabric(doc.get("fabric"))
    nodes: list[dict[str, Any]] = doc["nodes"]
    labels_of: dict[str, Mapping[str, str]] = {}
    gpus: dict[str, tuple[int, ...]] = {}
    topos: dict[str, Topology] = {}
    for i, n in enumerate(nodes):
        at = f"nodes[{i}]"
        if not isinstance(n, dict) or not isinstance(n.get("name"), str) or not n["name"]:
            raise PlacementError(f"{at}: a node needs a name")
        name = n["name"]
        if name in gpus:
            raise PlacementError(f"{at}: node {name} is listed twice")
        if "nodeType" in n:
            try:
                topos[name] = builtin(str(n["nodeType"]))
            except KeyError as exc:
                raise PlacementError(f"{at}: {exc.args[0]}") from exc
        elif topologies is not None and name in topologies:
            topos[name] = topologies[name]
        else:
            raise PlacementError(f"{at}: node {name} needs a nodeType")
        got = n.get("gpus")
        size = topos[name].size
        if (not isinstance(got, list) or not got or len(set(got)) != len(got)
                or any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < size
                       for x in got)):
            raise PlacementError(f"{at}: gpus must list distinct GPU indices 0..{size - 1} of "
                                 f"node {name}, got {got!r}")
        gpus[name] = tuple(sorted(got))
        labels = n.get("labels", {})
        if not isinstance(labels, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise PlacementError(f"{at}: labels must map strings to strings")
        labels_of[name] = labels
    levels = doc.get("levels")
    if levels is None:
        levels = list(topograph_fabric(labels_of.values()))
    if not isinstance(levels, list) or not all(isinstance(x, str) for x in levels):
        raise PlacementError("levels: expected a list of node labels, widest first")
    where = {}
    for name, labels in labels_of.items():
        missing = [lv for lv in levels if lv not in labels]
        if missing:
            raise PlacementError(f"node {name} lacks the level label(s) {', '.join(missing)}")
        where[name] = Where(tuple(labels[lv] for lv in levels), labels.get(CLIQUE))
    return GangOnFabric(gpus, topos, where, fabric)
