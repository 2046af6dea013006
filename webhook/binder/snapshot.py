"""The planner's inputs kept current pod by pod, so that a cycle costs what changed.

Rebuilding them from every pod on every cycle (gangs, allocation, each node's free resources)
cost about 25 ms at 1,000 pods and 500 nodes, and the controller plans after every burst of
informer events. The snapshot owns these caches, each keyed on what its reader reads:
- the allocation, updated by `Allocation.add` / `remove` as each pod changes, and by
  `add_claim` / `remove_claim` as each ResourceClaim does;
- the members of every gang that still has an unbound member (the only gangs a plan can act
  on), so that assembling gangs costs only theirs;
- every gang whose members are all bound, as assembled when preemption last asked (kept until
  a member or its PodGroup changes: 2,000 running gangs cost ~5 ms to assemble afresh);
- each node's NodeState, recomputed when the node's usage or its NodeInfo object changes;
- the pods with podAntiAffinity terms, which every gang's placement must respect.
`planner.plan` computes the same from scratch; tests/binder/test_snapshot.py holds them equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from webhook.binder.allocation import Allocation, holding_node
from webhook.binder.claims import ClaimInfo
from webhook.binder.gangs import Gang, PodGroupInfo, assemble, gang_key, is_member
from webhook.binder.interpod import LabelIndex, Neighbours, holds_terms
from webhook.binder.nodes import NodeInfo
from webhook.binder.pods import PodInfo
from webhook.topology.model import NodeState


def _member_of(pod: PodInfo, scheduler_name: str) -> str | None:
    """The key of the gang `assemble` would put the pod in, or None."""
    return gang_key(pod)[0] if is_member(pod, scheduler_name) else None


class Snapshot:
    def __init__(self, scheduler_name: str) -> None:
        self.scheduler_name = scheduler_name
        self.allocation = Allocation({})
        self._pods: dict[str, PodInfo] = {}
        self._claims: dict[str, ClaimInfo] = {}
        self._members: dict[str, dict[str, PodInfo]] = {}  # gang key -> pod key -> pod
        self._unbound: dict[str, set[str]] = {}  # gang key -> keys of its unbound members
        self._states: dict[str, tuple[NodeInfo, NodeState]] = {}
        self._stale: set[str] = set()  # nodes whose usage changed since their state was made
        self._holders: dict[str, PodInfo] = {}  # pods with inter-pod terms (holds_terms)
        #: gang key -> (its PodGroup as read: None when the CRD is absent, False when there is
        #: no such PodGroup; the default timeout; the gang assembled from them)
        self._running: dict[str, tuple[PodGroupInfo | bool | None, int, Gang]] = {}

    def put(self, pod: PodInfo) -> bool:
        """The pod as the planner is to see it now (added or replaced). False when a plan
        cannot differ for it: the same pod, or only its resourceVersion is new (the informer
        showing a write we had assumed), or only when its job last checkpointed: that prices
        its gang as a victim when some change makes a gang preempt, and never makes one
        preempt (its job may say it every few minutes)."""
        old = self._pods.get(pod.key)
        if old is pod:
            return False
        changed = old is None or replace(old, resource_version=pod.resource_version,
                                         checkpointed=pod.checkpointed) != pod
        if old is not None:
            self._drop(old)
        self._pods[pod.key] = pod
        if holds_terms(pod):
            self._holders[pod.key] = pod
        self._touch(self.allocation.add(pod))
        gang = _member_of(pod, self.scheduler_name)
        if gang is not None:
            self._running.pop(gang, None)
            self._members.setdefault(gang, {})[pod.key] = pod
            if not pod.bound:
                self._unbound.setdefault(gang, set()).add(pod.key)
        return changed

    def remove(self, key: str) -> None:
        old = self._pods.pop(key, None)
        if old is not None:
            self._drop(old)

    def put_claim(self, claim: ClaimInfo) -> bool:
        """The claim as the planner is to see it now (added or replaced). True when the GPUs it
        holds changed."""
        old = self._claims.get(claim.key)
        self.remove_claim(claim.key)
        self._claims[claim.key] = claim
        self._touch(self.allocation.add_claim(claim))
        return old is None or (old.node, old.devices) != (claim.node, claim.devices)

    def remove_claim(self, key: str) -> bool:
        """Forget the claim; True when it held GPUs."""
        old = self._claims.pop(key, None)
        if old is not None:
            self._touch(self.allocation.remove_claim(old))
        return old is not None and old.node is not None

    def _drop(self, pod: PodInfo) -> None:
        self._holders.pop(pod.key, None)
        self._touch(self.allocation.remove(pod))
        gang = _member_of(pod, self.scheduler_name)
        if gang is None:
            return
        self._running.pop(gang, None)
        members = self._members[gang]
        del members[pod.key]
        if not members:
            del self._members[gang]
        unbound = self._unbound.get(gang)
        if unbound is not None:
            unbound.discard(pod.key)
            if not unbound:
                del self._unbound[gang]

    def _touch(self, node: str | None) -> None:
        if node is not None:
            self._stale.add(node)

    def open_gangs(self, pod_groups: Mapping[str, PodGroupInfo] | None,
                   podgroup_default_timeout: int) -> dict[str, Gang]:
        """The gangs with an unbound member, as `assemble` makes them from every pod."""
        return assemble((p for g in self._unbound for p in self._members[g].values()),
                        self.scheduler_name, pod_groups, podgroup_default_timeout)

    def running_gangs(self, pod_groups: Mapping[str, PodGroupInfo] | None,
                      podgroup_default_timeout: int) -> dict[str, Gang]:
        """The gangs whose members are all bound (preemption's candidates), as `assemble`
        makes them from every pod: the same Gang objects from cycle to cycle while their
        members and PodGroup are unchanged (so that what preemption derives from a gang may be
        kept by it)."""
        out: dict[str, Gang] = {}
        cached = self._running
        for key, members in self._members.items():
            if key in self._unbound:
                continue
            group = None if pod_groups is None else pod_groups.get(key, False)
            hit = cached.get(key)
            if hit is None or hit[0] != group or hit[1] != podgroup_default_timeout:
                made = assemble(members.values(), self.scheduler_name, pod_groups,
                                podgroup_default_timeout)[key]
                hit = cached[key] = (group, podgroup_default_timeout, made)
            out[key] = hit[2]
        for key in cached.keys() - out.keys():
            del cached[key]  # (a member unbound: an open gang now)
        return out

    def holds(self, key: str) -> bool:
        """Whether the pod `key` still holds resources (not gone, not ended)."""
        pod = self._pods.get(key)
        return pod is not None and holding_node(pod) is not None

    def neighbours(self, nodes: Mapping[str, NodeInfo], index: LabelIndex | None = None
                   ) -> Neighbours:
        """The pods on nodes, as inter-pod affinity terms count them (read on first use);
        `index`: the nodes by label value, kept by the caller's FitCache."""
        return Neighbours(self._pods.values(), self._holders.values(), nodes, index)

    def node_states(self, nodes: Mapping[str, NodeInfo]) -> dict[str, NodeState]:
        """What is free on each node, in `nodes` order (a fresh dict: the planner edits it)."""
        out: dict[str, NodeState] = {}
        cached = self._states
        for name, node in nodes.items():
            hit = cached.get(name)
            if hit is None or hit[0] is not node or name in self._stale:
                hit = cached[name] = (node, self.allocation.node_state(node))
            out[name] = hit[1]
        for name in self._stale.difference(nodes):
            cached.pop(name, None)  # not in `nodes`: its state was not remade above
        self._stale.clear()
        if len(cached) > len(nodes):
            for name in [n for n in cached if n not in nodes]:
                del cached[name]
        return out
