"""What users hit when a multi-node gang loses a part, on four real nodes:

- a worker pod deleted: its Job makes it again, and the binder puts it back in the gang's rack
  (the required level), next to the ranks that still run, on GPUs no one holds;
- a node's kubelet killed mid-job: the node goes NotReady and its pod is evicted (Event
  `TaintManagerEviction`), but stays Terminating while no kubelet confirms it stopped, and JobSet
  waits for it before it restarts the gang. That is Kubernetes' rule for a node that stops
  answering (it may still run the pod); the admin's step for a node known down, the
  `node.kubernetes.io/out-of-service` taint, lets the pod garbage collector delete it, and JobSet
  restarts the whole gang, which the binder places whole in the one rack that still has two
  healthy nodes. The kubelet back and the taint gone, the node's old pod is gone and its GPUs
  are free;
- the binder's leader deleted while it binds a cross-node gang: the next leader binds it whole
  in one rack, no GPU twice.
"""

from __future__ import annotations

from typing import Any

from jobruns import live, running
from jobs import ensure_namespace
from layout import GPUS_PER_NODE, RACKS, TRAINING_LABEL
from ranks import check_assignments, printed, visible
from real_helpers import assigned_uuids, pod_ready
from workloads import FAST_FAILOVER, HOLD, indexed_job

from e2e import jobkind_scenarios as scenarios
from e2e.cluster import NAMESPACE
from e2e.node import image
from e2e.node.cluster import NodeCluster
from e2e.probes import eventually
from webhook import keys
from webhook.kube import EVENTS, JOBS, LEASES, NODES, PODS, SERVICES, ApiError, KubeApi

RACK_NS = "failure-rack"  # the shipped network-rack policy: Indexed Jobs, required rack


async def seen_by_ranks(cluster: NodeCluster, pods: list[dict[str, Any]]
                        ) -> dict[str, list[str]]:
    """Pod name -> the GPUs its rank printed (waited for: the line comes as it starts)."""
    seen: dict[str, list[str]] = {}
    for pod in pods:
        lines = await eventually(lambda p=pod: printed(cluster, p), within=60, interval=1,
                                 what=f"{pod['metadata']['name']}'s line")
        seen[pod["metadata"]["name"]] = visible(lines[0])
    return seen


async def clear(kube: KubeApi, ns: str, resource: Any, name: str) -> None:
    try:
        await kube.delete(resource, name, ns, propagation_policy="Background")
    except ApiError as exc:
        if not exc.not_found:
            raise


async def test_a_deleted_worker_comes_back_in_its_gangs_rack(
        kube: KubeApi, node_cluster: NodeCluster) -> None:
    await ensure_namespace(kube, RACK_NS, {"muster.io/network": "rack"})
    name = "survivor"
    service, job = indexed_job(RACK_NS, name, 2, GPUS_PER_NODE, HOLD, backoff_limit=2)
    await kube.create(SERVICES, service, namespace=RACK_NS)
    await kube.create(JOBS, job, namespace=RACK_NS)
    try:
        pods = await running(kube, RACK_NS, f"job-name={name}", 2)
        rack = {RACKS[p["spec"]["nodeName"]] for p in pods}
        assert len(rack) == 1
        [gone] = [p for p in pods if p["metadata"]["labels"][
            "batch.kubernetes.io/job-completion-index"] == "1"]
        await kube.delete(PODS, gone["metadata"]["name"], RACK_NS)

        async def replaced() -> list[dict[str, Any]] | None:
            now = await running(kube, RACK_NS, f"job-name={name}", 2)
            uids = {p["metadata"]["uid"] for p in now}
            return now if gone["metadata"]["uid"] not in uids else None
        pods = await eventually(replaced, within=300, interval=1,
                                what="the Job to make rank 1 again and the binder to place it")
        assert {RACKS[p["spec"]["nodeName"]] for p in pods} == rack, "the gang split racks"
        check_assignments(pods, await seen_by_ranks(node_cluster, pods))
    finally:
        await clear(kube, RACK_NS, JOBS, name)


def gang_jobset(name: str, ns: str) -> dict[str, Any]:
    """A JobSet of one Indexed Job of 2 ranks x 8 GPUs that restarts whole when a rank fails."""
    container = {
        "name": "rank", "image": f"{image.IMAGE_REPOSITORY}:{image.IMAGE_TAG}",
        "imagePullPolicy": "Never", "command": ["python", "-c", HOLD],
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                      "limits": {keys.GPU_RESOURCE: str(GPUS_PER_NODE)}}}
    template = {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                         "tolerations": FAST_FAILOVER, "containers": [container]}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"failurePolicy": {"maxRestarts": 2},
                     "replicatedJobs": [{"name": "rank", "replicas": 1, "template": {"spec": {
                         "parallelism": 2, "completions": 2, "completionMode": "Indexed",
                         "backoffLimit": 0, "template": template}}}]}}


#: what an admin puts on a node known to be down (non-graceful node shutdown, GA in 1.28)
OUT_OF_SERVICE = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown",
                  "effect": "NoExecute"}


async def stuck(kube: KubeApi, ns: str, pod: dict[str, Any]) -> bool:
    """The pod marked for deletion and still there: what JobSet waits on."""
    try:
        got = await kube.get(PODS, pod["metadata"]["name"], namespace=ns)
    except ApiError as exc:
        if exc.not_found:
            raise AssertionError("the pod went without an admin's step") from exc
        raise
    return bool(got["metadata"].get("deletionTimestamp"))


def is_ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in node["status"].get("conditions", []))


async def node_ready(kube: KubeApi, node: str) -> bool:
    return is_ready(await kube.get(NODES, node))


async def test_a_dead_kubelet_restarts_the_gang_whole_in_a_healthy_rack(
        kube: KubeApi, node_cluster: NodeCluster, jobset_controller: None) -> None:
    ns = await ensure_namespace(kube, "failure-node", TRAINING_LABEL)
    name = "restarts"
    selector = f"jobset.sigs.k8s.io/jobset-name={name}"
    await kube.create(scenarios.JOBSETS, gang_jobset(name, ns), namespace=ns)
    try:
        first = await running(kube, ns, selector, 2)
        first_rack = {RACKS[p["spec"]["nodeName"]] for p in first}
        assert len(first_rack) == 1
        [victim] = [p for p in first if p["metadata"]["labels"][
            "batch.kubernetes.io/job-completion-index"] == "1"]
        dead = victim["spec"]["nodeName"]
        node_cluster.kubelet(dead, "stop")
        try:
            await eventually(lambda: stuck(kube, ns, victim), within=120, interval=1,
                             what=f"{dead} NotReady and its pod evicted, Terminating")
            await kube.patch(NODES, dead, {"spec": {"taints": [OUT_OF_SERVICE]}})
            async def restarted() -> list[dict[str, Any]] | None:
                now = await running(kube, ns, selector, 2)
                return now if not {p["metadata"]["uid"] for p in now} & \
                    {p["metadata"]["uid"] for p in first} else None
            again = await eventually(restarted, within=300, interval=2,
                                     what="JobSet to restart the gang and the binder to place it")
            racks = {RACKS[p["spec"]["nodeName"]] for p in again}
            # who placed each pod, and whether the webhook made it a gang member, when not
            assert len(racks) == 1 and racks != first_rack, [
                (p["spec"]["nodeName"], p["spec"].get("schedulerName"),
                 (p["metadata"].get("annotations") or {}).get(keys.ANN_GANG_NAME))
                for p in again]
            check_assignments(again, await seen_by_ranks(node_cluster, again))
            evicted = (await kube.list(EVENTS, namespace=ns, field_selector=(
                f"involvedObject.name={victim['metadata']['name']}")))["items"]
            assert "TaintManagerEviction" in {e["reason"] for e in evicted}, evicted
        finally:
            await kube.patch(NODES, dead, {"spec": {"taints": None}})
            node_cluster.kubelet(dead, "start")
        await eventually(lambda: node_ready(kube, dead), within=120, interval=1,
                         what=f"{dead} Ready again")

        async def cleaned() -> bool:
            pods = (await kube.list(PODS, namespace=ns))["items"]
            return not [p for p in pods if p["spec"].get("nodeName") == dead]
        await eventually(cleaned, within=120, interval=1,
                         what=f"the old pod on {dead} gone once its kubelet is back")
    finally:
        await clear(kube, ns, scenarios.JOBSETS, name)


async def settled(kube: KubeApi) -> None:
    """Every node Ready and untainted, with a ready agent pod of its own: an earlier test's
    node comes back with a new agent, whose device plugin the kubelet may still be replacing
    (an Allocate on the old one's socket fails the pod, UnexpectedAdmissionError)."""
    async def ready() -> bool:
        nodes = (await kube.list(NODES))["items"]
        agents = live((await kube.list(PODS, namespace=NAMESPACE,
                                       label_selector="app.kubernetes.io/component=agent")
                       )["items"])
        serving = {p["spec"].get("nodeName") for p in agents if pod_ready(p)}
        return len(nodes) == len(agents) == len(RACKS) and all(
            is_ready(n) and n["metadata"]["name"] in serving
            and not any(t["key"].startswith("node.kubernetes.io/")
                        for t in n["spec"].get("taints") or ()) for n in nodes)
    await eventually(ready, within=180, interval=1,
                     what="every node Ready with its agent serving")


async def live_leader(kube: KubeApi) -> str | None:
    """The binder pod holding the lease, once it runs (an earlier test's dead node may have
    taken the last holder, whose lease then runs out)."""
    lease = await kube.get(LEASES, "muster-binder", namespace=NAMESPACE)
    holder = lease["spec"].get("holderIdentity", "").rsplit("_", 1)[0]  # hostname_pid
    pods = (await kube.list(PODS, namespace=NAMESPACE,
                            label_selector="app.kubernetes.io/component=binder"))["items"]
    return holder if holder in {p["metadata"]["name"] for p in live(pods)
                                if p["status"].get("phase") == "Running"} else None


async def test_the_binder_leader_deleted_mid_bind_binds_the_gang_whole_in_one_rack(
        kube: KubeApi, node_cluster: NodeCluster) -> None:
    await ensure_namespace(kube, RACK_NS, {"muster.io/network": "rack"})
    name = "mid-bind"
    await settled(kube)
    leader = await eventually(lambda: live_leader(kube), within=120, interval=1,
                              what="a running binder pod holding the lease")
    service, job = indexed_job(RACK_NS, name, 2, GPUS_PER_NODE, HOLD)
    await kube.create(SERVICES, service, namespace=RACK_NS)
    await kube.create(JOBS, job, namespace=RACK_NS)
    try:
        async def first_bound() -> bool:
            pods = (await kube.list(PODS, namespace=RACK_NS,
                                    label_selector=f"job-name={name}"))["items"]
            return any(p["spec"].get("nodeName") and assigned_uuids(p) for p in pods)
        await eventually(first_bound, within=120, interval=0.2, what="a first rank bound")
        await kube.delete(PODS, leader, NAMESPACE)
        pods = await running(kube, RACK_NS, f"job-name={name}", 2)
        assert len({p["spec"]["nodeName"] for p in pods}) == 2
        assert len({RACKS[p["spec"]["nodeName"]] for p in pods}) == 1
        check_assignments(pods, await seen_by_ranks(node_cluster, pods))
        # The old leader may finish the bind while it stops, then release the lease (no
        # holder) before a standby takes it: wait for the standby rather than read it once.
        async def next_leader() -> bool:
            lease = await kube.get(LEASES, "muster-binder", namespace=NAMESPACE)
            holder = (lease["spec"].get("holderIdentity") or "").rsplit("_", 1)[0]
            return holder not in ("", leader)
        await eventually(next_leader, within=60, interval=0.5,
                         what="another binder pod holding the lease")
    finally:
        await clear(kube, RACK_NS, JOBS, name)
