"""Preferred scheduling terms of the binder's gangs (pure): preferred node affinity, preferred
podAffinity and podAntiAffinity, and topologySpreadConstraints with whenUnsatisfiable
ScheduleAnyway; and the placed pods' preferred terms (and required podAffinity) that select a
member. A member's nodes are scored as kube-scheduler's NodeAffinity, InterPodAffinity and
PodTopologySpread score plugins score them, each normalised to 0-100 over the nodes the member
may use and fits on, and summed (their default weights are equal).

They are weighed after the gang's topology, which comes first (docs/topology.md: the best GPU
set first). The engine is asked again with each member's nodes narrowed to those it scores
highest, then to those of its next score or better (`MOST_TIERS` tries at most); the first
placement as good as the one without preferences (no more nodes, no less allreduce bandwidth,
no wider network domain) is kept. The pods on nodes are counted, the gang's own members not:
the gang is placed whole (or, one member at a time, its job scored once).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from webhook.binder.fit import term_matches
from webhook.binder.interpod import Neighbours, counts
from webhook.binder.nodes import NodeInfo
from webhook.binder.pods import PodInfo, Preferences
from webhook.binder.spread import Spread
from webhook.topology.gpu_choice import usable_mask
from webhook.topology.model import (
    GangPlacement,
    GangRequest,
    MemberRequest,
    NodeState,
    Unplaceable,
)
from webhook.topology.placement import member_capacity

#: kube-scheduler's MaxNodeScore
MAX_SCORE = 100.0

#: the engine on the round's nodes, asked for a gang
Engine = Callable[[GangRequest], GangPlacement | Unplaceable]


def _node_affinity(prefs: Preferences, nodes: Sequence[NodeInfo]) -> list[float]:
    """The weights of the terms each node matches, the highest made 100."""
    raw = [sum(w for w, t in prefs.nodes if term_matches(t, n)) for n in nodes]
    top = max(raw, default=0)
    return [MAX_SCORE * s / top if top else 0.0 for s in raw]


def _inter_pod(pod: PodInfo, prefs: Preferences, nodes: Sequence[NodeInfo], nb: Neighbours
               ) -> list[float]:
    """Per term of the pod's, its weight (negative for podAntiAffinity) times the pods it
    counts in the node's domain; per scoring term of a placed pod that selects the pod, its
    weight in that pod's domain; the lowest sum made 0 and the highest 100."""
    weighed = [(term, Counter({v: w * n for v, n in nb.domains(term).items()}))
               for w, term in prefs.pods]
    weighed += [(term, by_value) for term, by_value in nb.soft_domains().items()
                if counts(term, pod)]
    raw = [0.0] * len(nodes)
    for term, by_value in weighed:
        if not by_value:
            continue
        for i, n in enumerate(nodes):
            value = n.labels.get(term.topology_key)
            if value is not None:
                raw[i] += by_value.get(value, 0)
    lo, hi = min(raw, default=0.0), max(raw, default=0.0)
    return [MAX_SCORE * (s - lo) / (hi - lo) if hi > lo else 0.0 for s in raw]


def _spread(pod: PodInfo, prefs: Preferences, nodes: Sequence[NodeInfo], spread: Spread
            ) -> list[float]:
    """Per constraint, the pods its domain of the node counts, weighed by log(domains + 2), plus
    maxSkew - 1; the fewest made 100, more pods less. A node without every key scores 0."""
    keys = tuple(dict.fromkeys(t.topology_key for t in prefs.spread))
    raw: list[float | None] = [
        0.0 if all(k in n.labels for k in keys) else None for n in nodes]
    for term in prefs.spread:
        count = spread.domains(pod, term, keys)
        weight = math.log(len(count) + 2)
        for i, n in enumerate(nodes):
            s = raw[i]
            if s is not None:
                raw[i] = s + count.get(n.labels[term.topology_key], 0) * weight + \
                    term.max_skew - 1
    scored = [s for s in raw if s is not None]
    lo, hi = min(scored, default=0.0), max(scored, default=0.0)
    return [0.0 if s is None else MAX_SCORE if hi == 0 else MAX_SCORE * (hi + lo - s) / hi
            for s in raw]


class Scores:
    """The members' scores of the nodes they may use and fit on, for one gang's placement (the
    pods on nodes and what is free change as the round places gangs). Keyed on what a score
    reads: a job's pods share their preferences, namespace, constraints, requests and nodes,
    and are scored once."""

    def __init__(self, nodes: Mapping[str, NodeInfo], states: Mapping[str, NodeState],
                 nb: Neighbours) -> None:
        self.nodes = nodes
        self.states = states
        self.nb = nb
        self.spread = Spread(nb)
        self._memo: dict[tuple[object, ...], dict[str, float]] = {}
        #: (its topology, its free GPUs) -> a node's usable free GPUs: nodes alike share it
        self._usable: dict[tuple[int, frozenset[int]], int] = {}

    def _fits(self, n: NodeState, m: MemberRequest) -> bool:
        """The member fits on the node alone, now (kube-scheduler scores only such nodes)."""
        if n.free_pods < 1 or n.free_cpu_milli < m.cpu_milli or \
                n.free_memory_bytes < m.memory_bytes:
            return False
        if m.gpus == 0:
            return True
        # (most nodes of a busy cluster are ruled out by their count of free GPUs alone)
        if n.topology is None or len(n.free_gpus) < m.gpus:
            return False
        key = (id(n.topology), n.free_gpus)  # (the states, and so the topologies, outlive it)
        usable = self._usable.get(key)
        if usable is None:
            usable = self._usable[key] = usable_mask(n.topology, n.free_gpus)
        return member_capacity(n, usable, m) > 0

    def weighs(self, pod: PodInfo) -> bool:
        """Whether the pod has preferences, or a placed pod's scoring term selects it."""
        return pod.preferences is not None or self.nb.selects(pod)

    def of(self, pod: PodInfo, m: MemberRequest) -> dict[str, float]:
        """node -> the pod's score there, over the nodes it may use and fits on now."""
        prefs = pod.preferences or Preferences()
        selected = self.nb.selects(pod)  # (then its labels are read)
        key = (prefs, pod.namespace, pod.labels if selected else (), pod.constraints,
               m.eligible_nodes, m.gpus, m.cpu_milli, m.memory_bytes)
        found = self._memo.get(key)
        if found is None:
            names = self.nodes if m.eligible_nodes is None else sorted(m.eligible_nodes)
            nodes = [self.nodes[n] for n in names
                     if n in self.states and self._fits(self.states[n], m)]
            total = [0.0] * len(nodes)
            parts = [_node_affinity(prefs, nodes) if prefs.nodes else None,
                     _inter_pod(pod, prefs, nodes, self.nb) if prefs.pods or selected
                     else None,
                     _spread(pod, prefs, nodes, self.spread) if prefs.spread else None]
            for part in parts:
                for i, s in enumerate(part or ()):
                    total[i] += s
            found = self._memo[key] = {n.name: s for n, s in zip(nodes, total, strict=True)}
        return found


#: the most narrowed requests the engine is asked for, best scores first
MOST_TIERS = 3


def tiers(request: GangRequest, pods: Mapping[str, PodInfo], scores: Scores,
          scored_as: Mapping[str, MemberRequest] | None = None) -> list[GangRequest]:
    """The gang with each member's nodes narrowed to those it scores highest, then to those
    of its next score or better, and so on (at most `MOST_TIERS`; its lowest score is the
    placement without preferences). Empty when no member prefers any node to another.
    `scored_as`: a member scored as this request of it (over its nodes), its nodes narrowed
    after (a member placed alone within a domain: its job's members share one score)."""
    narrowed: list[list[MemberRequest]] = []  # per member: its requests, tier by tier
    for m in request.members:
        asked = (scored_as or {}).get(m.key, m)
        scored = scores.of(pods[m.key], asked) if scores.weighs(pods[m.key]) else {}
        if asked is not m and m.eligible_nodes is not None:
            scored = {n: s for n, s in scored.items() if n in m.eligible_nodes}
        floors = sorted(set(scored.values()), reverse=True)[:-1][:MOST_TIERS]
        narrowed.append([replace(m, eligible_nodes=frozenset(
            n for n, s in scored.items() if s >= floor)) for floor in floors])
    depth = max(map(len, narrowed), default=0)
    return [replace(request, members=tuple(
        tiers[min(t, len(tiers) - 1)] if tiers else m
        for tiers, m in zip(narrowed, request.members, strict=True)))
        for t in range(depth)]


def _within(placement: GangPlacement, request: GangRequest) -> bool:
    """Every member on a node the request lets it use."""
    nodes = {mp.key: mp.node for mp in placement.members}
    return all(m.eligible_nodes is None or nodes[m.key] in m.eligible_nodes
               for m in request.members)


def _span(placement: GangPlacement, paths: Mapping[str, tuple[str, ...]]) -> int:
    """How deep the narrowest network domain holding every node of the placement is."""
    found = [paths.get(mp.node, ()) for mp in placement.members]
    depth = 0
    while found and all(len(p) > depth and p[depth] == found[0][depth] for p in found):
        depth += 1
    return depth


def as_good(placement: GangPlacement, base: GangPlacement,
            paths: Mapping[str, tuple[str, ...]] | None) -> bool:
    """No more nodes than `base`, no less allreduce bandwidth, and (`paths`: each node's
    network domains, widest first, when the gang asks for a level) no wider a domain."""
    return (placement.nodes_used <= base.nodes_used
            and placement.gang_gbps >= base.gang_gbps
            and (paths is None or _span(placement, paths) >= _span(base, paths)))


def _slices_kept(request: GangRequest) -> GangRequest:
    """The request with its preferred slices required: on the preferred nodes the gang keeps
    the slices `base` may have (a placement without them can look as good by nodes, bandwidth
    and domain)."""
    net = request.network
    if net is None or net.slice_level is None or net.slice_mode != "preferred":
        return request
    return replace(request, network=replace(net, slice_mode="required"))


def preferred(request: GangRequest, base: GangPlacement, pods: Mapping[str, PodInfo],
              scores: Scores, *, engine: Engine,
              paths: Mapping[str, tuple[str, ...]] | None,
              scored_as: Mapping[str, MemberRequest] | None = None) -> GangPlacement:
    """The placement on the nodes the members prefer most, where the engine finds one as good
    as `base` (its placement without preferences); else `base`. `scored_as`: as `tiers`."""
    for narrowed in tiers(_slices_kept(request), pods, scores, scored_as):
        if _within(base, narrowed):
            return base
        got = engine(narrowed)
        if isinstance(got, GangPlacement) and as_good(got, base, paths):
            return got
    return base
