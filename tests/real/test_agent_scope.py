"""What the node agent's credentials may write on a real API server: its own Node and the pods
bound to it, nothing else (the chart's ValidatingAdmissionPolicies, agent.nodeRestriction, on the
node claim of the token the kubelet projects; the RBAC of templates/agent.yaml).

The agent runs on the one real node, muster-node. A token is requested for its ServiceAccount,
bound to its pod as the kubelet's projected token is, so the API server puts the node's name in
it; a second Node object, with no kubelet behind it, stands for "another node"."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from jobs import ensure_namespace

from e2e.cluster import NAMESPACE, RELEASE
from e2e.node import image
from e2e.node.cluster import NODE_NAME, NodeCluster
from e2e.probes import eventually
from webhook import keys
from webhook.kube import NODES, PODS, ApiError, KubeApi, Resource, make_api_client

SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts", True, "ServiceAccount")
OTHER_NODE = "muster-other-node"
SCOPE_NS = "agent-scope"
LABEL = "muster.io/scope-test"


def _pod(name: str, node: str) -> dict[str, Any]:
    """A pod bound to `node` at creation, as a kubelet-run static workload would be."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"example.com/note": "kept"}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "pause", "image": image.PAUSE,
                                     "imagePullPolicy": "Never",
                                     "resources": {"requests": {"cpu": "1m",
                                                                "memory": "8Mi"}}}]}}


async def _agent_pod(kube: KubeApi) -> dict[str, Any]:
    pods = (await kube.list(PODS, namespace=NAMESPACE,
                            label_selector="app.kubernetes.io/component=agent"))["items"]
    (pod,) = [p for p in pods if p["spec"].get("nodeName") == NODE_NAME]
    return pod


async def _agent_token(kube: KubeApi) -> str:
    """A token of the agent's ServiceAccount bound to the agent's pod on muster-node."""
    pod = await _agent_pod(kube)
    answer = await kube.create_subresource(SERVICEACCOUNTS, f"{RELEASE}-agent", "token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 600, "boundObjectRef": {
            "apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"]}}}, namespace=NAMESPACE)
    token: str = answer["status"]["token"]
    return token


@pytest.fixture
async def agent(kube: KubeApi, node_cluster: NodeCluster, tmp_path: Path
                ) -> AsyncIterator[KubeApi]:
    """An API client with the agent's credentials."""
    config = json.loads(node_cluster.kubeconfig.read_text())
    config["users"] = [{"name": "admin", "user": {"token": await _agent_token(kube)}}]
    path = tmp_path / "agent.kubeconfig"
    path.write_text(json.dumps(config))
    client = await make_api_client(str(path))
    try:
        yield KubeApi(client)
    finally:
        await client.close()


async def _refused(call: Any, said: str) -> None:
    try:
        await call
    except ApiError as exc:
        assert exc.status == 403, exc
        assert said in exc.message, exc.message
    else:
        raise AssertionError(f"the agent's credentials were allowed to: {said}")


async def test_the_agent_writes_only_its_own_node_and_its_pods(kube: KubeApi,
                                                               agent: KubeApi) -> None:
    ns = await ensure_namespace(kube, SCOPE_NS)
    await kube.create(NODES, {"apiVersion": "v1", "kind": "Node",
                              "metadata": {"name": OTHER_NODE}})
    try:
        own_pod = await kube.create(PODS, _pod("on-own-node", NODE_NAME), namespace=ns)
        other_pod = await kube.create(PODS, _pod("on-other-node", OTHER_NODE), namespace=ns)
        mark = {"metadata": {"labels": {LABEL: "x"}}}

        # its own Node: as the publisher does (a merge patch of muster.io/ keys)
        await agent.patch(NODES, NODE_NAME, mark, patch_type="merge")
        node = await kube.get(NODES, NODE_NAME)
        assert node["metadata"]["labels"][LABEL] == "x"

        # another Node: refused by the policy (the first call also waits for it to be active)
        async def other_node_refused() -> bool:
            try:
                await agent.patch(NODES, OTHER_NODE, mark, patch_type="merge")
            except ApiError as exc:
                assert exc.status == 403, exc
                assert f"the muster agent of node {NODE_NAME} may write only its own Node, " \
                       f"not {OTHER_NODE}" in exc.message, exc.message
                return True
            await kube.patch(NODES, OTHER_NODE, {"metadata": {"labels": {LABEL: None}}},
                             patch_type="merge")
            return False
        await eventually(other_node_refused, within=30, interval=1.0,
                         what="the agent policy to refuse a write to another Node")
        labels = (await kube.get(NODES, OTHER_NODE))["metadata"].get("labels") or {}
        assert LABEL not in labels

        # its own Node, but a key that is not Muster's (a role label, a taint)
        await _refused(agent.patch(NODES, NODE_NAME, {"metadata": {"labels": {
            "node-role.kubernetes.io/control-plane": ""}}}, patch_type="merge"),
            "may change only muster.io/ labels and annotations")
        await _refused(agent.patch(NODES, NODE_NAME, {"spec": {"unschedulable": True}},
                                   patch_type="merge"),
            "may not change a node's spec")

        # the record of the agent's pod on its Node: the running agent wrote its own at
        # registration (through these policies); another pod's is refused
        pod = await _agent_pod(kube)
        own = keys.gpu_agent(NAMESPACE, pod["metadata"]["name"], pod["metadata"]["uid"])

        async def recorded() -> bool:
            node = await kube.get(NODES, NODE_NAME)
            return bool(node["metadata"].get("annotations", {}).get(keys.ANN_GPU_AGENT) == own)
        await eventually(recorded, within=60, interval=1.0,
                         what="the agent to record its own pod on its Node")
        await _refused(agent.patch(NODES, NODE_NAME, {"metadata": {"annotations": {
            keys.ANN_GPU_AGENT: keys.gpu_agent(NAMESPACE, "another-agent", "u-2")}}},
            patch_type="merge"), f"may record only its own pod in {keys.ANN_GPU_AGENT} ({own})")
        node = await kube.get(NODES, NODE_NAME)
        assert node["metadata"]["annotations"][keys.ANN_GPU_AGENT] == own

        # pods: the served mark on a pod of its node, as NodePods.acknowledge writes it
        def served(pod: dict[str, Any]) -> list[dict[str, Any]]:
            return [{"op": "test", "path": "/metadata/uid", "value": pod["metadata"]["uid"]},
                    {"op": "add", "path": "/metadata/annotations/muster.io~1gpu-allocated",
                     "value": NODE_NAME}]
        await agent.patch(PODS, "on-own-node", served(own_pod), ns, patch_type="json")
        got = await kube.get(PODS, "on-own-node", ns)
        assert got["metadata"]["annotations"] == {"example.com/note": "kept",
                                                  "muster.io/gpu-allocated": NODE_NAME}
        # two policies refuse this one (the agent's own-node policy and the annotation
        # guard); the API server reports whichever it evaluated first
        await _refused(agent.patch(PODS, "on-other-node", served(other_pod), ns,
                                   patch_type="json"), "only pods bound to")
        got = await kube.get(PODS, "on-other-node", ns)
        assert "muster.io/gpu-allocated" not in (got["metadata"].get("annotations") or {})

        # RBAC: the calls the agent makes and no others
        listed = await agent.list(PODS, field_selector=f"spec.nodeName={NODE_NAME}")
        assert any(p["metadata"]["name"] == "on-own-node" for p in listed["items"])
        await _refused(agent.get(PODS, "on-own-node", ns), "cannot get resource")
        await _refused(agent.delete(PODS, "on-own-node", ns), "cannot delete resource")
    finally:
        await kube.patch(NODES, NODE_NAME, {"metadata": {"labels": {LABEL: None}}},
                         patch_type="merge")
        for name in ("on-own-node", "on-other-node"):
            try:  # no kubelet confirms the other pod's end: no grace period
                await kube.request("DELETE", PODS.path(ns, name),
                                   body={"kind": "DeleteOptions", "apiVersion": "v1",
                                         "gracePeriodSeconds": 0})
            except ApiError as exc:
                if not exc.not_found:
                    raise
        await kube.delete(NODES, OTHER_NODE)
