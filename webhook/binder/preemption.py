"""Gang-aware preemption as a pure function: which whole running gangs to evict so that a
waiting gang of higher priority can be placed with its topology request (docs/binder.md,
"Priority and preemption").

The question "does the gang fit once these gangs are gone?" is answered by the binder's own
planning cycle (`planner.plan_gangs`) on the nodes of one candidate domain, their states with
the victims' GPUs, CPU, memory and pod slots given back: the same filters, network levels and
placement engine that will place the gang once the victims are gone, not a second fit model.

The search, cheap before it is exact:
1. Victims: running gangs of this binder of strictly lower priority whose every member may
   be evicted now (no PodDisruptionBudget forbids it), not admitted by Kueue (Kueue's to
   preempt), none of their pods being deleted; never part of a gang. The work a victim loses
   is its GPUs times the time since it started (its members' latest `status.startTime`, which
   the kubelet sets), not since it was created: a gang that queued for hours and started a
   minute ago loses a minute. Where its job says when it last saved its state (the latest
   `muster.io/last-checkpoint-time` of its members), since then: a gang that checkpointed a
   minute ago loses a minute too. The job's word can only lower its own gang's price (a time
   before its start counts as its start, one to come as now), never raise it, nor touch
   another gang's.
2. Domains: where the gang must or should be, one domain at a time: each domain of its
   network level (required: only those; preferred: those, and the whole cluster), each node
   for a single-node gang (preferred: likewise), else the whole cluster.
3. Per domain, the victims touching it, cheapest per GPU first (lowest priority, then the
   least work lost per GPU it frees: the youngest; then the most GPUs freed there); a domain
   whose room with all its victims gone cannot hold the gang is skipped unseen, and the
   prefix of victims that gives it room enough is its estimate (no fit tested yet). Room is
   counted in members, whole pods per node: GPUs a few here and there hold no pod.
4. Domains in order of estimate (at equal estimates, in the order of preference): victims
   are added from that prefix on until the gang fits; then every victim with no pod on the
   nodes the placement uses is dropped (it freed nothing the placement takes: no trial
   needed), and each other one is dropped if the gang still fits without it (a minimal set;
   tried only where the room left without it could still hold the gang).
   The search stops at the first domain whose set costs no more than the next domain's
   estimate, or after `MAX_DOMAINS` domains were tested. A trial places on the domain's
   nodes with a free GPU once the victims are gone, and its nodes without GPUs (where a
   launcher may go): a GPU node left full serves no member here, and a trial over the whole
   cluster then reads what can change, not every node.
5. Narrow domains against the whole cluster: a gang that prefers a level gets one of its
   domains freed (prefer one rack over scattered GPUs in many) unless the whole cluster's set
   loses less than 1/`LOCALITY_WORTH` of the domain's; the whole cluster when none can be.
The cost of a set: (its highest priority, GPU-seconds lost, GPUs, gangs), compared in order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from webhook import keys
from webhook.binder.allocation import Allocation, holding_node
from webhook.binder.assignment import assigned_indices
from webhook.binder.fit import FitCache
from webhook.binder.gangs import Gang
from webhook.binder.nodes import NodeInfo
from webhook.binder.planner import Place, PlaceFn, PlanConfig, Preempt, PreemptFn, plan_gangs
from webhook.binder.pods import PodInfo
from webhook.binder.queue import GangQueue
from webhook.binder.reserve import reservation
from webhook.topology.model import NodeState
from webhook.topology.network import HOSTNAME, Domains, resolved

#: domains whose fit is tested at most, per decision (each costs a few planning trials)
MAX_DOMAINS = 4
#: planning trials at most, per decision (a bound on its latency)
MAX_TRIALS = 24
#: a gang's preferred (not required) level is worth this many times the work lost: one of
#: its domains is freed unless the whole cluster's victims lose less than 1/this of that
LOCALITY_WORTH = 2

Cost = tuple[int, float, int, int]


@dataclass(frozen=True, slots=True)
class Held:
    """What a running gang holds, read from its members once (a `Running` is kept from cycle
    to cycle while its gang is unchanged; a decision reads these for every candidate)."""

    #: its pods by the node they hold resources on, and the GPUs they hold there
    on: dict[str, list[PodInfo]]
    gpus_on: dict[str, int]
    gpus: int
    #: when it started (its members' latest status.startTime; 0: a member it holds resources
    #: for has not started, so the gang has done no work yet) and its highest priority
    started: float
    priority: int
    #: when its job last saved its state, by its members' word (0: none says)
    saved: float
    #: the schedulers its pods name; whether one of them is being deleted or has ended
    schedulers: frozenset[str]
    going: bool


def held(gang: Gang) -> Held:
    on: dict[str, list[PodInfo]] = {}
    gpus_on: dict[str, int] = {}
    going = False
    started: float | None = 0.0
    saved = 0.0
    for pod in gang.members:
        going = going or pod.deleting or pod.terminated
        node = holding_node(pod)
        if node is not None:
            on.setdefault(node, []).append(pod)
            gpus_on[node] = gpus_on.get(node, 0) + pod.gpus
            # a gang works once its last member runs: lost work counts from then (not from
            # creation, which includes its time in the queue)
            started = None if started is None or not pod.started else max(started, pod.started)
            saved = max(saved, pod.checkpointed)
    return Held(on, gpus_on, sum(gpus_on.values()), started or 0.0, gang.priority, saved,
                frozenset(p.scheduler_name for p in gang.members), going)


def work_since(h: Held, now: float) -> float:
    """Seconds of work the gang would lose were it evicted `now`: since it started, or since
    its last checkpoint when it says so (never before its start, never in the future)."""
    if h.started <= 0:
        return 0.0  # a member has not started: the gang has done no work yet
    return max(0.0, now - max(h.started, h.saved))


@dataclass(frozen=True, slots=True)
class Running:
    """A running gang of this binder, as a victim candidate.

    `gang`: its members (as `gangs.assemble` makes them; the bound ones hold resources);
    `evictable`: every PodDisruptionBudget covering its pods allows evicting all of them now
    (the Eviction API would not answer 429); `kueue_admitted`: Kueue admitted its workload
    (Kueue preempts it, not Muster); `held`: what it holds (`held(gang)`, made here)."""

    gang: Gang
    evictable: bool = True
    kueue_admitted: bool = False
    held: Held = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "held", held(self.gang))


@dataclass(frozen=True, slots=True)
class Preemption:
    """The decision: evict `victims` (whole gangs), then `place` is where the preemptor fits
    (within `domain`: "<label>=<value>" of each level down to the one it asks for, or "" for
    the whole cluster)."""

    victims: tuple[Running, ...]
    place: Place
    domain: str

    @property
    def gpus(self) -> int:
        return sum(_gpus(v.gang) for v in self.victims)


#: why a running gang may not be a victim: each kind, as its wait counts such gangs
Problem = Literal["preemptor", "priority", "kueue", "budget", "foreign", "going", "empty"]
_COUNTED: dict[Problem, str] = {
    "priority": "of priority {p} or more", "kueue": "admitted by Kueue (Kueue preempts them)",
    "budget": "that a PodDisruptionBudget protects now",
    "foreign": "with pods of another scheduler", "going": "going already"}


def victim_problem(preemptor: Gang, candidate: Running, scheduler_name: str,
                   priority: int | None = None) -> str | None:
    """Why `candidate` may not be evicted for `preemptor` (of `priority`: its own when None),
    or None when it may."""
    above = preemptor.priority if priority is None else priority
    kind = _problem(preemptor, candidate, scheduler_name, above)
    return None if kind is None else {
        "preemptor": "it is the preemptor",
        "priority": f"its priority {candidate.held.priority} is not lower than {above}",
        "kueue": "Kueue admitted it (Kueue preempts its workloads)",
        "budget": "a PodDisruptionBudget forbids evicting it now",
        "foreign": "some of its pods are another scheduler's",
        "going": "it is already going",
        "empty": "it holds nothing"}[kind]


def _problem(preemptor: Gang, candidate: Running, scheduler_name: str, above: int
             ) -> Problem | None:
    facts = candidate.held
    if candidate.gang.key == preemptor.key:
        return "preemptor"
    if facts.priority >= above:
        return "priority"
    if candidate.kueue_admitted:
        return "kueue"
    if not candidate.evictable:
        return "budget"
    if facts.schedulers - {scheduler_name}:
        return "foreign"
    if facts.going:
        return "going"
    return None if facts.on else "empty"


def declined(preemptor: Gang, running: Sequence[Running], scheduler_name: str) -> str:
    """Why `preemptor` preempts nothing (`plan_preemption` found no set), for its wait: how
    many running gangs it could evict, and why the others may not go."""
    kinds = Counter(_problem(preemptor, v, scheduler_name, preemptor.priority) for v in running)
    eligible = kinds.pop(None, 0)
    kept = [f"{n} {_COUNTED[k].format(p=preemptor.priority)}" for k, n in kinds.items()
            if k in _COUNTED]
    if not eligible:
        return "; it preempts nothing: no running gang may be evicted for it" + (
            f" ({', '.join(kept)})" if kept else "")
    return (f"; it preempts nothing: no set of the {eligible} running gang(s) of lower priority "
            "that may be evicted lets it be placed" + (
                f" (of the others, {', '.join(kept)})" if kept else ""))


def plan_preemption(preemptor: Gang, running: Sequence[Running], nodes: Mapping[str, NodeInfo],
                    states: Mapping[str, NodeState], *, config: PlanConfig, place: PlaceFn,
                    now: float, fit: FitCache | None = None) -> Preemption | None:
    """The smallest set of whole lower-priority gangs of `running` to evict for `preemptor` (a
    gang with pending members that does not fit on `states`, what is free now) to be placed
    with its topology request, and where it then goes; None when even evicting every eligible
    victim would not let it be placed. `fit`: the binder's FitCache of `nodes` (for the
    network's domains; a fresh one when None). See the module's docstring."""
    priority = preemptor.priority
    eligible = [v for v in running
                if victim_problem(preemptor, v, config.scheduler_name, priority) is None]
    if not eligible:
        return None
    fit = fit or FitCache()
    narrow, whole = _domains(preemptor, nodes, config, fit)
    search = _Search(preemptor, nodes, states, config, place, now, fit.gpuless(nodes))
    search.index(eligible, narrow)
    if narrow is not None:
        for i, (name, members) in enumerate(zip(narrow.names, narrow.members, strict=True)):
            search.add_domain(name, members, search.room[i], search.touching[i])
    if whole:
        search.add_domain("", frozenset(nodes), search.whole_room, search.whole)
    return search.run()


def preempter(running: Callable[[], Sequence[Running]], nodes: Mapping[str, NodeInfo], *,
              config: PlanConfig, place: PlaceFn, now: float, fit: FitCache) -> PreemptFn:
    """`plan_preemption` as one planning cycle asks it (`planner.PreemptFn`): `running` is
    read once, when a gang first asks (most cycles never do); a gang chosen as a victim in the
    cycle is no victim for another preemptor of the same cycle (its room is the first's)."""
    known: list[Running] = []
    taken: set[str] = set()

    def decide(gang: Gang, states: Mapping[str, NodeState]) -> Preempt | str:
        if not known:
            known.extend(running())
        candidates = [r for r in known if r.gang.key not in taken]
        found = plan_preemption(gang, candidates, nodes, states, config=config, place=place,
                                now=now, fit=fit)
        if found is None:
            return declined(gang, candidates, config.scheduler_name)
        victims = tuple(v.gang for v in found.victims)
        taken.update(v.key for v in victims)
        held = [(v.key, [p for p in v.members if holding_node(p) is not None]) for v in victims]
        return Preempt(gang, victims, found.place, found.domain,
                       reservation(gang.key, found.place.assignments, held, now))
    return decide


def kueue_admitted(gang: Gang) -> bool:
    """Whether Kueue admitted the gang's workload: a member carries a label Kueue sets on the
    pods it admits (`keys.KUEUE_ADMITTED_LABELS`)."""
    return any(k in keys.KUEUE_ADMITTED_LABELS for p in gang.members for k, _ in p.labels)


def _domains(gang: Gang, nodes: Mapping[str, NodeInfo], config: PlanConfig, fit: FitCache
             ) -> tuple[Domains | None, bool]:
    """The narrow domains to try, in the order of preference, and whether the whole cluster
    is tried after them (module docstring)."""
    topo = gang.topology
    if topo is not None and topo.single_node:
        return _hosts(nodes), topo.mode != "required"
    net = topo.network if topo is not None else None
    if net is None or net.unconstrained:
        return None, True
    levels = config.levels_for(net)
    if isinstance(levels, str):
        return None, False
    network = fit.network(nodes, levels, config.domains)
    req = resolved(net, network)
    required = req.level if req.mode == "required" else req.max_level
    label = required or req.level
    if label is None:
        return None, True
    if label == HOSTNAME:
        return _hosts(nodes), False
    chain = network.chain(label)
    depth = chain.index(label) + 1 if label in chain else len(chain)
    return network.domains(chain, depth), required is None


def _hosts(nodes: Mapping[str, NodeInfo]) -> Domains:
    return Domains.of([(f"{HOSTNAME}={n}", frozenset((n,))) for n in nodes])


def _gpus(gang: Gang) -> int:
    return sum(p.gpus for p in gang.members if holding_node(p) is not None)


@dataclass(slots=True, eq=False)
class _Victim:
    running: Running  # (what it holds: `running.held`)
    #: (priority, GPU-seconds lost, GPUs) were it evicted
    cost: tuple[int, float, int]
    #: (priority, seconds lost per GPU): the order victims are taken in, cheapest first
    rank: tuple[int, float]


@dataclass(slots=True)
class _Domain:
    name: str
    nodes: frozenset[str]
    #: victims touching it, cheapest first
    victims: list[_Victim]
    #: how many of `victims`, first, give it GPUs enough, and what they cost
    prefix: int
    estimate: Cost
    #: its room (in members) before any victim goes
    room: int
    #: its place in the order of preference (a narrower domain first, at equal cost)
    rank: int
    #: what a trial places on, before victims give back: its nodes with a free GPU, and those
    #: without GPUs (a launcher's); a node whose GPUs are all taken serves only as a victim's
    base: dict[str, NodeState] | None = None


def _cost(victims: Sequence[_Victim]) -> Cost:
    return (max((v.cost[0] for v in victims), default=-2**31), sum(v.cost[1] for v in victims),
            sum(v.cost[2] for v in victims), len(victims))


@dataclass(slots=True)
class _Search:
    preemptor: Gang
    nodes: Mapping[str, NodeInfo]
    states: Mapping[str, NodeState]
    config: PlanConfig
    place: PlaceFn
    now: float
    #: the nodes without GPUs (`FitCache.gpuless`): a trial places on them too
    gpuless: tuple[str, ...]
    domains: list[_Domain] = field(default_factory=list)
    trials: int = 0
    #: (GPUs of its smallest GPU pod, how many GPU pods it places): a node holds
    #: free // unit of its members (no fewer than any mix of its pods' sizes)
    _members: tuple[int, int] = (1, 0)
    #: free GPUs per node that has some
    _free: dict[str, int] = field(default_factory=dict)
    #: per narrow domain (by index), its room before any victim goes (in members), and the
    #: victims holding resources there with the GPUs they hold there; the same for the whole
    #: cluster (`nodes`)
    room: list[int] = field(default_factory=list)
    touching: list[dict[_Victim, int]] = field(default_factory=list)
    whole_room: int = 0
    whole: dict[_Victim, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sizes = [p.gpus for p in self.preemptor.pending if p.gpus > 0]
        self._members = (min(sizes, default=1), len(sizes))
        self._free = {n: len(s.free_gpus) for n, s in self.states.items() if s.free_gpus}

    def index(self, eligible: Sequence[Running], narrow: Domains | None) -> None:
        """Each eligible victim's cost; per domain, its room and the victims touching it (one
        pass over what the victims hold: the narrow domains are disjoint)."""
        where = narrow.index if narrow is not None else {}
        count = len(narrow.names) if narrow is not None else 0
        touching: list[dict[_Victim, int]] = [{} for _ in range(count)]
        self.touching = touching
        now, nodes, whole = self.now, self.nodes, self.whole
        for r in eligible:
            h = r.held
            age = work_since(h, now)
            v = _Victim(r, (h.priority, h.gpus * age, h.gpus),
                        (h.priority, age if h.gpus else 0.0))
            inside = 0
            for node, gpus in h.gpus_on.items():
                if node in nodes:
                    inside += gpus
                    d = where.get(node)
                    if d is not None:
                        t = touching[d]
                        t[v] = t.get(v, 0) + gpus
            if inside:
                whole[v] = inside
        unit = self._members[0]
        self.room = room = [0] * count
        for node, free in self._free.items():
            d = where.get(node)
            if d is not None:
                room[d] += free // unit
            if node in nodes:
                self.whole_room += free // unit

    def add_domain(self, name: str, members: frozenset[str], room: int,
                   freed: dict[_Victim, int]) -> None:
        """Keep the domain if all its victims (`freed`: each one's GPUs there) would give it
        room enough (it has `room` before), with its estimate. Room is counted in members,
        whole pods per node (`_members`): GPUs scattered over nodes, a few per node, hold no
        pod."""
        need = self._members[1]
        order = sorted(freed, key=lambda v: (v.rank, -freed[v], v.running.gang.key))
        free: dict[str, int] = {}  # of its nodes the victims so far give back to
        prefix, before_any = 0, room
        for v in order:
            if room >= need and prefix:
                break
            room += self._give_back(v, members, free)
            prefix += 1
        if room < need or not order:
            return
        self.domains.append(_Domain(name, members, order, prefix, _cost(order[:prefix]),
                                    before_any, len(self.domains)))

    def run(self) -> Preemption | None:
        """The best set of the narrow domains; of the whole cluster when none has one, or
        when its set loses less than 1/`LOCALITY_WORTH` of the narrow one's work (a gang that
        prefers a level is given a domain of it unless that costs much more)."""
        narrow = self._best([d for d in self.domains if d.name])
        wide = self._best([d for d in self.domains if not d.name])
        if narrow is None or wide is None:
            found = narrow or wide
            return None if found is None else found[1]
        (n, near), (w, far) = narrow, wide
        return far if (w[0], w[1] * LOCALITY_WORTH, w[2], w[3]) < n else near

    def _best(self, domains: list[_Domain]) -> tuple[Cost, Preemption] | None:
        best: tuple[Cost, Preemption] | None = None
        for domain in sorted(domains, key=lambda d: (d.estimate, d.rank))[:MAX_DOMAINS]:
            if best is not None and best[0] <= domain.estimate:
                break
            found = self._in(domain)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
            if self.trials >= MAX_TRIALS:
                break
        return best

    def _in(self, domain: _Domain) -> tuple[Cost, Preemption] | None:
        """The minimal set of `domain`'s victims that lets the gang fit there, if any."""
        chosen = domain.victims[:domain.prefix]
        placed = self._fits(domain, chosen)
        for extra in domain.victims[domain.prefix:]:
            if placed is not None or self.trials >= MAX_TRIALS:
                break
            chosen.append(extra)
            placed = self._fits(domain, chosen)
        if placed is None:
            return None
        chosen = _on_used(chosen, placed)
        for v in sorted(chosen, key=lambda v: v.cost, reverse=True):
            if len(chosen) == 1 or self.trials >= MAX_TRIALS:
                break
            if all(c is not v for c in chosen):
                continue  # (dropped with a placement that no longer used its nodes)
            fewer = [c for c in chosen if c is not v]
            if self._room(domain, fewer) < self._members[1]:
                continue  # (too few GPUs there without it: no trial needed)
            again = self._fits(domain, fewer)
            if again is not None:
                chosen, placed = _on_used(fewer, again), again
        return _cost(chosen), Preemption(tuple(v.running for v in chosen), placed, domain.name)

    def _room(self, domain: _Domain, victims: Sequence[_Victim]) -> int:
        """The domain's room (in members, as `add_domain` counts it) once `victims` go: at
        least what a trial could place there."""
        free: dict[str, int] = {}
        return domain.room + sum(self._give_back(v, domain.nodes, free) for v in victims)

    def _give_back(self, victim: _Victim, members: frozenset[str], free: dict[str, int]) -> int:
        """Add the GPUs `victim` holds on `members` to `free` (per node, from what is free
        now), and return the room in members that gives."""
        unit, room = self._members[0], 0
        for node, gpus in victim.running.held.gpus_on.items():
            if node in members:
                before = free.get(node)
                if before is None:
                    before = self._free.get(node, 0)
                free[node] = before + gpus
                room += (before + gpus) // unit - before // unit
        return room

    def _fits(self, domain: _Domain, victims: Sequence[_Victim]) -> Place | None:
        """The planning cycle's placement of the preemptor on the domain's nodes, the victims'
        resources given back; None when it does not fit there."""
        self.trials += 1
        if domain.base is None:
            within = [n for n in (*self._free, *self.gpuless) if n in domain.nodes]
            domain.base = {n: s for n in within if (s := self.states.get(n)) is not None}
        states = dict(domain.base)
        for v in victims:
            for node, pods in v.running.held.on.items():
                if node in domain.nodes and node in self.states:
                    states[node] = _given_back(states.get(node, self.states[node]), pods)
        nodes = {n: self.nodes[n] for n in sorted(states)}
        plan = plan_gangs({self.preemptor.key: self.preemptor}, Allocation({}),
                          {n: states[n] for n in nodes}, nodes, config=self.config,
                          queue=GangQueue(), fit=FitCache(), place=self.place, now=self.now)
        return next((p for p in plan.places if p.gang.key == self.preemptor.key), None)


def _on_used(victims: list[_Victim], placed: Place) -> list[_Victim]:
    """The victims with a pod on a node the placement uses: the others free nothing it uses,
    so it holds without them (no trial needed)."""
    used = {a.node for _, a in placed.assignments}
    return [v for v in victims if not used.isdisjoint(v.running.held.on)]


def _given_back(state: NodeState, pods: Sequence[PodInfo]) -> NodeState:
    """The node's state once `pods` (on it) let go of their GPUs, CPU, memory and slots: the
    inverse of `NodeState.less`. GPUs only where the pod's assignment names them (a DRA pod's
    claims hold its GPUs until they are deallocated: counted as still held)."""
    gpus = set(state.free_gpus)
    for pod in pods:
        if not pod.dra and pod.assignment is not None and pod.assignment.node == state.name:
            gpus |= assigned_indices(pod.assignment)
    return NodeState(state.name, state.topology, frozenset(gpus),
                     state.free_cpu_milli + sum(p.cpu_milli for p in pods),
                     state.free_memory_bytes + sum(p.memory_bytes for p in pods),
                     state.free_pods + len(pods), state.nvlink_domain)
