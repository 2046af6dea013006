"""What the binder needs from a pod, parsed once from the raw API object (plain dict)."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from webhook import keys
from webhook.binder.assignment import AssignmentError, Record, decode_assignment, decode_record
from webhook.binder.claims import PodClaims, parse_pod_claims
from webhook.binder.extended import Requests, extended_requests, status_claims
from webhook.podresources import GPU, gpu_asks, pod_requests
from webhook.policy.compiled import Requirement as LabelRequirement
from webhook.quantity import milli, units
from webhook.topology.model import GpuAssignment, NetworkRequest, TopologyRequest
from webhook.topology.network import LevelsError, topology_ref

TERMINATED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class Requirement:
    """One matchExpressions / matchFields entry of a node selector term."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Term:
    """A nodeSelectorTerm: every expression and field requirement must hold."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""


@dataclass(frozen=True, slots=True)
class Constraints:
    """Where a pod may run. Hashable: pods of one job share it, so node filtering is cached."""

    node_selector: tuple[tuple[str, str], ...] = ()
    #: required node affinity terms (ORed); None when the pod has no required node affinity
    terms: tuple[Term, ...] | None = None
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True, slots=True)
class PodTerm:
    """One required podAffinity / podAntiAffinity term: the pods it counts (label selector and
    namespaces) and the node label whose value makes a domain."""

    #: None: a nil labelSelector, which counts no pod
    selector: tuple[LabelRequirement, ...] | None
    #: None: every namespace (namespaceSelector {})
    namespaces: frozenset[str] | None
    topology_key: str


@dataclass(frozen=True, slots=True)
class PodAffinity:
    """The pod's required inter-pod terms (kube-scheduler's InterPodAffinity filter reads the
    same; the preferred ones are scores, which the binder does not weigh)."""

    affinity: tuple[PodTerm, ...] = ()
    anti: tuple[PodTerm, ...] = ()


@dataclass(frozen=True, slots=True)
class SpreadTerm:
    """One topologySpreadConstraint with whenUnsatisfiable DoNotSchedule (kube-scheduler's
    PodTopologySpread filter reads the same; ScheduleAnyway ones are scores, not weighed)."""

    max_skew: int
    topology_key: str
    #: labelSelector with the matchLabelKeys' values from the pod's labels (None: a nil
    #: labelSelector, which counts no pod)
    selector: tuple[LabelRequirement, ...] | None
    #: fewer domains than this count as a domain with no pod (None: unset)
    min_domains: int | None = None
    #: nodeAffinityPolicy Honor (its default): only nodes the pod's nodeSelector and required
    #: node affinity admit are domains
    honour_affinity: bool = True
    #: nodeTaintsPolicy Honor (default Ignore): only nodes whose taints the pod tolerates
    honour_taints: bool = False


@dataclass(frozen=True, slots=True)
class Preferences:
    """The pod's scores (kube-scheduler's NodeAffinity, InterPodAffinity and PodTopologySpread
    scores read the same): the binder weighs them among placements its topology finds as good
    (`webhook.binder.prefer`). Hashable: pods of one job share it."""

    #: preferredDuringScheduling node affinity: (weight, term)
    nodes: tuple[tuple[int, Term], ...] = ()
    #: preferredDuringScheduling podAffinity (weight > 0) and podAntiAffinity (weight < 0)
    pods: tuple[tuple[int, PodTerm], ...] = ()
    #: topologySpreadConstraints with whenUnsatisfiable ScheduleAnyway
    spread: tuple[SpreadTerm, ...] = ()


@dataclass(frozen=True, slots=True)
class PodInfo:
    key: str  # "namespace/name"
    namespace: str
    name: str
    uid: str
    resource_version: str
    scheduler_name: str
    node_name: str | None
    terminated: bool  # Succeeded or Failed, or deleted before it was bound
    #: metadata.deletionTimestamp is set: no longer a member of its gang (a job recreated under
    #: the same name, or a worker its controller replaces), though it may still hold its node
    deleting: bool
    priority: int
    created: float  # epoch seconds
    cpu_milli: int
    memory_bytes: int
    gpus: int  # what the scheduler counts (webhook.podresources.pod_requests)
    #: (container name, GPUs) for init containers then app containers, in spec order
    container_gpus: tuple[tuple[str, int], ...]
    init_containers: int  # how many leading entries of container_gpus are init containers
    constraints: Constraints
    #: the init containers that are sidecars (restartPolicy Always): their GPUs stay theirs
    sidecars: frozenset[str] = frozenset()
    #: spec.schedulingGates is not empty: not to be scheduled yet, as kube-scheduler skips it
    #: (the API server refuses its Binding); it is scheduled once its last gate is removed
    gated: bool = False
    gang_name: str | None = None  # from muster.io/gang-name
    pod_group: str | None = None  # from the coscheduling label
    min_member: int | None = None
    timeout_seconds: int | None = None
    #: muster.io/gang-preemption, as the webhook wrote it from the policy (None: not set)
    preemption: str | None = None
    #: spec.preemptionPolicy Never (the PriorityClass's, set by the API server's admission):
    #: the pod never preempts, whatever its annotation says
    never_preempts: bool = False
    #: spec.terminationGracePeriodSeconds (Kubernetes' default 30)
    grace_seconds: int = 30
    topology: TopologyRequest | None = None
    #: the binder's assignment (muster.io/gpu-assignment), read only on pods of this binder's
    #: scheduler name, and on a bound one only for the node it is bound to (`trusted_annotations`)
    assignment: GpuAssignment | None = None
    #: raw assignment annotation text (present even when it does not parse), under the same rule
    assignment_raw: str | None = None
    #: the gang placement its Binding recorded (muster.io/gang-placement; empty when none,
    #: unreadable, or not on a pod this binder bound): the members placed with it, reserved
    #: until they are bound too
    placement: Record = ()
    #: problems with Muster's annotations, in words for an Event
    problems: tuple[str, ...] = ()
    #: status.phase is Pending (or not set yet): the kubelet has not started the pod
    pending: bool = True
    #: status.startTime, epoch seconds (0: none yet): when the kubelet took the pod on
    started: float = 0.0
    #: muster.io/last-checkpoint-time, epoch seconds (0: none, or unreadable): when its job
    #: last saved its state, by its own word
    checkpointed: float = 0.0
    #: the node agent served every GPU container (muster.io/gpu-allocated)
    allocated: bool = False
    #: its Ready condition is True (read of the node agents' pods: webhook.binder.agents)
    ready: bool = False
    #: its spec.resourceClaims (None: none)
    claims: PodClaims | None = None
    #: its GPUs come from its claims (webhook.binder.dra.resolve, or the special claim its
    #: status names): the claims, not `assignment`, hold them, and its assignment is read back
    #: from them
    dra: bool = False
    #: the special claim's requests for its plain GPU requests (webhook.binder.extended), or
    #: why it can have none
    extended: Requests | str = ()
    #: the special claim its status.extendedResourceClaimStatus names ("" when none)
    extended_status: str = ""
    #: the DeviceClass serving nvidia.com/gpu as an extended resource ("" when none; set by
    #: the binder from the DeviceClasses it watches)
    gpu_class: str = ""
    #: keys of the claims allocated and reserved for it alone while it is unbound
    held_claims: tuple[str, ...] = ()
    #: what keeps the binder from allocating its claims, in words for an Event
    claim_problems: tuple[str, ...] = ()
    #: metadata.labels, sorted (what other pods' inter-pod terms select on)
    labels: tuple[tuple[str, str], ...] = ()
    #: its rank in its job where its labels say it (`pod_rank`), else ()
    rank: tuple[int, ...] = ()
    #: its required podAffinity / podAntiAffinity (None: none)
    pod_affinity: PodAffinity | None = None
    #: its topologySpreadConstraints with whenUnsatisfiable DoNotSchedule
    spread: tuple[SpreadTerm, ...] = ()
    #: its preferred node and pod affinity and ScheduleAnyway spread (None: none)
    preferences: Preferences | None = None

    @property
    def bound(self) -> bool:
        return self.node_name is not None

    @property
    def anti_affinity(self) -> tuple[PodTerm, ...]:
        """Its required podAntiAffinity terms (empty: none)."""
        return self.pod_affinity.anti if self.pod_affinity is not None else ()


def _claims(spec: Mapping[str, Any], status: Mapping[str, Any], gpus: int, problems: list[str]
            ) -> tuple[PodClaims | None, PodClaims | None]:
    """The pod's claims (its own, else the special claim its status names) and that special
    claim, if any."""
    own = parse_pod_claims(spec, status)
    if own is not None and gpus:
        problems.append(f"asks for {GPU} and uses ResourceClaims: one or the other")
    special = status_claims(spec, status)
    return own or special, special


def _checkpoint(ann: Mapping[str, str]) -> float:
    """When the pod's job says it last saved its state (0: it does not say, or not as an RFC
    3339 time with its zone: what the chart's guard lets a job write). Not a problem of the
    gang's when unreadable: the word is only ever a discount on its price as a victim, never a
    reason to hold it back."""
    value = ann.get(keys.ANN_LAST_CHECKPOINT)
    at = _instant(value) if value and keys.CHECKPOINT_TIME.fullmatch(value) else None
    return at.timestamp() if at is not None else 0.0


def parse_time(value: str | None) -> float:
    at = _instant(value)
    return at.timestamp() if at is not None else 0.0


def _instant(value: str | None) -> datetime | None:
    """An RFC 3339 time as the API server writes it (None: none, or unreadable)."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _requirements(items: Any) -> tuple[Requirement, ...]:
    return tuple(
        Requirement(str(e.get("key", "")), str(e.get("operator", "")),
                    tuple(str(v) for v in e.get("values") or ()))
        for e in items or ()
    )


def _term(t: Mapping[str, Any]) -> Term:
    return Term(_requirements(t.get("matchExpressions")), _requirements(t.get("matchFields")))


def parse_constraints(spec: Mapping[str, Any]) -> Constraints:
    selector = spec.get("nodeSelector") or {}
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms: tuple[Term, ...] | None = None
    if required is not None:
        terms = tuple(_term(t) for t in required.get("nodeSelectorTerms") or ())
    tolerations = tuple(
        Toleration(str(t.get("key") or ""), str(t.get("operator") or "Equal"),
                   str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in spec.get("tolerations") or ()
    )
    return Constraints(tuple(sorted((str(k), str(v)) for k, v in selector.items())), terms,
                       tolerations)


def label_selector(sel: Any) -> tuple[LabelRequirement, ...] | None:
    if not isinstance(sel, Mapping):
        return None
    reqs: list[LabelRequirement] = [("In", str(k), frozenset((str(v),)))
                                    for k, v in (sel.get("matchLabels") or {}).items()]
    reqs += [(str(e.get("operator", "")), str(e.get("key", "")),
              frozenset(str(v) for v in e.get("values") or ()))
             for e in sel.get("matchExpressions") or ()]
    return tuple(reqs)


def _pod_terms(items: Any, namespace: str, anti: bool, problems: list[str]
               ) -> tuple[PodTerm, ...]:
    terms = []
    for t in items or ():
        names = frozenset(str(n) for n in t.get("namespaces") or ())
        ns_sel = t.get("namespaceSelector")
        if ns_sel is not None and (ns_sel.get("matchLabels") or ns_sel.get("matchExpressions")):
            # The binder does not watch Namespaces. Counting every namespace keeps an
            # anti-affinity term (it forbids more); an affinity term would allow too much.
            if not anti:
                problems.append("podAffinity: a namespaceSelector with labels is not evaluated "
                                "by this binder; name the namespaces instead")
                continue
            ns_sel = {}
        namespaces = None if ns_sel is not None else (names or frozenset((namespace,)))
        terms.append(PodTerm(label_selector(t.get("labelSelector")), namespaces,
                             str(t.get("topologyKey") or "")))
    return tuple(terms)


def parse_pod_affinity(spec: Mapping[str, Any], namespace: str, problems: list[str]
                       ) -> PodAffinity | None:
    """The required podAffinity and podAntiAffinity terms of a pod spec (None: none)."""
    affinity = spec.get("affinity") or {}
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    found = PodAffinity(
        _pod_terms((affinity.get("podAffinity") or {}).get(required), namespace, False,
                   problems),
        _pod_terms((affinity.get("podAntiAffinity") or {}).get(required), namespace, True,
                   problems))
    return found if found.affinity or found.anti else None


def _weighted(items: Any, what: str, problems: list[str]) -> list[tuple[int, Any]]:
    """The (weight, term) of preferredDuringScheduling entries whose weight is 1-100, as the
    API server requires (the others are said in `problems`)."""
    out = []
    for item in items or ():
        weight = item.get("weight") if isinstance(item, Mapping) else None
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
            problems.append(f"{what}: each preferred term needs a weight of 1-100")
            continue
        out.append((weight, item))
    return out


def parse_preferences(spec: Mapping[str, Any], labels: Mapping[str, str], namespace: str,
                      problems: list[str]) -> Preferences | None:
    """The pod's preferred node and pod affinity and ScheduleAnyway spread (None: none)."""
    affinity = spec.get("affinity") or {}
    preferred = "preferredDuringSchedulingIgnoredDuringExecution"
    nodes = tuple((w, _term(t.get("preference") or {})) for w, t in _weighted(
        (affinity.get("nodeAffinity") or {}).get(preferred), "nodeAffinity", problems))
    pods: list[tuple[int, PodTerm]] = []
    for sign, kind in ((1, "podAffinity"), (-1, "podAntiAffinity")):
        for w, t in _weighted((affinity.get(kind) or {}).get(preferred), kind, problems):
            # (a preferred podAffinity term whose namespaceSelector has labels is not weighed:
            # a score never keeps a pod from its nodes, so that is not a problem to say)
            terms = _pod_terms([t.get("podAffinityTerm") or {}], namespace, sign < 0, [])
            pods += [(sign * w, term) for term in terms]
    found = Preferences(nodes, tuple(pods),
                        parse_spread(spec, labels, problems, "ScheduleAnyway"))
    return found if found.nodes or found.pods or found.spread else None


def pod_rank(labels: Mapping[str, str]) -> tuple[int, ...]:
    """A pod's rank in its job, as its operator's labels say it: a JobSet's job index then the
    completion index; an Indexed Job's completion index; Kubeflow's replica index after its
    replica type (master, chief or launcher first); LeaderWorkerSet's worker index; a Kueue pod
    group's pod index. () where none says it (or one is no whole number): names decide."""
    def index(label: str) -> int | None:
        return keys.decimal(str(labels.get(label, "")))
    completion = index(keys.COMPLETION_INDEX_LABEL)
    if completion is not None:
        job = index(keys.JOBSET_JOB_INDEX_LABEL)
        return (completion,) if job is None else (job, completion)
    replica = index(keys.REPLICA_INDEX_LABEL)
    if replica is not None:
        kind = str(labels.get(keys.REPLICA_TYPE_LABEL, "")).lower()
        return (0 if kind in keys.FIRST_REPLICA_TYPES else 1, replica)
    found = (index(keys.LWS_WORKER_INDEX_LABEL), index(keys.KUEUE_POD_GROUP_INDEX_LABEL))
    return next(((i,) for i in found if i is not None), ())


def parse_spread(spec: Mapping[str, Any], labels: Mapping[str, str], problems: list[str],
                 when: str = "DoNotSchedule") -> tuple[SpreadTerm, ...]:
    """The pod's topologySpreadConstraints whose whenUnsatisfiable is `when`, each
    matchLabelKeys merged into its selector as kube-scheduler merges them (a key the pod lacks
    is left out)."""
    out = []
    for c in spec.get("topologySpreadConstraints") or ():
        if not isinstance(c, Mapping) or c.get("whenUnsatisfiable") != when:
            continue
        skew, key, floor = c.get("maxSkew"), c.get("topologyKey"), c.get("minDomains")
        if not isinstance(skew, int) or skew < 1 or not isinstance(key, str) or not key or (
                floor is not None and (not isinstance(floor, int) or floor < 1)):
            problems.append("topologySpreadConstraints: each needs a topologyKey, a maxSkew "
                            "of at least 1 and a minDomains of at least 1 when set")
            continue
        selector = label_selector(c.get("labelSelector"))
        merged = [("In", str(k), frozenset((str(labels[k]),)))
                  for k in c.get("matchLabelKeys") or () if k in labels]
        if selector is not None:
            selector = (*selector, *merged)
        out.append(SpreadTerm(skew, key, selector, floor,
                              c.get("nodeAffinityPolicy", "Honor") != "Ignore",
                              c.get("nodeTaintsPolicy", "Ignore") == "Honor"))
    return tuple(out)


def parse_topology_request(text: str) -> TopologyRequest:
    """The webhook's muster.io/gpu-topology pod annotation; ValueError when malformed."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{keys.ANN_GPU_TOPOLOGY} is not JSON: {exc.msg}") from exc
    if not isinstance(doc, dict) or doc.get("v") != 1:
        raise ValueError(f"{keys.ANN_GPU_TOPOLOGY} must be an object with \"v\": 1")
    mode = doc.get("mode", "required")
    if mode not in ("required", "preferred"):
        raise ValueError(f"{keys.ANN_GPU_TOPOLOGY}: mode must be required or preferred, "
                         f"not {mode!r}")
    ring = doc.get("minRingGBps")
    if ring is not None and (isinstance(ring, bool) or not isinstance(ring, int | float)):
        raise ValueError(f"{keys.ANN_GPU_TOPOLOGY}: minRingGBps must be a number")
    return TopologyRequest(mode=mode, single_node=bool(doc.get("singleNode", False)),
                           min_ring_gbps=None if ring is None else float(ring),
                           network=_network_request(doc.get("network")))


def _network_request(doc: Any) -> NetworkRequest | None:
    """The "network" part of muster.io/gpu-topology; ValueError when malformed."""
    if doc is None:
        return None
    where = f"{keys.ANN_GPU_TOPOLOGY}: network"
    if not isinstance(doc, dict):
        raise ValueError(f"{where} must be an object")
    level, mode = doc.get("level"), doc.get("mode", "required")
    slice_level, size = doc.get("sliceLevel"), doc.get("sliceSize", 0)
    slice_mode, max_level = doc.get("sliceMode", "required"), doc.get("maxLevel")
    for name, value in (("mode", mode), ("sliceMode", slice_mode)):
        if value not in ("required", "preferred"):
            raise ValueError(f"{where}.{name} must be required or preferred, not {value!r}")
    for name, value in (("level", level), ("sliceLevel", slice_level), ("maxLevel", max_level)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{where}.{name} must be a node label key")
        if isinstance(value, str) and value.startswith(keys.NETWORK_TIER_PREFIX) and \
                keys.network_tier(value) is None:
            raise ValueError(f"{where}.{name}: a tier is {keys.NETWORK_TIER_PREFIX}N, N >= 1, "
                             f"not {value!r}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"{where}.sliceSize must be a whole number")
    if (slice_level is None) != (size == 0):
        raise ValueError(f"{where}: sliceLevel and sliceSize go together")
    if max_level is not None and (level is None or mode != "preferred"):
        raise ValueError(f"{where}.maxLevel bounds a preferred level")
    unconstrained = doc.get("unconstrained", False)
    if not isinstance(unconstrained, bool):
        raise ValueError(f"{where}.unconstrained must be true or false")
    if unconstrained and (level is not None or slice_level is not None):
        raise ValueError(f"{where}: an unconstrained gang has no level and no slices")
    topology = doc.get("topology")
    if topology is not None and not _names_topology(topology):
        raise ValueError(f"{where}.topology must be kai:NAME or kueue:NAME, NAME a Topology's "
                         f"name, not {topology!r}")
    return NetworkRequest(level=level, mode=mode, slice_level=slice_level, slice_size=size,
                          slice_mode=slice_mode, max_level=max_level, unconstrained=unconstrained,
                          topology=topology)


def _names_topology(text: Any) -> bool:
    try:
        return isinstance(text, str) and topology_ref(text) is not None
    except LevelsError:
        return False


def _positive_int(text: str, what: str, problems: list[str]) -> int | None:
    try:
        value = int(text)
    except ValueError:
        problems.append(f"{what} must be an integer, got {text!r}")
        return None
    if value < 1:
        problems.append(f"{what} must be at least 1, got {value}")
        return None
    return value


def _pod_requests(spec: Mapping[str, Any], problems: list[str]) -> tuple[int, int, int]:
    """(CPU milli, memory bytes, GPUs) the scheduler counts for the pod, each rounded up once
    for the pod as the scheduler does (podresources)."""
    requests = pod_requests(spec, problems)
    return (milli(requests.get("cpu", (0, False))[0]),
            units(requests.get("memory", (0, False))[0]),
            units(requests.get(GPU, (0, False))[0]))


def _gang_annotations(ann: Mapping[str, str], problems: list[str]
                      ) -> tuple[int | None, int | None]:
    """(minMember, timeout) of a muster gang, from the webhook's annotations."""
    min_member = timeout = None
    if keys.ANN_GANG_MIN_MEMBER in ann:
        min_member = _positive_int(ann[keys.ANN_GANG_MIN_MEMBER], keys.ANN_GANG_MIN_MEMBER,
                                   problems)
    elif keys.ANN_GANG_NAME in ann:
        problems.append(f"{keys.ANN_GANG_NAME} is set but {keys.ANN_GANG_MIN_MEMBER} is missing")
    if keys.ANN_GANG_TIMEOUT in ann:
        timeout = _positive_int(ann[keys.ANN_GANG_TIMEOUT], keys.ANN_GANG_TIMEOUT, problems)
    return min_member, timeout


def _preemption(ann: Mapping[str, str], problems: list[str]) -> str | None:
    value = ann.get(keys.ANN_GANG_PREEMPTION)
    if value is not None and value not in keys.PREEMPTION_VALUES:
        problems.append(f"{keys.ANN_GANG_PREEMPTION} must be one of "
                        f"{', '.join(keys.PREEMPTION_VALUES)}, got {value!r}")
        return None
    return value


@functools.lru_cache(maxsize=256)
def _record(annotation: str) -> Record:
    """The members of one placement carry the same record: decoded once, one object, which
    Gang.recorded reads once. An unreadable one reserves nothing."""
    try:
        return decode_record(annotation)
    except AssignmentError:
        return ()


def trusted_annotations(ann: Mapping[str, str], spec: Mapping[str, Any], scheduler_name: str
                        ) -> tuple[GpuAssignment | None, str | None, Record]:
    """(assignment, its raw text, gang record) of a pod, as far as the binder `scheduler_name`
    may trust them: only a pod with that spec.schedulerName (immutable once the pod exists)
    carries what the binder wrote, and a bound pod's only for the node it is bound to (the
    Binding that wrote them named that node). On any other pod they are someone else's words
    (a user's forgery): ignored, so that they neither take GPUs from the free set nor steer a
    gang. Who may write them at all is the chart's ValidatingAdmissionPolicy's business."""
    if (spec.get("schedulerName") or "default-scheduler") != scheduler_name:
        return None, None, ()
    node = spec.get("nodeName") or None
    assignment = None
    raw = ann.get(keys.ANN_GPU_ASSIGNMENT)
    if raw is not None:
        try:
            assignment = decode_assignment(raw)
        except AssignmentError:
            assignment = None  # treated as unknown GPUs in use; the planner decides
        if node is not None and assignment is not None and assignment.node != node:
            return None, None, ()  # no Binding of ours wrote this
    recorded = ann.get(keys.ANN_GANG_PLACEMENT)
    placement = _record(recorded) if recorded is not None and node is not None else ()
    return assignment, raw, placement


def _topology(ann: Mapping[str, str], problems: list[str]) -> TopologyRequest | None:
    """The pod's GPU topology request, if it has one that parses."""
    if keys.ANN_GPU_TOPOLOGY not in ann:
        return None
    try:
        return parse_topology_request(ann[keys.ANN_GPU_TOPOLOGY])
    except ValueError as exc:
        problems.append(str(exc))
        return None


def parse_pod(obj: Mapping[str, Any],
              scheduler_name: str = keys.DEFAULT_BINDER_SCHEDULER_NAME) -> PodInfo:
    """The pod as the binder `scheduler_name` sees it. Never raises for bad user input:
    problems are collected for an Event instead."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ann: Mapping[str, str] = meta.get("annotations") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    problems: list[str] = []
    cpu, mem, gpus = _pod_requests(spec, problems)
    claims, special = _claims(spec, status, gpus, problems)
    extended_status = special.names[0][1] if special is not None else ""
    asks = gpu_asks(spec)
    min_member, timeout = _gang_annotations(ann, problems)
    preemption = _preemption(ann, problems)
    topology = _topology(ann, problems)
    assignment, raw, placement = trusted_annotations(ann, spec, scheduler_name)
    if claims is not None:
        assignment, raw = None, None  # its claims are the record (webhook.binder.dra)
    pod_affinity = parse_pod_affinity(spec, ns, problems)
    spread = parse_spread(spec, labels, problems)
    preferences = parse_preferences(spec, labels, ns, problems)
    priority = spec.get("priority")
    grace = spec.get("terminationGracePeriodSeconds")
    return PodInfo(
        key=f"{ns}/{name}",
        namespace=ns,
        name=name,
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
        node_name=spec.get("nodeName") or None,
        # an unbound pod being deleted (a finalizer keeps it) is never scheduled, as
        # kube-scheduler skips it; a bound one holds its node until the kubelet lets go
        terminated=status.get("phase") in TERMINATED_PHASES or bool(
            meta.get("deletionTimestamp") and not spec.get("nodeName")),
        deleting=bool(meta.get("deletionTimestamp")),
        priority=priority if isinstance(priority, int) else 0,
        created=parse_time(meta.get("creationTimestamp")),
        cpu_milli=cpu,
        memory_bytes=mem,
        gpus=gpus,
        container_gpus=tuple((a.name, a.gpus) for a in asks),
        init_containers=len(spec.get("initContainers") or ()),
        constraints=parse_constraints(spec),
        sidecars=frozenset(a.name for a in asks if a.kind == "sidecar"),
        gated=bool(spec.get("schedulingGates")),
        gang_name=ann.get(keys.ANN_GANG_NAME) or None,
        pod_group=labels.get(keys.COSCHEDULING_GROUP_LABEL) or None,
        min_member=min_member,
        timeout_seconds=timeout,
        preemption=preemption,
        never_preempts=spec.get("preemptionPolicy") == "Never",
        grace_seconds=grace if isinstance(grace, int) and grace >= 0 else 30,
        topology=topology,
        assignment=assignment,
        assignment_raw=raw,
        placement=placement,
        problems=tuple(problems),
        pending=status.get("phase", "Pending") == "Pending",
        started=parse_time(status.get("startTime")),
        checkpointed=_checkpoint(ann),
        allocated=keys.ANN_GPU_ALLOCATED in ann,
        ready=any(c.get("type") == "Ready" and c.get("status") == "True"
                  for c in status.get("conditions") or ()),
        claims=claims,
        dra=special is not None,
        extended=extended_requests(spec) if gpus else (),
        extended_status=extended_status,
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        rank=pod_rank(labels),
        pod_affinity=pod_affinity,
        spread=spread,
        preferences=preferences,
    )
