"""One scenario per job kind, for both tiers: submit the job as its user and its operator would,
then check that every pod of the job (of each LeaderWorkerSet group) joined one PodGroup of the
right size, created by the webhook under the shipped policies.

`controllers=True` (the real node): the test creates the job and what its operator creates
(Jobs, StatefulSets), and the real Job and StatefulSet controllers create the pods.
`controllers=False` (the emulator, which runs no controllers): the test creates those pods too,
as the controllers would. No operator (JobSet, Trainer, LWS, training operator) runs in either
tier, and no pod is scheduled (the gangs' schedulers are not installed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from e2e import jobkinds
from e2e.jobkinds import Replicated
from e2e.probes import eventually
from webhook import keys
from webhook.kube import (
    COSCHEDULING_PODGROUPS,
    JOBS,
    PODS,
    VOLCANO_PODGROUPS,
    KubeApi,
    Resource,
)
from webhook.policy import operators
from webhook.policy.workload import JOBSET_REPLICATED_JOB_LABEL

JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", True, "JobSet")
TRAINJOBS = Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", True, "TrainJob")
LEADERWORKERSETS = Resource("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", True,
                            "LeaderWorkerSet")
PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs", True, "PyTorchJob")
STATEFULSETS = Resource("apps", "v1", "statefulsets", True, "StatefulSet")

#: namespaces of the shipped example policies: team-d (Volcano), team-b (coscheduling)
VOLCANO_NS, COSCHEDULING_NS = "team-d", "team-b"


@dataclass(frozen=True)
class Gang:
    """What must come out: `pods` pods selected by `selector` (and named `names`, when
    given), all in PodGroup `name`."""

    resource: Resource
    name: str
    min_member: int
    pods: int
    selector: str
    names: frozenset[str] | None = None


@dataclass(frozen=True)
class Tier:
    kube: KubeApi
    controllers: bool
    container: Mapping[str, Any]


async def _jobs(tier: Tier, jobs: list[dict[str, Any]]) -> None:
    for job in jobs:
        made = await tier.kube.create(JOBS, job, namespace=job["metadata"]["namespace"])
        if not tier.controllers:
            for pod in operators.job_pods(made):
                await tier.kube.create(PODS, pod, namespace=made["metadata"]["namespace"])


async def _statefulset(tier: Tier, sts: dict[str, Any]) -> list[dict[str, Any]]:
    """The StatefulSet and its pods (made by the controller, or here)."""
    ns = sts["metadata"]["namespace"]
    made = await tier.kube.create(STATEFULSETS, sts, namespace=ns)
    if not tier.controllers:
        return [await tier.kube.create(PODS, pod, namespace=ns)
                for pod in operators.statefulset_pods(made)]
    names = {f"{sts['metadata']['name']}-{i}" for i in range(sts["spec"]["replicas"])}
    found: list[dict[str, Any]] = []

    async def created() -> bool:
        found[:] = [p for p in (await tier.kube.list(PODS, namespace=ns))["items"]
                    if p["metadata"]["name"] in names]
        return len(found) == len(names)
    await eventually(created, within=60, what=f"the pods of StatefulSet {sts['metadata']['name']}")
    return sorted(found, key=lambda p: str(p["metadata"]["name"]))


async def jobset(tier: Tier, name: str) -> list[Gang]:
    """A driver and two replicas of a 2-pod worker Job: one gang of 5."""
    js = jobkinds.jobset(name, VOLCANO_NS, [Replicated("driver"),
                                            Replicated("workers", replicas=2, parallelism=2)],
                         container=tier.container)
    made = await tier.kube.create(JOBSETS, js, namespace=VOLCANO_NS)
    await _jobs(tier, operators.child_jobs(made))
    return [Gang(VOLCANO_PODGROUPS, name, 5, 5, f"{operators.JOBSET_NAME_LABEL}={name}")]


async def trainjob(tier: Tier, name: str) -> list[Gang]:
    """A TrainJob of 3 nodes whose JobSet starts with a dataset initializer: the 3 node pods
    are the gang; the initializer's pod, which completes before them, is not in it."""
    tj = await tier.kube.create(TRAINJOBS, jobkinds.trainjob(name, COSCHEDULING_NS, 3),
                                namespace=COSCHEDULING_NS)
    js = await tier.kube.create(
        JOBSETS, operators.trainjob_jobset(tj, jobkinds.pod_template(tier.container)),
        namespace=COSCHEDULING_NS)
    await _jobs(tier, operators.child_jobs(js))
    return [Gang(COSCHEDULING_PODGROUPS, name, 3, 3,
                 f"{operators.JOBSET_NAME_LABEL}={name},{JOBSET_REPLICATED_JOB_LABEL}=node")]


async def initializer_pods(kube: KubeApi, name: str) -> list[dict[str, Any]]:
    found = await kube.list(PODS, namespace=COSCHEDULING_NS, label_selector=(
        f"{operators.JOBSET_NAME_LABEL}={name},{JOBSET_REPLICATED_JOB_LABEL}=dataset-initializer"))
    return list(found["items"])


async def leaderworkerset(tier: Tier, name: str) -> list[Gang]:
    """Two groups of a leader and two workers: two gangs of 3."""
    lws = await tier.kube.create(
        LEADERWORKERSETS, jobkinds.leaderworkerset(name, VOLCANO_NS, groups=2, size=3,
                                                   container=tier.container),
        namespace=VOLCANO_NS)
    leaders = await _statefulset(tier, operators.leader_statefulset(lws))
    for group, leader in enumerate(leaders):
        await _statefulset(tier, operators.worker_statefulset(lws, leader, group))
    # a leader has no group label until LWS's pod webhook adds it: its name says its group
    return [Gang(VOLCANO_PODGROUPS, f"{name}-{g}", 3, 3, f"{operators.LWS_NAME_LABEL}={name}",
                 frozenset({f"{name}-{g}", f"{name}-{g}-0", f"{name}-{g}-1"})) for g in range(2)]


async def elastic_pytorchjob(tier: Tier, name: str) -> list[Gang]:
    """4 Workers with an elastic minimum of 2: the gang waits for 2. The training operator does
    not run here, so its pods are created as it would (on both tiers)."""
    job = await tier.kube.create(
        PYTORCHJOBS, jobkinds.elastic_pytorchjob(name, VOLCANO_NS, workers=4, min_replicas=2,
                                                 container=tier.container),
        namespace=VOLCANO_NS)
    for pod in operators.kubeflow_pods(job):
        await tier.kube.create(PODS, pod, namespace=VOLCANO_NS)
    return [Gang(VOLCANO_PODGROUPS, name, 2, 4, f"training.kubeflow.org/job-name={name}")]


async def indexed_job(tier: Tier, name: str) -> list[Gang]:
    """An Indexed Job of 3 ranks, all running at once: one gang of 3."""
    await _jobs(tier, [jobkinds.indexed_job(name, VOLCANO_NS, parallelism=3, completions=3,
                                            container=tier.container)])
    return [Gang(VOLCANO_PODGROUPS, name, 3, 3, f"batch.kubernetes.io/job-name={name}")]


def group_key(pod: Mapping[str, Any], resource: Resource) -> str | None:
    """The PodGroup a pod joined, by its backend's key."""
    meta = pod["metadata"]
    if resource is VOLCANO_PODGROUPS:
        return (meta.get("annotations") or {}).get(keys.VOLCANO_GROUP_ANNOTATION)
    return (meta.get("labels") or {}).get(keys.COSCHEDULING_GROUP_LABEL)


async def check(kube: KubeApi, ns: str, gang: Gang) -> dict[str, Any]:
    """Every pod of the gang in its one PodGroup, created before any of them; the PodGroup."""
    pods: list[dict[str, Any]] = []

    async def all_created() -> bool:
        pods[:] = [p for p in (await kube.list(PODS, namespace=ns,
                                               label_selector=gang.selector))["items"]
                   if gang.names is None or p["metadata"]["name"] in gang.names]
        return len(pods) >= gang.pods
    await eventually(all_created, within=60, what=f"{gang.pods} pods of {gang.name}")
    assert len(pods) == gang.pods, [p["metadata"]["name"] for p in pods]
    joined = {str(p["metadata"]["name"]): group_key(p, gang.resource) for p in pods}
    assert set(joined.values()) == {gang.name}, joined
    group = await kube.get(gang.resource, gang.name, namespace=ns)
    assert group["spec"]["minMember"] == gang.min_member, group["spec"]
    assert all(int(group["metadata"]["resourceVersion"]) < int(p["metadata"]["resourceVersion"])
               for p in pods)
    return group


SCENARIOS = {"jobset": jobset, "trainjob": trainjob, "leaderworkerset": leaderworkerset,
             "elastic-pytorchjob": elastic_pytorchjob, "indexed-job": indexed_job}
