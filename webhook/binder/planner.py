"""One scheduling cycle as a pure function: cluster snapshot in, actions out.

Rules (docs/binder.md has the reasoning):
- Recovery: every Binding of a gang records the whole placement (muster.io/gang-placement), so
  once a member is bound the others are reserved by that record. A pending member a bound
  member's record names is bound to its recorded node and GPUs if they are still free and it
  still fits there; otherwise it is placed afresh with the gang's other pending members.
  Unbound pods carrying an assignment annotation (an earlier Muster binder PATCHed every
  member's assignment before the first Binding; one may be upgraded mid-gang) are bound when
  their gang already has bound members or when the consistent reserved members reach minMember
  with the bound ones; otherwise they are stripped and the gang is placed afresh. Inconsistent
  reservations (node gone, GPUs changed or doubly assigned, pod no longer fits) are always
  stripped. Pods whose GPUs come through DRA claims (webhook.binder.dra) are reserved by their
  claims instead of an annotation, under the same rules; the record never binds one, as its
  claims are allocated only by a placement.
- Queue: ready gangs go in order (priority desc, oldest first). A gang that has failed for
  longer than `starvation_seconds` and that would fit on the empty cluster reserves: no gang
  after it in the order is placed until it is.
- Preemption: a gang that does not fit and may preempt (`Gang.may_preempt`) has the fewest,
  cheapest whole gangs of lower priority evicted whose going lets it be placed with its
  topology request (`webhook.binder.preemption`; `Plan.preempts`); what it will use is
  reserved for it (`webhook.binder.reserve`) until it is placed: taken from what is free right
  after its turn in every cycle, so no gang after it takes it.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from webhook import keys
from webhook.binder.agents import AGENT_WAIT
from webhook.binder.allocation import Allocation
from webhook.binder.assignment import (
    Assigner,
    AssignmentError,
    Record,
    assigned_indices,
    shape_matches,
    uuids_of,
)
from webhook.binder.claims import DEVICE_CLASS, ClaimInfo
from webhook.binder.fit import (
    FitCache,
    agent_details,
    agent_note,
    extended_on,
    gpu_serving,
    serves,
    why_not,
)
from webhook.binder.gangs import Gang, PodGroupInfo, assemble
from webhook.binder.interpod import Neighbours, holds_terms, one_per_node, rules, violation
from webhook.binder.nodes import NodeInfo
from webhook.binder.pods import PodInfo
from webhook.binder.prefer import Scores, preferred
from webhook.binder.queue import GangQueue
from webhook.binder.reserve import Reservation
from webhook.binder.spread import Spread, keys_of
from webhook.binder.spread import violation as spread_violation
from webhook.topology.groups import NodeGroups
from webhook.topology.hierarchy import joined
from webhook.topology.model import (
    GangPlacement,
    GangRequest,
    GpuAssignment,
    MemberRequest,
    NetworkRequest,
    NodeState,
    Unplaceable,
)
from webhook.topology.network import Levels, Network, resolved, topology_ref
from webhook.topology.placement import DEFAULT_INTER_NODE_GBPS
from webhook.topology.ringfloor import meets_min_ring


class PlaceFn(Protocol):
    """The placement engine (`webhook.topology.place_gang`), given the node set's network and
    the round's grouping of the nodes (the same placement, faster on a large cluster)."""

    def __call__(self, nodes: Sequence[NodeState], gang: GangRequest, *,
                 network: Network | None, groups: NodeGroups | None = None
                 ) -> GangPlacement | Unplaceable: ...


WaitKind = Literal["members", "invalid", "unplaceable", "blocked", "backoff"]
#: how the reasons of a gang short of members, and of one behind a gang that reserves, begin
#: (`muster analyze` reads them in a pod's PodScheduled condition to say what to do)
MEMBERS_WAIT = "waiting for members"
BLOCKED_WAIT = "queued behind gang"
#: how the reason of a gang waiting for the gangs it preempted goes on
PREEMPTING_WAIT = "waiting for the gangs"


@dataclass(frozen=True, slots=True)
class Place:
    gang: Gang
    placement: GangPlacement
    assignments: tuple[tuple[PodInfo, GpuAssignment], ...]

    @property
    def record(self) -> Record:
        """What every member's Binding records (muster.io/gang-placement)."""
        return tuple(sorted((p.name, a.node, tuple(sorted(assigned_indices(a))))
                            for p, a in self.assignments))


@dataclass(frozen=True, slots=True)
class Finish:
    """Bind reserved pods whose assignments are still valid."""

    gang: Gang
    assignments: tuple[tuple[PodInfo, GpuAssignment], ...]


@dataclass(frozen=True, slots=True)
class Strip:
    """Remove assignments from unbound pods so that the gang is placed afresh."""

    gang: Gang
    pods: tuple[PodInfo, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    gang: Gang
    kind: WaitKind
    reason: str
    timed_out: bool = False
    reserves: bool = False  # unplaceable gang that now holds back later gangs


@dataclass(frozen=True, slots=True)
class Preempt:
    """Evict `victims` (whole gangs of lower priority) so that `gang` can go where `place`
    says (within `domain`: "<label>=<value>, ...", "" for anywhere) once they are gone;
    `reservation` holds that for it meanwhile."""

    gang: Gang
    victims: tuple[Gang, ...]
    place: Place
    domain: str
    reservation: Reservation


class PreemptFn(Protocol):
    """The preemption planner (`webhook.binder.preemption.preempter`): for a gang that does
    not fit on `states` (what is free now), its victims and where it then goes, or why it
    preempts nothing (words its wait ends with)."""

    def __call__(self, gang: Gang, states: Mapping[str, NodeState]) -> Preempt | str: ...


@dataclass(slots=True)
class Plan:
    places: list[Place] = field(default_factory=list)
    preempts: list[Preempt] = field(default_factory=list)
    finishes: list[Finish] = field(default_factory=list)
    strips: list[Strip] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    gangs: dict[str, Gang] = field(default_factory=dict)
    allocation: Allocation = field(default_factory=lambda: Allocation({}))


@dataclass(frozen=True, slots=True)
class PlanConfig:
    scheduler_name: str
    starvation_seconds: float = 60.0
    #: coscheduling's default when a PodGroup sets no scheduleTimeoutSeconds
    podgroup_default_timeout: int = 60
    #: the cluster's network levels, node labels widest first, and their aliases
    #: (webhook.topology.network)
    levels: Levels = field(default_factory=Levels)
    #: per node, its domains of levels no node label carries: {level: domain}
    #: (`webhook.binder.hypernodes`)
    domains: Mapping[str, Mapping[str, str]] = field(default_factory=dict, compare=False)
    #: the API whose Topology objects the binder reads ("kai", "kueue"; `--network-levels
    #: kai:NAME`), and each one's levels as read, by reference ("kai:NAME")
    topology_api: str = ""
    topologies: Mapping[str, Levels] = field(default_factory=dict, compare=False)
    #: whether a gang whose policy does not say may preempt: "Never" or "LowerPriority"
    #: (`--preemption`)
    preemption: str = "Never"

    def levels_for(self, req: NetworkRequest) -> Levels | str:
        """The levels `req` resolves against: those of the Topology object it names, where the
        binder reads that API's Topologies, else the binder's own; why it waits where it names
        one the binder has not read."""
        topology = req.topology
        if topology is None or not self.topology_api or \
                not topology.startswith(f"{self.topology_api}:"):
            return self.levels
        found = self.topologies.get(topology)
        if found is not None:
            return found
        ref = topology_ref(topology)
        return (f"it names {ref.says if ref else topology}, which the binder has not read (not "
                "in the cluster, or its levels cannot be read)")


def _reservation(pod: PodInfo, nodes: Mapping[str, NodeInfo],
                 conflicts: Mapping[str, Mapping[int, list[str]]],
                 states: Mapping[str, NodeState]) -> GpuAssignment | str:
    """An annotated reservation's assignment if it still holds, else what is wrong with it."""
    a = pod.assignment
    if a is None:
        return ("only some of its ResourceClaims are allocated for it, or on different nodes"
                if pod.dra else "assignment annotation is unreadable")
    node = nodes.get(a.node)
    if node is None:
        return f"node {a.node} no longer exists"
    reason = why_not(pod.constraints, node)
    if reason is not None:
        return f"node {a.node}: {reason}"
    if not shape_matches(a, pod.container_gpus):
        return "assignment does not match the containers' GPU limits"
    indices = assigned_indices(a)
    if indices - node.healthy_gpus:
        return f"GPUs {sorted(indices - node.healthy_gpus)} are not healthy GPUs of {a.node}"
    if not pod.dra and any(c.uuids != uuids_of(node.topology, c.indices)
                           for c in a.containers.values()):  # a claim names devices, not UUIDs
        return f"GPU UUIDs on {a.node} changed"
    doubled = sorted(i for i in indices if i in conflicts.get(a.node, {}))
    if doubled:
        return f"GPUs {doubled} on {a.node} are assigned to another pod too"
    s = states[a.node]
    if s.free_cpu_milli < 0 or s.free_memory_bytes < 0 or s.free_pods < 0:
        return f"node {a.node} is overcommitted"
    return a


def _empty_state(node: NodeInfo) -> NodeState:
    gpus = frozenset(sorted(node.healthy_gpus)[: node.gpu_capacity])
    return NodeState(node.name, node.topology, gpus, node.cpu_milli, node.memory_bytes, node.pods,
                     node.nvlink_domain)


def _on_empty(r: _Round, request: GangRequest, network: Network | None, *, apart: bool,
              place: PlaceFn) -> GangPlacement | Unplaceable:
    """The gang placed on the empty cluster: could it ever run here (a starving gang reserves
    the cluster only then)?"""
    empty = [_empty_state(n) for n in r.nodes.values()]
    return place(_one_slot(empty) if apart else empty, request, network=network)


def _one_slot(states: Iterable[NodeState]) -> list[NodeState]:
    """The states with at most one pod slot each: the engine, which packs members, then gives
    each its own node (members whose anti-affinity by hostname counts each other)."""
    return [replace(s, free_pods=min(s.free_pods, 1)) for s in states]


def _meet(memo: dict[tuple[frozenset[str], frozenset[str]], frozenset[str]],
          a: frozenset[str], b: frozenset[str]) -> frozenset[str]:
    """a & b, one set object for members alike (the engine compares them often)."""
    kept = memo.get((a, b))
    if kept is None:
        kept = memo[a, b] = a & b
    return kept


def _request(gang: Gang, pending: list[PodInfo], nodes: Mapping[str, NodeInfo], fit: FitCache,
             nb: Neighbours | None) -> tuple[GangRequest, str] | str:
    """The gang (its `pending` members) as the engine takes it, and a note for its wait when
    inter-pod terms (`nb`: the placed pods, when some term concerns the gang) ruled nodes out;
    or why no node is eligible for one of its members."""
    topo = gang.topology
    # a single-node gang that already runs somewhere (e.g. a restarted worker) stays there
    home = frozenset(p.node_name for p in gang.bound if p.gpus and p.node_name)
    own: set[tuple[str, ...]] = set()
    note = ""
    narrowed: dict[tuple[frozenset[str], frozenset[str]], frozenset[str]] = {}
    members = []
    for pod in pending:
        eligible = fit.eligible(pod.constraints, nodes, gpu_serving(pod))
        if pod.gpus and home and topo is not None and topo.single_node:
            eligible = eligible & home
        if not eligible:
            return _no_node_reason(pod, nodes)
        if pod.spread:
            eligible = _meet(narrowed, eligible, fit.labels(nodes).carrying(keys_of(pod)))
            if not eligible:
                return (f"pod {pod.key}: no node it may use has the labels its "
                        f"topologySpreadConstraints need ({', '.join(keys_of(pod))})")
        if nb is not None:
            allowed = rules(pod, nb)
            if allowed.allowed is not None:
                kept = _meet(narrowed, eligible, allowed.allowed)
                if not kept:
                    return allowed.reason or (
                        f"pod {pod.key}: its podAffinity and podAntiAffinity, and the pods "
                        "already placed, allow none of the nodes its other constraints allow")
                if len(kept) < len(eligible) and not note:
                    note = (f" (inter-pod affinity rules out {len(eligible) - len(kept)} of "
                            f"the {len(eligible)} nodes pod {pod.key} could use otherwise)")
                eligible = kept
            if allowed.own:
                own.add(allowed.own)
        members.append(MemberRequest(
            key=pod.key, gpus=pod.gpus, cpu_milli=pod.cpu_milli,
            memory_bytes=pod.memory_bytes,
            eligible_nodes=None if len(eligible) == len(nodes) else eligible, rank=pod.rank,
        ))
    network = topo.network if topo is not None else None
    if network is None and len(own) == 1:
        # members whose affinity selects each other, and no placed pod (a launcher without the
        # term rides along): one domain for the gang, chosen as for a required level
        network = NetworkRequest(level=next(iter(own))[0], mode="required")
    return GangRequest(
        name=gang.key, members=tuple(members),
        mode=topo.mode if topo is not None else "preferred",
        single_node=topo.single_node if topo is not None else False,
        min_ring_gbps=topo.min_ring_gbps if topo is not None else None,
        network=network,
    ), note


def _join_bound(gang: Gang, request: GangRequest, network: Network
                ) -> tuple[GangRequest, str] | str:
    """The request with its members kept to the one domain of its required network level that
    the gang's bound members run in, and a note for its wait: a member placed while others run
    (a worker its controller made again) joins them there, as a placement of the whole gang
    would have put it. Or why no node of that domain is eligible for one."""
    net = request.network
    if net is None or net.level is None or net.mode != "required" or not gang.bound:
        return request, ""
    label = network.label(net.level)
    chain = network.chain(label)
    if label not in chain:
        return request, ""
    depth = chain.index(label) + 1
    domains = network.domains(chain, depth)
    homes = {domains.index.get(p.node_name or "") for p in gang.bound}
    if len(homes) != 1:
        return request, ""
    [home] = homes
    if home is None:  # (their node lacks the label)
        return request, ""
    domain = domains.members[home]
    value = network.paths(chain)[next(iter(domain))][depth - 1]
    members = []
    for m in request.members:
        eligible = domain if m.eligible_nodes is None else m.eligible_nodes & domain
        if not eligible:
            return (f"pod {m.key}: no node of {label}={value}, where its gang's bound members "
                    "run (its network level is required), is eligible for it")
        members.append(replace(m, eligible_nodes=eligible))
    return replace(request, members=tuple(members)), \
        f" (kept to {label}={value}, where its bound members run)"


def _serving_reason(pod: PodInfo, node: NodeInfo) -> str:
    """Why a node with a topology cannot serve the pod's GPUs."""
    serving = gpu_serving(pod)
    if serving == "dra":
        return "no ResourceSlice of the DRA driver"
    if serving == "either":
        return f"no allocatable {keys.GPU_RESOURCE} and no ResourceSlice of the DRA driver"
    if pod.gpu_class and pod.gpu_class != DEVICE_CLASS:
        return (f"no allocatable {keys.GPU_RESOURCE} (DeviceClass {pod.gpu_class} serves it "
                f"through DRA; this binder allocates only {DEVICE_CLASS})")
    if pod.gpu_class and isinstance(pod.extended, str):
        return (f"no allocatable {keys.GPU_RESOURCE} (not served through DRA: "
                f"{pod.extended})")
    if node.dra_gpus and not pod.dra:
        return (f"no allocatable {keys.GPU_RESOURCE}, and no DeviceClass serves it through DRA "
                "(extendedResourceName, Kubernetes 1.37+)")
    return f"no allocatable {keys.GPU_RESOURCE}"


def _no_node_reason(pod: PodInfo, nodes: Mapping[str, NodeInfo]) -> str:
    if not nodes:
        return "no nodes in the cluster"
    reasons: dict[str, int] = {}
    restarting: list[NodeInfo] = []
    for node in nodes.values():
        r = why_not(pod.constraints, node)
        if r is None and pod.gpus:
            r = ("unreadable GPU topology annotation" if node.topology_error
                 else "no published GPU topology") if node.topology is None else None
        if r is None and pod.gpus and node.agent_wait is not None:
            r = AGENT_WAIT
            restarting.append(node)
        if r is None and pod.gpus and not serves(node, gpu_serving(pod)):
            r = _serving_reason(pod, node)
        if r is not None:
            reasons[r] = reasons.get(r, 0) + 1
    detail = ", ".join(f"{n} node(s): {r}" for r, n in sorted(reasons.items(),
                                                                key=lambda kv: -kv[1])[:3])
    agents = f"; {agent_details(restarting)}" if restarting else ""
    return f"pod {pod.name}: 0/{len(nodes)} nodes are eligible ({detail}{agents})"


def plan(pods: Sequence[PodInfo], nodes: Mapping[str, NodeInfo],
         pod_groups: Mapping[str, PodGroupInfo] | None, *, config: PlanConfig,
         queue: GangQueue, fit: FitCache, place: PlaceFn, now: float,
         generation: int = 0, inflight: Collection[str] = (),
         claims: Sequence[ClaimInfo] = ()) -> Plan:
    """One cycle from every pod (DRA ones resolved: webhook.binder.dra) and claim: gangs,
    allocation and node states made from scratch."""
    allocation = Allocation.from_pods(pods, claims)
    gangs = assemble(pods, config.scheduler_name, pod_groups, config.podgroup_default_timeout)
    holders = [p for p in pods if holds_terms(p)]
    return plan_gangs(gangs, allocation,
                      {name: allocation.node_state(node) for name, node in nodes.items()},
                      nodes, config=config, queue=queue, fit=fit, place=place, now=now,
                      generation=generation, inflight=inflight,
                      neighbours=Neighbours(pods, holders, nodes))


def plan_gangs(gangs: Mapping[str, Gang], allocation: Allocation,
               states: dict[str, NodeState], nodes: Mapping[str, NodeInfo], *,
               config: PlanConfig, queue: GangQueue, fit: FitCache, place: PlaceFn,
               now: float, generation: int = 0, inflight: Collection[str] = (),
               neighbours: Neighbours | None = None, groups: NodeGroups | None = None,
               preempt: PreemptFn | None = None,
               reserved: Mapping[str, Reservation] | None = None) -> Plan:
    """One cycle from its inputs (webhook.binder.snapshot keeps them current): `states` is
    what is free per node under `allocation`, and is consumed by this cycle's placements;
    `neighbours` the pods on nodes, which inter-pod affinity terms count (none when None);
    `groups` the nodes grouped for the engine, kept by the caller across cycles (`sync`ed
    here: a fresh grouping when None); `preempt` decides preemptions (none when None);
    `reserved` the reservations of gangs that preempted, by gang key.
    Gangs whose members are all bound need nothing and are left out of the plan, so that a
    caller may pass only the others."""
    live = {k: g for k, g in sorted(gangs.items()) if any(not p.bound for p in g.members)}
    groups = groups if groups is not None else NodeGroups()
    groups.sync(list(states.values()))
    r = _Round(Plan(gangs=live, allocation=allocation), nodes, states, config, now,
               neighbours or Neighbours((), (), nodes), groups, preempt=preempt,
               reserved=dict(reserved or {}))
    conflicts = allocation.conflicts()
    candidates = [g for g in live.values()
                  if g.key not in inflight and _ready(r, g, conflicts)]
    candidates.sort(key=Gang.order_key)
    for key in r.reserved.keys() - {g.key for g in candidates}:
        _hold(r, key)
    blocker: Gang | None = None
    for gang in candidates:
        _turn(r, gang, blocker, queue=queue, fit=fit, place=place, generation=generation)
        if gang.key in r.reserved and not (r.out.places and r.out.places[-1].gang is gang):
            _hold(r, gang.key)
        if blocker is None and r.out.waits and r.out.waits[-1].gang is gang and \
                r.out.waits[-1].reserves:
            blocker = gang
    return r.out


def _turn(r: _Round, gang: Gang, blocker: Gang | None, *, queue: GangQueue, fit: FitCache,
          place: PlaceFn, generation: int) -> None:
    """The gang's turn in the queue: it waits behind `blocker`, or for its backoff, or is
    placed if it fits (a wait that `reserves` makes it the blocker of the gangs after it)."""
    if blocker is not None:
        r.wait(gang, "blocked", f"{BLOCKED_WAIT} {blocker.key}, which has waited longer "
               f"than {r.config.starvation_seconds:g}s for resources")
    elif not queue.due(gang.key, r.now, generation):
        r.wait(gang, "backoff", "", queue.reserves(gang.key))
    else:
        _try_place(r, gang, queue, fit, place)


@dataclass(slots=True)
class _Round:
    """One planning round: its result so far, the nodes, and what is free on them now."""

    out: Plan
    nodes: Mapping[str, NodeInfo]
    states: dict[str, NodeState]
    config: PlanConfig
    now: float
    #: the pods on nodes, this round's placements added, as inter-pod terms count them
    neighbours: Neighbours
    #: `states` grouped for the engine, kept current by `consume`
    groups: NodeGroups
    #: the round's assignments: a job's pods share their containers' shape
    assign: Assigner = field(default_factory=Assigner)
    preempt: PreemptFn | None = None
    #: the reservations of gangs that preempted, not yet taken from `states` (`_hold`)
    reserved: dict[str, Reservation] = field(default_factory=dict)

    def consume(self, node: str, need: MemberRequest | PodInfo, gpus: Collection[int]) -> None:
        """Take what `need` uses on `node` (its `gpus`) from what is free there."""
        state = self.states[node].less(gpus, need.cpu_milli, need.memory_bytes)
        self.states[node] = state
        self.groups.put(state)

    def wait(self, gang: Gang, kind: WaitKind, why: str, reserves: bool = False) -> None:
        timed_out = gang.timeout_seconds is not None and \
            self.now - gang.created >= gang.timeout_seconds
        self.out.waits.append(Wait(gang, kind, why, timed_out, reserves))


_Conflicts = Mapping[str, Mapping[int, list[str]]]


def _ready(r: _Round, gang: Gang, conflicts: _Conflicts) -> bool:
    """Whether the gang is to be placed now; otherwise what happens to it is recorded (it is
    invalid, finishes or strips its reservations, or waits for members)."""
    if gang.problems:
        r.wait(gang, "invalid", "; ".join(gang.problems))
        return False
    if gang.reserved:
        _settle_reservations(r, gang, conflicts)
        return False
    pending = gang.pending
    if not pending or _finish_recorded(r, gang):
        return False
    have = len(gang.bound) + len(pending)
    if have < gang.min_member:
        r.wait(gang, "members", f"{MEMBERS_WAIT}: {have} of minMember {gang.min_member} exist")
        return False
    return True


def _settle_reservations(r: _Round, gang: Gang, conflicts: _Conflicts) -> None:
    """Members reserved (annotated) by an earlier round: bind the good ones if the gang is
    whole with them, strip the ones whose reservation no longer holds."""
    ok: list[tuple[PodInfo, GpuAssignment]] = []
    bad: list[tuple[PodInfo, str]] = []
    for pod in gang.reserved:
        held = _reservation(pod, r.nodes, conflicts, r.states)
        if isinstance(held, str):
            bad.append((pod, held))
        else:
            ok.append((pod, held))
    if gang.bound or len(gang.bound) + len(ok) >= gang.min_member:
        if ok:
            r.out.finishes.append(Finish(gang, tuple(ok)))
        if bad:
            r.out.strips.append(Strip(gang, tuple(p for p, _ in bad), bad[0][1]))
    else:
        why = bad[0][1] if bad else (
            f"only {len(ok)} of minMember {gang.min_member} members were reserved")
        r.out.strips.append(Strip(gang, tuple(gang.reserved), why))


def _finish_recorded(r: _Round, gang: Gang) -> bool:
    """Bind the pending members that a bound member's record reserves, where the recorded slot
    is still free and the pod still fits it; True when there are some. The others are placed
    afresh (the gang has a bound member: it is completed, not released)."""
    finish: list[tuple[PodInfo, GpuAssignment]] = []
    for pod, node, gpus in gang.recorded:
        served = r.nodes.get(node)
        if pod.dra or (served is not None and extended_on(pod, served)):
            continue  # bound only once its claims are allocated: by a placement of its own
        assignment = _recorded_assignment(r, pod, node, gpus)
        if assignment is not None:
            finish.append((pod, assignment))
    if finish:
        r.out.finishes.append(Finish(gang, tuple(finish)))
    return bool(finish)


def _recorded_assignment(r: _Round, pod: PodInfo, node_name: str, gpus: tuple[int, ...]
                         ) -> GpuAssignment | None:
    """The pod's assignment to its recorded slot, taken from the round's free resources; None
    when the slot no longer holds (node gone or changed, GPUs taken, the pod does not fit)."""
    node, state = r.nodes.get(node_name), r.states.get(node_name)
    if (node is None or state is None or why_not(pod.constraints, node) is not None
            or len(gpus) != pod.gpus or not state.free_gpus.issuperset(gpus)
            or state.free_cpu_milli < pod.cpu_milli
            or state.free_memory_bytes < pod.memory_bytes or state.free_pods < 1):
        return None
    try:
        assignment = r.assign.build(node_name, node.topology, gpus, pod.container_gpus,
                                    pod.init_containers, sidecars=pod.sidecars)
    except AssignmentError:
        return None
    r.consume(node_name, pod, gpus)
    r.neighbours.add(pod, node_name)
    return assignment


def _hold(r: _Round, key: str) -> None:
    """Take what the reservation of gang `key` holds from what is free: no gang after it in
    this round gets it."""
    for slot in r.reserved.pop(key).slots:
        state = r.states.get(slot.node)
        if state is not None:
            state = r.states[slot.node] = state.less(slot.gpus, slot.cpu_milli,
                                                      slot.memory_bytes)
            r.groups.put(state)


def _preempting(r: _Round, gang: Gang, why: str) -> str | None:
    """For a gang that does not fit (`why`): None when it waits for the gangs it preempted
    to go, or preempts some now (`Plan.preempts`; its reservation is held after its turn);
    else what its wait adds (why it preempts nothing, where it may preempt)."""
    held = r.reserved.get(gang.key)
    if held is not None:
        r.wait(gang, "unplaceable", f"{why}; {PREEMPTING_WAIT} it preempted "
               f"({', '.join(held.victims)}) to go")
        return None
    if r.preempt is None or not gang.may_preempt(r.config.preemption):
        return ""
    found = r.preempt(gang, r.states)
    if isinstance(found, str):
        return found
    r.out.preempts.append(found)
    r.reserved[gang.key] = found.reservation
    where = f" in {found.domain}" if found.domain else ""
    r.wait(gang, "unplaceable", f"{why}; {PREEMPTING_WAIT} of lower priority "
           f"({', '.join(v.key for v in found.victims)}) to go: it fits{where} without them")
    return None


def _try_place(r: _Round, gang: Gang, queue: GangQueue, fit: FitCache, place: PlaceFn
               ) -> None:
    """Place the gang on what is free; if it cannot be, it waits (and, starving, reserves
    the cluster: the gangs behind it wait), or preempts."""
    pending = gang.pending  # (read once: a list made from the members)
    terms = r.neighbours if r.neighbours.active(pending) else None
    asked = _asked(r, gang, pending, fit, terms)
    if isinstance(asked, str):
        r.wait(gang, "unplaceable", asked)
        return
    request, note, network = asked
    apart = terms is not None and one_per_node(pending)

    def engine(req: GangRequest) -> GangPlacement | Unplaceable:
        if apart:
            return place(_one_slot(r.states.values()), req, network=network)
        return place(list(r.states.values()), req, network=network, groups=r.groups)

    result = engine(request)
    if isinstance(result, Unplaceable):
        note += agent_note(pending, fit.restarting(r.nodes))
        _unplaced(r, gang, queue, request, result.reason + note, network=network, apart=apart,
                  place=place)
        return
    by_key = {p.key: p for p in pending}
    scores = Scores(r.nodes, r.states, r.neighbours)
    if any(map(scores.weighs, pending)):
        result = preferred(request, result, by_key, scores, engine=engine,
                           paths=_near(gang, network))
    spread = any(p.spread for p in pending)
    if terms is not None or spread:
        kept = _kept(r, gang, request, result, by_key, place=place, terms=terms,
                     spread=spread, network=network)
        if isinstance(kept, str):
            r.wait(gang, "unplaceable", kept)
            return
        result = kept
    _commit(r, gang, request, result, by_key)


def _asked(r: _Round, gang: Gang, pending: list[PodInfo], fit: FitCache,
           terms: Neighbours | None) -> tuple[GangRequest, str, Network | None] | str:
    """The gang as the engine takes it, a note for its wait, and the network its levels make
    (None: it asks for none); or why it cannot be placed."""
    asked = _request(gang, pending, r.nodes, fit, terms)
    if isinstance(asked, str):
        return asked
    request, note = asked
    if request.network is None:
        return request, note, None
    levels = r.config.levels_for(request.network)
    if isinstance(levels, str):
        return f"gang {gang.name}: {levels}"
    network = fit.network(r.nodes, levels, r.config.domains)
    home = _join_bound(gang, request, network)
    if isinstance(home, str):
        return home
    request, kept_to = home
    return request, note + kept_to, network


def _unplaced(r: _Round, gang: Gang, queue: GangQueue, request: GangRequest, why: str, *,
              network: Network | None, apart: bool, place: PlaceFn) -> None:
    """A gang the engine cannot place preempts, or waits (and, starving, reserves the cluster
    when it would fit on it empty)."""
    declined = _preempting(r, gang, why)
    if declined is None:
        return
    since = queue.waiting_since(gang.key)
    starving = since is not None and r.now - since >= r.config.starvation_seconds
    reserves = starving and isinstance(_on_empty(r, request, network, apart=apart, place=place),
                                       GangPlacement)
    r.wait(gang, "unplaceable", why + declined, reserves)


def _near(gang: Gang, network: Network | None) -> Mapping[str, tuple[str, ...]] | None:
    """Each node's domains of the levels the gang asks for, widest first (None: it asks for
    no level, or the levels are not known)."""
    topo = gang.topology
    net = topo.network if topo is not None else None
    if net is None or network is None or net.unconstrained:
        return None
    net = resolved(net, network)  # (aliases and tiers as labels, as the placement reads them)
    return network.paths(network.chain(net.max_level, net.level))


def _commit(r: _Round, gang: Gang, request: GangRequest, result: GangPlacement,
            by_key: Mapping[str, PodInfo]) -> None:
    """The placement is the plan's: its assignments made, what it uses taken from the round."""
    members = {m.key: m for m in request.members}
    assignments = []
    for mp in result.members:
        pod = by_key[mp.key]
        node = r.nodes[mp.node]
        assignments.append((pod, r.assign.build(mp.node, node.topology, mp.gpus,
                                                pod.container_gpus, pod.init_containers,
                                                sidecars=pod.sidecars)))
        r.consume(mp.node, members[mp.key], mp.gpus)
        r.neighbours.add(pod, mp.node)
    r.out.places.append(Place(gang, result, tuple(assignments)))


def _kept(r: _Round, gang: Gang, request: GangRequest, result: GangPlacement,
          by_key: Mapping[str, PodInfo], *, place: PlaceFn, terms: Neighbours | None,
          spread: bool, network: Network | None) -> GangPlacement | str:
    """The engine's placement when it keeps the members' inter-pod terms (`terms`: when some
    concern the gang) and topology spread constraints. Else, unless the gang must be whole
    within one node or one domain its topology asks for, its members placed one at a time, as
    kube-scheduler binds them, when that keeps them (the engine packs members: one per node,
    one rack each, or subgroups apart by rack are not its choice). Else why not, in words.
    `spread`: some member has a topology spread constraint."""
    broken = _broken(result, by_key, r.neighbours, terms, spread)
    if broken is None:
        return result
    topo = gang.topology
    net = topo.network if topo is not None else None
    if net is not None:  # (aliases and tiers as labels, as the placement reads them)
        net = resolved(net, network)
    if (request.single_node and request.mode == "required") or (net is not None and (
            (net.level is not None and net.mode == "required") or net.slice_level is not None)):
        return broken
    # (an unconstrained gang's members go where each fits best, not near each other)
    apart = _Apart(r, request, by_key, place, terms, _near(gang, network), dict(r.states)).run()
    if isinstance(apart, Unplaceable):
        return f"{broken}; one member at a time, {apart.reason}"
    again = _broken(apart, by_key, r.neighbours, terms, spread)  # (by construction, none)
    return apart if again is None else f"{broken}; one member at a time, {again}"


def _broken(result: GangPlacement, by_key: Mapping[str, PodInfo], nb: Neighbours,
            terms: Neighbours | None, spread: bool) -> str | None:
    """The first inter-pod term or topology spread constraint the placement breaks, counting
    the pods on nodes and the gang's own members, in words; None when it keeps them all."""
    placed = [(by_key[mp.key], mp.node) for mp in result.members]
    why = spread_violation(placed, nb) if spread else None
    if why is None and terms is not None:
        why = violation(placed, terms)
    return why


@dataclass(slots=True)
class _Apart:
    """A gang placed one member at a time, as kube-scheduler binds them: each on the node the
    engine likes best of those its inter-pod terms and topology spread constraints allow, the
    members before it counted; with `near` (each node's domains, widest first: the gang asks
    for a network level), as close to the first member as it can be (its narrowest domain,
    else each wider one, else anywhere). On a copy of the round's states (`states`), as only
    `_commit` consumes them; the round's node groups (the engine reads them, not every node)
    and the placed pods follow the members meanwhile, and are put back after."""

    r: _Round
    request: GangRequest
    by_key: Mapping[str, PodInfo]
    place: PlaceFn
    terms: Neighbours | None
    near: Mapping[str, tuple[str, ...]] | None
    states: dict[str, NodeState]
    spread: Spread = field(init=False)
    #: every node's name, for members eligible everywhere
    everywhere: frozenset[str] = field(init=False)
    #: the nodes within a domain (its path, widest first), made on first use
    within: dict[tuple[str, ...], frozenset[str]] = field(init=False, default_factory=dict)
    #: the members' preferences, each job's scored once, over the nodes it fits on as the
    #: first of its members is placed (a node the members before it filled is passed over by
    #: the engine, and the next best tried)
    scores: Scores = field(init=False)

    def __post_init__(self) -> None:
        self.spread = Spread(self.r.neighbours)
        self.everywhere = frozenset(self.r.nodes)
        self.scores = Scores(self.r.nodes, self.states, self.r.neighbours)

    def run(self) -> GangPlacement | Unplaceable:
        mark = self.r.neighbours.mark()
        try:
            return self._place_all()
        finally:
            self.r.neighbours.rollback(mark)
            for node in [n for n, s in self.states.items() if s is not self.r.states[n]]:
                self.r.groups.put(self.r.states[node])

    def _place_all(self) -> GangPlacement | Unplaceable:
        placed: list[GangPlacement] = []  # each member's, alone
        anchor: tuple[str, ...] = ()
        for m in self.request.members:
            pod = self.by_key[m.key]
            got = self._closest(m, self._may_go(m, pod), anchor)
            if isinstance(got, Unplaceable):
                return got
            (mp,) = got.members
            self.states[mp.node] = self.states[mp.node].less(mp.gpus, m.cpu_milli,
                                                             m.memory_bytes)
            self.r.groups.put(self.states[mp.node])
            self.spread.add(pod, mp.node)
            if self.terms is not None:
                self.terms.add(pod, mp.node)
            placed.append(got)
            if not anchor and self.near is not None:
                anchor = self.near.get(mp.node, ())
        result = joined(placed, self.states.values(), DEFAULT_INTER_NODE_GBPS)
        total = sum(m.gpus for m in self.request.members)
        floor = self.request.min_ring_gbps
        if self.request.mode == "required" and not meets_min_ring(result.gang_gbps, floor,
                                                                  total):
            return Unplaceable(f"the gang would have {result.gang_gbps:g} GB/s of allreduce "
                               f"bus bandwidth, under its minRingGBps {floor:g}")
        return result

    def _may_go(self, m: MemberRequest, pod: PodInfo) -> frozenset[str]:
        """The nodes a member may go to now: its eligible ones, less those its topology spread
        constraints block, within those its inter-pod terms allow, the members placed counted."""
        may = m.eligible_nodes if m.eligible_nodes is not None else self.everywhere
        if pod.spread:
            may = may - self.spread.blocked(pod)
        allowed = rules(pod, self.terms).allowed if self.terms is not None else None
        return may if allowed is None else may & allowed

    def _closest(self, m: MemberRequest, may: frozenset[str], anchor: tuple[str, ...]
                 ) -> GangPlacement | Unplaceable:
        """The engine's choice for the member among `may`: within the anchor's narrowest
        domain when it can, else each wider one, else anywhere."""
        tries = (may & self._within(anchor[:depth])
                 for depth in range(len(anchor), 0, -1))  # (made only while needed)
        got: GangPlacement | Unplaceable = Unplaceable("no node")
        for nodes in itertools.chain((t for t in tries if t and len(t) < len(may)), (may,)):
            one = replace(self.request, members=(replace(m, eligible_nodes=nodes),),
                          network=None, single_node=False, min_ring_gbps=None)
            got = self._engine(one)
            if isinstance(got, GangPlacement):
                if self.scores.weighs(self.by_key[m.key]):
                    got = preferred(one, got, self.by_key, self.scores, engine=self._engine,
                                    paths=None, scored_as={m.key: m})
                break
        return got

    def _engine(self, one: GangRequest) -> GangPlacement | Unplaceable:
        """The engine's choice for one member on what is free now."""
        return self.place(list(self.states.values()), one, network=None, groups=self.r.groups)

    def _within(self, domain: tuple[str, ...]) -> frozenset[str]:
        """The nodes within a domain, named by its path (widest first)."""
        found = self.within.get(domain)
        if found is None:
            found = self.within[domain] = frozenset(
                n for n, path in (self.near or {}).items() if path[:len(domain)] == domain)
        return found
