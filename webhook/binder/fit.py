"""Node filters: which nodes may host a pod (selectors, affinity, taints, cordon).

Resource fit (CPU, memory, pods, GPUs) is the placement engine's job, from NodeState's free
amounts; this module decides MemberRequest.eligible_nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from webhook.binder.agents import AGENT_WAIT
from webhook.binder.claims import DEVICE_CLASS
from webhook.binder.interpod import LabelIndex
from webhook.binder.nodes import NodeInfo, Taint, tolerates
from webhook.binder.pods import Constraints, PodInfo, Requirement, Term
from webhook.topology.network import Levels, Network

#: effects a pod must tolerate to be scheduled (PreferNoSchedule is only a preference)
_HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
_UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")


def _int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _matches(req: Requirement, labels: Mapping[str, str]) -> bool:
    present = req.key in labels
    value = labels.get(req.key, "")
    op = req.operator
    if op == "In":
        return present and value in req.values
    if op == "NotIn":
        return not present or value not in req.values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(req.values) == 1:
        have, want = _int(value), _int(req.values[0])
        if have is None or want is None:
            return False
        return have > want if op == "Gt" else have < want
    return False  # unknown operator: the API server would have refused it; match nothing


def term_matches(term: Term, node: NodeInfo) -> bool:
    if not term.expressions and not term.fields:
        return False  # an empty term matches no objects (k8s NodeSelectorTerm semantics)
    fields = {"metadata.name": node.name}
    return (all(_matches(r, node.labels) for r in term.expressions)
            and all(_matches(r, fields) for r in term.fields))


def why_not(c: Constraints, node: NodeInfo) -> str | None:
    """None when the pod may run on the node, else a short reason."""
    if node.unschedulable and not tolerates(c.tolerations, _UNSCHEDULABLE_TAINT):
        return "node is unschedulable (cordoned)"
    unmet = _affinity_unmet(c, node)
    if unmet is not None:
        return unmet
    taint = _untolerated(c, node)
    return None if taint is None else f"untolerated taint {taint.key}:{taint.effect}"


def _affinity_unmet(c: Constraints, node: NodeInfo) -> str | None:
    for key, value in c.node_selector:
        if node.labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match"
    if c.terms is not None and not any(term_matches(t, node) for t in c.terms):
        return "required node affinity does not match"
    return None


def _untolerated(c: Constraints, node: NodeInfo) -> Taint | None:
    return next((t for t in node.taints
                 if t.effect in _HARD_EFFECTS and not tolerates(c.tolerations, t)), None)


def admits(c: Constraints, node: NodeInfo) -> bool:
    """The pod's nodeSelector and required node affinity admit the node (what a topology
    spread constraint's nodeAffinityPolicy Honor reads)."""
    return _affinity_unmet(c, node) is None


def tolerated(c: Constraints, node: NodeInfo) -> bool:
    """The pod tolerates the node's NoSchedule and NoExecute taints (nodeTaintsPolicy Honor)."""
    return _untolerated(c, node) is None


#: how a pod gets its GPUs: none, the device plugin (nvidia.com/gpu), DRA (ResourceClaims), or
#: either: plain requests that a DRA-only node serves through a special claim
#: (webhook.binder.extended)
Serving = Literal["none", "devicePlugin", "dra", "either"]


def gpu_serving(pod: PodInfo) -> Serving:
    if pod.gpus <= 0:
        return "none"
    if pod.dra:
        return "dra"
    if pod.gpu_class == DEVICE_CLASS and isinstance(pod.extended, tuple):
        return "either"
    return "devicePlugin"


def extended_on(pod: PodInfo, node: NodeInfo) -> bool:
    """Whether the pod's plain GPU requests are served on the node through its special claim:
    as kube-scheduler decides, where the node has no allocatable nvidia.com/gpu."""
    return gpu_serving(pod) == "either" and not node.gpus and bool(node.dra_gpus)


def serves(node: NodeInfo, serving: Serving) -> bool:
    """GPU pods need a node with published topology: the binder always hands out a concrete GPU
    set, which an unknown node cannot honour; DRA pods a node whose driver publishes its GPUs,
    others one whose device plugin advertises some (a DRA-only node's kubelet has none); and
    none while its GPU agent restarts (webhook.binder.agents)."""
    if serving == "none":
        return True
    if node.topology is None or node.agent_wait is not None:
        return False
    if serving == "either":
        return bool(node.gpus or node.dra_gpus)
    return bool(node.dra_gpus if serving == "dra" else node.gpus)


def eligible_nodes(c: Constraints, nodes: Iterable[NodeInfo], serving: Serving
                   ) -> frozenset[str]:
    """Names of nodes the pod may use."""
    return frozenset(n.name for n in nodes if serves(n, serving) and why_not(c, n) is None)


def agent_details(restarting: Sequence[NodeInfo], lead: str = "") -> str:
    """Each node's (at most 3) agent pod and what it is waited for."""
    named = "; ".join(f"node {n.name}: {lead}{n.agent_wait}" for n in restarting[:3])
    more = f"; and {len(restarting) - 3} more node(s)" if len(restarting) > 3 else ""
    return named + more


def agent_note(pods: Iterable[PodInfo], restarting: Iterable[NodeInfo]) -> str:
    """For the wait of a gang that did not fit: the nodes some GPU pod of `pods` could use but
    for their GPU agent restarting ("" when none)."""
    gpu = [p for p in pods if p.gpus]
    left = [n for n in restarting if n.topology is not None
            and any(why_not(p.constraints, n) is None for p in gpu)]
    return f" ({agent_details(left, f'{AGENT_WAIT}: ')})" if left else ""


#: the most networks kept for one node set: the binder's levels and the few Topologies gangs
#: name
_NETWORKS = 8


class FitCache:
    """What the binder derives from the node set: eligible node sets per (constraints, needs
    GPU), every node's network domains, and the nodes by label value. Pods of one job share
    constraints, so a gang costs a handful of node scans. Invalidate whenever the node set
    changes."""

    def __init__(self) -> None:
        self._cache: dict[tuple[Constraints, Serving], frozenset[str]] = {}
        #: per set of levels (the binder's, and each Topology a gang names)
        self._networks: dict[Levels, Network] = {}
        self._network: Network | None = None
        self._domains: Mapping[str, Mapping[str, str]] | None = None
        self._labels: LabelIndex | None = None
        self._restarting: tuple[NodeInfo, ...] | None = None
        self._gpuless: tuple[str, ...] | None = None

    def clear(self) -> None:
        self._cache.clear()
        self._networks.clear()
        self._network = None
        self._labels = None
        self._restarting = None
        self._gpuless = None

    def restarting(self, nodes: Mapping[str, NodeInfo]) -> tuple[NodeInfo, ...]:
        """The nodes whose GPU agent restarts (made once per node set)."""
        if self._restarting is None:
            self._restarting = tuple(n for n in nodes.values() if n.agent_wait is not None)
        return self._restarting

    def gpuless(self, nodes: Mapping[str, NodeInfo]) -> tuple[str, ...]:
        """The nodes without GPU topology (made once per node set)."""
        if self._gpuless is None:
            self._gpuless = tuple(n for n, info in nodes.items() if info.topology is None)
        return self._gpuless

    def labels(self, nodes: Mapping[str, NodeInfo]) -> LabelIndex:
        """The nodes by label value, for inter-pod terms (made once per node set)."""
        if self._labels is None or self._labels.nodes is not nodes:
            self._labels = LabelIndex(nodes)
        return self._labels

    @property
    def made_network(self) -> Network | None:
        """The network last made for the current node set, if a placement asked for one."""
        return self._network

    def network(self, nodes: Mapping[str, NodeInfo], levels: Levels,
                domains: Mapping[str, Mapping[str, str]] | None = None) -> Network:
        """The nodes' labels as the placement groups them by domain of `levels`, with `domains`
        (per node, its domains of levels no label carries) over them (made once per node set
        and levels)."""
        if self._domains is not domains:
            self._networks.clear()
            self._domains = domains
        found = self._networks.get(levels)
        if found is None:
            if len(self._networks) >= _NETWORKS:  # (levels that changed: HyperNode tiers)
                self._networks.clear()
            more = domains or {}
            found = self._networks[levels] = Network(levels, {
                name: {**n.labels, **more[name]} if name in more else n.labels
                for name, n in nodes.items()})
        self._network = found
        return found

    def eligible(self, c: Constraints, nodes: Mapping[str, NodeInfo],
                 serving: Serving) -> frozenset[str]:
        key = (c, serving)
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = eligible_nodes(c, nodes.values(), serving)
        return found
