"""Gangs: the binder's pods grouped by the webhook's annotations or a coscheduling PodGroup."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from webhook.binder.pods import PodInfo
from webhook.topology.model import TopologyRequest


@dataclass(frozen=True, slots=True)
class PodGroupInfo:
    """The parts of a scheduling.x-k8s.io PodGroup the binder uses."""

    min_member: int
    timeout_seconds: int | None = None


@dataclass(slots=True)
class Gang:
    key: str  # "namespace/gang", or "namespace/pod:<name>" for a pod without a gang
    namespace: str
    name: str
    min_member: int = 1
    timeout_seconds: int | None = None
    members: list[PodInfo] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    # (these read node_name, not PodInfo.bound: a cycle reads them several times per gang)
    @property
    def bound(self) -> list[PodInfo]:
        return [p for p in self.members if p.node_name is not None]

    @property
    def reserved(self) -> list[PodInfo]:
        """Unbound members that carry an assignment annotation (written by a binder)."""
        return [p for p in self.members
                if p.node_name is None and p.assignment_raw is not None]

    @property
    def pending(self) -> list[PodInfo]:
        """Unbound members without an assignment: what the next placement must place."""
        return [p for p in self.members if p.node_name is None and p.assignment_raw is None]

    @property
    def recorded(self) -> list[tuple[PodInfo, str, tuple[int, ...]]]:
        """Pending members that a bound member's gang-placement record names, each with the
        node and GPUs of the slot the gang was placed with."""
        wanted = {p.name: p for p in self.pending}
        slots: dict[str, tuple[PodInfo, str, tuple[int, ...]]] = {}
        read: set[int] = set()
        for member in self.members:
            # a placement's members share one record object (pods._record): read each once,
            # or a large gang would cost members x record size per cycle
            if wanted and member.bound and member.placement and id(member.placement) not in read:
                read.add(id(member.placement))
                for name, node, gpus in member.placement:
                    if name in wanted:
                        slots.setdefault(name, (wanted[name], node, gpus))
        return list(slots.values())

    @property
    def priority(self) -> int:
        return max((p.priority for p in self.members), default=0)

    @property
    def created(self) -> float:
        return min((p.created for p in self.members), default=0.0)

    @property
    def topology(self) -> TopologyRequest | None:
        for pod in sorted(self.members, key=lambda p: (-p.gpus, p.name)):
            if pod.topology is not None:
                return pod.topology
        return None

    def may_preempt(self, default: str) -> bool:
        """Whether the gang may evict lower-priority gangs to be placed: its policy's
        gang.preemption (muster.io/gang-preemption; members of one webhook call agree, the
        stricter wins if not), else the binder's `default`; never when a member's
        PriorityClass says preemptionPolicy Never, which no annotation overrides."""
        said = {p.preemption for p in self.members if p.preemption is not None}
        wanted = ("Never" if "Never" in said else "LowerPriority") if said else default
        return wanted == "LowerPriority" and not any(p.never_preempts for p in self.members)

    def order_key(self) -> tuple[int, float, str]:
        """Queue order: higher priority first, then older, then by name (deterministic)."""
        return (-self.priority, self.created, self.key)


def is_member(pod: PodInfo, scheduler_name: str) -> bool:
    """Whether the pod belongs to a gang of this binder's: ours, alive, not being deleted, and
    not held by scheduling gates (kube-scheduler keeps a gated pod out of its queue, so a gang
    plugin never sees it arrive)."""
    return (pod.scheduler_name == scheduler_name and not pod.terminated and not pod.deleting
            and not pod.gated)


def gang_key(pod: PodInfo) -> tuple[str, str]:
    """(key, gang name) of the gang a pod belongs to."""
    if pod.gang_name:
        return f"{pod.namespace}/{pod.gang_name}", pod.gang_name
    if pod.pod_group:
        return f"{pod.namespace}/{pod.pod_group}", pod.pod_group
    return f"{pod.namespace}/pod:{pod.name}", pod.name


def assemble(pods: Iterable[PodInfo], scheduler_name: str,
             pod_groups: Mapping[str, PodGroupInfo] | None,
             podgroup_default_timeout: int = 60) -> dict[str, Gang]:
    """Gangs of the live pods that name our scheduler.

    minMember: the largest any member's annotation asks for (members written by one webhook call
    agree; the largest is the safe reading if they do not), or the PodGroup's. A coscheduling
    pod whose PodGroup does not exist is held with a problem, as the coscheduling plugin does.
    `pod_groups` None means the PodGroup CRD is not installed. A PodGroup without
    scheduleTimeoutSeconds gets coscheduling's default (60 s).
    """
    gangs: dict[str, Gang] = {}
    for pod in pods:
        if not is_member(pod, scheduler_name):
            continue
        key, name = gang_key(pod)
        gang = gangs.get(key)
        if gang is None:
            gang = gangs[key] = Gang(key=key, namespace=pod.namespace, name=name, min_member=0)
        gang.members.append(pod)
        for problem in (*pod.problems, *pod.claim_problems):
            if problem not in gang.problems:
                gang.problems.append(problem)
        if pod.gang_name:
            gang.min_member = max(gang.min_member, pod.min_member or 0)
            if pod.timeout_seconds is not None:
                gang.timeout_seconds = max(gang.timeout_seconds or 0, pod.timeout_seconds)
    for gang in gangs.values():
        first = gang.members[0]
        if first.gang_name is None and first.pod_group is not None:
            group = (pod_groups or {}).get(gang.key)
            if group is None:
                gang.problems.append(f"PodGroup {gang.key} not found")
            else:
                gang.min_member = group.min_member
                gang.timeout_seconds = group.timeout_seconds or podgroup_default_timeout
        gang.min_member = max(gang.min_member, 1)
        gang.members.sort(key=lambda p: (p.rank, p.name))  # (ranks where labels say them)
    return gangs
