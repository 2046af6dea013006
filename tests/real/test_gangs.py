"""Gangs that never wait forever in silence, on the real node with Muster installed by Helm: a
closed Volcano queue, a PodGroup another object controls, a job the webhook cannot read (its
RBAC taken away), a finished job's PodGroup, and explicit zeros on the job."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from jobs import ensure_namespace, mpijob
from real_helpers import kubectl

from e2e.cluster import NAMESPACE, RELEASE
from e2e.node.cluster import NodeCluster
from e2e.probes import eventually
from webhook import keys
from webhook.demo import scenario
from webhook.kube import (
    EVENTS,
    JOBS,
    MPIJOBS,
    PODS,
    VOLCANO_PODGROUPS,
    VOLCANO_QUEUES,
    ApiError,
    KubeApi,
    Resource,
)
from webhook.policy import operators

PRIORITY_CLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", False, "PriorityClass")

NS = "team-a"  # policy mpi-volcano


async def _events(kube: KubeApi, reason: str, name: str) -> list[dict[str, Any]]:
    found = (await kube.list(EVENTS, namespace=NS,
                             field_selector=f"reason={reason}"))["items"]
    return [e for e in found if e["involvedObject"]["name"] == name]


async def _workers(kube: KubeApi, job: dict[str, Any]) -> list[dict[str, Any]]:
    made = await kube.create(MPIJOBS, copy.deepcopy(job), namespace=NS)
    return operators.mpi_worker_pods(made)


async def test_a_closed_queue_falls_back_with_an_event(kube: KubeApi) -> None:
    await ensure_namespace(kube, NS)
    queue = scenario.volcano_queue("closed-q", "Closed")
    await kube.create(VOLCANO_QUEUES, queue)
    await kube.patch(VOLCANO_QUEUES, "closed-q", {"status": queue["status"]},
                     subresource="status")
    job = mpijob("queued", NS, workers=2)
    job["metadata"]["annotations"][keys.VOLCANO_QUEUE_ANNOTATION] = "closed-q"
    pod = (await _workers(kube, job))[0]
    made = await kube.create(PODS, pod, namespace=NS)
    assert made["metadata"]["annotations"][keys.VOLCANO_QUEUE_ANNOTATION] == "default"
    group = await kube.get(VOLCANO_PODGROUPS, "queued", namespace=NS)
    assert group["spec"]["queue"] == "default"  # the shipped policy's fallbackQueue

    async def told() -> bool:
        return bool(await _events(kube, "GangQueueUnavailable", "queued"))
    await eventually(told, within=30, what="the GangQueueUnavailable Event on the MPIJob")
    message = (await _events(kube, "GangQueueUnavailable", "queued"))[0]["message"]
    assert "Volcano queue 'closed-q' is Closed, not Open" in message


async def test_a_podgroup_another_object_controls_refuses_the_pods_until_it_goes(
        kube: KubeApi) -> None:
    await ensure_namespace(kube, NS)
    other = await kube.create(JOBS, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "someone-else"},
        "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never",
                                                         "containers": [{"name": "c",
                                                                         "image": "none"}]}}}},
        namespace=NS)
    await kube.create(VOLCANO_PODGROUPS, {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "taken", "ownerReferences": [{
            "apiVersion": "batch/v1", "kind": "Job", "name": "someone-else",
            "uid": other["metadata"]["uid"], "controller": True}]},
        "spec": {"minMember": 1, "queue": "default"}}, namespace=NS)
    pod = (await _workers(kube, mpijob("taken", NS, workers=2)))[0]
    with pytest.raises(ApiError) as refused:
        await kube.create(PODS, pod, namespace=NS)
    assert refused.value.status == 409
    assert "is controlled by Job someone-else" in refused.value.message
    assert (await kube.get(VOLCANO_PODGROUPS, "taken", namespace=NS))["spec"]["minMember"] == 1
    await kube.delete(VOLCANO_PODGROUPS, "taken", NS)  # it goes: the controller's retry works

    async def admitted() -> bool:
        try:
            await kube.create(PODS, pod, namespace=NS)
        except ApiError:
            return False
        return True
    await eventually(admitted, within=30, what="the retried create to be admitted")
    group = await kube.get(VOLCANO_PODGROUPS, "taken", namespace=NS)
    assert group["metadata"]["ownerReferences"][0]["kind"] == "MPIJob"


async def test_a_job_the_webhook_cannot_read_refuses_its_pods(
        kube: KubeApi, node_cluster: NodeCluster) -> None:
    """The webhook's RBAC for MPIJobs is taken away: every read is a real 403."""
    await ensure_namespace(kube, NS)
    role = f"{RELEASE}-webhook"
    saved = json.loads((await asyncio.to_thread(
        kubectl, node_cluster, "get", "clusterrole", role, "-o", "json")).stdout)
    reduced = copy.deepcopy(saved)
    reduced["rules"] = [r for r in reduced["rules"] if "kubeflow.org" not in r["apiGroups"]]
    await asyncio.to_thread(_apply, node_cluster, reduced)
    try:
        pod = (await _workers(kube, mpijob("unreadable", NS, workers=2)))[0]

        async def refused() -> bool:
            try:
                await kube.create(PODS, pod, namespace=NS)
            except ApiError as exc:
                return exc.status == 503 and "could not be read" in exc.message
            await kube.delete(PODS, pod["metadata"]["name"], NS)  # RBAC not yet in effect
            return False
        await eventually(refused,
                         within=30, what="the pod to be refused while its MPIJob cannot be read")
        assert not (await kube.list(VOLCANO_PODGROUPS, namespace=NS,
                                    field_selector="metadata.name=unreadable"))["items"]
    finally:
        await asyncio.to_thread(_apply, node_cluster, saved)

    async def admitted() -> bool:
        try:
            made = await kube.create(PODS, pod, namespace=NS)
        except ApiError:
            return False
        return made["metadata"]["annotations"].get(keys.VOLCANO_GROUP_ANNOTATION) == "unreadable"
    await eventually(admitted,
                     within=90, what="the pod admitted into its gang once the job can be read")


def _apply(cluster: NodeCluster, obj: dict[str, Any]) -> None:
    path = cluster.dir / f"apply-{obj['metadata']['name']}.json"
    obj = {k: v for k, v in obj.items() if k != "status"}
    obj["metadata"] = {k: v for k, v in obj["metadata"].items()
                       if k in ("name", "labels", "annotations")}
    path.write_text(json.dumps(obj))
    kubectl(cluster, "replace", "-f", str(path))


async def test_a_finished_jobs_podgroup_goes_and_explicit_zeros_are_kept(
        kube: KubeApi) -> None:
    await ensure_namespace(kube, NS)
    job = mpijob("finishes", NS, workers=2, minAvailable=0)
    job["spec"]["runPolicy"]["cleanPodPolicy"] = "Running"
    pod = (await _workers(kube, job))[0]
    await kube.create(PODS, pod, namespace=NS)
    group = await kube.get(VOLCANO_PODGROUPS, "finishes", namespace=NS)
    assert group["spec"]["minMember"] == 0 and "minResources" not in group["spec"]
    # what mpi-operator writes when the launcher Job succeeded
    await kube.patch(MPIJOBS, "finishes", {"status": {
        "conditions": [{"type": "Succeeded", "status": "True", "reason": "MPIJobSucceeded",
                        "lastTransitionTime": "2026-11-23T10:00:00Z",
                        "lastUpdateTime": "2026-11-23T10:00:00Z"}],
        "completionTime": "2026-11-23T10:00:00Z"}}, NS, subresource="status")

    async def gone() -> bool:
        found = await kube.list(VOLCANO_PODGROUPS, namespace=NS,
                                field_selector="metadata.name=finishes")
        return not found["items"]
    await eventually(gone, within=90, what="the janitor to delete the finished job's PodGroup")

    async def told() -> bool:  # the Event follows the delete
        return bool(await _events(kube, "PodGroupDeleted", "finishes"))
    await eventually(told, within=30, what="the PodGroupDeleted Event on the MPIJob")
    [event] = await _events(kube, "PodGroupDeleted", "finishes")
    assert "the MPIJob succeeded (cleanPodPolicy Running)" in event["message"]
    lease = await kube.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/"
                               f"leases/{RELEASE}-webhook-podgroup-cleanup")
    assert lease["spec"]["holderIdentity"].startswith(f"{RELEASE}-webhook-")  # a webhook pod


async def test_min_resources_count_the_higher_priority_workers_first(kube: KubeApi) -> None:
    await ensure_namespace(kube, NS)
    try:
        await kube.create(PRIORITY_CLASSES, {"apiVersion": "scheduling.k8s.io/v1",
                                             "kind": "PriorityClass",
                                             "metadata": {"name": "workers-first"},
                                             "value": 5000})
    except ApiError as exc:
        if not exc.conflict:
            raise
    job = mpijob("ranked", NS, workers=3, minAvailable=2)
    job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["priorityClassName"] = \
        "workers-first"

    async def sized() -> bool:  # the webhook's PriorityClass informer sees the new class
        name = f"ranked-{len(await kube.list(MPIJOBS, namespace=NS))}"
        ranked = copy.deepcopy(job)
        ranked["metadata"]["name"] = name
        await kube.create(PODS, (await _workers(kube, ranked))[0], namespace=NS)
        group = await kube.get(VOLCANO_PODGROUPS, name, namespace=NS)
        return bool(group["spec"]["minResources"].get(keys.GPU_RESOURCE) == "2")
    # two workers (1 GPU each), not the launcher and one worker, as mpi-operator counts
    await eventually(sized, within=30, what="minResources of the two higher-priority workers")
