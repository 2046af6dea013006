"""Required topology spread for the binder's gangs: topologySpreadConstraints with
whenUnsatisfiable DoNotSchedule, decided as kube-scheduler's PodTopologySpread filter decides
them for one pod at a time (pure).

For a constraint of a pending pod, the domains are the values of its topologyKey on the nodes
that carry every key of the pod's DoNotSchedule constraints and that its inclusion policies
admit (nodeAffinityPolicy Honor, the default: the pod's nodeSelector and required node
affinity; nodeTaintsPolicy Honor: its tolerations). A domain counts the pods of the pod's
namespace that the selector matches, bound and not being deleted. The pod may go on a node
that carries every key where, for each constraint, the node's domain count, plus one when the
pod matches its own selector, less the fewest of any domain, is at most maxSkew; the fewest is
0 while there are fewer domains than minDomains.

A gang is checked as kube-scheduler binds it, one member at a time: `Spread` counts the pods on
nodes and the members placed so far, `why_not` answers for the next one, `add` counts it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from webhook.binder.fit import admits, tolerated
from webhook.binder.interpod import Neighbours
from webhook.binder.pods import PodInfo, SpreadTerm
from webhook.policy.compiled import selector_matches


def counts(term: SpreadTerm, pod: PodInfo, namespace: str) -> bool:
    """Whether a constraint of a pod in `namespace` counts `pod`."""
    return (term.selector is not None and pod.namespace == namespace and not pod.deleting
            and selector_matches(term.selector, dict(pod.labels)))


def keys_of(pod: PodInfo) -> tuple[str, ...]:
    """The label keys a node must carry for the pod (kube-scheduler filters out the others)."""
    return tuple(dict.fromkeys(t.topology_key for t in pod.spread))


@dataclass(slots=True)
class _Domains:
    """One constraint of pods alike: its domains, and how many pods each counts."""

    term: SpreadTerm
    namespace: str
    #: admitted node -> its domain
    domain_of: dict[str, str]
    count: Counter[str] = field(default_factory=Counter)
    #: the fewest pods of a domain, and how many domains count that few (None: not known)
    _fewest: tuple[int, int] | None = None

    def fewest(self) -> int:
        if self.term.min_domains is not None and len(self.count) < self.term.min_domains:
            return 0
        if self._fewest is None:
            least = min(self.count.values(), default=0)
            self._fewest = (least, sum(1 for n in self.count.values() if n == least))
        return self._fewest[0]

    def add(self, pod: PodInfo, node: str) -> None:
        value = self.domain_of.get(node)
        if value is None or not counts(self.term, pod, self.namespace):
            return
        if self._fewest is not None and self.count[value] == self._fewest[0]:
            least, ties = self._fewest
            self._fewest = (least, ties - 1) if ties > 1 else None
        self.count[value] += 1

    def skew(self, pod: PodInfo, value: str) -> int:
        """The skew the pod makes in domain `value` (kube-scheduler reads the node's label
        value, whether or not the node itself is admitted)."""
        return self.count.get(value, 0) + counts(self.term, pod, self.namespace) - self.fewest()


class Spread:
    """The domains of the pending pods' constraints, counted from the pods on nodes
    (`Neighbours`) and the members added here; made per gang placement."""

    def __init__(self, nb: Neighbours) -> None:
        self.nb = nb
        self._added: list[tuple[PodInfo, str]] = []
        self._domains: dict[tuple[object, ...], _Domains] = {}

    def why_not(self, pod: PodInfo, node: str) -> str | None:
        """Why the pod may not go on the node now, in words; None when it may."""
        labels = self.nb.nodes[node].labels
        for term in pod.spread:
            value = labels.get(term.topology_key)
            if value is None:
                return (f"pod {pod.key} on {node}: the node has no {term.topology_key} label, "
                        "which its topologySpreadConstraints need")
            d = self._of(pod, term)
            skew = d.skew(pod, value)
            if skew > term.max_skew:
                return (f"pod {pod.key} on {node}: its topologySpreadConstraint (topologyKey "
                        f"{term.topology_key}, maxSkew {term.max_skew}) would make a skew of "
                        f"{skew} there ({d.count.get(value, 0)} matching pods in "
                        f"{term.topology_key}={value} already, {d.fewest()} in the emptiest "
                        "domain)")
        return None

    def blocked(self, pod: PodInfo) -> set[str]:
        """The nodes whose domains the pod may not join now (by their label's value, as
        `why_not` reads it)."""
        out: set[str] = set()
        for term in pod.spread:
            d = self._of(pod, term)
            limit = term.max_skew + d.fewest() - counts(term, pod, d.namespace)
            by_value = self.nb.index.values(term.topology_key)
            for value, n in d.count.items():
                if n > limit:
                    out |= by_value[value]
        return out

    def add(self, pod: PodInfo, node: str) -> None:
        """A member placed on `node`: counted by every constraint that selects it."""
        self._added.append((pod, node))
        for d in self._domains.values():
            d.add(pod, node)

    def domains(self, pod: PodInfo, term: SpreadTerm, keys: tuple[str, ...]) -> Counter[str]:
        """How many pods each of a constraint's domains counts, over the admitted nodes that
        carry every one of `keys`."""
        return self._of(pod, term, keys).count

    def _of(self, pod: PodInfo, term: SpreadTerm, keys: tuple[str, ...] | None = None
            ) -> _Domains:
        keys = keys_of(pod) if keys is None else keys
        policy = pod.constraints if term.honour_affinity or term.honour_taints else None
        key = (term, pod.namespace, keys, policy)
        found = self._domains.get(key)
        if found is None:
            c = pod.constraints
            # (no nodeSelector nor required node affinity: Honor admits every node)
            affinity = term.honour_affinity and (bool(c.node_selector) or c.terms is not None)
            keyed = self.nb.index.carrying(keys)
            domain_of = {
                name: info.labels[term.topology_key]
                for name, info in self.nb.nodes.items()
                if name in keyed and (not affinity or admits(c, info))
                and (not term.honour_taints or tolerated(c, info))}
            found = self._domains[key] = _Domains(term, pod.namespace, domain_of,
                                                  Counter(dict.fromkeys(domain_of.values(), 0)))
            for placed, node in (*self.nb.pods_in(pod.namespace), *self._added):
                found.add(placed, node)
        return found


def violation(placed: Sequence[tuple[PodInfo, str]], nb: Neighbours) -> str | None:
    """Why placing the gang's members (pod, node) breaks a topology spread constraint, in words,
    when no order of binding them one at a time keeps every one (tried greedily: the first
    member that may go next goes); None when it keeps them."""
    spread = Spread(nb)
    left = list(placed)
    while left:
        at = next((i for i, (pod, node) in enumerate(left)
                   if spread.why_not(pod, node) is None), None)
        if at is None:
            pod, node = left[0]
            return spread.why_not(pod, node)
        spread.add(*left.pop(at))
    return None
