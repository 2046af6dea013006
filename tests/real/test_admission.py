"""Admission through the webhook's Service on the real API server: the PodGroup before the pod,
Istio opt-out, one PodGroup for many concurrent pods, and nothing created by a dry run."""

from __future__ import annotations

from typing import Any

from jobs import delete_jobs, ensure_namespace, mpijob, submit

from e2e.probes import eventually, pods_of
from webhook import keys
from webhook.kube import (
    CONFIGMAPS,
    COSCHEDULING_PODGROUPS,
    EVENTS,
    MPIJOBS,
    PODS,
    VOLCANO_PODGROUPS,
    KubeApi,
    Resource,
)
from webhook.policy import operators

PRIORITY_CLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", False, "PriorityClass")


async def _launcher_made(kube: KubeApi, ns: str, job: str, count: int) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = []

    async def all_there() -> bool:
        nonlocal pods
        pods = await pods_of(kube, ns, job)
        return len(pods) == count
    await eventually(all_there, within=60,
                     what=f"the Job controller to create {job}'s launcher pod")
    return pods


def _older_than_every_pod(pg: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
    # etcd revisions: the PodGroup was written before any member pod
    return all(int(pg["metadata"]["resourceVersion"]) < int(p["metadata"]["resourceVersion"])
               for p in pods)


async def test_volcano_podgroup_before_its_pods_with_queue_priority_and_resources(
        kube: KubeApi) -> None:
    ns = await ensure_namespace(kube, "team-a")
    await kube.create(PRIORITY_CLASSES, {"apiVersion": "scheduling.k8s.io/v1",
                                         "kind": "PriorityClass",
                                         "metadata": {"name": "training-high"}, "value": 1000})
    job = await submit(kube, mpijob("vgg16", ns, priorityClass="training-high"))
    pods = await _launcher_made(kube, ns, "vgg16", 5)

    pg = await kube.get(VOLCANO_PODGROUPS, "vgg16", namespace=ns)
    assert _older_than_every_pod(pg, pods)
    owner = pg["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("MPIJob", job["metadata"]["uid"])
    assert pg["spec"]["minMember"] == 5
    assert pg["spec"]["queue"] == "research"  # the MPIJob's own queue annotation
    assert pg["spec"]["priorityClassName"] == "training-high"
    assert pg["spec"]["minResources"]["nvidia.com/gpu"] == "4"
    for pod in pods:
        assert pod["metadata"]["annotations"][keys.VOLCANO_GROUP_ANNOTATION] == "vgg16"
        assert pod["spec"]["schedulerName"] == "volcano"
    launcher = next(p for p in pods
                    if p["metadata"]["labels"][operators.JOB_ROLE_LABEL] == "launcher")
    assert launcher["metadata"]["ownerReferences"][0]["kind"] == "Job"  # the controller's pod
    assert launcher["metadata"]["labels"][keys.ISTIO_INJECT] == "false"
    assert launcher["metadata"]["annotations"][keys.ISTIO_INJECT] == "false"


async def test_a_podgroup_whose_owner_the_webhook_cannot_read_is_never_joined(
        kube: KubeApi) -> None:
    """Security review #54, under the chart's identities: the installed webhook runs as its
    ServiceAccount with the chart's RBAC, which reads job kinds but no ConfigMap of a team's
    namespace. A PodGroup with the job's name that a ConfigMap controls (another controller's
    leftover) answers 403 when the webhook reads its owner: the job's pods are admitted without
    a gang instead of joining it (its minMember would never be reached), and an Event says so."""
    ns = await ensure_namespace(kube, "team-a")
    name = "stale-owner"
    owner = await kube.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                                           "metadata": {"name": "not-a-job"}}, namespace=ns)
    await kube.create(VOLCANO_PODGROUPS, {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": name, "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "not-a-job",
            "uid": owner["metadata"]["uid"], "controller": True}]},
        "spec": {"minMember": 99, "queue": "research"}}, namespace=ns)
    try:
        await _joins_no_foreign_group(kube, ns, name)
    finally:  # its pods run without a gang: they must not hold the node's GPUs for later tests
        await delete_jobs(kube, ns, [name])
        await kube.delete(VOLCANO_PODGROUPS, name, ns)
        await kube.delete(CONFIGMAPS, "not-a-job", ns)


async def _joins_no_foreign_group(kube: KubeApi, ns: str, name: str) -> None:
    """The job `name`'s pods, admitted beside the PodGroup of that name, join none."""
    await submit(kube, mpijob(name, ns))
    pods = await _launcher_made(kube, ns, name, 5)
    for pod in pods:
        assert keys.VOLCANO_GROUP_ANNOTATION not in (pod["metadata"].get("annotations") or {})
        assert pod["spec"].get("schedulerName") in (None, "default-scheduler")
    pg = await kube.get(VOLCANO_PODGROUPS, name, namespace=ns)
    assert pg["spec"]["minMember"] == 99  # untouched
    assert pg["metadata"]["ownerReferences"][0]["kind"] == "ConfigMap"

    async def told() -> list[str]:
        found = (await kube.list(EVENTS, namespace=ns,
                                 field_selector="reason=GangPodGroupOwnerUnreadable"))["items"]
        return [e["message"] for e in found if e["involvedObject"].get("kind") == "MPIJob"
                and e["involvedObject"].get("name") == name]
    [message, *_] = await eventually(told, within=30, what="a GangPodGroupOwnerUnreadable Event")
    assert "controlled by ConfigMap not-a-job, which this webhook cannot read (HTTP 403)" \
        in message


async def test_coscheduling_podgroup_before_its_pods_with_timeout(kube: KubeApi) -> None:
    ns = await ensure_namespace(kube, "team-b")
    await submit(kube, mpijob("vgg16", ns))
    pods = await _launcher_made(kube, ns, "vgg16", 5)
    pg = await kube.get(COSCHEDULING_PODGROUPS, "vgg16", namespace=ns)
    assert _older_than_every_pod(pg, pods)
    assert pg["spec"]["minMember"] == 5
    assert pg["spec"]["scheduleTimeoutSeconds"] == 300
    assert pg["spec"]["minResources"]["nvidia.com/gpu"] == "4"
    for pod in pods:
        assert pod["metadata"]["labels"][keys.COSCHEDULING_GROUP_LABEL] == "vgg16"
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"


async def test_twenty_pods_created_at_once_give_exactly_one_podgroup(kube: KubeApi) -> None:
    ns = await ensure_namespace(kube, "team-b")  # the coscheduling policy's namespace
    await submit(kube, mpijob("wide", ns, workers=20), concurrently=True)
    pods = await _launcher_made(kube, ns, "wide", 21)
    groups = (await kube.list(COSCHEDULING_PODGROUPS, namespace=ns))["items"]
    mine = [g for g in groups if g["metadata"]["name"].startswith("wide")]
    assert [g["metadata"]["name"] for g in mine] == ["wide"]
    assert mine[0]["spec"]["minMember"] == 21
    assert all(p["metadata"]["labels"][keys.COSCHEDULING_GROUP_LABEL] == "wide" for p in pods)


async def test_server_dry_run_mutates_but_creates_nothing(kube: KubeApi) -> None:
    ns = await ensure_namespace(kube, "team-a")
    job = mpijob("dry", ns)
    made = await kube.create(MPIJOBS, job, namespace=ns)
    worker = operators.mpi_worker_pods(made)[0]
    answered = await kube.create(PODS, worker, namespace=ns, dry_run=True)
    assert answered["metadata"]["annotations"][keys.VOLCANO_GROUP_ANNOTATION] == "dry"
    assert not [p for p in (await kube.list(PODS, namespace=ns))["items"]
                if p["metadata"]["name"] == worker["metadata"]["name"]]
    groups = (await kube.list(VOLCANO_PODGROUPS, namespace=ns))["items"]
    assert "dry" not in [g["metadata"]["name"] for g in groups]
