"""Training-throughput model behind `muster simulate` and `muster demo`.

It predicts what a placement gives a data-parallel job (one rank per GPU, a ring allreduce of
fp32 gradients every step) from inputs that come from elsewhere: link speeds from spec sheets
(`webhook.topology`), a published single-GPU throughput per model, and a network bandwidth and
two efficiencies that are explicit inputs with documented defaults. Per step:

    compute  = batch / (one GPU's images/s)
    allreduce = 2(n-1)/n * gradient bytes / (efficiency * bottleneck GB/s)
    step     = compute + max(0, allreduce - overlap * compute)
    images/s = n * batch / step

The allreduce time is nccl-tests' definition of bus bandwidth read backwards; the bottleneck is
the GPU set's allreduce bandwidth on one node, or the slowest of the network and each node's
set when the job is split. The published reference benchmark (Alibaba ACK) is never an input:
`reference_checks` only compares the prediction with it. Sources: docs/topology.md.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from webhook.topology import besteffort
from webhook.topology.builtin import builtin
from webhook.topology.gpu_choice import set_score
from webhook.topology.hierarchy import place_gang
from webhook.topology.model import (
    GangPlacement,
    GangRequest,
    MemberPlacement,
    MemberRequest,
    NodeState,
    Topology,
    Unplaceable,
)
from webhook.topology.ringfloor import gang_gbps

# Published single-GPU training throughput, TensorFlow tf_cnn_benchmarks, fp32, synthetic data,
# batch 64 (img/s). P100: TensorFlow's own benchmark page (DGX-1 P100, May 2017). V100:
# Lambda's TensorFlow 1.12 benchmark (Tesla V100 SXM3 32 GB, 2019), which lists ResNet-50 only.
_P100_RESNET50 = 219.0
_P100_VGG16 = 154.0
_V100_RESNET50 = 405.0


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    params_millions: float  # fp32 gradients: 4 bytes per parameter
    gpu_images_per_s: float  # one GPU training alone, at `batch`
    batch: int = 64

    @property
    def gradient_bytes(self) -> float:
        return self.params_millions * 1e6 * 4


#: Named models. VGG16 on a V100 is derived, not measured: the P100 figure scaled by how much
#: faster a V100 trains ResNet-50 (the two published figures above).
PRESETS: Mapping[str, Model] = {
    "vgg16": Model("vgg16", 138.36, _P100_VGG16 * _V100_RESNET50 / _P100_RESNET50),
    "resnet50": Model("resnet50", 25.56, _V100_RESNET50),
}


@dataclass(frozen=True, slots=True)
class Links:
    """How fast the allreduce runs, beyond the GPU links the topology knows."""

    #: GB/s per direction between two nodes (a 10 GbE NIC by default: an assumption)
    network_gbps: float = 1.25
    #: the share of the bottleneck link's bandwidth the allreduce reaches (NCCL under Horovod)
    efficiency: float = 0.85
    #: the share of compute time the allreduce can hide behind (0: none, DESIGN's formula)
    overlap: float = 0.0


def allreduce_seconds(gradient_bytes: float, n: int, gbps: float) -> float:
    """Ring allreduce of `gradient_bytes` over n ranks whose bottleneck runs at `gbps`."""
    if n < 2:
        return 0.0
    return 2 * (n - 1) / n * gradient_bytes / (gbps * 1e9)


def step_seconds(model: Model, n: int, bottleneck_gbps: float, links: Links) -> float:
    compute = model.batch / model.gpu_images_per_s
    if n < 2:
        return compute
    comm = allreduce_seconds(model.gradient_bytes, n, bottleneck_gbps * links.efficiency)
    return compute + max(0.0, comm - links.overlap * compute)


def images_per_second(model: Model, n: int, bottleneck_gbps: float, links: Links) -> float:
    return n * model.batch / step_seconds(model, n, bottleneck_gbps, links)


# --- placements ------------------------------------------------------------------------------


def gpus_by_node(p: GangPlacement) -> dict[str, tuple[int, ...]]:
    out: dict[str, list[int]] = {}
    for m in p.members:
        if m.gpus:
            out.setdefault(m.node, []).extend(m.gpus)
    return {node: tuple(sorted(g)) for node, g in sorted(out.items())}


def bottleneck_gbps(by_node: Mapping[str, Sequence[int]], topologies: Mapping[str, Topology],
                    network_gbps: float) -> float:
    """The slowest link the job's ring crosses: each node's GPU set (its allreduce bandwidth),
    and the network when the job spans nodes. 0 for a single GPU (no allreduce)."""
    return gang_gbps([set_score(topologies[node], gpus).allreduce_gbps if len(gpus) > 1 else 0.0
                      for node, gpus in by_node.items()], network_gbps)


def regular_schedule(nodes: Sequence[NodeState], gang: GangRequest) -> GangPlacement | Unplaceable:
    """Default kube-scheduler spreading + the NVIDIA device plugin's best-effort policy, one pod
    at a time: each pod goes to the node with the most free GPUs (LeastAllocated, first on
    ties), which picks that pod's GPUs alone."""
    free = {n.name: set(n.free_gpus) for n in nodes if n.topology is not None}
    topo = {n.name: n.topology for n in nodes if n.topology is not None}
    placements = []
    for m in gang.members:
        name = max(sorted(free), key=lambda k: len(free[k]))
        gpus: tuple[int, ...] = ()
        if m.gpus:
            if len(free[name]) < m.gpus:
                return Unplaceable(f"no node has {m.gpus} free GPUs for {m.key}")
            gpus = besteffort.allocate(topo[name], sorted(free[name]), m.gpus)
            free[name] -= set(gpus)
        placements.append(MemberPlacement(key=m.key, node=name, gpus=gpus))
    return GangPlacement(members=tuple(placements),
                         nodes_used=len({p.node for p in placements}))


# --- scenarios -------------------------------------------------------------------------------


class ScenarioError(ValueError):
    """The scenario cannot be modelled (the gang does not fit the nodes, a bad input)."""


@dataclass(frozen=True, slots=True)
class Scenario:
    topology: Topology
    nodes: int = 2
    workers: int = 4
    gpus_per_worker: int = 1
    models: tuple[Model, ...] = (PRESETS["vgg16"], PRESETS["resnet50"])
    links: Links = Links()

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker


def reference_scenario(links: Links = Links()) -> Scenario:
    """DESIGN's reference: two DGX-1 V100, an MPIJob of 4 workers x 1 GPU, VGG16 and ResNet-50."""
    return Scenario(topology=builtin("dgx1-v100"), links=links)


def cluster(s: Scenario) -> list[NodeState]:
    return [NodeState(name=f"node-{chr(ord('a') + i)}" if i < 26 else f"node-{i}",
                      topology=s.topology, free_gpus=frozenset(range(s.topology.size)),
                      free_cpu_milli=1_000_000, free_memory_bytes=1 << 50)
            for i in range(s.nodes)]


def gang(s: Scenario) -> GangRequest:
    members = (
        MemberRequest(key="default/job-launcher", gpus=0, cpu_milli=1000),
        *(MemberRequest(key=f"default/job-worker-{i}", gpus=s.gpus_per_worker, cpu_milli=4000)
          for i in range(s.workers)),
    )
    return GangRequest(name="job", members=members)


@dataclass(frozen=True, slots=True)
class Placed:
    label: str
    gpus: Mapping[str, tuple[int, ...]]  # node -> GPU indices
    bottleneck_gbps: float
    over_network: bool
    images_per_s: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class InNodeSet:
    gpus: tuple[int, ...]
    allreduce_gbps: float
    images_per_s: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Sensitivity:
    """One uncertain input moved low and high, everything else as given."""

    name: str
    low: float
    high: float
    #: model -> ((Muster, regular) at low, (Muster, regular) at high), img/s
    images_per_s: Mapping[str, tuple[tuple[float, float], tuple[float, float]]]


@dataclass(frozen=True, slots=True)
class Check:
    model: str
    placement: str  # "muster" | "regular"
    predicted: float
    published: float

    @property
    def error_pct(self) -> float:
        return 100 * (self.predicted - self.published) / self.published


@dataclass(frozen=True, slots=True)
class Prediction:
    scenario: Scenario
    muster: Placed
    regular: Placed
    in_node: tuple[InNodeSet, ...] = ()
    sensitivity: tuple[Sensitivity, ...] = ()
    checks: tuple[Check, ...] = field(default_factory=tuple)


def _throughputs(s: Scenario, bottleneck: float, links: Links) -> dict[str, float]:
    return {m.name: images_per_second(m, s.gpus, bottleneck, links) for m in s.models}


def _placed(label: str, p: GangPlacement, s: Scenario) -> Placed:
    by_node = gpus_by_node(p)
    topologies = dict.fromkeys(by_node, s.topology)
    b = bottleneck_gbps(by_node, topologies, s.links.network_gbps)
    return Placed(label, by_node, b, len(by_node) > 1, _throughputs(s, b, s.links))


def _in_node(s: Scenario, muster: Placed) -> tuple[InNodeSet, ...]:
    """The same job on other GPU sets of one node: one set per distinct allreduce bandwidth."""
    t, k = s.topology, s.gpus
    if muster.over_network or not 1 < k < t.size or math.comb(t.size, k) > 20_000:
        return ()
    levels: dict[float, tuple[int, ...]] = {}
    for c in itertools.combinations(range(t.size), k):
        levels.setdefault(set_score(t, c).allreduce_gbps, c)
    return tuple(InNodeSet(c, g, _throughputs(s, g, s.links))
                 for g, c in sorted(levels.items(), reverse=True))


class _Variation(NamedTuple):
    name: str
    low: float
    high: float
    cases: tuple[tuple[Links, tuple[Model, ...]], tuple[Links, tuple[Model, ...]]]


def _variations(links: Links, models: tuple[Model, ...]) -> list[_Variation]:
    """The inputs a user is least sure of, each at -50 % and +50 % (shares kept within 0..1)."""
    net = (links.network_gbps * 0.5, links.network_gbps * 1.5)
    eff = (links.efficiency * 0.5, min(1.0, links.efficiency * 1.5))
    ov = (max(0.0, links.overlap - 0.5), min(1.0, links.overlap + 0.5))

    def scaled(f: float) -> tuple[Model, ...]:
        return tuple(replace(m, gpu_images_per_s=m.gpu_images_per_s * f) for m in models)

    return [
        _Variation("network GB/s", *net, ((replace(links, network_gbps=net[0]), models),
                                          (replace(links, network_gbps=net[1]), models))),
        _Variation("per-GPU images/s, times", 0.5, 1.5, ((links, scaled(0.5)),
                                                         (links, scaled(1.5)))),
        _Variation("allreduce efficiency", *eff, ((replace(links, efficiency=eff[0]), models),
                                                  (replace(links, efficiency=eff[1]), models))),
        _Variation("overlap", *ov, ((replace(links, overlap=ov[0]), models),
                                    (replace(links, overlap=ov[1]), models))),
    ]


def _sensitivity(s: Scenario, muster: Placed, regular: Placed) -> tuple[Sensitivity, ...]:
    rows = []
    for name, low, high, cases in _variations(s.links, s.models):
        ends = []
        for links, models in cases:
            v = replace(s, links=links, models=models)
            # the network moves the regular (split) bottleneck; placements stay as they are
            reg_b = bottleneck_gbps(regular.gpus, dict.fromkeys(regular.gpus, s.topology),
                                    links.network_gbps)
            mus_b = bottleneck_gbps(muster.gpus, dict.fromkeys(muster.gpus, s.topology),
                                    links.network_gbps)
            ends.append((_throughputs(v, mus_b, links), _throughputs(v, reg_b, links)))
        (m_lo, r_lo), (m_hi, r_hi) = ends
        rows.append(Sensitivity(name, low, high, {
            m.name: ((m_lo[m.name], r_lo[m.name]), (m_hi[m.name], r_hi[m.name]))
            for m in s.models}))
    return tuple(rows)


#: Alibaba ACK's published benchmark (docs/design.md): img/s with topology-aware placement (all 4
#: workers on one node) and with regular scheduling (2 + 2 over TCP). Used only to check.
REFERENCE: Mapping[str, tuple[float, float]] = {
    "vgg16": (991.92, 200.47),
    "resnet50": (1471.55, 745.38),
}


def is_reference(s: Scenario) -> bool:
    return (s.topology.name == "dgx1-v100" and s.nodes == 2 and s.workers == 4
            and s.gpus_per_worker == 1)


def reference_checks(s: Scenario, muster: Placed, regular: Placed) -> tuple[Check, ...]:
    if not is_reference(s):
        return ()
    return tuple(
        Check(m.name, label, placed.images_per_s[m.name], REFERENCE[m.name][i])
        for m in s.models if m.name in REFERENCE and m.batch == 64
        for i, (label, placed) in enumerate((("muster", muster), ("regular", regular))))


def predict(s: Scenario) -> Prediction:
    if s.workers < 1 or s.gpus_per_worker < 1 or s.nodes < 1:
        raise ScenarioError("workers, GPUs per worker and nodes must be at least 1")
    if not s.models:
        raise ScenarioError("no model to predict")
    if s.links.network_gbps <= 0 or not 0 < s.links.efficiency <= 1 or not (
            0 <= s.links.overlap <= 1):
        raise ScenarioError("network GB/s must be > 0, efficiency in (0, 1], overlap in [0, 1]")
    if any(m.params_millions <= 0 or m.gpu_images_per_s <= 0 or m.batch < 1 for m in s.models):
        raise ScenarioError("a model needs parameters, images/s and batch above 0")
    nodes, g = cluster(s), gang(s)
    aware = place_gang(nodes, g, inter_node_gbps=s.links.network_gbps)
    regular = regular_schedule(nodes, g)
    for p in (aware, regular):
        if isinstance(p, Unplaceable):
            raise ScenarioError(f"{s.workers} workers x {s.gpus_per_worker} GPUs do not fit "
                                f"{s.nodes} x {s.topology.name or 'node'}: {p.reason}")
    assert isinstance(aware, GangPlacement) and isinstance(regular, GangPlacement)
    muster = _placed("Muster", aware, s)
    spread = _placed("regular", regular, s)
    return Prediction(s, muster, spread, _in_node(s, muster), _sensitivity(s, muster, spread),
                      reference_checks(s, muster, spread))


# --- text ------------------------------------------------------------------------------------


def _where(p: Placed) -> str:
    return " + ".join(f"{node} GPUs {','.join(map(str, g))}" for node, g in p.gpus.items())


def _link(p: Placed, network: float) -> str:
    if p.over_network:
        slow = "network" if p.bottleneck_gbps == network else "a node's GPU set"
        return f"split across nodes, bottleneck {p.bottleneck_gbps:g} GB/s ({slow})"
    return f"one node, allreduce {p.bottleneck_gbps:g} GB/s" if p.bottleneck_gbps else "one GPU"


def format_prediction(r: Prediction) -> str:
    s, links = r.scenario, r.scenario.links
    names = [m.name for m in s.models]
    lines = [
        f"Scenario: {s.nodes} x {s.topology.name or 'node from file'}, {s.workers} workers x "
        f"{s.gpus_per_worker} GPU{'s' if s.gpus_per_worker > 1 else ''} (+ launcher); network "
        f"{links.network_gbps:g} GB/s between "
        f"nodes; allreduce efficiency {links.efficiency:g}, overlap {links.overlap:g}",
        "Models: " + "; ".join(f"{m.name} {m.params_millions:g} M parameters, "
                               f"{m.gpu_images_per_s:.1f} img/s on one GPU at batch {m.batch}"
                               for m in s.models),
        "",
        "Modelled training throughput (img/s):",
        "  " + f"{'':<58}" + "".join(f"{n:>11}" for n in names),
    ]
    for p in (r.muster, r.regular):
        lines.append(f"  {p.label + ': ' + _where(p):<58}"
                     + "".join(f"{p.images_per_s[n]:>11.1f}" for n in names))
        lines.append(f"    ({_link(p, links.network_gbps)})")
    lines.append("  " + f"{'speed-up (modelled)':<58}" + "".join(
        f"{r.muster.images_per_s[n] / r.regular.images_per_s[n]:>10.2f}x" for n in names))
    if r.checks:
        lines += ["", "Check against Alibaba ACK's published benchmark (never an input):"]
        for check in r.checks:
            lines.append(f"  {check.model:<9} {check.placement:<8} modelled "
                         f"{check.predicted:8.1f}   published {check.published:8.2f}   "
                         f"error {check.error_pct:+6.1f} %")
        for n in names:
            mine = [c for c in r.checks if c.model == n]
            if len(mine) == 2:
                a, b = mine
                lines.append(f"  {n:<9} speed-up modelled {a.predicted / b.predicted:.2f}x, "
                             f"published {a.published / b.published:.2f}x")
    if r.in_node:
        lines += ["", f"Inside one {s.topology.name or 'node'} ({s.gpus} GPUs; modelled img/s):"]
        best = r.in_node[0].images_per_s
        for other in r.in_node:
            ips = other.images_per_s
            lines.append(f"  GPUs {','.join(map(str, other.gpus)):<16} allreduce "
                         f"{other.allreduce_gbps:5g} GB/s  "
                         + "  ".join(f"{n} {ips[n]:8.1f}" for n in names)
                         + ("" if ips == best else "   (best set: " + ", ".join(
                             f"{n} {100 * (best[n] / ips[n] - 1):+.0f} %" for n in names) + ")"))
    lines += ["", "Sensitivity: each input at -50 % / +50 %, the rest as given "
              "(modelled img/s, Muster / regular, speed-up):"]
    for v in r.sensitivity:
        lines.append(f"  {v.name} {v.low:g} .. {v.high:g}")
        for n in names:
            (m_lo, r_lo), (m_hi, r_hi) = v.images_per_s[n]
            lines.append(f"    {n:<9} Muster {m_lo:8.1f} .. {m_hi:8.1f}   regular {r_lo:8.1f} .. "
                         f"{r_hi:8.1f}   speed-up {m_lo / r_lo:5.2f}x .. {m_hi / r_hi:5.2f}x")
    return "\n".join(lines)
