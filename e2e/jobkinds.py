"""Training jobs of every kind Muster gangs, and the objects their controllers create from them.

Each builder returns what a user submits (a JobSet, a TrainJob, a LeaderWorkerSet, an elastic
PyTorchJob, an Indexed Job) or what its controller makes of it, with the same names, labels and
controller references as upstream (JobSet controller: `<jobset>-<replicatedJob>-<index>` Jobs;
Kubeflow Trainer: a JobSet named after the TrainJob; LWS: a leader StatefulSet named after the
set, a worker StatefulSet `<name>-<group>` owned by each leader pod). The tests build pods from
them in memory (`job_pods`); the real tier creates the Jobs and StatefulSets and lets the real
Job and StatefulSet controllers create the pods.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"

DEFAULT_CONTAINER: Mapping[str, Any] = {
    "name": "main", "image": "trainer:1",
    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}


def controller_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The controller ownerReference a child of `obj` carries."""
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
            "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


def _pod_template(container: Mapping[str, Any], labels: Mapping[str, str] | None = None
                  ) -> dict[str, Any]:
    return {"metadata": {"labels": dict(labels or {})},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [copy.deepcopy(dict(container))]}}


@dataclass(frozen=True)
class Replicated:
    """One replicatedJob of a JobSet."""

    name: str
    replicas: int = 1
    parallelism: int = 1
    #: (name, "Ready" | "Complete") of the replicatedJob this one waits for
    depends_on: tuple[str, str] | None = None


def jobset(name: str, ns: str, jobs: Sequence[Replicated], *, in_order: bool = False,
           container: Mapping[str, Any] = DEFAULT_CONTAINER) -> dict[str, Any]:
    replicated = []
    for j in jobs:
        item: dict[str, Any] = {
            "name": j.name, "replicas": j.replicas,
            "template": {"spec": {"parallelism": j.parallelism, "completions": j.parallelism,
                                  "completionMode": "Indexed", "backoffLimit": 0,
                                  "template": _pod_template(container)}}}
        if j.depends_on:
            item["dependsOn"] = [{"name": j.depends_on[0], "status": j.depends_on[1]}]
        replicated.append(item)
    spec: dict[str, Any] = {"replicatedJobs": replicated}
    if in_order:
        spec["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    return {"apiVersion": JOBSET_API, "kind": "JobSet",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


def child_jobs(js: Mapping[str, Any], only: Sequence[str] | None = None
               ) -> list[dict[str, Any]]:
    """The Jobs the JobSet controller creates (of the replicatedJobs `only`, else all)."""
    out = []
    name = js["metadata"]["name"]
    for rj in js["spec"]["replicatedJobs"]:
        if only is not None and rj["name"] not in only:
            continue
        for index in range(rj.get("replicas", 1)):
            labels = {JOBSET_NAME: name, REPLICATED_JOB: rj["name"], JOB_INDEX: str(index)}
            spec = copy.deepcopy(rj["template"]["spec"])
            spec["template"]["metadata"].setdefault("labels", {}).update(labels)
            out.append({"apiVersion": "batch/v1", "kind": "Job",
                        "metadata": {"name": f"{name}-{rj['name']}-{index}",
                                     "namespace": js["metadata"]["namespace"],
                                     "labels": labels,
                                     "ownerReferences": [controller_of(js)]},
                        "spec": spec})
    return out


def job_pods(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pods the Job controller creates first: min(parallelism, completions) of them, with
    the Indexed completion index as label and annotation (Kubernetes 1.28)."""
    spec = job["spec"]
    count = min(spec.get("parallelism", 1), spec.get("completions") or spec.get("parallelism", 1))
    pods = []
    for index in range(count):
        template = copy.deepcopy(spec["template"])
        meta = template.setdefault("metadata", {})
        labels = meta.setdefault("labels", {})
        labels.update({"batch.kubernetes.io/job-name": job["metadata"]["name"],
                       "job-name": job["metadata"]["name"]})
        if spec.get("completionMode") == "Indexed":
            labels["batch.kubernetes.io/job-completion-index"] = str(index)
            meta.setdefault("annotations", {})[
                "batch.kubernetes.io/job-completion-index"] = str(index)
        meta.update(generateName=f"{job['metadata']['name']}-{index}-",
                    namespace=job["metadata"]["namespace"],
                    ownerReferences=[controller_of(job)])
        pods.append({"apiVersion": "v1", "kind": "Pod", **template})
    return pods


def trainjob(name: str, ns: str, num_nodes: int, runtime: str = "torch-distributed"
             ) -> dict[str, Any]:
    return {"apiVersion": TRAINER_API, "kind": "TrainJob",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"runtimeRef": {"name": runtime}, "trainer": {"numNodes": num_nodes}}}


def trainjob_jobset(tj: Mapping[str, Any], *, container: Mapping[str, Any] = DEFAULT_CONTAINER,
                    pod_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The JobSet Kubeflow Trainer makes from a TrainJob of a torch runtime: a dataset
    initializer that completes first, then `numNodes` training nodes (one Job, one pod each).
    `pod_labels` are what a runtime's podGroupPolicy makes the trainer add to every pod."""
    nodes = tj["spec"]["trainer"]["numNodes"]
    js = jobset(tj["metadata"]["name"], tj["metadata"]["namespace"],
                [Replicated("dataset-initializer"),
                 Replicated("node", parallelism=nodes,
                            depends_on=("dataset-initializer", "Complete"))],
                container=container)
    js["metadata"]["ownerReferences"] = [controller_of(tj)]
    for rj in js["spec"]["replicatedJobs"]:
        rj["template"]["spec"]["template"]["metadata"]["labels"].update(pod_labels or {})
    return js


def leaderworkerset(name: str, ns: str, *, groups: int, size: int, leader_ready: bool = False,
                    container: Mapping[str, Any] = DEFAULT_CONTAINER) -> dict[str, Any]:
    spec: dict[str, Any] = {"replicas": groups, "leaderWorkerTemplate": {
        "size": size, "workerTemplate": _pod_template(container)}}
    spec["leaderWorkerTemplate"]["workerTemplate"]["spec"]["restartPolicy"] = "Always"
    if leader_ready:
        spec["startupPolicy"] = "LeaderReady"
    return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


def _statefulset(name: str, replicas: int, labels: Mapping[str, str], *,
                 template: Mapping[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    ns = owner["metadata"]["namespace"]
    pod_template = copy.deepcopy(dict(template))
    pod_template.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": ns, "labels": dict(labels),
                         "ownerReferences": [controller_of(owner)]},
            "spec": {"replicas": replicas, "serviceName": name,
                     "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": dict(labels)}, "template": pod_template}}


def leader_statefulset(lws: Mapping[str, Any]) -> dict[str, Any]:
    """The LWS controller's leader StatefulSet: one leader pod per group, named after the set
    (the LWS pod webhook adds the group index later; the ordinal carries it meanwhile)."""
    name = lws["metadata"]["name"]
    template = lws["spec"]["leaderWorkerTemplate"]
    sts = _statefulset(name, lws["spec"]["replicas"], {LWS_NAME: name},
                       template=template["workerTemplate"], owner=lws)
    sts["spec"]["template"]["metadata"]["annotations"] = {LWS_SIZE: str(template["size"])}
    return sts


def worker_statefulset(lws: Mapping[str, Any], leader: Mapping[str, Any], group: int
                       ) -> dict[str, Any]:
    """The worker StatefulSet of one group, owned by its leader pod."""
    name = lws["metadata"]["name"]
    template = lws["spec"]["leaderWorkerTemplate"]
    return _statefulset(f"{name}-{group}", template["size"] - 1,
                        {LWS_NAME: name, LWS_GROUP: str(group)},
                        template=template["workerTemplate"], owner=leader)


def statefulset_pods(sts: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pods the StatefulSet controller creates, named by ordinal (1.28: with the index
    label)."""
    pods = []
    for ordinal in range(sts["spec"]["replicas"]):
        template = copy.deepcopy(sts["spec"]["template"])
        meta = template.setdefault("metadata", {})
        meta.setdefault("labels", {})["apps.kubernetes.io/pod-index"] = str(ordinal)
        meta.update(name=f"{sts['metadata']['name']}-{ordinal}",
                    namespace=sts["metadata"]["namespace"],
                    ownerReferences=[controller_of(sts)])
        pods.append({"apiVersion": "v1", "kind": "Pod", **template})
    return pods


def elastic_pytorchjob(name: str, ns: str, *, workers: int, min_replicas: int | None,
                       container: Mapping[str, Any] = DEFAULT_CONTAINER) -> dict[str, Any]:
    elastic: dict[str, Any] = {"rdzvBackend": "c10d", "maxReplicas": workers}
    if min_replicas is not None:
        elastic["minReplicas"] = min_replicas
    template = _pod_template({**container, "name": "pytorch"})
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"elasticPolicy": elastic, "pytorchReplicaSpecs": {"Worker": {
                "replicas": workers, "restartPolicy": "OnFailure", "template": template}}}}


def pytorch_pods(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pods the training operator creates: `<job>-<type>-<index>`."""
    pods = []
    for role, spec in job["spec"]["pytorchReplicaSpecs"].items():
        for index in range(spec.get("replicas", 1)):
            template = copy.deepcopy(spec["template"])
            meta = template.setdefault("metadata", {})
            meta.setdefault("labels", {}).update({
                "training.kubeflow.org/job-name": job["metadata"]["name"],
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                "training.kubeflow.org/replica-type": role.lower(),
                "training.kubeflow.org/replica-index": str(index)})
            meta.update(name=f"{job['metadata']['name']}-{role.lower()}-{index}",
                        namespace=job["metadata"]["namespace"],
                        ownerReferences=[controller_of(job)])
            pods.append({"apiVersion": "v1", "kind": "Pod", **template})
    return pods


def indexed_job(name: str, ns: str, *, parallelism: int, completions: int,
                container: Mapping[str, Any] = DEFAULT_CONTAINER) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns},
            "spec": {"parallelism": parallelism, "completions": completions,
                     "completionMode": "Indexed", "backoffLimit": 0,
                     "template": _pod_template(container)}}
