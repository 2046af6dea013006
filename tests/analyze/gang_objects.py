"""Recorded objects of gangs, as the API server returns them, for the tests of `muster gangs`
and `muster explain` (pure and against the emulator)."""

from __future__ import annotations

from typing import Any

from webhook import keys

BINDER = keys.DEFAULT_BINDER_SCHEDULER_NAME
AT = "2026-11-23T11:50:00Z"
JOB_UID = "uid-train"
MPI_POLICY = """\
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata: {name: mpi-topology}
spec:
  match: {namespaces: [team-a], ownerKinds: [kubeflow.org/MPIJob]}
  gang: {backend: muster, minAvailable: auto}
---
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata: {name: mpi-volcano}
spec:
  match: {namespaces: [team-v], ownerKinds: [kubeflow.org/MPIJob]}
  gang: {backend: volcano, queue: training}
"""


def mpijob(name: str = "train", ns: str = "team-a", uid: str = JOB_UID, workers: int = 2
           ) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "c", "image": "x"}]}}
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
            "metadata": {"name": name, "namespace": ns, "uid": uid},
            "spec": {"mpiReplicaSpecs": {"Launcher": {"replicas": 1, "template": template},
                                         "Worker": {"replicas": workers,
                                                    "template": template}}}}


def owned(obj: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["ownerReferences"] = [{
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
        "controller": True}]
    return obj


def pod(name: str, *, ns: str = "team-a", gang: str | None = "muster/train",
        min_member: int | None = 3, node: str | None = None, phase: str = "Pending",
        scheduler: str = BINDER, said: str | None = None, said_at: str = AT,
        owner: dict[str, Any] | None = None, uid: str | None = None) -> dict[str, Any]:
    """A job's pod as Muster admitted it: its gang (`gang`: "backend/name") recorded, bound to
    `node`, and what its scheduler `said` (its PodScheduled=False message)."""
    ann = {keys.ANN_POLICY: "mpi-topology"}
    backend, _, group = (gang or "").partition("/")
    if gang:
        ann[keys.ANN_JOINED_GANG] = gang
    if backend == "muster":
        ann[keys.ANN_GANG_NAME] = group
        if min_member is not None:
            ann[keys.ANN_GANG_MIN_MEMBER] = str(min_member)
    labels = {"training.kubeflow.org/job-name": "train",
              "training.kubeflow.org/replica-type": "worker"}
    if backend == "coscheduling":
        labels[keys.COSCHEDULING_GROUP_LABEL] = group
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [{"name": "c"}]}
    if node:
        spec["nodeName"] = node
    status: dict[str, Any] = {"phase": phase}
    if said is not None:
        status["conditions"] = [{"type": "PodScheduled", "status": "False",
                                 "reason": "Unschedulable", "message": said,
                                 "lastTransitionTime": said_at}]
    made = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{name}",
                         "creationTimestamp": "2026-11-23T11:00:00Z", "labels": labels,
                         "annotations": ann},
            "spec": spec, "status": status}
    return owned(made, owner or mpijob(ns=ns))


def podgroup(name: str = "train", *, ns: str = "team-a", api: str = "scheduling.volcano.sh/v1beta1",
             min_member: int = 3, phase: str | None = None, ours: bool = True,
             conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    group: dict[str, Any] = {
        "apiVersion": api, "kind": "PodGroup",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-pg-{name}",
                     "creationTimestamp": "2026-11-23T10:59:59Z",
                     "labels": {"app.kubernetes.io/managed-by": "muster"} if ours else {}},
        "spec": {"minMember": min_member}, "status": {}}
    if phase:
        group["status"]["phase"] = phase
    if conditions:
        group["status"]["conditions"] = conditions
    return owned(group, mpijob(name, ns))
