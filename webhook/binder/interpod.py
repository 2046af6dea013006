"""Required inter-pod affinity and anti-affinity for the binder's gangs, decided as
kube-scheduler's InterPodAffinity filter decides them for one pod at a time (pure).

A term counts the pods its selector and namespaces match, on nodes that carry its topology key;
the key's value is the domain. For a pending member on a node:
- each of its anti-affinity terms: no counted pod in the node's domain;
- each placed pod's anti-affinity term that matches the member: not in that pod's domain;
- its affinity terms: the node carries every key and each term counts a pod in its domain, or
  no term counts any pod anywhere and the member matches all its own terms (the first pod of a
  group that selects itself; the gang's others must then join its domain).

`Neighbours` holds the pods already on nodes; `rules` gives what they allow a pending member
before placement (the engine's eligible nodes, and a label the whole gang must share when its
members select each other); `violation` checks the whole placement, the gang's own members
counted, so that the binder binds nothing that breaks a term.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from webhook.binder.nodes import NodeInfo
from webhook.binder.pods import PodInfo, PodTerm
from webhook.keys import HOSTNAME_LABEL
from webhook.policy.compiled import selector_matches


def counts(term: PodTerm, pod: PodInfo) -> bool:
    """Whether the term counts the pod (its namespaces and label selector)."""
    if term.selector is None or (term.namespaces is not None
                                 and pod.namespace not in term.namespaces):
        return False
    return selector_matches(term.selector, dict(pod.labels))


#: what a placed pod's required podAffinity term that selects a pending pod adds to its score
#: in the term's domain (kube-scheduler's hardPodAffinityWeight, default 1)
HARD_AFFINITY_WEIGHT = 1


def holds_terms(pod: PodInfo) -> bool:
    """Whether the pod has inter-pod terms that concern other pods once it is placed: required
    podAntiAffinity (a filter), or required podAffinity or preferred terms (scores)."""
    prefs = pod.preferences
    return bool(pod.pod_affinity) or (prefs is not None and bool(prefs.pods))


class LabelIndex:
    """The nodes by the value of a label, per label key, made on first use (the binder's
    FitCache keeps one until the node set changes)."""

    def __init__(self, nodes: Mapping[str, NodeInfo]) -> None:
        self.nodes = nodes
        self.names = frozenset(nodes)
        self._by_key: dict[str, dict[str, frozenset[str]]] = {}
        self._carrying: dict[tuple[str, ...], frozenset[str]] = {}

    def values(self, key: str) -> dict[str, frozenset[str]]:
        """value -> the nodes whose label `key` has it."""
        found = self._by_key.get(key)
        if found is None:
            groups: dict[str, set[str]] = {}
            for name, node in self.nodes.items():
                value = node.labels.get(key)
                if value is not None:
                    groups.setdefault(value, set()).add(name)
            found = self._by_key[key] = {v: frozenset(g) for v, g in groups.items()}
        return found

    def carrying(self, keys: tuple[str, ...]) -> frozenset[str]:
        """The nodes that carry every one of the label `keys`."""
        found = self._carrying.get(keys)
        if found is None:
            found = self.names
            for key in keys:
                found = found & frozenset().union(*self.values(key).values())
            self._carrying[keys] = found
        return found


class Neighbours:
    """The pods on nodes that the terms count: bound (or assumed bound) and not terminated, and
    those placed earlier in the same planning round. `holders` are those of `pods` with terms
    of their own (`holds_terms`: the snapshot keeps them apart, so that a round where no term
    applies never reads every pod). Per term, the domains holding counted pods are worked out
    once."""

    def __init__(self, pods: Collection[PodInfo], holders: Iterable[PodInfo],
                 nodes: Mapping[str, NodeInfo], index: LabelIndex | None = None) -> None:
        self.nodes = nodes
        self.index = index if index is not None and index.nodes is nodes else LabelIndex(nodes)
        self._source = pods
        #: namespace -> pod key -> (pod, node); made on first use
        self._pods: dict[str, dict[str, tuple[PodInfo, str]]] | None = None
        self._holders = {p.key: (p, p.node_name) for p in holders
                         if p.node_name and not p.terminated}
        self._round: list[tuple[PodInfo, str]] = []
        self._domains: dict[PodTerm, Counter[str]] = {}
        self._anti: dict[PodTerm, dict[str, str]] | None = None
        self._soft: dict[PodTerm, Counter[str]] | None = None
        self._selects: dict[tuple[str, tuple[tuple[str, str], ...]], bool] = {}
        self._allowed: dict[tuple[tuple[PodTerm, ...], tuple[PodTerm, ...],
                                  tuple[PodTerm, ...], tuple[str, ...]], frozenset[str]] = {}

    def add(self, pod: PodInfo, node: str) -> None:
        """A pod placed by this round."""
        self._round.append((pod, node))
        if self._pods is not None:
            self._pods.setdefault(pod.namespace, {})[pod.key] = (pod, node)
        if holds_terms(pod):
            self._holders[pod.key] = (pod, node)
            self._anti = self._soft = None
        self._domains.clear()
        self._allowed.clear()  # (what the placed pods allow has changed)

    def mark(self) -> int:
        """Where `rollback` returns to: the pods added so far."""
        return len(self._round)

    def rollback(self, mark: int) -> None:
        """Forget the pods added since `mark` (a trial placement that is not kept)."""
        for pod, _ in self._round[mark:]:
            if self._pods is not None:
                self._pods.get(pod.namespace, {}).pop(pod.key, None)
            if self._holders.pop(pod.key, None) is not None:
                self._anti = self._soft = None
        del self._round[mark:]
        self._domains.clear()
        self._allowed.clear()

    def anti_domains(self) -> dict[PodTerm, dict[str, str]]:
        """Each distinct anti-affinity term of the placed pods: the domains it guards, each
        with one pod that guards it (pods of one job share their terms: one match each)."""
        if self._anti is None:
            self._anti = {}
            for holder, node in self._holders.values():
                for term in holder.anti_affinity:
                    value = self.domain(node, term.topology_key)
                    if value is not None:
                        self._anti.setdefault(term, {}).setdefault(value, holder.key)
        return self._anti

    def soft_domains(self) -> dict[PodTerm, Counter[str]]:
        """Each distinct scoring term of the placed pods (their preferred terms, and their
        required podAffinity at `HARD_AFFINITY_WEIGHT`): the weight it adds, summed, in each
        domain of its key, to a pending pod it selects (negative for podAntiAffinity)."""
        if self._soft is None:
            self._soft = {}
            self._selects.clear()
            for holder, node in self._holders.values():
                hard = holder.pod_affinity.affinity if holder.pod_affinity is not None else ()
                prefs = holder.preferences
                weighed = [*((HARD_AFFINITY_WEIGHT, t) for t in hard),
                           *(prefs.pods if prefs is not None else ())]
                for weight, term in weighed:
                    value = self.domain(node, term.topology_key)
                    if value is not None:
                        self._soft.setdefault(term, Counter())[value] += weight
        return self._soft

    def selects(self, pod: PodInfo) -> bool:
        """Whether a placed pod's scoring term selects the pending pod (asked once per
        namespace and labels: a job's pods share them)."""
        soft = self.soft_domains()
        key = (pod.namespace, pod.labels)
        found = self._selects.get(key)
        if found is None:
            found = self._selects[key] = any(counts(term, pod) for term in soft)
        return found

    def allowed(self, guards: tuple[PodTerm, ...], anti: tuple[PodTerm, ...],
                affinity: tuple[PodTerm, ...], anywhere: tuple[str, ...]) -> frozenset[str]:
        """The nodes outside the domains that the placed pods' anti-affinity `guards` and the
        member's own `anti` terms rule out, and inside a domain holding pods each `affinity`
        term counts, carrying each key of `anywhere` (the first of a group that selects
        itself). Keyed on the terms: members of a gang ask alike, worked out once a round."""
        key = (guards, anti, affinity, anywhere)
        found = self._allowed.get(key)
        if found is None:
            out = set(self.index.names)
            guarded = self.anti_domains()
            for term in guards:
                by_value = self.index.values(term.topology_key)
                for v in guarded[term]:
                    out -= by_value.get(v, frozenset())
            for term in anti:
                by_value = self.index.values(term.topology_key)
                for v in self.domains(term):
                    out -= by_value.get(v, frozenset())
            for term in affinity:
                by_value = self.index.values(term.topology_key)
                out &= set().union(*(by_value.get(v, ()) for v in self.domains(term)))
            for k in anywhere:
                out &= set().union(*self.index.values(k).values())
            found = self._allowed[key] = frozenset(out)
        return found

    def active(self, gang: Sequence[PodInfo]) -> bool:
        """Whether any term concerns this gang: its own, or a placed pod's anti-affinity term
        that selects one of its members (a cluster's other workloads keep their own pods apart
        by terms that select none of a training job's)."""
        if any(p.pod_affinity for p in gang):
            return True
        return bool(self._holders) and any(
            counts(term, p) for term in self.anti_domains() for p in gang)

    def _placed(self, namespaces: frozenset[str] | None) -> Iterable[tuple[PodInfo, str]]:
        """The pods on nodes in `namespaces` (None: every namespace)."""
        if self._pods is None:
            self._pods = {}
            for p in self._source:
                if p.node_name and not p.terminated:
                    self._pods.setdefault(p.namespace, {})[p.key] = (p, p.node_name)
            for p, n in self._round:
                self._pods.setdefault(p.namespace, {})[p.key] = (p, n)
        spaces = self._pods.keys() if namespaces is None else namespaces & self._pods.keys()
        return (entry for ns in spaces for entry in self._pods[ns].values())

    def pods_in(self, namespace: str) -> Iterable[tuple[PodInfo, str]]:
        """(pod, node) of the pods on nodes in one namespace."""
        return self._placed(frozenset((namespace,)))

    def domain(self, node: str, key: str) -> str | None:
        info = self.nodes.get(node)
        return None if info is None else info.labels.get(key)

    def domains(self, term: PodTerm) -> Counter[str]:
        """How many counted pods each domain of the term's key holds."""
        found = self._domains.get(term)
        if found is None:
            found = self._domains[term] = _tally(term, self._placed(term.namespaces), self)
        return found


def _tally(term: PodTerm, placed: Iterable[tuple[PodInfo, str]], nb: Neighbours
           ) -> Counter[str]:
    """How many of the (pod, node) pairs the term counts in each domain of its key."""
    found: Counter[str] = Counter()
    for pod, node in placed:
        if counts(term, pod):
            value = nb.domain(node, term.topology_key)
            if value is not None:
                found[value] += 1
    return found


@dataclass(frozen=True, slots=True)
class Rules:
    """What the placed pods' terms allow one pending member."""

    #: the nodes it may use (None: every node, as far as the terms go)
    allowed: frozenset[str] | None
    #: label keys of its affinity terms that only it and its gang can meet: the gang's members
    #: that it selects must share one domain of each
    own: tuple[str, ...] = ()
    #: why no node is allowed, in words (empty when some is)
    reason: str = ""


def _term_text(kind: str, term: PodTerm) -> str:
    return f"its {kind} (topologyKey {term.topology_key})"


def rules(member: PodInfo, nb: Neighbours) -> Rules:
    """What the placed pods' terms, and its own, allow a pending member before its gang is
    placed."""
    guards = tuple(t for t in nb.anti_domains() if counts(t, member))
    terms = member.pod_affinity
    anti = terms.anti if terms is not None else ()
    affinity = terms.affinity if terms is not None else ()
    anywhere: tuple[str, ...] = ()
    if affinity and not any(nb.domains(t) for t in affinity):
        if not all(counts(t, member) for t in affinity):
            return Rules(frozenset(), reason=(
                f"pod {member.key}: its podAffinity selects no pod on any node, and not the "
                "pod itself"))
        anywhere, affinity = tuple(dict.fromkeys(t.topology_key for t in affinity)), ()
    if not guards and not anti and not affinity and not anywhere:
        return Rules(None)
    allowed = nb.allowed(guards, anti, affinity, anywhere)
    reason = "" if allowed else (
        f"pod {member.key}: no node is allowed by its podAffinity and podAntiAffinity and the "
        "pods already placed")
    return Rules(allowed, anywhere, reason)


def one_per_node(gang: Sequence[PodInfo]) -> bool:
    """Whether a member's anti-affinity by hostname counts another member: the gang's pods
    must then each have a node of their own."""
    for pod in gang:
        for term in pod.anti_affinity:
            if term.topology_key == HOSTNAME_LABEL and any(
                    other.key != pod.key and counts(term, other) for other in gang):
                return True
    return False


def violation(placed: Sequence[tuple[PodInfo, str]], nb: Neighbours) -> str | None:
    """The first term that placing the gang's pending members (pod, node) breaks, in words,
    counting the pods already on nodes and the gang's own members; None when it keeps every
    term."""
    gang = _Gang(placed, nb)
    for pod, node in placed:
        for term, guarded in nb.anti_domains().items():
            value = nb.domain(node, term.topology_key)
            if value in guarded and counts(term, pod):
                return (f"pod {pod.key} on {node}: the podAntiAffinity of pod {guarded[value]} "
                        f"(topologyKey {term.topology_key}) forbids it there")
        for term in pod.anti_affinity:
            value = nb.domain(node, term.topology_key)
            if value is not None and gang.others(term, pod, value) > 0:
                return (f"pod {pod.key} on {node}: {_term_text('podAntiAffinity', term)} "
                        f"counts another pod in {term.topology_key}={value}")
        why = _affinity_unmet(pod, node, gang, nb)
        if why is not None:
            return why
    return None


class _Gang:
    """The gang's pending members where a placement puts them, counted per term as
    `Neighbours.domains` counts the pods already placed."""

    def __init__(self, placed: Sequence[tuple[PodInfo, str]], nb: Neighbours) -> None:
        self.placed = placed
        self.nb = nb
        self._domains: dict[PodTerm, Counter[str]] = {}

    def domains(self, term: PodTerm) -> Counter[str]:
        found = self._domains.get(term)
        if found is None:
            found = self._domains[term] = _tally(term, self.placed, self.nb)
        return found

    def others(self, term: PodTerm, pod: PodInfo, value: str) -> int:
        """Pods other than `pod` (which is in domain `value`) that the term counts there."""
        n = self.nb.domains(term)[value] + self.domains(term)[value]
        return n - 1 if counts(term, pod) else n

    def anywhere(self, term: PodTerm, pod: PodInfo) -> bool:
        """Whether the term counts a pod other than `pod` on any labelled node."""
        n = sum(self.nb.domains(term).values()) + sum(self.domains(term).values())
        return (n - 1 if counts(term, pod) else n) > 0


def _affinity_unmet(pod: PodInfo, node: str, gang: _Gang, nb: Neighbours) -> str | None:
    terms = pod.pod_affinity.affinity if pod.pod_affinity is not None else ()
    for term in terms:
        if nb.domain(node, term.topology_key) is None:
            return (f"pod {pod.key} on {node}: the node has no {term.topology_key} label, "
                    f"which {_term_text('podAffinity', term)} needs")
    unmet = [t for t in terms if gang.others(t, pod, nb.domain(node, t.topology_key) or "") == 0]
    if not unmet:
        return None
    if not any(gang.anywhere(t, pod) for t in terms) and all(counts(t, pod) for t in terms):
        return None  # the first of its kind, as kube-scheduler lets it be
    t = unmet[0]
    return (f"pod {pod.key} on {node}: {_term_text('podAffinity', t)} counts no other pod in "
            f"{t.topology_key}={nb.domain(node, t.topology_key)}")
