"""What the MPI operator (v2beta1) and the Job controller create for an MPIJob, and the Job
controller for an Indexed Job.

The demo and the e2e tests play those controllers' part, so that the webhook sees exactly the pod
shapes it sees in a cluster: workers named `<job>-worker-<i>` owned by the MPIJob, and a launcher
pod made with `generateName` by the Job controller, owned by the `<job>-launcher` Job that the
MPIJob owns (see ../shared/fixtures/admission/ for the real captured requests). An Indexed Job's
pods are `<job>-<index>-*`, labelled with their completion index.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

JOB_NAME = "training.kubeflow.org/job-name"
JOB_ROLE = "training.kubeflow.org/job-role"
OPERATOR = "training.kubeflow.org/operator-name"
REPLICA_INDEX = "training.kubeflow.org/replica-index"
REPLICA_TYPE = "training.kubeflow.org/replica-type"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def _owner(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"],
        "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True,
    }


def _labels(job: str, role: str) -> dict[str, str]:
    return {JOB_NAME: job, JOB_ROLE: role, OPERATOR: "mpi-operator", REPLICA_TYPE: role}


def _pod(template: Mapping[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(dict(template.get("spec", {})))
    tmeta = template.get("metadata", {})
    metadata.setdefault("labels", {}).update(tmeta.get("labels", {}))
    if tmeta.get("annotations"):
        metadata.setdefault("annotations", {}).update(tmeta["annotations"])
    spec.setdefault("schedulerName", "default-scheduler")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def worker_pods(mpijob: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Worker pods of a created MPIJob (it must carry metadata.uid)."""
    name, ns = mpijob["metadata"]["name"], mpijob["metadata"]["namespace"]
    spec = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]
    pods = []
    for i in range(int(spec.get("replicas", 1))):
        labels = {**_labels(name, "worker"), REPLICA_INDEX: str(i)}
        meta = {"name": f"{name}-worker-{i}", "namespace": ns, "labels": labels,
                "ownerReferences": [_owner(mpijob)]}
        pod = _pod(spec["template"], meta)
        pod["spec"].setdefault("hostname", meta["name"])
        pod["spec"].setdefault("subdomain", f"{name}-worker")
        pods.append(pod)
    return pods


def launcher_job(mpijob: Mapping[str, Any]) -> dict[str, Any]:
    """The batch Job the MPI operator creates for the launcher."""
    name, ns = mpijob["metadata"]["name"], mpijob["metadata"]["namespace"]
    template = copy.deepcopy(dict(mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]))
    template.setdefault("metadata", {}).setdefault("labels", {}).update(_labels(name, "launcher"))
    template["spec"].setdefault("restartPolicy", "Never")
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"{name}-launcher", "namespace": ns,
                     "labels": _labels(name, "launcher"), "ownerReferences": [_owner(mpijob)]},
        "spec": {"backoffLimit": 6, "completions": 1, "parallelism": 1, "template": template},
    }


def launcher_pod(job: Mapping[str, Any]) -> dict[str, Any]:
    """The pod the Job controller creates for a created launcher Job (generateName, no name)."""
    meta = {"generateName": f"{job['metadata']['name']}-",
            "namespace": job["metadata"]["namespace"], "ownerReferences": [_owner(job)]}
    return _pod(job["spec"]["template"], meta)


def indexed_pods(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pods the Job controller creates at once for a created Indexed Job: one per index up
    to its parallelism, as the controller labels and annotates them."""
    name, uid = job["metadata"]["name"], job["metadata"]["uid"]
    pods = []
    for i in range(int(job["spec"].get("parallelism", 1))):
        labels = {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
                  "controller-uid": uid, "job-name": name, COMPLETION_INDEX: str(i)}
        meta = {"generateName": f"{name}-{i}-", "namespace": job["metadata"]["namespace"],
                "labels": labels, "annotations": {COMPLETION_INDEX: str(i)},
                "ownerReferences": [_owner(job)]}
        pods.append(_pod(job["spec"]["template"], meta))
    return pods
