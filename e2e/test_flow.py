"""The whole system end to end, driven only through the Kubernetes API and the webhook's HTTPS
endpoint, as the API server would: the reference MPIJob placed by the binder and served by the
device plugin; the same job under Volcano and coscheduling; live policy edits; a broken policy
refused; policies changed by `helm upgrade`; the webhook down (fail open); the binder killed
mid-gang.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import (
    NAMESPACE,
    POLICIES_CONFIGMAP,
    LocalCluster,
    RealCluster,
    chart_values,
    namespace,
)
from e2e.probes import (
    EXTRA_POLICY,
    ROLLOUT_NAMESPACE,
    eventually,
    pods_of,
    probe_labels,
    rollout_loaded,
    rollout_policies,
)
from webhook import keys
from webhook.demo import EXAMPLE_POLICIES
from webhook.kube import (
    CONFIGMAPS,
    COSCHEDULING_PODGROUPS,
    EVENTS,
    JOBS,
    MPIJOBS,
    NAMESPACES,
    PODS,
    VOLCANO_PODGROUPS,
    ApiError,
    KubeApi,
)
from webhook.policy import operators
from webhook.topology import builtin, set_score

Cluster = LocalCluster | RealCluster
SHARED = Path(__file__).resolve().parents[1].parent / "shared"
REFERENCE_JOB = SHARED / "fixtures" / "jobs" / "mpijob-vgg16-4workers.yaml"
DGX1 = builtin("dgx1-v100")
BEST_4_GPU_GBPS = max(set_score(DGX1, c).allreduce_gbps
                      for c in itertools.combinations(range(DGX1.size), 4))


# --- helpers ---------------------------------------------------------------------------------

def reference_job(name: str, ns: str) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load(REFERENCE_JOB.read_text())
    job["metadata"].update(name=name, namespace=ns)
    return job


async def submit(kube: KubeApi, name: str, ns: str, *, launcher: bool = True
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The MPIJob, then what the MPI operator and the Job controller create for it."""
    job = await kube.create(MPIJOBS, reference_job(name, ns), namespace=ns)
    launcher_job = await kube.create(JOBS, operators.mpi_launcher_job(job), namespace=ns)
    for pod in operators.mpi_worker_pods(job):
        await kube.create(PODS, pod, namespace=ns)
    if launcher:
        await kube.create(PODS, operators.mpi_launcher_pod(launcher_job), namespace=ns)
    return job, launcher_job


async def all_bound(kube: KubeApi, ns: str, job: str, count: int = 5) -> bool:
    pods = await pods_of(kube, ns, job)
    return len(pods) == count and all(p["spec"].get("nodeName") for p in pods)


def assignment(pod: dict[str, Any]) -> dict[str, Any] | None:
    raw = (pod["metadata"].get("annotations") or {}).get(keys.ANN_GPU_ASSIGNMENT)
    return json.loads(raw) if raw else None


def gpus_of(pod: dict[str, Any]) -> list[tuple[int, str]]:
    a = assignment(pod)
    if a is None:
        return []
    return [(i, u) for c in a["containers"].values() for i, u in zip(c["indices"], c["uuids"],
                                                                      strict=True)]


def worker(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"]["labels"].get(operators.JOB_ROLE_LABEL) == "worker")


async def topology_namespace(kube: KubeApi, ns: str = "team-a") -> str:
    await kube.create(NAMESPACES, namespace(
        ns, {keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED}))
    return ns


# --- scenarios -------------------------------------------------------------------------------

async def test_reference_mpijob_is_placed_whole_on_the_best_nvlink_ring(cluster: Cluster) -> None:
    kube = cluster.kube
    ns = await topology_namespace(kube)
    job, _ = await submit(kube, "vgg16", ns, launcher=False)

    # Four of five gang members exist: nothing may be bound yet.
    await asyncio.sleep(2.0)
    assert not any(p["spec"].get("nodeName") for p in await pods_of(kube, ns, "vgg16"))
    await kube.create(PODS, operators.mpi_launcher_pod(await kube.get(JOBS, "vgg16-launcher",
                                                            namespace=ns)), namespace=ns)
    if isinstance(cluster, LocalCluster):
        # a kubelet restart while the gang is being bound: the device plugin registers again
        # and the node's next pods still get their own GPUs
        nodes: set[str] = set()

        async def first_bound() -> bool:
            nodes.update(p["spec"]["nodeName"] for p in await pods_of(kube, ns, "vgg16")
                         if worker(p) and p["spec"].get("nodeName"))
            return bool(nodes)
        await eventually(first_bound, within=30, what="a first worker to be bound")
        await asyncio.to_thread(cluster.restart_kubelet, next(iter(nodes)))
    await eventually(lambda: all_bound(kube, ns, "vgg16"), within=30,
                     what="the gang of 5 to be bound")

    pods = await pods_of(kube, ns, "vgg16")
    for pod in pods:  # the webhook's gang and topology request, on every member
        ann = pod["metadata"]["annotations"]
        assert ann[keys.ANN_GANG_NAME] == "vgg16" and ann[keys.ANN_GANG_MIN_MEMBER] == "5"
        assert "mpi-topology" in ann[keys.ANN_POLICY].split(",")
        assert pod["spec"]["schedulerName"] == keys.DEFAULT_BINDER_SCHEDULER_NAME
    launcher = next(p for p in pods if not worker(p))
    assert launcher["metadata"]["labels"][keys.ISTIO_INJECT] == "false"
    assert launcher["metadata"]["annotations"][keys.ISTIO_INJECT] == "false"
    for pod in pods:  # the whole job leaves both of Istio's data planes (istio-optout-mpi-jobs)
        assert pod["metadata"]["labels"][keys.ISTIO_INJECT] == "false"
        assert pod["metadata"]["labels"][keys.ISTIO_DATAPLANE_MODE] == "none"

    workers = [p for p in pods if worker(p)]
    assert len({p["spec"]["nodeName"] for p in pods}) == 1  # same node first
    chosen = sorted(i for p in workers for i, _ in gpus_of(p))
    assert len(chosen) == 4 and set_score(DGX1, chosen).allreduce_gbps == BEST_4_GPU_GBPS
    assert job["metadata"]["uid"]

    if isinstance(cluster, LocalCluster):  # the kubelet started the 4 workers' containers
        node = workers[0]["spec"]["nodeName"]
        started = await cluster.kubelet_started(node, 4)
        assert [e["event"] for e in started] == ["started"] * 4, started
        by_name = {p["metadata"]["namespace"] + "/" + p["metadata"]["name"]: p for p in workers}
        for event in started:  # per pod: its container got exactly the GPUs written on it
            given = event["envs"][0]["NVIDIA_VISIBLE_DEVICES"].split(",")
            assert given == [u for _, u in gpus_of(by_name[event["pod"]])], event
        served = [p["metadata"]["annotations"].get(keys.ANN_GPU_ALLOCATED)
                  for p in await pods_of(kube, ns, "vgg16") if worker(p)]
        assert served == [node] * 4  # the agent marked each one served


async def test_same_job_under_volcano_and_coscheduling_gets_its_podgroup_first(
        cluster: Cluster) -> None:
    kube = cluster.kube
    await kube.create(NAMESPACES, namespace("team-a"))  # no topology label: policy mpi-volcano
    await kube.create(NAMESPACES, namespace("team-b"))  # policy mpi-coscheduling
    for ns, resource in (("team-a", VOLCANO_PODGROUPS), ("team-b", COSCHEDULING_PODGROUPS)):
        job, _ = await submit(kube, "vgg16", ns)
        pg = await kube.get(resource, "vgg16", namespace=ns)
        pods = await pods_of(kube, ns, "vgg16")
        assert len(pods) == 5
        # created before the first pod was admitted: an older resourceVersion than every pod
        assert all(int(pg["metadata"]["resourceVersion"]) < int(p["metadata"]["resourceVersion"])
                   for p in pods)
        owner = pg["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"]) == ("MPIJob", job["metadata"]["uid"])
        assert pg["spec"]["minMember"] == 5
        assert pg["spec"]["minResources"]["nvidia.com/gpu"] == "4"
        for pod in pods:
            meta = pod["metadata"]
            if resource is VOLCANO_PODGROUPS:
                assert meta["annotations"][keys.VOLCANO_GROUP_ANNOTATION] == "vgg16"
                assert pod["spec"]["schedulerName"] == "volcano"
            else:
                assert meta["labels"][keys.COSCHEDULING_GROUP_LABEL] == "vgg16"
                assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
        if resource is VOLCANO_PODGROUPS:
            assert pg["spec"]["queue"] == "research"  # the MPIJob's own queue annotation
        else:
            assert pg["spec"]["scheduleTimeoutSeconds"] == 300
    await asyncio.sleep(1.0)  # the binder leaves other schedulers' pods alone
    for ns in ("team-a", "team-b"):
        for pod in await pods_of(kube, ns, "vgg16"):
            assert not pod["spec"].get("nodeName") and assignment(pod) is None


async def _policies(kube: KubeApi) -> dict[str, Any]:
    return await kube.get(CONFIGMAPS, POLICIES_CONFIGMAP, namespace=NAMESPACE)


async def test_policy_edit_is_picked_up_live_and_a_broken_one_refused(cluster: Cluster) -> None:
    kube = cluster.kube
    await kube.create(NAMESPACES, namespace("team-c"))
    assert "cost-center" not in await probe_labels(kube, "team-c")

    cm = await _policies(kube)
    cm["data"]["team-c.yaml"] = EXTRA_POLICY
    await kube.replace(CONFIGMAPS, POLICIES_CONFIGMAP, cm, namespace=NAMESPACE)  # kubectl edit

    async def labelled() -> bool:
        return (await probe_labels(kube, "team-c")).get("cost-center") == "vision"
    await eventually(labelled, within=30, what="the edited policy to apply without a restart")

    broken = copy.deepcopy(await _policies(kube))
    broken["data"]["team-c.yaml"] = EXTRA_POLICY.replace("cost-center: vision",
                                                         "cost-center: [not, a, string]")
    with pytest.raises(ApiError) as refused:
        await kube.replace(CONFIGMAPS, POLICIES_CONFIGMAP, broken, namespace=NAMESPACE)
    assert "team-c.yaml:" in refused.value.message and "spec.labels" in refused.value.message
    assert (await _policies(kube))["data"]["team-c.yaml"] == EXTRA_POLICY  # nothing lost

    if isinstance(cluster, LocalCluster):
        # A broken file that reaches the volume anyway (say, written while the validating
        # webhook was down): the server refuses it, keeps the last good set, and says so.
        from e2e.projection import write_atomically  # noqa: PLC0415

        write_atomically(cluster.policies_dir, {**broken["data"]})

        async def refused_event() -> bool:
            events = await kube.list(EVENTS, namespace=NAMESPACE)
            return any(e.get("reason") == "PolicyUpdateRefused" for e in events["items"])
        await eventually(refused_event, within=30,
                         what="a PolicyUpdateRefused Event on the ConfigMap")
        assert (await probe_labels(kube, "team-c")).get("cost-center") == "vision"


async def test_helm_upgrade_changes_policies_without_a_restart(cluster: Cluster) -> None:
    """The admin's way: one more policy in the chart values and `helm upgrade`. The running
    webhook applies it without a restart, and keeps being called over verified TLS (a caBundle
    lost in the upgrade would leave the pod unlabelled: failurePolicy Ignore)."""
    kube = cluster.kube
    await kube.create(NAMESPACES, namespace("team-d"))
    assert "cost-center" not in await probe_labels(kube, "team-d")
    webhook = cluster.procs["webhook"].popen if isinstance(cluster, LocalCluster) else None

    values = chart_values(EXAMPLE_POLICIES)
    values["policies"]["team-d.yaml"] = EXTRA_POLICY.replace("team-c", "team-d")
    await cluster.helm_upgrade(values)

    async def labelled() -> bool:
        return (await probe_labels(kube, "team-d")).get("cost-center") == "vision"
    await eventually(labelled, within=30, what="the upgraded policies to apply without a restart")
    if isinstance(cluster, LocalCluster):  # the same process, still running
        assert webhook is cluster.procs["webhook"].popen and webhook is not None
        assert webhook.poll() is None


async def test_helm_upgrade_rolls_a_policy_out_from_audit_to_enforce(cluster: Cluster) -> None:
    """The documented rollout (docs/policies.md, "Rolling out a policy"): shipped in audit mode,
    the policy changes none of a job's pods and makes no PodGroup, and the job gets one Event
    saying what it would do; after `helm upgrade` to enforce, the next job gets its gang."""
    kube, ns = cluster.kube, ROLLOUT_NAMESPACE
    await kube.create(NAMESPACES, namespace(ns))
    values = chart_values(EXAMPLE_POLICIES)
    values["policies"].update(rollout_policies("audit", "v1"))
    await cluster.helm_upgrade(values)
    await eventually(lambda: rollout_loaded(kube, "v1"), within=30,
                     what="the policies in audit mode to be loaded")
    job, _ = await submit(kube, "audited", ns)
    pods = await pods_of(kube, ns, "audited")
    assert len(pods) == 5
    for pod in pods:
        assert keys.COSCHEDULING_GROUP_LABEL not in pod["metadata"]["labels"]
        assert "rollout-gangs" not in pod["metadata"]["annotations"].get(keys.ANN_POLICY, "")
    assert (await kube.list(COSCHEDULING_PODGROUPS, namespace=ns))["items"] == []

    async def audit_events() -> list[dict[str, Any]]:
        return [e for e in (await kube.list(EVENTS, namespace=ns))["items"]
                if e.get("reason") == "PolicyAudit"]
    [event] = await eventually(audit_events, within=30, what="the job's PolicyAudit Event")
    assert event["involvedObject"]["uid"] == job["metadata"]["uid"]
    assert event["message"].startswith(
        "policy rollout-gangs (audit) would set PodGroup team-e/audited (coscheduling, "
        "minMember 5)")

    values["policies"].update(rollout_policies("enforce", "v2"))
    await cluster.helm_upgrade(values)
    await eventually(lambda: rollout_loaded(kube, "v2"), within=30,
                     what="the upgraded policy to be enforced")
    await submit(kube, "enforced", ns)
    for pod in await pods_of(kube, ns, "enforced"):
        assert pod["metadata"]["labels"][keys.COSCHEDULING_GROUP_LABEL] == "enforced"
    group = await kube.get(COSCHEDULING_PODGROUPS, "enforced", namespace=ns)
    assert group["spec"]["minMember"] == 5
    assert len(await audit_events()) == 1  # nothing audited any more


async def test_pods_are_still_created_while_the_webhook_is_down(cluster: Cluster) -> None:
    kube = cluster.kube
    ns = await topology_namespace(kube)
    await asyncio.to_thread(cluster.kill, "webhook")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "while-down"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    made = await kube.create(PODS, pod, namespace=ns)  # failurePolicy Ignore: admitted as is
    assert keys.ANN_POLICY not in (made["metadata"].get("annotations") or {})

    await asyncio.to_thread(cluster.start_webhook)
    job, _ = await submit(kube, "after", ns)
    assert job["metadata"]["uid"]
    for p in await pods_of(kube, ns, "after"):
        assert "mpi-topology" in p["metadata"]["annotations"][keys.ANN_POLICY]


async def test_binder_killed_mid_gang_never_assigns_a_gpu_twice(cluster: Cluster) -> None:
    kube = cluster.kube
    ns = await topology_namespace(kube)
    names = [f"job-{i}" for i in range(4)]  # 4 x 4 GPUs: exactly the two nodes' 16 GPUs
    await submit(kube, names[0], ns)

    async def any_bound() -> bool:
        pods = [p for n in names for p in await pods_of(kube, ns, n)]
        return any(p["spec"].get("nodeName") for p in pods)
    await eventually(any_bound, within=30, what="the first binding")
    await asyncio.to_thread(cluster.kill, "binder")  # SIGKILL, possibly mid-gang
    for name in names[1:]:
        await submit(kube, name, ns)
    await asyncio.to_thread(cluster.start_binder)

    async def every_gang_bound() -> bool:
        return all([await all_bound(kube, ns, n) for n in names])
    await eventually(every_gang_bound, within=60, what="every gang to be bound after the restart")
    seen: dict[tuple[str, int], str] = {}
    for name in names:
        pods = await pods_of(kube, ns, name)
        assert len({p["spec"]["nodeName"] for p in pods}) == 1, name
        for pod in pods:
            if worker(pod):
                gpus = gpus_of(pod)
                assert len(gpus) == 1, pod["metadata"]["name"]
                key = (pod["spec"]["nodeName"], gpus[0][0])
                assert key not in seen, f"GPU {key} assigned to {seen.get(key)} and " \
                                        f"{pod['metadata']['name']}"
                seen[key] = pod["metadata"]["name"]
    assert len(seen) == 16
