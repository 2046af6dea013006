"""The embedded default that `muster demo` runs: the reference scenario of docs/design.md.

Two DGX-1 V100 nodes (8 GPUs each) and the Alibaba ACK benchmark's MPIJob (TensorFlow +
Horovod, 4 workers x 1 GPU plus a launcher), submitted twice in a namespace whose policy asks for
topology-aware placement and once in a namespace whose policy uses the coscheduling plugin, and
an Indexed Job of 4 ranks in a namespace whose policy puts it on Volcano (the shipped examples
in webhook/demo/policies/). The cluster has Volcano's Queues and a PriorityClass, as one with
Volcano installed would.

Then priority and preemption: an MPIJob of 8 workers takes the node the reference jobs left
free, and an urgent one of 8 workers (a PriorityClass of its own) arrives, which only a whole
node can hold.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

from webhook import keys

NODES = ("node-a", "node-b")
TOPOLOGY_NAMESPACE = "team-a"  # labelled muster.io/gpu-topology=enabled: policy mpi-topology
GANG_NAMESPACE = "team-b"  # policy mpi-coscheduling
VOLCANO_NAMESPACE = "team-d"  # policy indexed-job-volcano
PRIORITY_CLASS = "batch-high"  # the Indexed Job's: its Volcano PodGroup carries it


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    namespace: str
    kind: Literal["MPIJob", "Indexed Job"]
    workers: int = 4
    priority_class: str = ""


JOBS = (Job("vgg16-a", TOPOLOGY_NAMESPACE, "MPIJob"), Job("vgg16-b", TOPOLOGY_NAMESPACE, "MPIJob"),
        Job("vgg16-c", GANG_NAMESPACE, "MPIJob"), Job("vgg16-d", VOLCANO_NAMESPACE, "Indexed Job"))
#: what the MPI operator and the Job controller create for JOBS
SUBMITTED = "3 MPIJobs and an Indexed Job, 19 pods"
#: the preemption scene: a job of the default priority fills the free node, then an urgent one
URGENT_CLASS, URGENT_PRIORITY = "urgent", 100000
FILLER = Job("filler", TOPOLOGY_NAMESPACE, "MPIJob", workers=8)
URGENT = Job("urgent", TOPOLOGY_NAMESPACE, "MPIJob", workers=8, priority_class=URGENT_CLASS)

NODE_ALLOCATABLE = {"cpu": "80", "memory": "512Gi", keys.GPU_RESOURCE: "8", "pods": "110"}


def node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED}},
        "status": {"allocatable": dict(NODE_ALLOCATABLE), "capacity": dict(NODE_ALLOCATABLE),
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


def volcano_queue(name: str, state: str = "Open") -> dict[str, Any]:
    """A Volcano Queue as its controller leaves it (status.state Open once it is usable)."""
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": name}, "spec": {"weight": 1, "reclaimable": True},
            "status": {"state": state}}


#: the queues of a cluster with Volcano installed, as the shipped policies and jobs name them
QUEUES = ("default", "training", "research")


def namespaces() -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": TOPOLOGY_NAMESPACE,
            "labels": {keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED}}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GANG_NAMESPACE}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": VOLCANO_NAMESPACE}},
    ]


def priority_classes() -> list[dict[str, Any]]:
    return [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
             "metadata": {"name": name}, "value": value}
            for name, value in ((PRIORITY_CLASS, 1000), (URGENT_CLASS, URGENT_PRIORITY))]


# The reference job, as `arena submit mpi --gpus=1 --workers=4` creates it
# (../shared/fixtures/jobs/mpijob-vgg16-4workers.yaml).
_IMAGE = ("registry.cn-hangzhou.aliyuncs.com/kubernetes-image-hub/"
          "tensorflow-benchmark:tf2.3.0-py3.7-cuda10.1")
_MPIJOB: dict[str, Any] = {
    "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
    "metadata": {"name": "", "namespace": "",
                 "annotations": {keys.VOLCANO_QUEUE_ANNOTATION: "research"}},
    "spec": {
        "slotsPerWorker": 1,
        "runPolicy": {"cleanPodPolicy": "Running"},
        "mpiReplicaSpecs": {
            "Launcher": {"replicas": 1, "template": {"spec": {"containers": [{
                "name": "mpi-launcher", "image": _IMAGE,
                "command": ["mpirun", "--allow-run-as-root", "-np", "4", "python",
                            "tf_cnn_benchmarks.py", "--model=vgg16", "--batch_size=64",
                            "--variable_update=horovod"],
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}}},
            "Worker": {"replicas": 4, "template": {"spec": {"containers": [{
                "name": "tensorflow", "image": _IMAGE,
                "resources": {"requests": {"cpu": "4", "memory": "16Gi"},
                              "limits": {keys.GPU_RESOURCE: "1"}}}]}}},
        },
    },
}


def mpijob(spec: Job) -> dict[str, Any]:
    job = copy.deepcopy(_MPIJOB)
    job["metadata"].update(name=spec.name, namespace=spec.namespace)
    replicas = job["spec"]["mpiReplicaSpecs"]
    replicas["Worker"]["replicas"] = spec.workers
    command = replicas["Launcher"]["template"]["spec"]["containers"][0]["command"]
    command[command.index("-np") + 1] = str(spec.workers)
    if spec.priority_class:
        for role in replicas.values():
            role["template"]["spec"]["priorityClassName"] = spec.priority_class
    return job


def indexed_job(name: str, namespace: str) -> dict[str, Any]:
    """The benchmark as 4 ranks of an Indexed Job (each reads its rank from
    JOB_COMPLETION_INDEX), at a priority class of its own."""
    worker = _MPIJOB["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"completionMode": "Indexed", "completions": 4, "parallelism": 4,
                 "backoffLimit": 0, "template": {"spec": {
                     "restartPolicy": "Never", "priorityClassName": PRIORITY_CLASS,
                     "containers": [copy.deepcopy(worker)]}}},
    }


def _crd(group: str, version: str, kind: str, plural: str, short: list[str], *,
         scope: str = "Namespaced") -> dict[str, Any]:
    """A minimal CustomResourceDefinition (structural, fields preserved) for the demo's emulator;
    tests and e2e install the upstream CRDs from ../shared/crds instead."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group, "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                      "listKind": f"{kind}List", "shortNames": short},
            "versions": [{
                "name": version, "served": True, "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }],
        },
    }


CRDS = (
    _crd("kubeflow.org", "v2beta1", "MPIJob", "mpijobs", ["mpij"]),
    _crd("scheduling.volcano.sh", "v1beta1", "PodGroup", "podgroups", ["pg", "podgroup-v1beta1"]),
    _crd("scheduling.x-k8s.io", "v1alpha1", "PodGroup", "podgroups", ["pg", "pgs"]),
    _crd("scheduling.volcano.sh", "v1beta1", "Queue", "queues", ["q", "queue-v1beta1"],
         scope="Cluster"),
)
