"""Issue #24 on the real node: a user who may create and patch pods in their own namespace tries
every way of forging Muster's annotations to take another pod's GPU. Each attempt is refused
(the chart's ValidatingAdmissionPolicy, the webhook's stripping) or has no effect on any GPU: the
attacker's container never sees the victim's GPUs, and the victim keeps them.

The attacker is a ServiceAccount with a Role on pods (and pods/status) in its namespace; kubectl
acts as it by impersonation (`--as`), so the API server sees its user name as it would see its
token's. The policy runs inside the API server: this is the only tier that evaluates it (the
emulator does not evaluate CEL)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from jobs import PRINT_GPUS, delete_jobs, ensure_namespace, mpijob, submit
from real_helpers import agent_pod, assigned_uuids, kubectl, scale_webhook, webhook_pods

from e2e.cluster import NAMESPACE, RELEASE
from e2e.node import image
from e2e.node.cluster import NODE_NAME, NodeCluster
from e2e.probes import eventually, pods_of
from webhook import keys
from webhook.kube import PODS, ApiError, KubeApi
from webhook.policy import operators

ATTACKER_NS = "mallory-team"
ATTACKER = f"system:serviceaccount:{ATTACKER_NS}:mallory"
GUARD = f"{RELEASE}-annotation-guard"
VICTIM = "victim"


def _rbac() -> list[dict[str, Any]]:
    """What a team member typically has: pods (and, generously, pods/status) in their own
    namespace; no pods/binding, nothing elsewhere."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "mallory", "namespace": ATTACKER_NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "pod-owner", "namespace": ATTACKER_NS},
         "rules": [{"apiGroups": [""], "resources": ["pods"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
                   {"apiGroups": [""], "resources": ["pods/status"],
                    "verbs": ["get", "update", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "mallory-pod-owner", "namespace": ATTACKER_NS},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "pod-owner"},
         "subjects": [{"kind": "ServiceAccount", "name": "mallory",
                       "namespace": ATTACKER_NS}]},
    ]


def _pod(name: str, *, gpus: int = 1, annotations: dict[str, str] | None = None,
         scheduler: str | None = None, gated: bool = False,
         node: str | None = None) -> dict[str, Any]:
    """The attacker's pod: prints the GPUs its container got, as the victim's do."""
    limits = {keys.GPU_RESOURCE: str(gpus)} if gpus else {}
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        "tolerations": [{"key": keys.TAINT_GPU_TOPOLOGY, "operator": "Exists"}],
        "containers": [{"name": "main", "image": f"{image.IMAGE_REPOSITORY}:{image.IMAGE_TAG}",
                        "imagePullPolicy": "Never", "command": ["python", "-c", PRINT_GPUS],
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                      "limits": limits}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    if gated:
        spec["schedulingGates"] = [{"name": "mallory.example/hold"}]
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ATTACKER_NS,
                         "annotations": annotations or {}},
            "spec": spec}


class Mallory:
    """kubectl as the attacker's ServiceAccount."""

    def __init__(self, cluster: NodeCluster, tmp: Path) -> None:
        self.cluster = cluster
        self.tmp = tmp

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return kubectl(self.cluster, "--as", ATTACKER, "--as-group", "system:serviceaccounts",
                       "--as-group", f"system:serviceaccounts:{ATTACKER_NS}", "-n", ATTACKER_NS,
                       *args, check=False)

    def create(self, pod: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        path = self.tmp / f"{pod['metadata']['name']}.json"
        path.write_text(json.dumps(pod))
        return self.run("create", "-f", str(path))

    def annotate(self, pod: str, key: str, value: str,
                 subresource: str | None = None) -> subprocess.CompletedProcess[str]:
        patch = json.dumps({"metadata": {"annotations": {key: value}}})
        extra = ["--subresource", subresource] if subresource else []
        return self.run("patch", "pod", pod, "--type", "merge", "-p", patch, *extra)


def _refused_by_the_guard(out: subprocess.CompletedProcess[str], what: str) -> None:
    assert out.returncode != 0, f"{what}: allowed\n{out.stdout}"
    assert GUARD in out.stderr and "denied request" in out.stderr, f"{what}: {out.stderr}"


def _assignment(victim_gpu: str) -> str:
    """A forged assignment that hands the victim's GPU to the attacker's container."""
    return json.dumps({"v": 1, "node": NODE_NAME, "containers": {
        "main": {"indices": [0], "uuids": [victim_gpu]}}})


async def _printed(cluster: NodeCluster, ns: str, name: str) -> list[str] | None:
    out = await asyncio.to_thread(kubectl, cluster, "logs", "-n", ns, name, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("GPUS="):
            return [u for u in line.removeprefix("GPUS=").split(",") if u]
    return None


async def _victim(kube: KubeApi, cluster: NodeCluster) -> dict[str, list[str]]:
    """A topology MPIJob (4 x 1 GPU) bound by the binder and running: each worker's GPUs, as
    assigned and as its container printed them."""
    ns = await ensure_namespace(kube, "gpu-team", {
        keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED})
    await submit(kube, mpijob(VICTIM, ns))
    pods: list[dict[str, Any]] = []

    async def running() -> bool:
        nonlocal pods
        pods = await pods_of(kube, ns, VICTIM)
        return len(pods) == 5 and all(p["status"].get("phase") == "Running" for p in pods)
    await eventually(running, within=300, what="the victim job bound and running")
    out = {}
    for p in pods:
        if p["metadata"]["labels"][operators.JOB_ROLE_LABEL] == "worker":
            printed = await _printed(cluster, ns, p["metadata"]["name"])
            assert printed == assigned_uuids(p) and len(printed) == 1, p["metadata"]["name"]
            out[p["metadata"]["name"]] = printed
    return out


async def _never_gets(kube: KubeApi, cluster: NodeCluster, name: str,
                      victim: set[str]) -> None:
    """The attacker's GPU pod ends refused by the kubelet (the agent serves no assignment it
    did not get from the binder), or at least never runs with a victim's GPU."""
    async def settled() -> dict[str, Any] | None:
        pod = await kube.get(PODS, name, namespace=ATTACKER_NS)
        phase = pod["status"].get("phase")
        return pod if phase in ("Failed", "Running", "Succeeded") else None
    pod = await eventually(settled, within=180, what=f"{name} admitted or refused")
    printed = await _printed(cluster, ATTACKER_NS, name) or []
    assert not set(printed) & victim, f"{name} got the victim's GPUs {printed}"
    assert pod["status"]["phase"] == "Failed", pod["status"]  # --unassigned error: refused


async def _mallory(kube: KubeApi, cluster: NodeCluster, tmp_path: Path) -> Mallory:
    """The attacker's namespace and Role, and kubectl as the attacker."""
    await ensure_namespace(kube, ATTACKER_NS)
    rbac = tmp_path / "rbac.json"
    rbac.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": _rbac()}))
    kubectl(cluster, "apply", "-f", str(rbac))
    return Mallory(cluster, tmp_path)


async def _webhook_logged(kube: KubeApi, cluster: NodeCluster, pod: str
                          ) -> dict[str, Any] | None:
    """The line "pod admitted with warnings" about `pod` in the log of whichever webhook
    replica answered its create."""
    for replica in await webhook_pods(kube):
        out = await asyncio.to_thread(kubectl, cluster, "logs", "-n", NAMESPACE,
                                      replica["metadata"]["name"], check=False)
        for line in out.stdout.splitlines():
            try:
                said = json.loads(line)
            except ValueError:
                continue
            if said.get("msg") == "pod admitted with warnings" and said.get("pod") == pod:
                return dict(said)
    return None


async def test_a_pod_owner_cannot_forge_their_way_to_another_pods_gpu(
        kube: KubeApi, node_cluster: NodeCluster, tmp_path: Path) -> None:
    mallory = await _mallory(kube, node_cluster, tmp_path)
    out = mallory.create(_pod("probe", gpus=0))
    assert out.returncode == 0, out.stderr  # the Role works
    try:
        victims = await _victim(kube, node_cluster)
        victim = {u for gpus in victims.values() for u in gpus}
        stolen = sorted(victim)[0]

        # 1. create with a forged assignment, the webhook up: the webhook strips it (and every
        #    key only the binder or the agent writes); the pod gets nothing of the victim's
        out = mallory.create(_pod("forged-create", annotations={
            keys.ANN_GPU_ASSIGNMENT: _assignment(stolen), keys.ANN_GPU_ALLOCATED: NODE_NAME,
            keys.ANN_GANG_PLACEMENT: json.dumps({"v": 1, "members": {}})}))
        assert out.returncode == 0, out.stderr
        made = await kube.get(PODS, "forged-create", namespace=ATTACKER_NS)
        assert not set(made["metadata"].get("annotations") or {}) & set(
            keys.PROTECTED_ANNOTATIONS)
        #    and the webhook's log tells the admin who tried (webhook.admission.outcomes)
        said = await eventually(lambda: _webhook_logged(kube, node_cluster, "forged-create"),
                                within=30, what="the webhook's line about the forged pod")
        assert said["namespace"] == ATTACKER_NS and any(
            f"removed {keys.ANN_GPU_ASSIGNMENT}" in w for w in said["warnings"]), said
        await _never_gets(kube, node_cluster, "forged-create", victim)

        # 2. a scheduling gate, then annotate, then remove the gate (the reported attack): the
        #    annotation is refused; the ungated pod is the kubelet's to refuse
        out = mallory.create(_pod("gated", gated=True))
        assert out.returncode == 0, out.stderr
        _refused_by_the_guard(mallory.annotate("gated", keys.ANN_GPU_ASSIGNMENT,
                                               _assignment(stolen)), "annotate a gated pod")
        out = mallory.run("patch", "pod", "gated", "--type", "json", "-p",
                          '[{"op": "remove", "path": "/spec/schedulingGates"}]')
        assert out.returncode == 0, out.stderr
        await _never_gets(kube, node_cluster, "gated", victim)

        # 3. a pod the binder bound (schedulerName is anyone's to set at create; the gang keys
        #    the webhook writes are allowed at create, and concern only the creator's pods):
        #    its record, assignment, gang keys and the agent's mark cannot be forged afterwards
        out = mallory.create(_pod("bound", gpus=0, scheduler=keys.DEFAULT_BINDER_SCHEDULER_NAME,
                                  annotations={keys.ANN_GANG_NAME: "solo",
                                               keys.ANN_GANG_MIN_MEMBER: "1"}))
        assert out.returncode == 0, out.stderr

        async def bound() -> bool:
            pod = await kube.get(PODS, "bound", namespace=ATTACKER_NS)
            return bool(pod["spec"].get("nodeName"))
        await eventually(bound, within=60, what="the binder to bind the attacker's pod")
        record = json.dumps({"v": 1, "members": {"bound": {"node": NODE_NAME, "gpus": [0]}}})
        for key, value in ((keys.ANN_GANG_PLACEMENT, record),
                           (keys.ANN_GPU_ASSIGNMENT, _assignment(stolen)),
                           (keys.ANN_GPU_ALLOCATED, NODE_NAME),
                           (keys.ANN_GANG_NAME, "someone-elses"),
                           (keys.ANN_GANG_MIN_MEMBER, "9"),
                           (keys.ANN_JOINED_GANG, "volcano/someone-elses"),
                           (keys.ANN_GPU_TOPOLOGY, '{"v":1,"mode":"required"}')):
            _refused_by_the_guard(mallory.annotate("bound", key, value), f"annotate {key}")
            _refused_by_the_guard(mallory.annotate("bound", key, value, "status"),
                                  f"annotate {key} through pods/status")
        _refused_by_the_guard(mallory.run("annotate", "pod", "bound", f"{keys.ANN_GANG_NAME}-"),
                              "remove the gang name")
        # the pod's other annotations stay its owner's, and so does the one muster.io/ key its
        # job writes on its running pods (when it last saved its state: it can only make its
        # own gang the cheaper preemption victim), alone and not beside another muster.io/ key
        out = mallory.annotate("bound", "example.com/note", "mine")
        assert out.returncode == 0, out.stderr
        out = mallory.annotate("bound", keys.ANN_LAST_CHECKPOINT, "2026-12-06T18:00:00Z")
        assert out.returncode == 0, out.stderr
        # as a time the binder reads, or the job hears the form to write (never ignored unsaid)
        for when in ("yesterday", "2026-12-06 19:00:00", "2026-12-06T19:00:00"):
            out = mallory.run("annotate", "pod", "bound", "--overwrite",
                              f"{keys.ANN_LAST_CHECKPOINT}={when}")
            _refused_by_the_guard(out, f"the checkpoint {when!r}")
            assert "is an RFC 3339 time with its zone, such as 2026-12-06T18:00:00Z" in \
                out.stderr, out.stderr
        # a day no month has passes the pattern and fails timestamp(): refused as an error
        _refused_by_the_guard(mallory.annotate("bound", keys.ANN_LAST_CHECKPOINT,
                                               "2026-02-30T19:00:00Z"), "February 30")
        pod = await kube.get(PODS, "bound", namespace=ATTACKER_NS)
        assert pod["metadata"]["annotations"][keys.ANN_LAST_CHECKPOINT] == "2026-12-06T18:00:00Z"
        both = json.dumps({"metadata": {"annotations": {
            keys.ANN_LAST_CHECKPOINT: "2026-12-06T19:00:00Z", keys.ANN_GANG_NAME: "other"}}})
        out = mallory.run("patch", "pod", "bound", "--type", "merge", "-p", both)
        _refused_by_the_guard(out, "the checkpoint beside a gang key")
        assert keys.ANN_GANG_NAME in out.stderr and f"{keys.ANN_LAST_CHECKPOINT}):" in out.stderr
        out = mallory.run("annotate", "pod", "bound", f"{keys.ANN_LAST_CHECKPOINT}-")
        assert out.returncode == 0, out.stderr

        # 4. a Binding carrying Muster's keys by anyone but the binder (here the cluster's
        #    admin, whom the guard does not exempt either): the API server would copy its
        #    annotations onto the pod with no pod UPDATE to check, so the Binding is refused
        await kube.create(PODS, {"apiVersion": "v1", "kind": "Pod",
                                 "metadata": {"name": "unbound"},
                                 "spec": {"schedulerName": "nobody", "containers": [
                                     {"name": "c", "image": "busybox"}]}}, ATTACKER_NS)
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {
            "name": "unbound", "annotations": {keys.ANN_GPU_ASSIGNMENT: _assignment(stolen)}},
            "target": {"kind": "Node", "name": NODE_NAME}}
        with pytest.raises(ApiError) as err:
            await kube.request("POST", PODS.path(ATTACKER_NS, "unbound") + "/binding",
                               body=binding)
        assert f"{GUARD}-bindings" in err.value.message, err.value.message
        # the legacy resource (POST .../namespaces/N/bindings) copies annotations the same way
        with pytest.raises(ApiError) as err:
            await kube.request("POST", f"/api/v1/namespaces/{ATTACKER_NS}/bindings",
                               body=binding)
        assert f"{GUARD}-bindings" in err.value.message, err.value.message
        unbound = await kube.get(PODS, "unbound", namespace=ATTACKER_NS)
        assert not unbound["spec"].get("nodeName")

        # 5. the webhook down (failurePolicy Ignore: pods are admitted unmutated): the policy
        #    inside the API server refuses what the webhook would have stripped, bound at
        #    create (spec.nodeName) or not
        await scale_webhook(kube, node_cluster, 0)
        for name, key, value, node in (
                ("down-assignment", keys.ANN_GPU_ASSIGNMENT, _assignment(stolen), None),
                ("down-bound", keys.ANN_GPU_ASSIGNMENT, _assignment(stolen), NODE_NAME),
                ("down-record", keys.ANN_GANG_PLACEMENT, record, None),
                ("down-allocated", keys.ANN_GPU_ALLOCATED, NODE_NAME, None)):
            _refused_by_the_guard(mallory.create(_pod(name, annotations={key: value}, node=node)),
                                  f"create with {key} while the webhook is down")

        # the victim kept its GPUs all along
        for name, gpus in victims.items():
            pod = await kube.get(PODS, name, namespace="gpu-team")
            assert pod["status"]["phase"] == "Running" and assigned_uuids(pod) == gpus, name
            assert await _printed(node_cluster, "gpu-team", name) == gpus, name
    finally:
        await scale_webhook(kube, node_cluster, 2)
        kubectl(node_cluster, "delete", "pods", "--all", "-n", ATTACKER_NS, "--wait=false",
                check=False)
        await delete_jobs(kube, "gpu-team", [VICTIM])


async def test_a_pod_bound_with_node_name_gets_no_gpu_of_a_binder_pod_waiting_there(
        kube: KubeApi, node_cluster: NodeCluster, tmp_path: Path) -> None:
    """Issue #54: the attacker binds its own GPU pod to the node (spec.nodeName, tolerations)
    and the kubelet admits it while the binder binds the victim's workers there. The kubelet
    does not tell the device plugin which pod it admits: before, the attacker's container got
    the first worker's assigned GPU and that worker was refused. Now the agent sees a GPU pod it
    cannot tie to any assignment pending beside the grants and refuses rather than guess: the
    attacker's pod fails, and every worker starts on the GPU the binder assigned it."""
    mallory = await _mallory(kube, node_cluster, tmp_path)
    try:
        out = mallory.create(_pod("squatter", node=NODE_NAME))
        assert out.returncode == 0, out.stderr
        # the kubelet is admitting it (the agent waits up to 10 s for an assignment) while
        # the binder binds the workers
        await asyncio.sleep(1)
        victims = await _victim(kube, node_cluster)
        victim = {u for gpus in victims.values() for u in gpus}
        assert len(victim) == 4
        await _never_gets(kube, node_cluster, "squatter", victim)
        squatter = await kube.get(PODS, "squatter", namespace=ATTACKER_NS)
        assert squatter["status"].get("reason") == "UnexpectedAdmissionError", squatter["status"]
        # the kubelet's own record agrees (PodResources, read by the agent): nobody holds
        # GPUs they should not
        metrics = (await asyncio.to_thread(
            kubectl, node_cluster, "get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/"
            f"{agent_pod(node_cluster)}:8080/proxy/metrics")).stdout
        for kind in ("assignment", "foreign", "shared"):
            line = f'muster_agent_gpu_holding_mismatches_current{{kind="{kind}"}} 0.0'
            assert line in metrics, metrics
    finally:
        kubectl(node_cluster, "delete", "pods", "--all", "-n", ATTACKER_NS, "--wait=false",
                check=False)
        await delete_jobs(kube, "gpu-team", [VICTIM])
