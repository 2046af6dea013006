"""What job a pod belongs to, read from the pod and its owner objects (pure, never raises).

Gang settings follow the MPI operator's (v2beta1) semantics, which users already know; the same
rules apply to the Kubeflow PyTorchJob/TFJob (sum of replicas), a batch/Job (parallelism) and a
bare pod (a gang of one). Every pod of one job must come out with the same group, so everything
here is read from the job object, never from the individual pod, when the job is known.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from webhook import keys
from webhook.policy.decision import OwnerRef
from webhook.quantity import QuantityError, add_quantities, format_quantity

MPIJOB = "kubeflow.org/MPIJob"
PYTORCHJOB = "kubeflow.org/PyTorchJob"
TFJOB = "kubeflow.org/TFJob"
BATCH_JOB = "batch/Job"
POD = "Pod"
#: spec field holding the replica specs of each Kubeflow job kind
_REPLICA_FIELD = {MPIJOB: "mpiReplicaSpecs", PYTORCHJOB: "pytorchReplicaSpecs",
                  TFJOB: "tfReplicaSpecs"}
_JOB_KINDS = frozenset({*_REPLICA_FIELD, BATCH_JOB})
#: replica types that go first when minResources is summed over the minMember first replicas
_LEADERS = ("Launcher", "Master", "Chief", "PS")
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
OPERATOR_LABEL = "training.kubeflow.org/operator-name"


def _d(value: Any) -> Mapping[str, Any]:
    if type(value) is dict:  # the common case, without the slower ABC check
        return value
    return value if isinstance(value, Mapping) else {}


def _l(value: Any) -> Sequence[Any]:
    return value if type(value) is list or isinstance(value, tuple) else ()


def _s(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _i(value: Any, default: int | None = None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def group_kind(api_version: Any, kind: Any) -> str:
    """"kubeflow.org/MPIJob" from apiVersion kubeflow.org/v2beta1; "Pod" for the core group."""
    if type(api_version) is str and type(kind) is str:
        return _group_kind(api_version, kind)
    return str(kind)


@lru_cache(maxsize=256)
def _group_kind(api_version: str, kind: str) -> str:
    group = api_version.rpartition("/")[0]
    return f"{group}/{kind}" if group else kind


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The controller ownerReference, or the only ownerReference when none is marked."""
    refs = _l(_d(obj.get("metadata")).get("ownerReferences"))
    only = None
    for ref in refs:
        if type(ref) is dict or isinstance(ref, Mapping):
            if ref.get("controller") is True:
                return ref
            only = ref if len(refs) == 1 else None
    return only


@dataclass(frozen=True, slots=True)
class Replica:
    role: str
    count: int
    pod_spec: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Priorities:
    """PriorityClass name → value, as the cluster has them (empty: every replica equal)."""

    values: Mapping[str, int] = field(default_factory=dict)


NO_PRIORITIES = Priorities()


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What the gang needs from a job object: a pure function of the object's content."""

    replicas: tuple[Replica, ...]
    members: int
    auto_min_member: int
    gpus: int
    scheduling_policy: Mapping[str, Any]
    queue: str | None
    priority_class: str | None
    #: (min_member, replica priorities) → minResources, filled on first use
    min_resources_memo: dict[tuple[int, tuple[int, ...]], dict[str, str] | None] = field(
        default_factory=dict)

    def replica_priorities(self, priorities: Priorities) -> tuple[int, ...]:
        """Each replica's PriorityClass value (0 without one, or for a class not found)."""
        return tuple(priorities.values.get(str(r.pod_spec.get("priorityClassName") or ""), 0)
                     for r in self.replicas)

    def min_resources(self, min_member: int, priorities: Priorities = NO_PRIORITIES
                      ) -> dict[str, str] | None:
        """Sum of requests (limits where no request) over the first min_member pods, the
        replicas of higher PriorityClass value first and, between equals, the launcher or
        master first: as mpi-operator's calPGMinResource (see docs/policies.md for where
        its arithmetic differs)."""
        key = (min_member, self.replica_priorities(priorities))
        if key not in self.min_resources_memo:
            self.min_resources_memo[key] = _sum_resources(self.replicas, min_member, key[1])
        found = self.min_resources_memo[key]
        return dict(found) if found is not None else None


def _sum_resources(replicas: tuple[Replica, ...], min_member: int,
                   values: tuple[int, ...]) -> dict[str, str] | None:
    total: dict[str, tuple[int, bool]] = {}
    left = min_member
    order = sorted(zip(values, replicas, strict=True),
                   key=lambda vr: (-vr[0], vr[1].role not in _LEADERS))
    for _, rep in order:
        take = min(rep.count, left)
        left -= take
        if take <= 0:
            continue
        for c in _l(rep.pod_spec.get("containers")):
            res = _d(_d(c).get("resources"))
            merged = {**_d(res.get("limits")), **_d(res.get("requests"))}
            for name, qty in merged.items():
                try:
                    add_quantities(total, str(name), qty, take)
                except QuantityError:
                    continue  # the API server rejects such pods anyway
    return {k: format_quantity(v, b) for k, (v, b) in sorted(total.items())} or None


@dataclass(frozen=True, slots=True)
class Workload:
    kind: str  # group/Kind of the job, or "Pod"
    name: str | None  # gang name; None when no stable name can be derived
    owner: OwnerRef | None  # owner of the PodGroup (the job), when known with its uid
    owner_kinds: frozenset[str]  # every kind in the ownership chain
    gpus: int  # GPUs of the whole job when its spec is known, else of this pod
    facts: JobFacts | None  # None when the job object is not available
    warnings: tuple[str, ...] = ()

    @property
    def members(self) -> int | None:
        """All pods of the job, None when the job object is unknown."""
        return self.facts.members if self.facts else None

    @property
    def auto_min_member(self) -> int | None:
        """minAvailable "auto": MPI workers + 1, else all members."""
        return self.facts.auto_min_member if self.facts else None

    @property
    def scheduling_policy(self) -> Mapping[str, Any]:
        """The job's runPolicy.schedulingPolicy."""
        return self.facts.scheduling_policy if self.facts else {}

    @property
    def queue(self) -> str | None:
        return self.facts.queue if self.facts else None

    @property
    def priority_class(self) -> str | None:
        return self.facts.priority_class if self.facts else None

    def min_resources(self, min_member: int, priorities: Priorities = NO_PRIORITIES
                      ) -> dict[str, str] | None:
        return self.facts.min_resources(min_member, priorities) if self.facts else None


_CACHE_SIZE = 512
_facts_cache: OrderedDict[tuple[str, str, str], JobFacts] = OrderedDict()


def job_facts(kind: str, obj: Mapping[str, Any]) -> JobFacts:
    """JobFacts of a job object, memoised by (kind, uid, resourceVersion): the API server
    changes resourceVersion on every write, so equal keys mean equal content. Objects without
    both (hand-written test input) are analysed every time."""
    meta = _d(obj.get("metadata"))
    uid, rv = _s(meta.get("uid")), _s(meta.get("resourceVersion"))
    if uid is None or rv is None:
        return _analyse_job(kind, obj)
    key = (kind, uid, rv)
    facts = _facts_cache.get(key)
    if facts is None:
        facts = _facts_cache[key] = _analyse_job(kind, obj)
        if len(_facts_cache) > _CACHE_SIZE:
            _facts_cache.popitem(last=False)
    return facts


def _analyse_job(kind: str, obj: Mapping[str, Any]) -> JobFacts:
    replicas = _replicas(kind, obj)
    members = sum(r.count for r in replicas)
    if kind == MPIJOB:
        auto = next((r.count for r in replicas if r.role == "Worker"), 0) + 1
    else:
        auto = members
    by_role = {r.role: r for r in replicas}
    priority_class = next(
        (pc for role in ("Launcher", "Worker", *sorted(by_role))
         if role in by_role and (pc := _s(by_role[role].pod_spec.get("priorityClassName")))),
        None)
    spec = _d(obj.get("spec"))
    return JobFacts(
        replicas=replicas, members=members, auto_min_member=auto,
        gpus=sum(r.count * pod_gpus(r.pod_spec) for r in replicas),
        scheduling_policy=_d(_d(spec.get("runPolicy")).get("schedulingPolicy")),
        queue=_s(_d(_d(obj.get("metadata")).get("annotations")).get(
            keys.VOLCANO_QUEUE_ANNOTATION)),
        priority_class=priority_class)


def _container_gpus(container: Any) -> int:
    res = _d(_d(container).get("resources"))
    limits = _d(res.get("limits"))
    raw = limits[keys.GPU_RESOURCE] if keys.GPU_RESOURCE in limits else _d(
        res.get("requests")).get(keys.GPU_RESOURCE, 0)
    if type(raw) is int:  # the common case first: no isinstance chain
        return raw
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        return 0
    try:
        return int(raw)
    except ValueError:
        return 0


def pod_gpus(spec: Mapping[str, Any]) -> int:
    """GPUs a pod asks for: its containers' sum, or its largest init container when more."""
    main = 0
    for c in _l(spec.get("containers")):
        main += _container_gpus(c)
    init: int | None = None
    for c in _l(spec.get("initContainers")):
        n = _container_gpus(c)
        init = n if init is None or n > init else init
    return max(main, 0 if init is None else init)


def _template_spec(replica: Any) -> Mapping[str, Any]:
    return _d(_d(_d(replica).get("template")).get("spec"))


def _replicas(kind: str, obj: Mapping[str, Any]) -> tuple[Replica, ...]:
    spec = _d(obj.get("spec"))
    if kind in _REPLICA_FIELD:
        out = []
        for role, rep in sorted(_d(spec.get(_REPLICA_FIELD[kind])).items()):
            default = 0 if (kind == MPIJOB and role == "Worker") else 1
            count = _i(_d(rep).get("replicas"), default) or 0
            out.append(Replica(str(role), max(count, 0), _template_spec(rep)))
        return tuple(out)
    if kind == BATCH_JOB:
        parallelism = _i(spec.get("parallelism"), 1) or 0
        completions = _i(spec.get("completions"))
        count = min(parallelism, completions) if completions is not None else parallelism
        return (Replica("Job", max(count, 0), _template_spec(spec)),)
    return ()


_workloads: OrderedDict[tuple[Any, ...], Workload] = OrderedDict()


def chain_key(pod: Mapping[str, Any], owners: Sequence[Mapping[str, Any]]
              ) -> tuple[Any, ...] | None:
    """Everything the owner-chain walk reads: the pod's ownerReferences (the fields used) and
    each owner's (uid, resourceVersion), which fix the owner's content. None when an owner has
    no uid/resourceVersion (hand-written input) or a reference is not an object of strings."""
    refs = _d(pod.get("metadata")).get("ownerReferences")
    if type(refs) is not list:
        return None
    key: list[Any] = []
    for ref in refs:
        if type(ref) is not dict:
            return None
        fields = (ref.get("apiVersion"), ref.get("kind"), ref.get("name"), ref.get("uid"))
        if not all(type(f) is str or f is None for f in fields):
            return None  # lists or objects there: not hashable, and never from an API server
        key.append((*fields, ref.get("controller") is True))
    key.append(None)
    for obj in owners:
        meta = _d(obj.get("metadata")) if type(obj) is dict else {}
        uid, rv = meta.get("uid"), meta.get("resourceVersion")
        if type(uid) is not str or type(rv) is not str:
            return None
        key.append((uid, rv))
    return tuple(key)


def analyse(pod: Mapping[str, Any], owners: Sequence[Mapping[str, Any]]) -> Workload:
    """What job the pod belongs to. A pod whose job object was found is analysed from its
    ownerReferences and owner objects alone, so such results are memoised by `chain_key`
    (the workers of one job share them)."""
    return analyse_keyed(pod, owners, chain_key(pod, owners))


def analyse_keyed(pod: Mapping[str, Any], owners: Sequence[Mapping[str, Any]],
                  key: tuple[Any, ...] | None) -> Workload:
    """`analyse` with the pod's `chain_key` already computed (the outcome memo needs it too)."""
    if key is not None:
        found = _workloads.get(key)
        if found is not None:
            return found
    work = _analyse(pod, owners)
    if key is not None and work.facts is not None and work.kind != POD:
        _workloads[key] = work
        if len(_workloads) > _CACHE_SIZE:
            _workloads.popitem(last=False)
    return work


def _analyse(pod: Mapping[str, Any], owners: Sequence[Mapping[str, Any]]) -> Workload:
    meta = _d(pod.get("metadata"))
    labels = _d(meta.get("labels"))
    warnings: list[str] = []
    objs = [o for o in owners if type(o) is dict or isinstance(o, Mapping)]

    # Follow controller references from the pod up, attaching owner objects where we have them.
    chain: list[tuple[str, Mapping[str, Any], Mapping[str, Any] | None]] = []
    ref = controller_ref(pod)
    seen = 0
    while ref is not None and seen < 8:
        seen += 1
        kind = group_kind(ref.get("apiVersion"), ref.get("kind"))
        obj = None
        for o in objs:
            if _d(o.get("metadata")).get("name") == ref.get("name") and \
                    group_kind(o.get("apiVersion"), o.get("kind")) == kind:
                obj = o
                break
        chain.append((kind, ref, obj))
        ref = controller_ref(obj) if obj is not None else None
    if chain and chain[-1][2] is None and chain[-1][0] in _JOB_KINDS:
        warnings.append(f"owner {chain[-1][0]} {chain[-1][1].get('name')} not available: gang "
                        "settings derived from the pod's ownerReferences and labels")
        # An MPI v2 launcher is a Job owned by the MPIJob: its labels still name the MPIJob.
        job_name = _s(labels.get(JOB_NAME_LABEL))
        if chain[-1][0] == BATCH_JOB and job_name and labels.get(OPERATOR_LABEL) == "mpi-operator":
            chain.append((MPIJOB, {"name": job_name}, None))
    owner_kinds = frozenset(k for k, _, _ in chain)

    known = [c for c in chain if c[0] in _JOB_KINDS]
    if not known:
        spec = _d(pod.get("spec"))
        ann = _d(meta.get("annotations"))
        gpus = pod_gpus(spec)
        facts = JobFacts(
            replicas=(Replica("Pod", 1, spec),), members=1, auto_min_member=1, gpus=gpus,
            scheduling_policy={}, queue=_s(ann.get(keys.VOLCANO_QUEUE_ANNOTATION)),
            priority_class=_s(spec.get("priorityClassName")))
        return Workload(kind=POD, name=_s(meta.get("name")), owner=None,
                        owner_kinds=owner_kinds, gpus=gpus, facts=facts,
                        warnings=tuple(warnings))

    kind, ref, obj = known[-1]  # the outermost job: the MPIJob above a launcher's Job
    uid = _s(ref.get("uid")) or (_s(_d(obj.get("metadata")).get("uid")) if obj else None)
    name = _s(ref.get("name"))
    api_version = _s(ref.get("apiVersion")) or (_s(obj.get("apiVersion")) if obj else None)
    owner = OwnerRef(api_version, kind.rpartition("/")[2], name, uid) \
        if name and uid and api_version else None
    if obj is None:
        return Workload(kind=kind, name=name, owner=owner, owner_kinds=owner_kinds,
                        gpus=pod_gpus(_d(pod.get("spec"))), facts=None,
                        warnings=tuple(warnings))
    facts = job_facts(kind, obj)
    return Workload(kind=kind, name=name, owner=owner, owner_kinds=owner_kinds,
                    gpus=facts.gpus, facts=facts, warnings=tuple(warnings))
