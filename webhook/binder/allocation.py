"""Allocation state derived from the cluster: what every live pod uses on every node.

Derived from pods and ResourceClaims only, so a restarted binder knows exactly what its
predecessor did. A pod holds node resources when it is bound, or when it carries a GPU assignment
but is not yet bound (the binder reserved them); GPUs are held by every non-terminated pod whose
assignment names them. Only the binder's own pods have an assignment here
(`pods.trusted_annotations`): a bound pod of another scheduler holds as many GPUs as it asks for,
which ones unknown, whatever its annotations say. A pod whose GPUs come through DRA holds none
itself: every claim allocated with devices of our driver holds those, whoever allocated it
(this binder or kube-scheduler), until its allocation is removed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from webhook.binder.assignment import assigned_indices
from webhook.binder.claims import ClaimInfo
from webhook.binder.nodes import NodeInfo
from webhook.binder.pods import PodInfo
from webhook.topology.model import NodeState


def holding_node(pod: PodInfo) -> str | None:
    """The node whose resources a live pod holds, if any."""
    if pod.terminated:
        return None
    if pod.node_name is not None:
        return pod.node_name
    return pod.assignment.node if pod.assignment is not None else None


@dataclass(slots=True)
class NodeUsage:
    cpu_milli: int = 0
    memory_bytes: int = 0
    pods: int = 0
    #: GPU index → keys of live pods whose assignment names it, and of the claims allocated
    #: it ("claim:" + key)
    gpus: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))
    #: GPUs used by bound pods without a (readable) assignment: count known, indices not
    unknown_gpus: int = 0


class Allocation:
    """Per-node usage; `add` and `remove` keep it current pod by pod (webhook.binder.snapshot),
    so that it always equals `from_pods` of the pods added and not removed."""

    def __init__(self, usage: Mapping[str, NodeUsage]) -> None:
        self.usage = dict(usage)
        #: nodes where a GPU may have several holders: `conflicts`, asked every cycle, looks
        #: at these only, not at every node (a tenth of an idle cycle with 500 nodes)
        self._shared = {n for n, u in self.usage.items()
                        if any(len(keys) > 1 for keys in u.gpus.values())}

    @classmethod
    def from_pods(cls, pods: Iterable[PodInfo], claims: Iterable[ClaimInfo] = ()
                  ) -> Allocation:
        alloc = cls({})
        for pod in pods:
            alloc.add(pod)
        for claim in claims:
            alloc.add_claim(claim)
        return alloc

    def add(self, pod: PodInfo) -> str | None:
        """Count what the pod holds; the node it holds resources on, if any."""
        return self._count(pod, 1)

    def remove(self, pod: PodInfo) -> str | None:
        """Undo `add` of the same pod."""
        return self._count(pod, -1)

    def _count(self, pod: PodInfo, sign: int) -> str | None:
        node = holding_node(pod)
        if node is None:
            return None
        u = self.usage.get(node)
        if u is None:
            u = self.usage[node] = NodeUsage()
        u.cpu_milli += sign * pod.cpu_milli
        u.memory_bytes += sign * pod.memory_bytes
        u.pods += sign
        if pod.dra:
            return node  # its claims hold its GPUs (add_claim)
        if pod.assignment is not None and pod.assignment.node == node:
            self._hold(node, u, assigned_indices(pod.assignment), pod.key, sign)
        elif pod.gpus and pod.node_name is not None:
            u.unknown_gpus += sign * pod.gpus
        return node

    def add_claim(self, claim: ClaimInfo) -> str | None:
        """Count the GPUs of our driver allocated to the claim; the node they are on, if any."""
        return self._count_claim(claim, 1)

    def remove_claim(self, claim: ClaimInfo) -> str | None:
        """Undo `add_claim` of the same claim."""
        return self._count_claim(claim, -1)

    def _count_claim(self, claim: ClaimInfo, sign: int) -> str | None:
        if claim.node is None:
            return None
        u = self.usage.get(claim.node)
        if u is None:
            u = self.usage[claim.node] = NodeUsage()
        self._hold(claim.node, u, {i for _, i in claim.devices}, "claim:" + claim.key, sign)
        return claim.node

    def _hold(self, node: str, u: NodeUsage, indices: Iterable[int], holder: str,
              sign: int) -> None:
        for index in indices:
            holders = u.gpus[index]
            if sign > 0:
                holders.append(holder)
                if len(holders) > 1:
                    self._shared.add(node)
            else:
                holders.remove(holder)
                if not holders:  # a listed index counts as held (node_state, assigned_gpus)
                    del u.gpus[index]

    def conflicts(self) -> dict[str, dict[int, list[str]]]:
        """GPUs named by more than one live pod's assignment or allocated claim, per node."""
        out: dict[str, dict[int, list[str]]] = {}
        for node in sorted(self._shared):
            dup = {i: keys for i, keys in self.usage[node].gpus.items() if len(keys) > 1}
            if dup:
                out[node] = dup
            else:
                self._shared.discard(node)  # resolved since: a pod let go
        return out

    def assigned_gpus(self, node: str) -> int:
        u = self.usage.get(node)
        return 0 if u is None else len(u.gpus) + u.unknown_gpus

    def node_state(self, node: NodeInfo) -> NodeState:
        u = self.usage.get(node.name) or NodeUsage()
        free = node.healthy_gpus.difference(u.gpus)
        if node.dra_gpus and not node.gpus:
            free &= node.dra_gpus  # DRA alone serves it: only the devices its slice publishes
        if u.unknown_gpus:
            # Someone else's pods use GPUs here without telling us which: hold back that many,
            # from the top, rather than risk handing one out twice.
            free = frozenset(sorted(free)[: max(0, len(free) - u.unknown_gpus)])
        if node.topology is not None and node.gpu_capacity < node.topology.size:
            # the device plugin and DRA advertise fewer than the topology lists: never exceed
            allowed = max(0, node.gpu_capacity - len(u.gpus) - u.unknown_gpus)
            free = frozenset(sorted(free)[:allowed])
        return NodeState(
            name=node.name,
            topology=node.topology,
            free_gpus=free,
            free_cpu_milli=node.cpu_milli - u.cpu_milli,
            free_memory_bytes=node.memory_bytes - u.memory_bytes,
            free_pods=node.pods - u.pods,
            nvlink_domain=node.nvlink_domain,
        )
