"""The cluster, the arrivals and the placements compared by bench/bench_topology.py (imported by
it and by tests/topology/test_topology_sim.py; no timing here).

Clusters: nodes in leaves (racks) in blocks (spine groups); in an NVL72-style cluster each leaf
is one NVLink clique (GB200 NVL72: 18 compute trays x 4 GPUs). Every gang is one data-parallel
job: `gpus` GPUs in pods of `pod_gpus`, that prefers to sit in one leaf (clique).

Placements, each a pure function of the free GPUs (docs/topology.md, "Bench" cites each):
- Muster: the binder's placement function (`muster_place`);
- Kueue TAS, BestFit: the fullest domain that fits at the preferred level, else one level up;
  down from there, children by most free first, the last one the best fit;
- KAI's topology plugin: the fullest domain that fits at the preferred level, else one level up,
  and inside it the sub-domains with the most free first; nodes bin-packed;
- kube-scheduler, pod by pod with a gang plugin: LeastAllocated (the emptiest node) or
  MostAllocated (the fullest node that fits), GPUs scored.
None but Muster chooses the GPUs inside a node: the NVIDIA device plugin's best-effort policy
does (`besteffort.allocate`), as kubelet asks it.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from webhook.topology import besteffort, builtin
from webhook.topology.fabric import Fabric, Where
from webhook.topology.gpu_choice import TableCache
from webhook.topology.hierarchy import place_gang
from webhook.topology.model import (
    GPU,
    GangPlacement,
    GangRequest,
    MemberRequest,
    NetworkRequest,
    NodeState,
    PCIeLevel,
    Topology,
    Unplaceable,
)
from webhook.topology.network import Network, nvlink_domain
from webhook.topology.simulate import PRESETS, Links, Model, step_seconds
from webhook.topology.stepmodel import GangOnFabric, gang_bus_gbps

SPINE = "network.topology.nvidia.com/spine"
LEAF = "network.topology.nvidia.com/leaf"
CLIQUE = "nvidia.com/gpu.clique"

#: the fat trees' workload: VGG16 (138 M parameters, fp32 gradients) at V100's published speed
VGG16: Model = PRESETS["vgg16"]
#: the NVL72 cluster's: 1,000 M parameters (4 GB of fp32 gradients), 500 ms of compute per step
#: on a GB200 (an assumption: no published per-GPU figure to take)
LARGE = Model("1b-params", 1000.0, gpu_images_per_s=128.0, batch=64)
LINKS = Links()


def gb200_tray() -> Topology:
    """One GB200 NVL72 compute tray: 4 Blackwell GPUs on the rack's NVLink switches (NVLink 5,
    18 links x 50 GB/s per direction per GPU), 2 per Grace CPU."""
    gpus = tuple(GPU(index=i, uuid=f"GPU-gb200-{i}", pci_bus_id=f"00000000:{i:02X}:00.0",
                     model="NVIDIA GB200", numa_node=i // 2) for i in range(4))
    none = tuple(tuple(0 for _ in range(4)) for _ in range(4))
    pcie = tuple(tuple(PCIeLevel.SYS if i // 2 != j // 2 else PCIeLevel.NODE for j in range(4))
                 for i in range(4))
    return Topology(gpus=gpus, nvlinks=none, pcie=pcie, nvlink_gbps=50.0,
                    nvswitch=frozenset(range(4)), nvswitch_links=18, name="gb200-tray",
                    pcie_gen=6)


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    nodes: int
    topology: Topology
    nodes_per_leaf: int
    leaves_per_block: int
    clique: bool  # each leaf is one NVLink clique
    fabric: Fabric
    workload: Model = VGG16

    @property
    def gpus_per_node(self) -> int:
        return self.topology.size

    @functools.cached_property
    def node_topologies(self) -> tuple[Topology, ...]:
        """Each node's Topology (`Cluster.names` order), with GPU UUIDs of its own as real
        nodes publish: the binder holds an object per node, not one shared by all."""
        return tuple(own_uuids(self.topology, node_name(i)) for i in range(self.nodes))

    @property
    def leaf_label(self) -> str:
        return CLIQUE if self.clique else LEAF

    @property
    def levels(self) -> tuple[str, ...]:
        return (SPINE, self.leaf_label)


def node_name(i: int) -> str:
    return f"n{i:05}"


def own_uuids(t: Topology, node: str) -> Topology:
    return dataclasses.replace(t, gpus=tuple(dataclasses.replace(g, uuid=f"GPU-{node}-{g.index}")
                                             for g in t.gpus))


def fat_tree(nodes: int) -> ClusterSpec:
    """DGX-1 V100 nodes (4 x 100 Gb/s EDR InfiniBand each), 16 per leaf, 16 leaves per spine
    block, 2:1 oversubscribed at the leaf and at the spine uplinks."""
    return ClusterSpec(f"fat tree, {nodes} x DGX-1 V100", nodes, builtin("dgx1-v100"), 16, 16,
                       False, Fabric(rail_gbps=12.5, rails=4, oversubscription=(2.0, 2.0)))


def nvl72(racks: int) -> ClusterSpec:
    """GB200 NVL72 racks (one clique of 18 trays x 4 GPUs each), one 400 Gb/s NIC per GPU,
    8 racks per spine block, 2:1 at the spine uplinks."""
    return ClusterSpec(f"NVL72, {racks} racks x 18 x GB200 tray", racks * 18, gb200_tray(), 18,
                       8, True, Fabric(rail_gbps=50.0, rails=4, oversubscription=(1.0, 2.0),
                                       clique_gbps=900.0), LARGE)


@dataclass
class Cluster:
    """What is free, kept incrementally, and each node's place in the network."""

    spec: ClusterSpec
    names: list[str] = field(init=False)
    leaf_of: list[int] = field(init=False)
    block_of: list[int] = field(init=False)
    free: list[frozenset[int]] = field(init=False)
    leaf_free: list[int] = field(init=False)
    block_free: list[int] = field(init=False)
    where: dict[str, Where] = field(init=False)
    labels: dict[str, dict[str, str]] = field(init=False)
    states: list[NodeState] = field(init=False)
    network: Network = field(init=False)

    def __post_init__(self) -> None:
        s = self.spec
        g = s.gpus_per_node
        self.names = [node_name(i) for i in range(s.nodes)]
        self.leaf_of = [i // s.nodes_per_leaf for i in range(s.nodes)]
        self.block_of = [leaf // s.leaves_per_block for leaf in self.leaf_of]
        self.free = [frozenset(range(g))] * s.nodes
        leaves = self.leaf_of[-1] + 1
        self.leaf_free = [0] * leaves
        self.block_free = [0] * (self.block_of[-1] + 1)
        for i in range(s.nodes):
            self.leaf_free[self.leaf_of[i]] += g
            self.block_free[self.block_of[i]] += g
        self.where = {}
        self.labels = {}
        for i, n in enumerate(self.names):
            block, leaf = f"b{self.block_of[i]}", f"b{self.block_of[i]}-l{self.leaf_of[i]}"
            self.where[n] = Where((block, leaf), leaf if s.clique else None)
            self.labels[n] = {SPINE: block, s.leaf_label: leaf}
        self.network = Network(s.levels, self.labels)
        self.states = [NodeState(n, t, self.free[i], 1 << 30, 1 << 50, 1000,
                                 nvlink_domain(self.labels[n]))
                       for i, (n, t) in enumerate(zip(self.names, s.node_topologies, strict=True))]

    def take(self, i: int, gpus: Sequence[int]) -> None:
        self._set(i, self.free[i] - frozenset(gpus))

    def give(self, i: int, gpus: Sequence[int]) -> None:
        self._set(i, self.free[i] | frozenset(gpus))

    def _set(self, i: int, new: frozenset[int]) -> None:
        d = len(new) - len(self.free[i])
        self.free[i] = new
        self.leaf_free[self.leaf_of[i]] += d
        self.block_free[self.block_of[i]] += d
        self.states[i] = dataclasses.replace(self.states[i], free_gpus=new)

    def leaves_in(self, block: int) -> range:
        per = self.spec.leaves_per_block
        return range(block * per, min((block + 1) * per, len(self.leaf_free)))

    def nodes_in(self, leaf: int) -> range:
        per = self.spec.nodes_per_leaf
        return range(leaf * per, min((leaf + 1) * per, self.spec.nodes))


@dataclass(frozen=True)
class Job:
    id: int
    gpus: int
    pod_gpus: int
    arrival: float  # minutes
    work: float  # minutes at its ideal step time

    @property
    def pods(self) -> int:
        return self.gpus // self.pod_gpus


#: share of jobs by GPU count. Our parametrization of the published statistics of Philly
#: (Jeon et al., ATC'19) and Helios (Hu et al., SC'21): most jobs take one GPU, jobs over 8
#: GPUs are a few percent of jobs yet most of the GPU time (docs/topology.md, "Bench").
SIZE_MIX: dict[int, float] = {1: 0.55, 2: 0.10, 4: 0.10, 8: 0.12, 16: 0.05, 32: 0.04,
                              64: 0.02, 128: 0.012, 256: 0.005, 512: 0.003}


def arrivals(spec: ClusterSpec, count: int, load: float, rng: random.Random) -> list[Job]:
    """Poisson arrivals offering `load` of the cluster's GPUs; run times log-normal (median
    60 min, sigma 1.5, as heavy-tailed as the traces' run times); a job of up to one node is
    one pod or one pod per GPU (even odds), a bigger one whole-node pods. Sizes above half
    the cluster are left out (the small clusters of the optimum)."""
    g = spec.gpus_per_node
    mix = {s: w for s, w in SIZE_MIX.items() if s <= spec.nodes * g // 2}
    sizes, weights = zip(*mix.items(), strict=True)
    mean_size = sum(s * w for s, w in mix.items()) / sum(mix.values())
    mean_work = 60.0 * 2.718281828 ** (1.5 ** 2 / 2)
    rate = load * spec.nodes * g / (mean_size * mean_work)  # jobs per minute
    t = 0.0
    jobs = []
    for i in range(count):
        t += rng.expovariate(rate)
        size = rng.choices(sizes, weights)[0]
        pod = g if size > g else size if rng.random() < 0.5 else 1
        jobs.append(Job(i, size, pod, t, rng.lognormvariate(4.0943, 1.5)))  # ln 60 = 4.0943
    return jobs


Placement = list[tuple[int, tuple[int, ...]]]  # (node index, GPUs) per pod
Placer = Callable[[Cluster, Job], Placement | None]


# --- in-node choice without Muster: the device plugin ----------------------------------------

_BEST_EFFORT: dict[tuple[str, frozenset[int], int], tuple[int, ...]] = {}


def device_plugin(t: Topology, free: frozenset[int], k: int) -> tuple[int, ...]:
    key = (t.name, free, k)
    got = _BEST_EFFORT.get(key)
    if got is None:
        got = _BEST_EFFORT[key] = besteffort.allocate(t, sorted(free), k)
    return got


def _fill(c: Cluster, job: Job, nodes: Sequence[int]) -> Placement | None:
    """Pods onto `nodes` in this order, each node as full as it can take; GPUs by the device
    plugin, pod by pod."""
    out: Placement = []
    free: dict[int, frozenset[int]] = {}
    for i in nodes:
        f = free.get(i, c.free[i])
        while len(out) < job.pods and len(f) >= job.pod_gpus:
            gpus = device_plugin(c.spec.topology, f, job.pod_gpus)
            f = f - frozenset(gpus)
            out.append((i, gpus))
        free[i] = f
        if len(out) == job.pods:
            return out
    return None


def _cap(c: Cluster, i: int, job: Job) -> int:
    return len(c.free[i]) // job.pod_gpus


# --- kube-scheduler ---------------------------------------------------------------------------


def kube(most_allocated: bool, rng: random.Random, *, whole_gangs: bool = False) -> Placer:
    """Pod by pod (a gang plugin binds them all or none): each pod on the node scored best by
    NodeResourcesFit with GPUs scored, LeastAllocated (most free GPUs) or MostAllocated (fewest
    free that still fit); ties at random, as kube-scheduler breaks them. `whole_gangs`: a gang
    of up to one node's GPUs is placed as one pod of all its GPUs, then split into its pods (no
    scheduler does this: `bench_topology.py --only packing` measures, with it, what
    MostAllocated's splitting of such gangs over nodes buys)."""

    def place(c: Cluster, job: Job) -> Placement | None:
        if whole_gangs and job.pods > 1 and job.gpus <= c.spec.gpus_per_node:
            got = place(c, dataclasses.replace(job, pod_gpus=job.gpus))
            return None if got is None else \
                [(i, gpus[p:p + job.pod_gpus]) for i, gpus in got
                 for p in range(0, len(gpus), job.pod_gpus)]
        free = list(c.free)
        buckets: dict[int, list[int]] = {}
        for i, f in enumerate(free):
            if len(f) >= job.pod_gpus:
                buckets.setdefault(len(f), []).append(i)
        out: Placement = []
        for _ in range(job.pods):
            fits = [n for n in buckets if n >= job.pod_gpus and buckets[n]]
            if not fits:
                return None
            level = min(fits) if most_allocated else max(fits)
            bucket = buckets[level]
            i = bucket.pop(rng.randrange(len(bucket)))
            gpus = device_plugin(c.spec.topology, free[i], job.pod_gpus)
            free[i] = free[i] - frozenset(gpus)
            out.append((i, gpus))
            if len(free[i]) >= job.pod_gpus:
                buckets.setdefault(len(free[i]), []).append(i)
        return out

    return place


# --- Kueue TAS and KAI ------------------------------------------------------------------------


def _fits_one(caps: dict[int, int], need: int, fullest: bool) -> int | None:
    """The domain that holds `need` and has the least room (best fit), or None."""
    ok = [(cap, d) for d, cap in caps.items() if cap >= need]
    return min(ok)[1] if ok and fullest else None


def _leaf_caps(c: Cluster, job: Job, leaves: range | list[int]) -> dict[int, int]:
    return {leaf: sum(_cap(c, i, job) for i in c.nodes_in(leaf)) for leaf in leaves}


def kueue_tas(c: Cluster, job: Job) -> Placement | None:
    """Kueue TAS, BestFit, preferred level the leaf: the fullest leaf that holds the gang; else
    the fullest block that does, its leaves taken most free first with the last one the best
    fit; else the whole cluster the same way. Nodes likewise: most free first, last best fit."""
    blocks = range(len(c.block_free))
    leaf_caps = _leaf_caps(c, job, range(len(c.leaf_free)))
    leaf = _fits_one(leaf_caps, job.pods, True)
    if leaf is not None:
        return _fill(c, job, _greedy_best_fit(
            {i: _cap(c, i, job) for i in c.nodes_in(leaf)}, job.pods))
    block_caps = {b: sum(leaf_caps[x] for x in c.leaves_in(b)) for b in blocks}
    block = _fits_one(block_caps, job.pods, True)
    chosen_blocks = [block] if block is not None else _greedy_best_fit(block_caps, job.pods)
    if not chosen_blocks:
        return None
    nodes: list[int] = []
    remaining = job.pods
    for b in chosen_blocks:
        take = min(remaining, block_caps[b])
        for leaf in _greedy_best_fit({x: leaf_caps[x] for x in c.leaves_in(b)}, take):
            part = min(take, leaf_caps[leaf])
            nodes += _greedy_best_fit({i: _cap(c, i, job) for i in c.nodes_in(leaf)}, part)
            take -= part
            remaining -= part
    return _fill(c, job, nodes)


def _greedy_best_fit(caps: dict[int, int], need: int) -> list[int]:
    """Kueue's descent: domains by most room first until `need` is covered, the last one
    swapped for the smallest that still covers the rest. [] when they cannot."""
    order = sorted((d for d in caps if caps[d] > 0), key=lambda d: (-caps[d], d))
    chosen: list[int] = []
    left = need
    for d in order:
        if left <= 0:
            break
        if caps[d] >= left:  # the last one: the best fit among those still unused
            rest = [x for x in order if x not in chosen and caps[x] >= left]
            chosen.append(min(rest, key=lambda x: (caps[x], x)))
            left = 0
            break
        chosen.append(d)
        left -= caps[d]
    return chosen if left <= 0 else []


def kai(c: Cluster, job: Job) -> Placement | None:
    """KAI's topology plugin, preferred level the leaf: the fullest leaf that holds the gang;
    else the fullest block that does, its leaves with the most free first; else the cluster,
    blocks most free first. Inside, nodes bin-packed (fewest free first)."""
    leaf_caps = _leaf_caps(c, job, range(len(c.leaf_free)))
    leaf = _fits_one(leaf_caps, job.pods, True)
    if leaf is not None:
        leaves = [leaf]
    else:
        block_caps = {b: sum(leaf_caps[x] for x in c.leaves_in(b))
                      for b in range(len(c.block_free))}
        block = _fits_one(block_caps, job.pods, True)
        blocks = [block] if block is not None else sorted(block_caps, key=lambda b: -block_caps[b])
        leaves = [x for b in blocks
                  for x in sorted(c.leaves_in(b), key=lambda x: (-leaf_caps[x], x))]
    nodes = [i for leaf in leaves
             for i in sorted((i for i in c.nodes_in(leaf) if _cap(c, i, job) > 0),
                             key=lambda i: (len(c.free[i]), i))]
    return _fill(c, job, nodes)


# --- Muster -----------------------------------------------------------------------------------


def request(c: Cluster, job: Job) -> GangRequest:
    """The gang as the binder hands it to its placement function."""
    members = tuple(MemberRequest(key=f"bench/j{job.id}-{p}", gpus=job.pod_gpus, cpu_milli=1000)
                    for p in range(job.pods))
    return GangRequest(name=f"bench/j{job.id}", members=members, mode="preferred",
                       network=NetworkRequest(level=c.spec.leaf_label, mode="preferred"))


def muster(tables: TableCache) -> Placer:
    """The binder's placement function, on the cluster's node states."""
    index: dict[str, int] = {}

    def place(c: Cluster, job: Job) -> Placement | None:
        if not index:
            index.update((n, i) for i, n in enumerate(c.names))
        got = muster_place(c, request(c, job), tables)
        if isinstance(got, Unplaceable):
            return None
        return [(index[m.node], m.gpus) for m in got.members]

    return place


def muster_place(c: Cluster, gang: GangRequest, tables: TableCache
                 ) -> GangPlacement | Unplaceable:
    """The call the binder makes (webhook.binder.controller): its placement function on the
    node states, with the cluster's network levels."""
    return place_gang(c.states, gang, network=c.network, tables=tables)


# --- what a placement is worth ----------------------------------------------------------------


def on_fabric(c: Cluster, placement: Placement) -> GangOnFabric:
    gpus: dict[str, list[int]] = {}
    for i, g in placement:
        gpus.setdefault(c.names[i], []).extend(g)
    return GangOnFabric({n: tuple(sorted(g)) for n, g in gpus.items()},
                        dict.fromkeys(gpus, c.spec.topology), c.where, c.spec.fabric)


def step(c: Cluster, placement: Placement, tables: TableCache) -> float:
    g = on_fabric(c, placement)
    return step_seconds(c.spec.workload, g.size, gang_bus_gbps(g, tables), LINKS)


def ideal_step(spec: ClusterSpec, job: Job, tables: TableCache) -> float:
    """The job's step on the empty cluster at its best: one node's best set, else whole nodes
    of one leaf, else of one block, else across blocks (fat trees and NVL72 racks alike)."""
    empty = Cluster(spec)
    g = spec.gpus_per_node
    if job.gpus <= g:
        set_ = tables.tables(spec.topology).choose((1 << g) - 1, job.gpus)
        assert set_ is not None
        gpus = tuple(i for i in range(g) if set_ >> i & 1)
        return step(empty, [(0, gpus)], tables)
    # nodes are numbered leaf by leaf, block by block: the first ones span the fewest domains
    return step(empty, [(i, tuple(range(g))) for i in range(job.gpus // g)], tables)


def narrowest_level(spec: ClusterSpec, job: Job) -> int:
    """0 node, 1 leaf (clique), 2 block, 3 cluster: the narrowest whose one domain could hold
    the job on the empty cluster."""
    g = spec.gpus_per_node
    if job.gpus <= g:
        return 0
    if job.gpus <= g * spec.nodes_per_leaf:
        return 1
    if job.gpus <= g * spec.nodes_per_leaf * spec.leaves_per_block:
        return 2
    return 3


def domains_spanned(c: Cluster, placement: Placement, level: int) -> int:
    nodes = {i for i, _ in placement}
    if level == 0:
        return len(nodes)
    if level == 1:
        return len({c.leaf_of[i] for i in nodes})
    if level == 2:
        return len({c.block_of[i] for i in nodes})
    return 1


def unusable_share(c: Cluster) -> float:
    """Free GPUs on nodes that cannot host a whole-node pod, as a share of all free GPUs."""
    g = c.spec.gpus_per_node
    free = total = 0
    for f in c.free:
        n = len(f)
        total += n
        if n < g:
            free += n
    return free / total if total else 0.0
