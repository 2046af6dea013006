"""MPIJobs on the real node, created the way the MPI operator creates them: the MPIJob, worker pods
with the operator's labels and ownerReference, and the launcher as a batch Job whose pod the real
Job controller creates. Containers run the Muster image (the only one on the node)."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import yaml

from e2e.node import image
from e2e.probes import eventually, pods_of
from webhook.kube import JOBS, MPIJOBS, NAMESPACES, PODS, ApiError, KubeApi
from webhook.policy import operators

REFERENCE_JOB = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "jobs" / \
    "mpijob-vgg16-4workers.yaml"
#: a container that prints the GPUs the kubelet handed it, then waits to be deleted
PRINT_GPUS = ("import os, time; print('GPUS=' + os.environ.get('NVIDIA_VISIBLE_DEVICES', ''),"
              " flush=True); time.sleep(3600)")


def mpijob(name: str, ns: str, workers: int = 4, **scheduling: Any) -> dict[str, Any]:
    """The reference MPIJob, sized for a 2-core node and running the Muster image."""
    job: dict[str, Any] = yaml.safe_load(REFERENCE_JOB.read_text())
    job["metadata"].update(name=name, namespace=ns)
    if scheduling:
        job["spec"]["runPolicy"]["schedulingPolicy"] = scheduling
    specs = job["spec"]["mpiReplicaSpecs"]
    specs["Worker"]["replicas"] = workers
    for spec in specs.values():
        for c in spec["template"]["spec"]["containers"]:
            c.update(image=f"{image.IMAGE_REPOSITORY}:{image.IMAGE_TAG}",
                     imagePullPolicy="Never", command=["python", "-c", PRINT_GPUS])
            c["resources"]["requests"] = {"cpu": "10m", "memory": "32Mi"}
        spec["template"]["spec"]["terminationGracePeriodSeconds"] = 1
    return job


async def submit(kube: KubeApi, job: dict[str, Any], *, concurrently: bool = False
                 ) -> dict[str, Any]:
    """The MPIJob, its launcher Job (the Job controller makes the pod) and its worker pods."""
    ns = job["metadata"]["namespace"]
    made = await kube.create(MPIJOBS, copy.deepcopy(job), namespace=ns)
    await kube.create(JOBS, operators.mpi_launcher_job(made), namespace=ns)
    pods = operators.mpi_worker_pods(made)
    if concurrently:
        await asyncio.gather(*(kube.create(PODS, p, namespace=ns) for p in pods))
    else:
        for pod in pods:
            await kube.create(PODS, pod, namespace=ns)
    return made


async def ensure_namespace(kube: KubeApi, name: str, labels: dict[str, str] | None = None
                           ) -> str:
    """The namespace, created unless an earlier test of the session made it."""
    try:
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": name, "labels": labels or {}}})
    except ApiError as exc:
        if not exc.conflict:
            raise
    return name


async def delete_jobs(kube: KubeApi, ns: str, names: list[str]) -> None:
    """Remove the jobs and their pods now (the garbage collector would take its time)."""
    for name in names:
        for resource in (MPIJOBS, JOBS):
            try:
                await kube.delete(resource, name if resource is MPIJOBS else f"{name}-launcher",
                                  ns, propagation_policy="Background")
            except ApiError as exc:
                if not exc.not_found:
                    raise
    pods = [p for name in names for p in await pods_of(kube, ns, name)]
    await asyncio.gather(*(kube.delete(PODS, p["metadata"]["name"], ns) for p in pods),
                         return_exceptions=True)

    async def gone() -> bool:
        return not [p for name in names for p in await pods_of(kube, ns, name)]
    await eventually(gone, within=120, what="the jobs' pods to be deleted")
