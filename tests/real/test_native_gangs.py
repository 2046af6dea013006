"""Gang backend kubernetes on the real node: kube-scheduler's own gang scheduling (the Workload
API, feature gate GenericWorkload) with the objects Muster's webhook makes. No Volcano, no
coscheduling plugin and no Muster binder: the pods keep the default scheduler.

The node's room is an extended resource the test advertises on the node's status
(`example.com/slot`): 4 slots for a 5-pod MPIJob (4 workers and the launcher), then 5."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from jobs import delete_jobs, ensure_namespace, mpijob, submit
from real_helpers import policies_everywhere

from e2e.cluster import NAMESPACE, RELEASE
from e2e.node.cluster import NODE_NAME, NodeCluster
from e2e.probes import eventually, pods_of
from webhook import keys
from webhook.kube import CONFIGMAPS, NODES, PODS, KubeApi, Resource
from webhook.policy import native

NS = "team-native"
SLOT = "example.com/slot"
POLICY = """\
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata:
  name: mpi-native
spec:
  match:
    namespaces: [team-native]
  gang:
    backend: kubernetes
"""


def _resources(api: str) -> tuple[Resource, Resource]:
    version = api.rpartition("/")[2]
    return (Resource(native.GROUP, version, "workloads", True, "Workload"),
            Resource(native.GROUP, version, "podgroups", True, "PodGroup"))


async def _slots(kube: KubeApi, count: int | None) -> None:
    """Advertise `count` slots on the node (None: none), as a device plugin would."""
    await kube.patch(NODES, NODE_NAME, {"status": {"capacity": {
        SLOT: None if count is None else str(count)}}}, subresource="status")


async def _policy_seen(kube: KubeApi) -> bool:
    """A server-side dry-run pod carries the policy's audit annotation."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "probe-"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    made = await kube.create(PODS, pod, namespace=NS, dry_run=True)
    return (made["metadata"].get("annotations") or {}).get(keys.ANN_POLICY) == "mpi-native"


def _job(name: str) -> dict[str, Any]:
    job = mpijob(name, NS, workers=4)
    for spec in job["spec"]["mpiReplicaSpecs"].values():
        for c in spec["template"]["spec"]["containers"]:
            c["resources"] = {"requests": {"cpu": "10m", "memory": "32Mi", SLOT: "1"},
                              "limits": {SLOT: "1"}}
    return job


async def test_kube_scheduler_binds_none_of_a_gang_that_does_not_fit_then_all_of_it(
        kube: KubeApi, node_cluster: NodeCluster) -> None:
    served = native.pick_api(await kube.served(native.GROUP))
    if served is None:
        pytest.skip(f"Kubernetes {node_cluster.version} serves no Workload API")
    workloads, podgroups = _resources(served)
    await ensure_namespace(kube, NS)
    config = f"{RELEASE}-policies"
    await kube.patch(CONFIGMAPS, config, {"data": {"mpi-native.yaml": POLICY}},
                     namespace=NAMESPACE)
    await _slots(kube, 4)
    name = "native-gang"
    try:
        await eventually(
            lambda: policies_everywhere(kube, node_cluster, lambda: _policy_seen(kube)),
            within=120, interval=1, what="every webhook replica to load the native-gang policy")
        job = await submit(kube, _job(name))

        async def five() -> list[dict[str, Any]] | None:
            pods = await pods_of(kube, NS, name)
            return pods if len(pods) == 5 else None
        pods = await eventually(five, within=60, what="the job's 5 pods")
        uid = job["metadata"]["uid"]
        for pod in pods:  # each joined the gang Muster made for the job, on kube-scheduler
            assert pod["spec"].get("schedulingGroup") == {"podGroupName": name}, (
                pod["metadata"]["name"], pod["metadata"].get("annotations"))
            assert pod["spec"]["schedulerName"] == "default-scheduler"
        for resource in (workloads, podgroups):
            obj = await kube.get(resource, name, namespace=NS)
            assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
        group = await kube.get(podgroups, name, namespace=NS)
        assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 5}}

        async def tried() -> bool:  # kube-scheduler looked at the gang and found no room
            pods = await pods_of(kube, NS, name)
            return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                       for p in pods for c in p["status"].get("conditions") or ())
        await eventually(tried, within=90, what="kube-scheduler to find the gang no room")
        await asyncio.sleep(10)  # four pods fit: none may be bound meanwhile
        pods = await pods_of(kube, NS, name)
        assert [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")] == []

        await _slots(kube, 5)
        started = time.monotonic()

        async def all_running() -> bool:
            pods = await pods_of(kube, NS, name)
            return len(pods) == 5 and all(p["status"].get("phase") == "Running" for p in pods)
        await eventually(all_running, within=180, what="the whole gang to run")
        print(f"gang of 5 bound and Running {time.monotonic() - started:.1f} s after the "
              "fifth slot appeared")
        for pod in await pods_of(kube, NS, name):
            assert pod["spec"]["nodeName"] == NODE_NAME
            annotations = pod["metadata"].get("annotations") or {}
            # kube-scheduler bound it: no Muster binder assignment, no Volcano group
            assert keys.ANN_GANG_PLACEMENT not in annotations
            assert keys.VOLCANO_GROUP_ANNOTATION not in annotations
    finally:
        await delete_jobs(kube, NS, [name])
        await _slots(kube, None)
        await kube.patch(CONFIGMAPS, config, {"data": {"mpi-native.yaml": None}},
                         namespace=NAMESPACE)
