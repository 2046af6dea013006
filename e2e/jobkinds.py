"""Training jobs of every kind Muster gangs, as their users submit them.

Each builder returns what a user submits (a JobSet, a TrainJob, a LeaderWorkerSet, an elastic
PyTorchJob, an Indexed Job). What their operators and controllers make of them (Jobs,
StatefulSets, pods) comes from `webhook.policy.operators`, the builders `muster policy explain`
expands a job with: the tests build pods from them in memory; the real tier creates the Jobs and
StatefulSets and lets the real Job and StatefulSet controllers create the pods.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
LWS_API = "leaderworkerset.x-k8s.io/v1"

DEFAULT_CONTAINER: Mapping[str, Any] = {
    "name": "main", "image": "trainer:1",
    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}


def pod_template(container: Mapping[str, Any], labels: Mapping[str, str] | None = None
                 ) -> dict[str, Any]:
    """A pod template for tests: quick to stop (the real tier deletes what it made)."""
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
                                  "template": pod_template(container)}}}
        if j.depends_on:
            item["dependsOn"] = [{"name": j.depends_on[0], "status": j.depends_on[1]}]
        replicated.append(item)
    spec: dict[str, Any] = {"replicatedJobs": replicated}
    if in_order:
        spec["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    return {"apiVersion": JOBSET_API, "kind": "JobSet",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


def trainjob(name: str, ns: str, num_nodes: int, runtime: str = "torch-distributed"
             ) -> dict[str, Any]:
    return {"apiVersion": TRAINER_API, "kind": "TrainJob",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"runtimeRef": {"name": runtime}, "trainer": {"numNodes": num_nodes}}}


def leaderworkerset(name: str, ns: str, *, groups: int, size: int, leader_ready: bool = False,
                    container: Mapping[str, Any] = DEFAULT_CONTAINER) -> dict[str, Any]:
    spec: dict[str, Any] = {"replicas": groups, "leaderWorkerTemplate": {
        "size": size, "workerTemplate": pod_template(container)}}
    spec["leaderWorkerTemplate"]["workerTemplate"]["spec"]["restartPolicy"] = "Always"
    if leader_ready:
        spec["startupPolicy"] = "LeaderReady"
    return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


def elastic_pytorchjob(name: str, ns: str, *, workers: int, min_replicas: int | None,
                       container: Mapping[str, Any] = DEFAULT_CONTAINER) -> dict[str, Any]:
    elastic: dict[str, Any] = {"rdzvBackend": "c10d", "maxReplicas": workers}
    if min_replicas is not None:
        elastic["minReplicas"] = min_replicas
    template = pod_template({**container, "name": "pytorch"})
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"elasticPolicy": elastic, "pytorchReplicaSpecs": {"Worker": {
                "replicas": workers, "restartPolicy": "OnFailure", "template": template}}}}


def indexed_job(name: str, ns: str, *, parallelism: int, completions: int,
                container: Mapping[str, Any] = DEFAULT_CONTAINER) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns},
            "spec": {"parallelism": parallelism, "completions": completions,
                     "completionMode": "Indexed", "backoffLimit": 0,
                     "template": pod_template(container)}}
