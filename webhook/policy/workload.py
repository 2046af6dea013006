"""What job a pod belongs to, read from the pod and its owner objects (pure, never raises).

Gang settings follow the MPI operator's (v2beta1) semantics, which users already know; each
job kind's pods are counted from its own spec as its operator does (`podsets`): MPIJob,
PyTorchJob (elastic too), TFJob, JobSet, TrainJob, LeaderWorkerSet (a gang per group), batch/Job,
and a bare pod (a gang of one). Every pod of one job must come out with the same group, so
everything here is read from the job objects, never from the individual pod, when the job is
known; the exceptions are a LeaderWorkerSet pod's group index and a JobSet pod's replicatedJob,
which `chain_key` includes.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from webhook import keys
from webhook.lru import Lru
from webhook.podresources import pod_gpus, pod_requests
from webhook.policy import podsets
from webhook.policy.decision import OwnerRef
from webhook.policy.jsonshape import as_int, as_list, as_map, as_str
from webhook.policy.podsets import PodSets, Replica
from webhook.quantity import add_value, format_quantity

MPIJOB = "kubeflow.org/MPIJob"
PYTORCHJOB = "kubeflow.org/PyTorchJob"
TFJOB = "kubeflow.org/TFJob"
BATCH_JOB = "batch/Job"
JOBSET = "jobset.x-k8s.io/JobSet"
TRAINJOB = "trainer.kubeflow.org/TrainJob"
LEADERWORKERSET = "leaderworkerset.x-k8s.io/LeaderWorkerSet"
POD = "Pod"
_JOB_KINDS = frozenset({MPIJOB, PYTORCHJOB, TFJOB, BATCH_JOB, JOBSET, TRAINJOB,
                        LEADERWORKERSET})
#: replica types that go first when minResources is summed over the minMember first replicas
_LEADERS = ("Launcher", "Master", "Chief", "PS", "Leader")
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
OPERATOR_LABEL = "training.kubeflow.org/operator-name"
#: set by the JobSet controller on its Jobs and their pods
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
#: JobSet's exclusive placement: each child Job alone in one domain of this node label. Its pod
#: webhook gives the leader (completion index 0) the affinity terms and refuses the followers
#: until the leader is scheduled, unless the node-selector strategy is also set
JOBSET_EXCLUSIVE_ANNOTATION = "alpha.jobset.sigs.k8s.io/exclusive-topology"
JOBSET_NODE_SELECTOR_ANNOTATION = "alpha.jobset.sigs.k8s.io/node-selector"
#: set by the LeaderWorkerSet controller (workers) and its pod webhook (leaders)
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
#: set by the StatefulSet controller (Kubernetes 1.28+): a leader's ordinal is its group index
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
#: the pod labels `chain_key` includes: the only things read from a pod of a known job
_POD_KEY_LABELS = (JOBSET_REPLICATED_JOB_LABEL, LWS_GROUP_INDEX_LABEL, POD_INDEX_LABEL)
_STR_OR_NONE = frozenset({str, type(None)})


#: core-group kinds (no group in `ownerKinds`) that own pods: a LeaderWorkerSet's leader Pod,
#: a ReplicationController, a Node (its static pods' mirrors)
_CORE_POD_OWNERS = frozenset({POD, "ReplicationController", "Node"})


#: owner kinds as `ownerKinds` names them whose spelling is known: the job kinds, the core
#: owners and Kubernetes' own workload controllers
_KNOWN_OWNERS = frozenset({*_JOB_KINDS, *_CORE_POD_OWNERS, "apps/ReplicaSet", "apps/Deployment",
                           "apps/StatefulSet", "apps/DaemonSet", "batch/CronJob"})


def unmatched_owner_kind(kind: str) -> str | None:
    """Why an `ownerKinds` entry matches no pod, when it certainly does not: a known kind
    written in another case (`kubeflow.org/MpiJob`: kinds are compared exactly), or a Kind
    without its group, which names a core-group kind, and none of that name owns pods
    (`PyTorchJob` for `kubeflow.org/PyTorchJob`). Names the kind most likely meant."""
    if kind in _KNOWN_OWNERS:
        return None
    cased = next((k for k in sorted(_KNOWN_OWNERS) if k.lower() == kind.lower()), None)
    if cased is not None:
        return (f"{kind!r} matches no pod: groups and kinds are compared exactly, case "
                f"included; did you mean {cased}?")
    if "/" in kind:
        return None
    known = {k.rpartition("/")[2].lower(): k for k in sorted(_JOB_KINDS)}
    close = difflib.get_close_matches(kind.lower(), known, n=1, cutoff=0.75)
    meant = (f"did you mean {known[close[0]]}?" if close
             else "write group/Kind, e.g. kubeflow.org/MPIJob or batch/Job")
    return (f"{kind!r} has no group, so it names a core-group kind, and no such kind owns pods: "
            f"it matches no pod; {meant}")


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
    refs = as_list(as_map(obj.get("metadata")).get("ownerReferences"))
    only = None
    for ref in refs:
        if type(ref) is dict or isinstance(ref, Mapping):
            if ref.get("controller") is True:
                return ref
            only = ref if len(refs) == 1 else None
    return only


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
    #: pods whose resources minResources "auto" reserves at least (see podsets.PodSets)
    reserve_members: int = 0
    #: replicas whose pods run before the gang and do not join it
    outside: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()
    #: the job object's own network annotations (KAI reads them there: `keys.NETWORK_ANNOTATIONS`)
    network: Mapping[str, str] = field(default_factory=dict)
    #: (min_member, replica priorities) → minResources, filled on first use
    min_resources_memo: dict[tuple[int, tuple[int, ...]], dict[str, str] | None] = field(
        default_factory=dict)

    def replica_priorities(self, priorities: Priorities) -> tuple[int, ...]:
        """Each replica's PriorityClass value (0 without one, or for a class not found)."""
        if not priorities.values:  # no PriorityClass known: every replica 0
            return (0,) * len(self.replicas)
        return tuple(priorities.values.get(str(r.pod_spec.get("priorityClassName") or ""), 0)
                     for r in self.replicas)

    def min_resources(self, min_member: int, values: tuple[int, ...] | None = None
                      ) -> dict[str, str] | None:
        """Sum of the requests of the first min_member pods (at least `reserve_members`: a
        staged job reserves what all its stages need), each pod's counted as the scheduler
        counts it (`podresources.pod_requests`), the replicas of higher PriorityClass value
        first and, between equals, the launcher or master first: as mpi-operator's
        calPGMinResource (see docs/policies.md for where its arithmetic differs). `values`:
        `replica_priorities` (None: every replica equal)."""
        key = (max(min_member, self.reserve_members),
               values if values is not None else (0,) * len(self.replicas))
        if key not in self.min_resources_memo:
            self.min_resources_memo[key] = _sum_resources(self.replicas, *key)
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
        # a bad quantity counts as none: the API server rejects such pods anyway
        for name, value in pod_requests(rep.pod_spec).items():
            add_value(total, name, value, take)
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
    #: why this pod runs apart from its job's gang (a JobSet initializer), else None
    solo: str | None = None

    @property
    def members(self) -> int | None:
        """All pods of the job, None when the job object is unknown."""
        return self.facts.members if self.facts else None

    @property
    def auto_min_member(self) -> int | None:
        """minAvailable "auto": the pods that start together (podsets)."""
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

    def min_resources(self, min_member: int, values: tuple[int, ...] | None = None
                      ) -> dict[str, str] | None:
        return self.facts.min_resources(min_member, values) if self.facts else None


def _version(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    meta = as_map(obj.get("metadata"))
    uid, rv = as_str(meta.get("uid")), as_str(meta.get("resourceVersion"))
    return (uid, rv) if uid is not None and rv is not None else None


def facts_key(kind: str, obj: Mapping[str, Any], inner: Mapping[str, Any] | None
              ) -> tuple[Any, ...] | None:
    """kind and each object's (uid, resourceVersion): the API server changes resourceVersion
    on every write, so equal keys mean equal content. None for objects without both
    (hand-written input)."""
    versions = [_version(o) for o in (obj, inner) if o is not None]
    return None if any(v is None for v in versions) else (kind, *versions)


def pod_sets(kind: str, obj: Mapping[str, Any], inner: Mapping[str, Any] | None = None
             ) -> PodSets:
    """The job's pods, as its operator counts them (see podsets)."""
    spec = as_map(obj.get("spec"))
    if kind == MPIJOB:
        replicas = podsets.kubeflow_replicas(as_map(spec.get("mpiReplicaSpecs")),
                                             workers_default=0)
        return PodSets(replicas, next((r.count for r in replicas if r.role == "Worker"), 0) + 1)
    if kind == PYTORCHJOB:
        return podsets.pytorchjob(spec)
    if kind == TFJOB:
        replicas = podsets.kubeflow_replicas(as_map(spec.get("tfReplicaSpecs")))
        return PodSets(replicas, sum(r.count for r in replicas))
    if kind == BATCH_JOB:
        return podsets.batch_job(spec)
    if kind == JOBSET:
        return podsets.jobset(spec)
    if kind == TRAINJOB:
        nodes = as_int(as_map(spec.get("trainer")).get("numNodes"))
        return podsets.jobset(as_map(as_map(inner).get("spec")), nodes)
    if kind == LEADERWORKERSET:
        return podsets.leaderworkerset(spec, as_map(as_map(obj.get("metadata")).get("annotations")))
    return PodSets((), 0)


def _job_facts(kind: str, obj: Mapping[str, Any], inner: Mapping[str, Any] | None) -> JobFacts:
    sets = pod_sets(kind, obj, inner)
    by_role = {r.role: r for r in sets.replicas}
    priority_class = next(
        (pc for role in ("Launcher", "Worker", *sorted(by_role))
         if role in by_role and (pc := as_str(by_role[role].pod_spec.get("priorityClassName")))),
        None)
    spec = as_map(obj.get("spec"))
    annotations = as_map(as_map(obj.get("metadata")).get("annotations"))
    queue = as_str(annotations.get(keys.VOLCANO_QUEUE_ANNOTATION))
    if queue is None and inner is not None:
        queue = as_str(as_map(as_map(inner.get("metadata")).get("annotations")).get(
            keys.VOLCANO_QUEUE_ANNOTATION))
    return JobFacts(
        replicas=sets.replicas, members=sets.members, auto_min_member=sets.auto_min_member,
        gpus=sum(r.count * pod_gpus(r.pod_spec) for r in sets.replicas),
        scheduling_policy=as_map(as_map(spec.get("runPolicy")).get("schedulingPolicy")),
        queue=queue, priority_class=priority_class, reserve_members=sets.reserve_members,
        outside=sets.outside, notes=sets.notes,
        network={k: v for k in keys.NETWORK_ANNOTATIONS
                 if type(v := annotations.get(k)) is str})


def chain_key(pod: Mapping[str, Any], owners: Sequence[Mapping[str, Any]]
              ) -> tuple[Any, ...] | None:
    """Everything the owner-chain walk reads: the pod's ownerReferences (the fields used), its
    name and the `_POD_KEY_LABELS` (a LeaderWorkerSet's group; a JobSet's replicatedJob), and
    each owner's (uid, resourceVersion), which fix the owner's content. None when an owner has
    no uid/resourceVersion (hand-written input) or a reference is not an object of strings."""
    meta = as_map(pod.get("metadata"))
    refs = meta.get("ownerReferences")
    if type(refs) is not list:
        return None
    key: list[Any] = []
    by_sts = False
    for ref in refs:
        if type(ref) is not dict:
            return None
        get = ref.get
        fields = (get("apiVersion"), get("kind"), get("name"), get("uid"))
        for f in fields:
            if type(f) not in _STR_OR_NONE:
                return None  # lists or objects there: not hashable, never from an API server
        controller = get("controller") is True
        # the name only where it is read: a StatefulSet pod's ordinal (a LeaderWorkerSet leader)
        by_sts = by_sts or (controller and fields[1] == "StatefulSet")
        key.append((*fields, controller))
    labels = meta.get("labels")
    if labels is not None and type(labels) is not dict:
        return None
    name = meta.get("name") if by_sts else None
    pod_keys = (name, *map(labels.get, _POD_KEY_LABELS)) if labels else (name,)
    for v in pod_keys:
        if type(v) not in _STR_OR_NONE:
            return None
    key.append(pod_keys)
    for obj in owners:
        meta = as_map(obj.get("metadata")) if type(obj) is dict else {}
        uid, rv = meta.get("uid"), meta.get("resourceVersion")
        if type(uid) is not str or type(rv) is not str:
            return None
        key.append((uid, rv))
    return tuple(key)


def workload_of(pod: Mapping[str, Any], owners: Sequence[Mapping[str, Any]]) -> Workload:
    """What job the pod belongs to (analysed afresh; `WorkloadMemo` remembers analyses)."""
    return _read_workload(pod, owners, None)


class WorkloadMemo:
    """Analyses of job pods by `chain_key`, and job facts by `facts_key`, each a bounded LRU.

    A pod whose job object was found is analysed from its ownerReferences, `chain_key`'s few pod
    fields and the owner objects alone, so the workers of one job share one analysis. The policy
    index owns one (so a policy reload starts it empty)."""

    def __init__(self, size: int = 512) -> None:
        self._workloads: Lru[tuple[Any, ...], Workload] = Lru(size)
        self._facts: Lru[tuple[Any, ...], JobFacts] = Lru(size)

    def workload(self, pod: Mapping[str, Any], owners: Sequence[Mapping[str, Any]],
                 key: tuple[Any, ...] | None) -> Workload:
        """`workload_of`, remembered by the pod's `chain_key` (computed by the caller: the
        outcome memo needs it too)."""
        if key is not None:
            found = self._workloads.get(key)
            if found is not None:
                return found
        work = _read_workload(pod, owners, self)
        if key is not None and work.facts is not None and work.kind != POD:
            self._workloads.put(key, work)
        return work

    def facts(self, kind: str, obj: Mapping[str, Any], inner: Mapping[str, Any] | None = None
              ) -> JobFacts:
        """JobFacts of a job object (and, for a TrainJob, the JobSet made from it)."""
        key = facts_key(kind, obj, inner)
        found = self._facts.get(key) if key is not None else None
        if found is None:
            found = _job_facts(kind, obj, inner)
            if key is not None:
                self._facts.put(key, found)
        return found

    def clear(self) -> None:
        self._workloads.clear()
        self._facts.clear()


_Link = tuple[str, Mapping[str, Any], Mapping[str, Any] | None]


def _chain(pod: Mapping[str, Any], owners: Sequence[Mapping[str, Any]]) -> list[_Link]:
    """(group/Kind, reference, object when given) from the pod's controller up to the root."""
    objs = [o for o in owners if type(o) is dict or isinstance(o, Mapping)]
    chain: list[_Link] = []
    ref = controller_ref(pod)
    while ref is not None and len(chain) < 8:
        kind = group_kind(ref.get("apiVersion"), ref.get("kind"))
        obj = next((o for o in objs if as_map(o.get("metadata")).get("name") == ref.get("name")
                    and group_kind(o.get("apiVersion"), o.get("kind")) == kind), None)
        chain.append((kind, ref, obj))
        ref = controller_ref(obj) if obj is not None else None
    return chain


def _bare_pod(pod: Mapping[str, Any], owner_kinds: frozenset[str], warnings: list[str],
              solo: str | None = None) -> Workload:
    meta = as_map(pod.get("metadata"))
    spec = as_map(pod.get("spec"))
    gpus = pod_gpus(spec)
    facts = JobFacts(
        replicas=(Replica("Pod", 1, spec),), members=1, auto_min_member=1, gpus=gpus,
        scheduling_policy={},
        queue=as_str(as_map(meta.get("annotations")).get(keys.VOLCANO_QUEUE_ANNOTATION)),
        priority_class=as_str(spec.get("priorityClassName")))
    return Workload(kind=POD, name=as_str(meta.get("name")), owner=None, owner_kinds=owner_kinds,
                    gpus=gpus, facts=facts, warnings=tuple(warnings), solo=solo)


def _lws_group(pod: Mapping[str, Any], chain: list[_Link]) -> str | None:
    """A LeaderWorkerSet pod's group index: the workers' label, else the leader's ordinal (the
    LWS pod webhook labels leaders too, but it may run after Muster's)."""
    meta = as_map(pod.get("metadata"))
    labels = as_map(meta.get("labels"))
    group = as_str(labels.get(LWS_GROUP_INDEX_LABEL))
    if group is None and len(chain) == 2:  # a leader: pod -> StatefulSet -> LeaderWorkerSet
        group = as_str(labels.get(POD_INDEX_LABEL))
        name, sts = as_str(meta.get("name")), as_str(chain[0][1].get("name"))
        if group is None and name and sts and name.startswith(sts + "-"):
            group = name[len(sts) + 1:]
    return group if group is not None and group.isdigit() else None


def _replicated_job(pod: Mapping[str, Any], chain: list[_Link]) -> str | None:
    """The JobSet replicatedJob of a pod: its Job's label, else its own."""
    job = chain[0][2] if chain and chain[0][0] == BATCH_JOB else None
    for meta in (as_map(job.get("metadata")) if job else {}, as_map(pod.get("metadata"))):
        name = as_str(as_map(meta.get("labels")).get(JOBSET_REPLICATED_JOB_LABEL))
        if name:
            return name
    return None


def _leader_first(pod: Mapping[str, Any], chain: list[_Link]) -> str | None:
    """The node label of a JobSet's exclusive placement by leader pods, from the pod's Job,
    else its replicatedJob's template, else the JobSet (as the JobSet controller passes them
    down); None when it has none or uses the node-selector strategy."""
    merged: dict[str, Any] = {}
    jobset = next((o for k, _, o in chain if k == JOBSET and o is not None), None)
    if jobset is not None:
        merged.update(as_map(as_map(jobset.get("metadata")).get("annotations")))
        name = _replicated_job(pod, chain)
        for rj in as_list(as_map(jobset.get("spec")).get("replicatedJobs")):
            if as_map(rj).get("name") == name:
                template = as_map(as_map(as_map(rj).get("template")).get("metadata"))
                merged.update(as_map(template.get("annotations")))
    job = chain[0][2] if chain and chain[0][0] == BATCH_JOB else None
    if job is not None:
        merged.update(as_map(as_map(job.get("metadata")).get("annotations")))
    key = as_str(merged.get(JOBSET_EXCLUSIVE_ANNOTATION))
    return key if key and JOBSET_NODE_SELECTOR_ANNOTATION not in merged else None


def _read_workload(pod: Mapping[str, Any], owners: Sequence[Mapping[str, Any]],
                   memo: WorkloadMemo | None) -> Workload:
    labels = as_map(as_map(pod.get("metadata")).get("labels"))
    warnings: list[str] = []
    chain = _chain(pod, owners)
    if chain and chain[-1][2] is None and chain[-1][0] in _JOB_KINDS:
        warnings.append(f"owner {chain[-1][0]} {chain[-1][1].get('name')} not available: gang "
                        "settings derived from the pod's ownerReferences and labels")
        # An MPI v2 launcher is a Job owned by the MPIJob: its labels still name the MPIJob.
        job_name = as_str(labels.get(JOB_NAME_LABEL))
        if chain[-1][0] == BATCH_JOB and job_name and labels.get(OPERATOR_LABEL) == "mpi-operator":
            chain.append((MPIJOB, {"name": job_name}, None))
    owner_kinds = frozenset(k for k, _, _ in chain)

    known = [c for c in chain if c[0] in _JOB_KINDS]
    if not known:
        return _bare_pod(pod, owner_kinds, warnings)

    kind, ref, obj = known[-1]  # the outermost job: the MPIJob above a launcher's Job
    exclusive = _leader_first(pod, chain) if JOBSET in owner_kinds else None
    if exclusive:
        return _bare_pod(pod, owner_kinds, warnings, solo=(
            f"JobSet exclusive placement ({JOBSET_EXCLUSIVE_ANNOTATION}: {exclusive}) creates "
            "each Job's followers only once its leader is scheduled, so a gang of its pods "
            "would never be whole: they are scheduled one by one, as JobSet expects"))
    uid = as_str(ref.get("uid")) or (as_str(as_map(obj.get("metadata")).get("uid"))
                                     if obj else None)
    name = as_str(ref.get("name"))
    api_version = as_str(ref.get("apiVersion")) or (as_str(obj.get("apiVersion")) if obj else None)
    owner = OwnerRef(api_version, kind.rpartition("/")[2], name, uid) \
        if name and uid and api_version else None
    if kind == LEADERWORKERSET:
        group = _lws_group(pod, chain)
        if group is None:
            warnings.append(f"LeaderWorkerSet {name}: the pod's group index is unknown (no "
                            f"{LWS_GROUP_INDEX_LABEL} label, no ordinal)")
        name = f"{name}-{group}" if name and group is not None else None
    inner = None
    if kind == TRAINJOB:
        # the TrainJob's pods are those of the JobSet the trainer made from it
        inner = next((o for k, _, o in chain if k == JOBSET and o is not None), None)
        obj = obj if inner is not None else None
    if obj is None:
        return Workload(kind=kind, name=name, owner=owner, owner_kinds=owner_kinds,
                        gpus=pod_gpus(as_map(pod.get("spec"))), facts=None,
                        warnings=tuple(warnings))
    facts = memo.facts(kind, obj, inner) if memo is not None else _job_facts(kind, obj, inner)
    replicated = _replicated_job(pod, chain) if facts.outside else None
    if replicated in facts.outside:
        return _bare_pod(pod, owner_kinds, warnings, solo=(
            f"replicatedJob {replicated} of {kind} {ref.get('name')} runs to completion before "
            "the gang starts (dependsOn Complete): its pods are not part of the gang"))
    return Workload(kind=kind, name=name, owner=owner, owner_kinds=owner_kinds,
                    gpus=facts.gpus, facts=facts, warnings=(*warnings, *facts.notes))
