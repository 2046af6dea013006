"""Real training jobs on the training image (`e2e.node.train_image`), as a user submits them:
an MPIJob (mpi-operator v2beta1: the launcher runs `mpirun` over SSH to the workers, an
allreduce over TCP) and a PyTorchJob (training operator v1: a master and workers, DDP steps with
gloo). Every rank prints one JSON line (`e2e/train/rank.py`); the MPI ranks print through the
launcher's `mpirun`, each PyTorchJob pod its own.

Which scheduler places a job is the policies' choice, by namespace: `shipped_namespace` names
the shipped example policies' namespace for a kind and a backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from e2e.node.train_image import PROGRAMS, TRAIN_IMAGE
from webhook import keys

Backend = Literal["muster", "volcano", "coscheduling"]
RANK = f"{PROGRAMS}/rank.py"
#: how mpirun reaches the workers and how the ranks talk: ssh (mpi-operator's hostfile), the
#: TCP BTL on the pods' interface, no shared memory or UCX (the ranks are on different pods)
MPIRUN_ARGS = ("--allow-run-as-root", "--bind-to", "none", "--mca", "plm_rsh_agent", "ssh",
               "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
               "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0")
SSH_DIR = "/root/.ssh"
#: the container name the training operator gives MASTER_ADDR, RANK... to
PYTORCH_CONTAINER = "pytorch"
#: each rank says where it runs (the downward API)
NODE_NAME_ENV = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
#: the pod's own name and namespace (Downward API): where a rank says it checkpointed
POD_ENV = [{"name": f"POD_{field.upper()}", "valueFrom": {"fieldRef": {
    "fieldPath": f"metadata.{field}"}}} for field in ("name", "namespace")]


def checkpoint_rbac(ns: str, account: str) -> list[dict[str, Any]]:
    """A ServiceAccount whose pods may say when they checkpointed (docs/binder.md): a Role on
    the pods of their namespace (get, patch), bound to it."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": account, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": account, "namespace": ns},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": account, "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}]},
    ]


@dataclass(frozen=True)
class Namespace:
    name: str
    labels: dict[str, str] = field(default_factory=dict)


def shipped_namespace(kind: Literal["MPIJob", "PyTorchJob"], backend: Backend) -> Namespace:
    """Where the shipped example policies (webhook/demo/policies) give `kind` to `backend`."""
    shipped = {("MPIJob", "muster"): Namespace(  # mpi-topology: a label, any name
                   "train-mpi", {keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED}),
               ("MPIJob", "volcano"): Namespace("team-a"),  # mpi-volcano
               ("MPIJob", "coscheduling"): Namespace("team-b"),  # mpi-coscheduling
               ("PyTorchJob", "volcano"): Namespace("team-d")}  # pytorchjob-volcano
    try:
        return shipped[(kind, backend)]
    except KeyError:
        raise ValueError(f"no shipped policy gives a {kind} to {backend}") from None


def _pod_spec(container: dict[str, Any], nameserver: str | None, ns: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 1, "containers": [container]}
    if nameserver:  # a cluster whose kubelet names no cluster DNS
        spec |= {"dnsPolicy": "None", "dnsConfig": {
            "nameservers": [nameserver], "options": [{"name": "ndots", "value": "5"}],
            "searches": [f"{ns}.svc.cluster.local", "svc.cluster.local", "cluster.local"]}}
    return {"spec": spec}


def _container(name: str, command: list[str], gpus: int,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "10m", "memory": "64Mi"}}
    if gpus:
        resources["limits"] = {keys.GPU_RESOURCE: str(gpus)}
    return {"name": name, "image": TRAIN_IMAGE, "imagePullPolicy": "Never", "command": command,
            "resources": resources,
            "env": [NODE_NAME_ENV, *({"name": k, "value": v} for k, v in (env or {}).items())]}


def mpijob(name: str, ns: str, *, workers: int, gpus_per_worker: int = 1,
           slots_per_worker: int = 1, nameserver: str | None = None) -> dict[str, Any]:
    """An MPIJob of `workers` workers (sshd, `gpus_per_worker` GPUs each) and a launcher that
    runs `rank.py mpi` on `workers * slots_per_worker` ranks with `mpirun` over ssh.
    `nameserver`: the pods' DNS server where the kubelet names none."""
    ranks = workers * slots_per_worker
    launcher = _container("launcher", ["python3", RANK, "launch", "-np", str(ranks),
                                       *MPIRUN_ARGS, "python3", RANK, "mpi"], 0)
    worker = _container("worker", ["python3", RANK, "sshd"], gpus_per_worker)
    # the workers' sshd is ready when it listens: the launcher waits for it too (rank.py)
    worker["readinessProbe"] = {"tcpSocket": {"port": 22}, "periodSeconds": 1}
    return {
        "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"slotsPerWorker": slots_per_worker, "sshAuthMountPath": SSH_DIR,
                 "mpiImplementation": "OpenMPI", "runPolicy": {"cleanPodPolicy": "None"},
                 "mpiReplicaSpecs": {
                     "Launcher": {"replicas": 1, "restartPolicy": "OnFailure",
                                  "template": _pod_spec(launcher, nameserver, ns)},
                     "Worker": {"replicas": workers, "restartPolicy": "Never",
                                "template": _pod_spec(worker, nameserver, ns)}}}}


def pytorchjob(name: str, ns: str, *, workers: int, gpus_per_worker: int = 1, steps: int = 5,
               step_seconds: float = 0.0, save_every: int = 0, nameserver: str | None = None,
               service_account: str | None = None, priority_class: str | None = None
               ) -> dict[str, Any]:
    """A PyTorchJob of a master and `workers` workers, `gpus_per_worker` GPUs each (the master
    too: it is rank 0), each running `steps` DDP steps with gloo, one each `step_seconds` at
    most; the training operator gives each MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE.
    Rank 0 checkpoints and says so on its pod every `save_every` steps and at the end, as
    `service_account` (`checkpoint_rbac`'s; None: the namespace's default, which may not).
    `priority_class`: every pod's PriorityClass."""
    command = ["python3", RANK, "ddp", str(steps)]
    if step_seconds:
        command += ["--step-seconds", str(step_seconds)]
    if save_every:
        command += ["--save-every", str(save_every)]

    def replicas(count: int) -> dict[str, Any]:
        rank = _container(PYTORCH_CONTAINER, command, gpus_per_worker,
                          {"GLOO_SOCKET_IFNAME": "eth0"})
        rank["env"] += POD_ENV
        template = _pod_spec(rank, nameserver, ns)
        if service_account:
            template["spec"]["serviceAccountName"] = service_account
        if priority_class:
            template["spec"]["priorityClassName"] = priority_class
        # the master's Service resolves only once its pod runs: a worker tries again
        return {"replicas": count, "restartPolicy": "OnFailure", "template": template}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"runPolicy": {"cleanPodPolicy": "None"},
                     "pytorchReplicaSpecs": {"Master": replicas(1), "Worker": replicas(workers)}}}


#: the training operator's init container for a PyTorchJob's workers (its
#: `--pytorch-init-container-template-file`, with `--pytorch-init-container-image=TRAIN_IMAGE`):
#: it waits for the master's name as its default does, with `getent` of the training image
#: instead of `nslookup` in `alpine:3.10`, which a cluster without a registry cannot pull
PYTORCH_INIT_TEMPLATE = """
- name: init-pytorch
  image: {{.InitContainerImage}}
  imagePullPolicy: IfNotPresent
  resources:
    limits: {cpu: 100m, memory: 20Mi}
    requests: {cpu: 50m, memory: 10Mi}
  command:
  - sh
  - -c
  - for i in $(seq {{.MaxTries}}); do getent hosts {{.MasterAddr}} && exit 0;
    echo waiting for master; sleep 2; done; exit 1
"""


def pytorch_operator_flags(template: Path) -> list[str]:
    """The training operator's flags for PyTorchJobs on the training image, `template` the file
    `PYTORCH_INIT_TEMPLATE` was written to."""
    return [f"--pytorch-init-container-image={TRAIN_IMAGE}",
            f"--pytorch-init-container-template-file={template}"]
