"""How many pods each job kind runs, and which of them must start together (pure, never raises).

One function per kind reads the job object's spec the way its operator (or Kueue, computing the
job's pod sets) does, and returns its `PodSets`: the replicas in start order, how many pods the
gang waits for, and how many pods' resources it reserves. Sources, cited in docs/policies.md:

- JobSet (`jobset.x-k8s.io/v1alpha2`): each replicatedJob runs `replicas` Jobs of
  min(parallelism, completions) pods, as Kueue's jobset integration counts them. A
  replicatedJob that another one `dependsOn` with status Complete runs to completion before it
  (Kubeflow Trainer's dataset and model initializers): it is not part of the gang. Those created
  only after an earlier one is Ready (`dependsOn` status Ready, `startupPolicyOrder: InOrder`)
  cannot be waited for, or the gang would deadlock: the gang waits for the first stage and
  reserves the resources of all, as LWS's Volcano provider does for `LeaderReady`.
- TrainJob (`trainer.kubeflow.org/v1alpha1`): the JobSet the trainer made from it, with the
  `node` replicatedJob sized by the TrainJob's `trainer.numNodes` (the trainer resizes it so).
- PyTorchJob with `elasticPolicy`: the gang waits for the non-Worker replicas plus the elastic
  minimum of Workers (`minReplicas`, defaulted from maxReplicas, then from the Worker replicas,
  as the training operator defaults it); it scales up without a new gang.
- LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`): each group (leader + size-1 workers) is its
  own gang; with `startupPolicy: LeaderReady` the workers are created once the leader is ready,
  so the gang waits for the leader alone and reserves the group's resources (LWS's own Volcano
  provider does exactly this); so too with exclusive placement
  (`leaderworkerset.sigs.k8s.io/exclusive-topology`), whose workers are created once the leader
  is scheduled.
- batch/v1 Job: min(parallelism, completions) pods run at once, Indexed or not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.policy.jsonshape import as_int, as_list, as_map, as_str

#: the replicatedJob of a Kubeflow Trainer v2 runtime that runs the training nodes
TRAINER_NODE_JOB = "node"


@dataclass(frozen=True, slots=True)
class Replica:
    role: str
    count: int
    pod_spec: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PodSets:
    """The pods of a job that belong to its gang, in the order they start."""

    replicas: tuple[Replica, ...]
    #: pods the gang waits for when minAvailable is "auto"
    auto_min_member: int
    #: pods whose resources minResources "auto" reserves at least (0: only the min members)
    reserve_members: int = 0
    #: replicas (JobSet replicatedJobs) that run before the gang and are not part of it
    outside: frozenset[str] = frozenset()
    #: what the user should know about how the gang was sized
    notes: tuple[str, ...] = ()

    @property
    def members(self) -> int:
        return sum(r.count for r in self.replicas)


def template_spec(holder: Any) -> Mapping[str, Any]:
    """`holder.template.spec`: the pod spec of a replica, a Job spec or an LWS template."""
    return as_map(as_map(as_map(holder).get("template")).get("spec"))


def running_pods(job_spec: Mapping[str, Any]) -> int:
    """Pods a batch/v1 Job runs at once: parallelism (default 1), at most completions."""
    parallelism = as_int(job_spec.get("parallelism"), 1) or 0
    completions = as_int(job_spec.get("completions"))
    count = min(parallelism, completions) if completions is not None else parallelism
    return max(count, 0)


def kubeflow_replicas(specs: Mapping[str, Any], *, workers_default: int = 1
                      ) -> tuple[Replica, ...]:
    """The replica types of a Kubeflow job (MPIJob, PyTorchJob, TFJob), by name."""
    out = []
    for role, rep in sorted(specs.items()):
        default = workers_default if role == "Worker" else 1
        count = as_int(as_map(rep).get("replicas"), default) or 0
        out.append(Replica(str(role), max(count, 0), template_spec(rep)))
    return tuple(out)


def elastic_min_workers(spec: Mapping[str, Any], workers: int) -> int | None:
    """The elastic minimum of Workers of a PyTorchJob, None without an elasticPolicy."""
    policy = spec.get("elasticPolicy")
    if not isinstance(policy, Mapping):
        return None
    lo, hi = as_int(policy.get("minReplicas")), as_int(policy.get("maxReplicas"))
    return max(0, min(workers, lo if lo is not None else hi if hi is not None else workers))


def pytorchjob(spec: Mapping[str, Any]) -> PodSets:
    replicas = kubeflow_replicas(as_map(spec.get("pytorchReplicaSpecs")))
    members = sum(r.count for r in replicas)
    workers = next((r.count for r in replicas if r.role == "Worker"), 0)
    minimum = elastic_min_workers(spec, workers)
    if minimum is None:
        return PodSets(replicas, members)
    auto = members - workers + minimum
    return PodSets(replicas, auto, notes=(
        f"elastic PyTorchJob: the gang waits for {auto} of its {members} pods "
        f"({minimum} of {workers} Workers, elasticPolicy.minReplicas)",))


def batch_job(spec: Mapping[str, Any]) -> PodSets:
    count = running_pods(spec)
    notes: tuple[str, ...] = ()
    completions = as_int(spec.get("completions"))
    if spec.get("completionMode") == "Indexed" and completions is not None \
            and completions > count:
        notes = (f"Indexed Job: {completions} completions run {count} at a time "
                 f"(parallelism), so the gang is those {count} pods; a job whose ranks must all "
                 "run together needs parallelism = completions",)
    return PodSets((Replica("Job", count, template_spec(spec)),), count, notes=notes)


@dataclass(frozen=True, slots=True)
class _Stage:
    name: str
    replica: Replica
    after_ready: bool  # created only once an earlier replicatedJob is Ready


def jobset(spec: Mapping[str, Any], node_count: int | None = None) -> PodSets:
    """A JobSet's gang; `node_count` is a TrainJob's numNodes for its `node` replicatedJob."""
    in_order = as_map(spec.get("startupPolicy")).get("startupPolicyOrder") == "InOrder"
    jobs = [as_map(j) for j in as_list(spec.get("replicatedJobs"))]
    before = {as_str(as_map(d).get("name")) for j in jobs for d in as_list(j.get("dependsOn"))
              if as_map(d).get("status") == "Complete"}
    stages: list[_Stage] = []
    for j in jobs:
        name = as_str(j.get("name")) or ""
        job_spec = template_spec(j)
        per_job = running_pods(job_spec)
        if name == TRAINER_NODE_JOB and node_count is not None:
            per_job = node_count
        count = (as_int(j.get("replicas"), 1) or 0) * per_job
        after_ready = any(as_map(d).get("status") == "Ready" for d in as_list(j.get("dependsOn")))
        if name not in before:
            stages.append(_Stage(name, Replica(name, max(count, 0), template_spec(job_spec)),
                                 after_ready or (in_order and bool(stages))))
    replicas = tuple(s.replica for s in stages)
    members = sum(r.count for r in replicas)
    outside = frozenset(n for n in before if n)
    notes = [f"replicatedJobs {', '.join(sorted(outside))} run to completion before the others "
             "start (dependsOn Complete): their pods are not part of the gang"] if outside else []
    # the first replicatedJob of the gang starts it, whatever it waited for
    first = next((i for i, s in enumerate(stages) if i and s.after_ready), None)
    if first is None:
        return PodSets(replicas, members, outside=outside, notes=tuple(notes))
    auto = sum(s.replica.count for s in stages[:first])
    why = "startupPolicyOrder InOrder" if in_order else "dependsOn Ready"
    notes.append(f"{why}: later replicatedJobs are created once earlier ones are Ready, so the "
                 f"gang waits for the first {auto} of {members} pods and reserves the resources "
                 "of all")
    return PodSets(replicas, auto, reserve_members=members, outside=outside, notes=tuple(notes))


#: LeaderWorkerSet's exclusive placement: each group alone in one domain of this node label;
#: its controller creates a group's workers only once the leader is scheduled
LWS_EXCLUSIVE_ANNOTATION = "leaderworkerset.sigs.k8s.io/exclusive-topology"


def leaderworkerset(spec: Mapping[str, Any], annotations: Mapping[str, Any]) -> PodSets:
    """One group of a LeaderWorkerSet (`spec`, the object's `annotations`): its leader and
    size-1 workers."""
    template = as_map(spec.get("leaderWorkerTemplate"))
    size = max(as_int(template.get("size"), 1) or 1, 1)
    workers = as_map(as_map(template.get("workerTemplate")).get("spec"))
    # without a leaderTemplate the leader runs the worker template
    leader = as_map(as_map(template.get("leaderTemplate")).get("spec")) or workers
    replicas = (Replica("Leader", 1, leader), Replica("Worker", size - 1, workers))
    exclusive = as_str(annotations.get(LWS_EXCLUSIVE_ANNOTATION))
    why = ("startupPolicy LeaderReady: the workers are created once the leader is ready"
           if spec.get("startupPolicy") == "LeaderReady" else
           f"exclusive placement ({LWS_EXCLUSIVE_ANNOTATION}: {exclusive}): the workers are "
           "created once the leader is scheduled" if exclusive else None)
    if why and size > 1:
        return PodSets(replicas, 1, reserve_members=size, notes=(
            f"{why}, so the gang waits for the leader and reserves the resources of all "
            f"{size} pods",))
    return PodSets(replicas, size)
