"""What each job kind's operator and controllers create from a job, down to its pods (pure).

Every object has the name, labels and controller reference upstream gives it:
- the MPI operator (v2beta1): workers `<job>-worker-<i>` owned by the MPIJob, and a
  `<job>-launcher` Job whose pod the Job controller makes (see ../shared/fixtures/admission/
  for the real captured requests);
- the training operator: `<job>-<type>-<i>` (PyTorchJob, TFJob);
- the Job controller: min(parallelism, completions) pods at first, `<job>-<index>-*` when
  Indexed (with the completion index as label and annotation), else `<job>-*`;
- the JobSet controller: `<jobset>-<replicatedJob>-<index>` Jobs;
- Kubeflow Trainer: a JobSet named after the TrainJob, as a torch runtime makes it (a dataset
  initializer that completes first, then `numNodes` training nodes); `expand` does not read the
  runtime, so its pods run the TrainJob's own `trainer` image and `resourcesPerNode`;
- LeaderWorkerSet: a leader StatefulSet named after the set (pods `<name>-<group>`), and a
  worker StatefulSet `<name>-<group>` owned by each leader pod.

`expand` turns a job as submitted into its pods, each with its owner objects, for
`muster policy explain | test`; the demo and the test tiers play the controllers' part with the
same builders, on the objects the API server returned.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook import keys
from webhook.policy.jsonshape import as_int, as_list, as_map, as_str
from webhook.policy.podsets import running_pods
from webhook.policy.workload import (
    BATCH_JOB,
    JOB_NAME_LABEL,
    JOBSET,
    JOBSET_REPLICATED_JOB_LABEL,
    LEADERWORKERSET,
    LWS_GROUP_INDEX_LABEL,
    MPIJOB,
    OPERATOR_LABEL,
    POD_INDEX_LABEL,
    PYTORCHJOB,
    TFJOB,
    TRAINJOB,
    group_kind,
)

JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
#: the training operator's replica specs and operator name, per kind
_KUBEFLOW = {PYTORCHJOB: ("pytorchReplicaSpecs", "pytorchjob-controller"),
             TFJOB: ("tfReplicaSpecs", "tfjob-controller")}


@dataclass(frozen=True)
class JobPod:
    """A pod a job's controllers create, and its owner objects from its controller up."""

    pod: dict[str, Any]
    owners: tuple[dict[str, Any], ...]


def controller_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The controller ownerReference a child of `obj` carries."""
    meta = as_map(obj.get("metadata"))
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
            "name": meta.get("name"), "uid": meta.get("uid"),
            "controller": True, "blockOwnerDeletion": True}


def _meta(owner: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    """Metadata of a child of `owner`: in its namespace, controlled by it."""
    ns = as_map(owner.get("metadata")).get("namespace")
    return {**fields, **({"namespace": ns} if ns else {}),
            "ownerReferences": [controller_of(owner)]}


def _pod(template: Any, metadata: dict[str, Any]) -> dict[str, Any]:
    """A pod from a pod template: the template's labels and annotations, then `metadata`."""
    template = as_map(template)
    tmeta = as_map(template.get("metadata"))
    labels = {**as_map(tmeta.get("labels")), **metadata.pop("labels", {})}
    annotations = {**as_map(tmeta.get("annotations")), **metadata.pop("annotations", {})}
    meta = {**metadata, **({"labels": labels} if labels else {}),
            **({"annotations": annotations} if annotations else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": copy.deepcopy(dict(as_map(template.get("spec"))))}


def _template(value: Any, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A copy of a pod template, with a metadata mapping holding `labels` too."""
    out = copy.deepcopy(dict(as_map(value)))
    meta = dict(as_map(out.get("metadata")))
    if labels:
        meta["labels"] = {**as_map(meta.get("labels")), **labels}
    out["metadata"] = meta
    return out


def _name(obj: Mapping[str, Any]) -> str:
    return str(as_map(obj.get("metadata")).get("name") or "")


# --- MPI operator (v2beta1) -----------------------------------------------------------------


def _mpi_labels(job: str, role: str) -> dict[str, str]:
    return {JOB_NAME_LABEL: job, JOB_ROLE_LABEL: role, OPERATOR_LABEL: "mpi-operator",
            keys.REPLICA_TYPE_LABEL: role}


def mpi_worker_pods(mpijob: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The worker pods of an MPIJob."""
    name = _name(mpijob)
    spec = as_map(as_map(as_map(mpijob.get("spec")).get("mpiReplicaSpecs")).get("Worker"))
    pods = []
    for i in range(as_int(spec.get("replicas"), 1) or 0):
        pod = _pod(spec.get("template"), _meta(
            mpijob, name=f"{name}-worker-{i}",
            labels={**_mpi_labels(name, "worker"), keys.REPLICA_INDEX_LABEL: str(i)}))
        pod["spec"].setdefault("schedulerName", "default-scheduler")
        pod["spec"].setdefault("hostname", f"{name}-worker-{i}")
        pod["spec"].setdefault("subdomain", f"{name}-worker")
        pods.append(pod)
    return pods


def mpi_launcher_job(mpijob: Mapping[str, Any]) -> dict[str, Any]:
    """The batch Job the MPI operator creates for the launcher."""
    name = _name(mpijob)
    launcher = as_map(as_map(as_map(mpijob.get("spec")).get("mpiReplicaSpecs")).get("Launcher"))
    template = _template(launcher.get("template"), _mpi_labels(name, "launcher"))
    template["spec"] = {"restartPolicy": "Never", **as_map(template.get("spec"))}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": _meta(mpijob, name=f"{name}-launcher",
                              labels=_mpi_labels(name, "launcher")),
            "spec": {"backoffLimit": 6, "completions": 1, "parallelism": 1,
                     "template": template}}


def mpi_launcher_pod(job: Mapping[str, Any]) -> dict[str, Any]:
    """The pod the Job controller creates for a launcher Job (generateName, no name)."""
    (pod,) = job_pods(job)
    pod["spec"].setdefault("schedulerName", "default-scheduler")
    return pod


# --- the training operator, the Job and JobSet controllers, Kubeflow Trainer ----------------


def kubeflow_pods(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pods the training operator creates for a PyTorchJob or TFJob: `<job>-<type>-<i>`."""
    field, operator = _KUBEFLOW[group_kind(job.get("apiVersion"), job.get("kind"))]
    name = _name(job)
    pods = []
    for role, replica in as_map(as_map(job.get("spec")).get(field)).items():
        spec = as_map(replica)
        for i in range(as_int(spec.get("replicas"), 1) or 0):
            pods.append(_pod(spec.get("template"), _meta(
                job, name=f"{name}-{str(role).lower()}-{i}",
                labels={JOB_NAME_LABEL: name, OPERATOR_LABEL: operator,
                        keys.REPLICA_TYPE_LABEL: str(role).lower(),
                        keys.REPLICA_INDEX_LABEL: str(i)})))
    return pods


def job_pods(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pods the Job controller creates first: as many as run at once (podsets), with the
    Indexed completion index as label and annotation."""
    spec = as_map(job.get("spec"))
    name = _name(job)
    indexed = spec.get("completionMode") == "Indexed"
    pods = []
    for i in range(running_pods(spec)):
        labels = {"batch.kubernetes.io/job-name": name, "job-name": name}
        annotations = {}
        if indexed:
            labels[keys.COMPLETION_INDEX_LABEL] = annotations[keys.COMPLETION_INDEX_LABEL] = str(i)
        pods.append(_pod(spec.get("template"), _meta(
            job, generateName=f"{name}-{i}-" if indexed else f"{name}-", labels=labels,
            annotations=annotations)))
    return pods


def child_jobs(js: Mapping[str, Any], only: Sequence[str] | None = None
               ) -> list[dict[str, Any]]:
    """The Jobs the JobSet controller creates (of the replicatedJobs `only`, else all)."""
    out = []
    name = _name(js)
    for rj in map(as_map, as_list(as_map(js.get("spec")).get("replicatedJobs"))):
        rj_name = str(rj.get("name") or "")
        if only is not None and rj_name not in only:
            continue
        for index in range(as_int(rj.get("replicas"), 1) or 0):
            labels = {JOBSET_NAME_LABEL: name, JOBSET_REPLICATED_JOB_LABEL: rj_name,
                      keys.JOBSET_JOB_INDEX_LABEL: str(index)}
            spec = copy.deepcopy(dict(as_map(as_map(rj.get("template")).get("spec"))))
            spec["template"] = _template(spec.get("template"), labels)
            out.append({"apiVersion": "batch/v1", "kind": "Job",
                        "metadata": _meta(js, name=f"{name}-{rj_name}-{index}",
                                          labels=labels),
                        "spec": spec})
    return out


def trainjob_jobset(tj: Mapping[str, Any], template: Mapping[str, Any]) -> dict[str, Any]:
    """The JobSet Kubeflow Trainer makes from a TrainJob of a torch runtime: a dataset
    initializer that completes first, then `numNodes` training nodes (one Job, one pod each),
    every pod from the pod `template` (with the labels a runtime's podGroupPolicy makes the
    trainer add to every pod)."""
    nodes = as_int(as_map(as_map(tj.get("spec")).get("trainer")).get("numNodes"), 1) or 1

    def replicated(name: str, parallelism: int) -> dict[str, Any]:
        return {"name": name, "replicas": 1, "template": {"spec": {
            "parallelism": parallelism, "completions": parallelism, "completionMode": "Indexed",
            "backoffLimit": 0, "template": copy.deepcopy(dict(template))}}}

    node = replicated("node", nodes)
    node["dependsOn"] = [{"name": "dataset-initializer", "status": "Complete"}]
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": _meta(tj, name=_name(tj)),
            "spec": {"replicatedJobs": [replicated("dataset-initializer", 1), node]}}


def trainer_template(tj: Mapping[str, Any]) -> dict[str, Any]:
    """The pod template of a TrainJob's pods, from its `trainer` (image, command, args, env,
    resourcesPerNode): the runtime's own template is not known here."""
    trainer = as_map(as_map(tj.get("spec")).get("trainer"))
    container: dict[str, Any] = {"name": "node", "image": as_str(trainer.get("image")) or ""}
    for field in ("command", "args", "env"):
        if trainer.get(field) is not None:
            container[field] = copy.deepcopy(trainer[field])
    if trainer.get("resourcesPerNode") is not None:
        container["resources"] = copy.deepcopy(trainer["resourcesPerNode"])
    return {"spec": {"restartPolicy": "Never", "containers": [container]}}


# --- LeaderWorkerSet and the StatefulSet controller ------------------------------------------


def _statefulset(name: str, replicas: int, labels: Mapping[str, str], *,
                 template: Any, owner: Mapping[str, Any]) -> dict[str, Any]:
    pod_template = _template(template, labels)
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": _meta(owner, name=name, labels=dict(labels)),
            "spec": {"replicas": replicas, "serviceName": name,
                     "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": dict(labels)}, "template": pod_template}}


def _lws_template(lws: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_map(as_map(lws.get("spec")).get("leaderWorkerTemplate"))


def leader_statefulset(lws: Mapping[str, Any]) -> dict[str, Any]:
    """The LWS controller's leader StatefulSet: one leader pod per group, named after the set
    (the LWS pod webhook adds the group index later; the ordinal carries it meanwhile). Leaders
    run the leaderTemplate, the workerTemplate without one."""
    name = _name(lws)
    template = _lws_template(lws)
    sts = _statefulset(name, as_int(as_map(lws.get("spec")).get("replicas"), 1) or 0,
                       {LWS_NAME_LABEL: name},
                       template=template.get("leaderTemplate") or template.get("workerTemplate"),
                       owner=lws)
    sts["spec"]["template"]["metadata"]["annotations"] = {
        LWS_SIZE_ANNOTATION: str(as_int(template.get("size"), 1))}
    return sts


def worker_statefulset(lws: Mapping[str, Any], leader: Mapping[str, Any], group: int
                       ) -> dict[str, Any]:
    """The worker StatefulSet of one group, owned by its leader pod."""
    name = _name(lws)
    template = _lws_template(lws)
    return _statefulset(f"{name}-{group}", (as_int(template.get("size"), 1) or 1) - 1,
                        {LWS_NAME_LABEL: name, LWS_GROUP_INDEX_LABEL: str(group)},
                        template=template.get("workerTemplate"), owner=leader)


def statefulset_pods(sts: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pods the StatefulSet controller creates, named by ordinal, with the index label."""
    spec = as_map(sts.get("spec"))
    return [_pod(spec.get("template"), _meta(sts, name=f"{_name(sts)}-{ordinal}",
                                             labels={POD_INDEX_LABEL: str(ordinal)}))
            for ordinal in range(as_int(spec.get("replicas"), 1) or 0)]


# --- a job as submitted, down to its pods ----------------------------------------------------

#: namespace of the stand-in uids (uuid5): the same manifest always gets the same ones
_UIDS = uuid.uuid5(uuid.NAMESPACE_URL, "https://muster.io/operators")


def _created(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object as the API server would store it: a manifest not created yet gets a stand-in
    uid (derived from its kind and name), which its children's ownerReferences carry."""
    out = copy.deepcopy(dict(obj))
    meta = out["metadata"] = dict(as_map(out.get("metadata")))
    if not meta.get("uid"):
        key = f"{out.get('apiVersion')}/{out.get('kind')}/{meta.get('namespace')}/" \
              f"{meta.get('name')}"
        meta["uid"] = str(uuid.uuid5(_UIDS, key))
    return out


def is_job(obj: Mapping[str, Any]) -> bool:
    """A job kind `expand` knows, rather than a pod."""
    return group_kind(obj.get("apiVersion"), obj.get("kind")) in _EXPANDS


def expand(job: Mapping[str, Any]) -> list[JobPod]:
    """The pods a job's operator and controllers create at first, with their owners."""
    kind = group_kind(job.get("apiVersion"), job.get("kind"))
    if not _name(job):
        raise ValueError(f"the {kind} has no metadata.name")
    return _EXPANDS[kind](_created(job))


def _mpijob(job: dict[str, Any]) -> list[JobPod]:
    launcher = _created(mpi_launcher_job(job))
    return [JobPod(mpi_launcher_pod(launcher), (launcher, job)),
            *(JobPod(pod, (job,)) for pod in mpi_worker_pods(job))]


def _batch_job(job: dict[str, Any]) -> list[JobPod]:
    return [JobPod(pod, (job,)) for pod in job_pods(job)]


def _jobset(js: dict[str, Any]) -> list[JobPod]:
    return [JobPod(p.pod, (*p.owners, js))
            for child in map(_created, child_jobs(js)) for p in _batch_job(child)]


def _trainjob(tj: dict[str, Any]) -> list[JobPod]:
    js = _created(trainjob_jobset(tj, trainer_template(tj)))
    return [JobPod(p.pod, (*p.owners, tj)) for p in _jobset(js)]


def _leaderworkerset(lws: dict[str, Any]) -> list[JobPod]:
    leaders = _created(leader_statefulset(lws))
    out = []
    for group, leader in enumerate(map(_created, statefulset_pods(leaders))):
        out.append(JobPod(leader, (leaders, lws)))
        workers = _created(worker_statefulset(lws, leader, group))
        out += [JobPod(pod, (workers, leader, leaders, lws)) for pod in statefulset_pods(workers)]
    return out


def _kubeflow(job: dict[str, Any]) -> list[JobPod]:
    return [JobPod(pod, (job,)) for pod in kubeflow_pods(job)]


_EXPANDS = {MPIJOB: _mpijob, PYTORCHJOB: _kubeflow, TFJOB: _kubeflow, BATCH_JOB: _batch_job,
            JOBSET: _jobset, TRAINJOB: _trainjob, LEADERWORKERSET: _leaderworkerset}
#: the job kinds `expand` knows, as group/Kind
JOB_KINDS = tuple(_EXPANDS)
