"""Helpers of the real tier: kubectl and helm on the test cluster, the release's values."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import NAMESPACE, RELEASE, chart_values, helm, render_chart
from e2e.node import image
from e2e.node.assets import REPO
from e2e.node.cluster import NodeCluster
from e2e.node.kubectl import crd_documents, kubectl, wait_established, write_list
from e2e.probes import eventually, open_volcano_queues
from webhook import keys
from webhook.binder.controller import Binder, BinderConfig
from webhook.cli import main
from webhook.demo import EXAMPLE_POLICIES
from webhook.kube import EVENTS, PODS, ApiError, KubeApi, Resource, make_api_client
from webhook.topology import codec
from webhook.topology.model import Topology

__all__ = ["FAIL_CLOSED_LABEL", "NETWORK_LEVELS", "agent_dra_state", "agent_pod",
           "assigned_indices", "assigned_uuids", "binder_as_chart", "bound_whole",
           "chart_binder_grant", "chart_reader", "crd_documents", "delete_now", "diagnostics",
           "failed_scheduling", "fake_node", "gpu_pod", "kubectl", "muster_json", "pod_events",
           "pod_ready", "policies_everywhere", "policy_digests", "release_values", "run_helm",
           "scale_webhook", "upgrade_release", "wait_established", "wait_webhook_pods",
           "webhook_pods", "with_api"]

#: the binder's network levels (docs/topology.md): Topograph's spine (a block) and leaf (a
#: rack), then GPU Feature Discovery's NVLink clique; the shipped network-topology.yaml names them
NETWORK_LEVELS = ["network.topology.nvidia.com/spine", "network.topology.nvidia.com/leaf",
                  "nvidia.com/gpu.clique"]
#: the aliases KAI manifests may name them by (KAI's Topology `alias`)
_NETWORK_ALIASES = {"network.topology.nvidia.com/spine": "block",
                    "network.topology.nvidia.com/leaf": "rack"}
#: the namespace label the tier's release makes fail-closed (webhook.failClosedNamespaceLabel)
FAIL_CLOSED_LABEL = {"muster.io/admission": "required"}


def pod_ready(pod: dict[str, Any]) -> bool:
    """The pod's Ready condition (a pod just created has no containerStatuses to check yet)."""
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod.get("status", {}).get("conditions", []))


async def webhook_pods(kube: KubeApi, *, terminating: bool = False) -> list[dict[str, Any]]:
    """The release's webhook pods; those being deleted only when `terminating`."""
    pods: list[dict[str, Any]] = (await kube.list(
        PODS, namespace=NAMESPACE, label_selector="app.kubernetes.io/component=webhook"))["items"]
    return pods if terminating else [p for p in pods
                                     if not p["metadata"].get("deletionTimestamp")]


async def wait_webhook_pods(kube: KubeApi, replicas: int, within: float = 180) -> None:
    """Until exactly `replicas` webhook pods are live and ready; for 0, until none is left at
    all (a terminating pod may still answer)."""
    async def settled() -> bool:
        if replicas == 0:
            return not await webhook_pods(kube, terminating=True)
        live = await webhook_pods(kube)
        return len(live) == replicas and all(pod_ready(p) for p in live)
    await eventually(settled, within=within, what=f"{replicas} ready webhook pods")


async def scale_webhook(kube: KubeApi, cluster: NodeCluster, replicas: int) -> None:
    """Scale the webhook Deployment and wait until exactly `replicas` pods are ready (for 0,
    until every pod is gone: only then has the API server no kept-alive connection to one)."""
    kubectl(cluster, "scale", "deployment", "-n", NAMESPACE, "-l",
            "app.kubernetes.io/component=webhook", f"--replicas={replicas}")
    await wait_webhook_pods(kube, replicas)


def with_api(cluster: NodeCluster, use: Callable[[KubeApi], Awaitable[None]]) -> None:
    """Runs `use` with a client of its own: for a fixture wider than a test, which has no
    test's event loop (call it inside the cluster's network)."""
    async def run() -> None:
        client = await make_api_client(str(cluster.kubeconfig))
        try:
            await use(KubeApi(client))
        finally:
            await client.close()
    asyncio.run(run())


def run_helm(cluster: NodeCluster, *args: str, timeout: float = 420
             ) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([helm(), "--kubeconfig", str(cluster.kubeconfig), *args],
                         capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out


def upgrade_release(cluster: NodeCluster, values: dict[str, Any], file_name: str) -> None:
    """`helm upgrade --wait` of the session's release to `values` (written to `file_name` in
    the cluster's directory; call it inside the cluster's network)."""
    path = cluster.dir / file_name
    path.write_text(json.dumps(values))
    run_helm(cluster, "upgrade", RELEASE, str(REPO / "charts" / "muster"), "--namespace",
             NAMESPACE, "--values", str(path), "--wait", "--timeout", "3m")


async def policy_digests(kube: KubeApi, cluster: NodeCluster) -> dict[str, str | None]:
    """Each webhook pod (terminating ones too: they may still answer) → the digest of the policy
    set it serves, its `muster_policy_set_info` read through the API server's pod proxy, as
    docs/policies.md ("Rolling out a policy") tells admins to; None while it has none."""
    digests: dict[str, str | None] = {}
    for pod in await webhook_pods(kube, terminating=True):
        name = pod["metadata"]["name"]
        [port] = [p["containerPort"] for c in pod["spec"]["containers"]
                  for p in c.get("ports", []) if p.get("name") == "metrics"]
        text = (await asyncio.to_thread(
            kubectl, cluster, "get", "--raw",
            f"/api/v1/namespaces/{NAMESPACE}/pods/{name}:{port}/proxy/metrics",
            check=False)).stdout
        found = re.search(r'^muster_policy_set_info\{digest="([0-9a-f]+)"\} 1\.0$', text, re.M)
        digests[name] = found.group(1) if found else None
    return digests


async def policies_everywhere(kube: KubeApi, cluster: NodeCluster,
                              probe: Callable[[], Awaitable[bool]]) -> bool:
    """Whether every webhook replica serves the policy set `probe` (a dry run through the API
    server) looks for: each replica reloads on its own, once the kubelet has updated its volume,
    and the API server keeps its connection to one replica, so probes alone may never reach the
    other. True when a probe sees the set and every replica shows the same digest."""
    if not await probe():
        return False
    digests = set((await policy_digests(kube, cluster)).values())
    return len(digests) == 1 and None not in digests


def agent_pod(cluster: NodeCluster) -> str:
    """The name of the release's live agent pod (the tier has one node)."""
    out = kubectl(cluster, "get", "pods", "-n", NAMESPACE, "-l",
                  "app.kubernetes.io/component=agent", "-o", "json")
    [pod] = [p for p in json.loads(out.stdout)["items"]
             if not p["metadata"].get("deletionTimestamp")]
    return str(pod["metadata"]["name"])


def agent_dra_state(cluster: NodeCluster) -> tuple[dict[str, Any], list[str]]:
    """(the DRA driver's checkpoint, the CDI spec files), read inside the agent's pod, where the
    chart mounts the kubelet's plugin directory and containerd's CDI directory at the host's
    paths (agent.dra.pluginsDir, agent.dra.cdiDir)."""
    path = f"/var/lib/kubelet/plugins/{keys.DRA_DRIVER}/checkpoint.json"
    script = (f"import json, os; print(json.dumps([open({path!r}).read(), "
              f"sorted(os.listdir('/var/run/cdi'))]))")
    out = kubectl(cluster, "exec", "-n", NAMESPACE, agent_pod(cluster), "--", "python", "-c",
                  script)
    state, files = json.loads(out.stdout)
    checkpoint: dict[str, Any] = json.loads(state)
    return checkpoint, files


def release_values(cluster: NodeCluster) -> dict[str, Any]:
    """The values an admin of this node would set: the shipped policies, the locally imported
    image and the fake NVML (no GPU here)."""
    values = chart_values(EXAMPLE_POLICIES)
    values["image"] = {"repository": image.IMAGE_REPOSITORY, "tag": image.IMAGE_TAG,
                       "pullPolicy": "Never"}
    values["agent"] = {"extraArgs": ["--fake-nvml=dgx1-v100"]}
    # as a KAI Topology's spec.levels: a label, with its alias where it has one
    values["binder"] = {"networkLevels": [
        {"nodeLabel": label, "alias": _NETWORK_ALIASES[label]} if label in _NETWORK_ALIASES
        else label for label in NETWORK_LEVELS]}
    values["webhook"] = {"failClosedNamespaceLabel": dict(FAIL_CLOSED_LABEL)}
    return values


@contextlib.contextmanager
def installed(cluster: NodeCluster, values: dict[str, Any], work: Path, *, within: float,
              helm_timeout: str) -> Iterator[NodeCluster]:
    """The cluster started, the CRDs applied, Volcano's queues open and Muster installed by
    `helm install` with `values`, stopped after; a step that fails prints the cluster's logs and
    diagnostics, and stops it."""
    try:
        cluster.start(within=within)
        with cluster.netns():
            crds = write_list(work / "crds.json", crd_documents())
            kubectl(cluster, "apply", "--server-side", "-f", str(crds))
            wait_established(cluster)
            with_api(cluster, open_volcano_queues)
            (work / "values.yaml").write_text(yaml.safe_dump(values))
            run_helm(cluster, "install", RELEASE, str(REPO / "charts" / "muster"),
                     "--namespace", NAMESPACE, "--create-namespace",
                     "--values", str(work / "values.yaml"), "--wait", "--timeout", helm_timeout)
    except BaseException:
        print(cluster.logs())
        if cluster.alive() is None:
            with cluster.netns():
                print(diagnostics(cluster))
        cluster.stop()
        raise
    try:
        yield cluster
    finally:
        cluster.stop()


def diagnostics(cluster: NodeCluster) -> str:
    """What a person debugging a red run needs first: every pod, the warnings, the logs of each
    container that is not ready and of Muster's own (a ready agent that publishes nothing says
    why only there), the tokens the API server refused and the webhook calls that failed (call
    it inside the cluster's network)."""
    out = [kubectl(cluster, "get", "pods", "-A", "-o", "wide", check=False).stdout,
           kubectl(cluster, "get", "events", "-A", "--field-selector", "type=Warning",
                   check=False).stdout]
    pods = kubectl(cluster, "get", "pods", "-A", "-o", "json", check=False).stdout
    for pod in json.loads(pods or '{"items": []}')["items"]:
        statuses = pod.get("status", {}).get("containerStatuses", [])
        meta = pod["metadata"]
        if all(s.get("ready") for s in statuses) and statuses and \
                meta["namespace"] != NAMESPACE:
            continue
        for c in statuses:
            logs = kubectl(cluster, "logs", "-n", meta["namespace"], meta["name"], "-c",
                           c["name"], "--tail=30", check=False)
            out.append(f"--- logs {meta['namespace']}/{meta['name']} {c['name']}\n"
                       f"{logs.stdout}{logs.stderr}")
    log = cluster.dir / "logs" / "kube-apiserver.log"
    lines = (log.read_text(errors="replace") if log.exists() else "").splitlines()
    refused = [line for line in lines if "Unable to authenticate" in line]
    out.append("--- kube-apiserver: the last requests it could not authenticate\n"
               + "\n".join(refused[-10:]))
    # (a pod admitted without the webhook, failurePolicy Ignore, is said only here)
    unanswered = [line for line in lines if "calling webhook" in line]
    out.append("--- kube-apiserver: the last webhook calls that failed\n"
               + "\n".join(unanswered[-10:]))
    return "\n".join(out)


def fake_node(name: str, topology: Topology, labels: dict[str, str],
              taint: dict[str, str]) -> dict[str, Any]:
    """A Node object as the node agent with fake NVML publishes it (its topology annotation,
    allocatable GPUs), Ready, with `labels` and `taint`: no kubelet runs it, so the pods bound to
    it stay Pending."""
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110",
             keys.GPU_RESOURCE: str(topology.size)}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels},
                         "annotations": {keys.ANN_NODE_TOPOLOGY: codec.encode(topology)}},
            "spec": {"taints": [taint]},
            "status": {"allocatable": alloc, "capacity": dict(alloc),
                       "conditions": [{"type": "Ready", "status": "True",
                                       "reason": "KubeletReady", "message": "fake node"}]}}


_CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", False, "ClusterRole")
_CLUSTER_ROLE_BINDINGS = Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings",
                                  False, "ClusterRoleBinding")


def chart_binder_grant(tmp_path: Path, levels: str, group: str, name: str
                       ) -> list[dict[str, Any]]:
    """The rule of the binder's ClusterRole for API `group` in the chart rendered with
    `binder.networkLevels: <levels>` (so a chart that grants too little fails the test), as a
    ClusterRole `name` bound to the binder's service account."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"binder": {"networkLevels": levels}}))
    [role] = [d for d in render_chart(values)
              if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-binder")]
    rules = [r for r in role["rules"] if group in r["apiGroups"]]
    assert len(rules) == 1, role["rules"]
    meta = {"name": name}
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": meta, "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": meta, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                           "kind": "ClusterRole", **meta},
             "subjects": [{"kind": "ServiceAccount", "name": f"{RELEASE}-binder",
                           "namespace": NAMESPACE}]}]


@contextlib.asynccontextmanager
async def binder_as_chart(kube: KubeApi, cluster: NodeCluster, config: BinderConfig, *,
                          grant: list[dict[str, Any]],
                          objects: Sequence[tuple[Resource, dict[str, Any]]], ns: str
                          ) -> AsyncIterator[Binder]:
    """A binder of `config` run in the test against the API server as the chart's binder
    service account (impersonated), with `grant` (`chart_binder_grant`) bound and the
    cluster-scoped `objects` (nodes, HyperNodes) created first; after it these, and every pod
    of `ns`, are deleted."""
    client = await make_api_client(str(cluster.kubeconfig))
    client.set_default_header("Impersonate-User",
                              f"system:serviceaccount:{NAMESPACE}:{RELEASE}-binder")
    binder = Binder(KubeApi(client), config)
    role, binding = grant
    task: asyncio.Task[None] | None = None
    try:
        await kube.create(_CLUSTER_ROLES, role)
        await kube.create(_CLUSTER_ROLE_BINDINGS, binding)
        for resource, obj in objects:
            await kube.create(resource, obj)
        task = asyncio.create_task(binder.run())
        await asyncio.wait_for(binder.synced.wait(), 60)
        yield binder
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await client.close()
        await delete_now(kube, _CLUSTER_ROLE_BINDINGS.path(None, binding["metadata"]["name"]))
        await delete_now(kube, _CLUSTER_ROLES.path(None, role["metadata"]["name"]))
        for pod in (await kube.list(PODS, namespace=ns))["items"]:
            await delete_now(kube, PODS.path(ns, pod["metadata"]["name"]))
        for resource, obj in reversed(objects):
            await delete_now(kube, resource.path(None, obj["metadata"]["name"]))


async def bound_whole(kube: KubeApi, ns: str, prefix: str, count: int) -> set[str]:
    """The nodes the `count` pods of `ns` named `prefix`* are bound to, once all are."""
    async def bound() -> set[str] | None:
        pods = [p for p in (await kube.list(PODS, namespace=ns))["items"]
                if p["metadata"]["name"].startswith(prefix)]
        where = {p["spec"].get("nodeName") for p in pods}
        return where if len(pods) == count and None not in where else None
    found: set[str] = await eventually(bound, within=60, interval=0.5,
                                      what=f"{prefix}* bound whole")
    return found


async def failed_scheduling(kube: KubeApi, ns: str, prefix: str, within: float = 90) -> str:
    """The first FailedScheduling Event's message about a pod whose name starts with `prefix`
    (waited for)."""
    async def told() -> str | None:
        events = (await kube.list(EVENTS, namespace=ns,
                                  field_selector="reason=FailedScheduling"))["items"]
        found = [e["message"] for e in events if e["involvedObject"]["name"].startswith(prefix)]
        return found[0] if found else None
    try:
        message: str = await eventually(told, within=within, interval=0.5,
                                        what=f"a FailedScheduling Event about {ns}/{prefix}")
    except AssertionError as exc:  # the pods as they are then: who holds them, and where
        pods = [p for p in (await kube.list(PODS, namespace=ns))["items"]
                if p["metadata"]["name"].startswith(prefix.rsplit("-", 1)[0])]
        raise AssertionError(f"{exc}; the pods: {json.dumps([_held(p) for p in pods])}") from exc
    return message


def _held(pod: dict[str, Any]) -> dict[str, Any]:
    """What decides who places a pod, and whether it was: for a failure's message."""
    spec, status = pod["spec"], pod.get("status") or {}
    return {"name": pod["metadata"]["name"], "scheduler": spec.get("schedulerName"),
            "node": spec.get("nodeName"), "gates": spec.get("schedulingGates"),
            "nodeSelector": spec.get("nodeSelector"), "phase": status.get("phase"),
            "annotations": sorted(pod["metadata"].get("annotations") or {}),
            "conditions": [(c.get("type"), c.get("status"), c.get("message"))
                           for c in status.get("conditions") or ()]}


def _assigned(pod: dict[str, Any], field: str) -> list[Any]:
    """A field (`indices`, `uuids`) of the binder's assignment on the pod, over its
    containers; none where it has no assignment."""
    raw = (pod["metadata"].get("annotations") or {}).get(keys.ANN_GPU_ASSIGNMENT)
    return [] if not raw else [x for c in json.loads(raw)["containers"].values()
                               for x in c[field]]


def assigned_indices(pod: dict[str, Any]) -> list[int]:
    """The GPU indices the binder's assignment gives the pod (none without one)."""
    return _assigned(pod, "indices")


def assigned_uuids(pod: dict[str, Any]) -> list[str]:
    """The GPU UUIDs the binder's assignment gives the pod (none without one)."""
    return _assigned(pod, "uuids")


async def delete_now(kube: KubeApi, path: str) -> None:
    """DELETE with no grace period; gone already is fine."""
    try:
        await kube.request("DELETE", path, body={"kind": "DeleteOptions", "apiVersion": "v1",
                                                 "gracePeriodSeconds": 0})
    except ApiError as exc:
        if not exc.not_found:
            raise


def chart_reader(cluster: NodeCluster, work: Path, name: str) -> tuple[Path, Path]:
    """A ServiceAccount `name` (namespace default) bound to the chart's reader ClusterRole
    (`reader.clusterRole`: what analyze, gangs and explain read), with the verbs it must not
    have checked by the API server: (its kubeconfig, the RBAC objects to delete after)."""
    objs = [{"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": name, "namespace": "default"}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": name},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": f"{RELEASE}-reader"},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}]}]
    rbac = write_list(work / f"{name}-rbac.json", objs)
    with cluster.netns():
        kubectl(cluster, "apply", "-f", str(rbac))
        token = kubectl(cluster, "create", "token", name, "-n", "default", "--duration",
                        "1h").stdout.strip()
        for verb, resource in (("create", "pods/binding"), ("patch", "pods/status"),
                               ("create", "events"), ("delete", "podgroups.scheduling.x-k8s.io"),
                               ("watch", "pods"), ("get", "secrets")):
            said = kubectl(cluster, "auth", "can-i", verb, resource, "-A",
                           f"--as=system:serviceaccount:default:{name}", check=False)
            assert said.stdout.strip() == "no", (verb, resource, said.stdout)
    config = json.loads(cluster.kubeconfig.read_text())
    config["users"] = [{"name": "admin", "user": {"token": token}}]
    path = work / f"{name}.kubeconfig"
    path.write_text(json.dumps(config))
    return path, rbac


async def muster_json(kubeconfig: Path, *argv: str) -> Any:
    """`muster ARGV --kubeconfig K -o json` against the cluster, in this process (the CLI an
    admin runs): its JSON output, once it exits 0."""
    def run() -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main([*argv, "--kubeconfig", str(kubeconfig), "-o", "json"])
        return code, out.getvalue()
    code, out = await asyncio.to_thread(run)
    assert code == 0, out
    return json.loads(out)


async def pod_events(kube: KubeApi, ns: str, reason: str) -> dict[str, str]:
    """Pod name -> the message of the `reason` Event about it."""
    items = (await kube.list(EVENTS, namespace=ns, field_selector=f"reason={reason}"))["items"]
    return {e["involvedObject"]["name"]: e["message"] for e in items
            if e["involvedObject"].get("kind") == "Pod"}


def gpu_pod(name: str, ns: str, scheduler: str, gpus: int, *, gang: str | None = None,
            members: int = 0, network: dict[str, Any] | None = None, node: str | None = None
            ) -> dict[str, Any]:
    """A pod of `scheduler` asking for `gpus`, as the webhook annotates a gang's member (its
    gang, and `network`: the request's "network" part), or bound to `node` already."""
    ann: dict[str, str] = {}
    if gang:
        ann |= {keys.ANN_GANG_NAME: gang, keys.ANN_GANG_MIN_MEMBER: str(members)}
    if network:
        ann[keys.ANN_GPU_TOPOLOGY] = json.dumps({"v": 1, "mode": "preferred",
                                                 "network": network})
    spec: dict[str, Any] = {
        "schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
        "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "main", "image": "train:1",
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                      "limits": {keys.GPU_RESOURCE: str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": ann}, "spec": spec}
