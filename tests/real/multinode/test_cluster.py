"""The four nodes themselves, then a gang across two of them: every node Ready with its rack, an
agent on each publishing GPUs of its own; an Indexed Job under the shipped `network-rack` policy
(required rack) lands whole in one rack on two nodes, each rank sees exactly the GPUs the binder
assigned it, and the ranks sum their numbers over TCP, finding rank 0 by its DNS name."""

from __future__ import annotations

from typing import Any

from jobs import ensure_namespace
from layout import GPUS_PER_NODE, LEAF, RACKS
from ranks import check_assignments, printed, visible
from workloads import EXCHANGE, indexed_job

from e2e.cluster import NAMESPACE
from e2e.node.cluster import NodeCluster
from e2e.probes import eventually
from webhook import keys
from webhook.kube import JOBS, NODES, PODS, SERVICES, KubeApi
from webhook.topology import codec

NS = "rack-team"
async def test_every_node_is_ready_in_its_rack_with_gpus_of_its_own(kube: KubeApi) -> None:
    async def published() -> dict[str, Any] | None:
        nodes = {n["metadata"]["name"]: n for n in (await kube.list(NODES))["items"]}
        ready = all(any(c["type"] == "Ready" and c["status"] == "True"
                        for c in n["status"].get("conditions", [])) for n in nodes.values())
        have = all(n["status"].get("allocatable", {}).get(keys.GPU_RESOURCE) ==
                   str(GPUS_PER_NODE) and keys.ANN_NODE_TOPOLOGY in n["metadata"]
                   .get("annotations", {}) for n in nodes.values())
        return nodes if set(nodes) == set(RACKS) and ready and have else None
    nodes = await eventually(published, within=180, interval=1,
                             what="4 Ready nodes, each with 8 GPUs published by its agent")
    assert {n: nodes[n]["metadata"]["labels"][LEAF] for n in nodes} == RACKS
    uuids = [g.uuid for n in nodes.values()
             for g in codec.decode(n["metadata"]["annotations"][keys.ANN_NODE_TOPOLOGY]).gpus]
    assert len(uuids) == len(set(uuids)) == 4 * GPUS_PER_NODE
    agents = (await kube.list(PODS, namespace=NAMESPACE,
                              label_selector="app.kubernetes.io/component=agent"))["items"]
    assert sorted(p["spec"]["nodeName"] for p in agents) == sorted(RACKS)


async def test_an_indexed_job_runs_whole_in_one_rack_across_two_nodes(
        kube: KubeApi, node_cluster: NodeCluster) -> None:
    await ensure_namespace(kube, NS, {"muster.io/network": "rack"})
    name, world = "exchange", 2
    service, job = indexed_job(NS, name, world, GPUS_PER_NODE, EXCHANGE)
    await kube.create(SERVICES, service, namespace=NS)
    await kube.create(JOBS, job, namespace=NS)

    async def done() -> list[dict[str, Any]] | None:
        pods = (await kube.list(PODS, namespace=NS, label_selector=f"job-name={name}"))["items"]
        phases = {p["status"].get("phase") for p in pods}
        assert "Failed" not in phases, [p["status"] for p in pods]
        return pods if len(pods) == world and phases == {"Succeeded"} else None
    pods = await eventually(done, within=300, interval=1, what=f"{name}'s ranks Succeeded")
    nodes = {p["spec"]["nodeName"] for p in pods}
    assert len(nodes) == world, f"two whole-node ranks on two nodes: {nodes}"
    assert len({RACKS[n] for n in nodes}) == 1, f"required rack, but placed on {nodes}"
    lines = {p["metadata"]["name"]: await printed(node_cluster, p) for p in pods}
    for pod in pods:
        [line] = lines[pod["metadata"]["name"]]
        assert line["node"] == pod["spec"]["nodeName"]
        assert line["sum"] == world * (world + 1) // 2, line
    check_assignments(pods, {n: visible(ls[0]) for n, ls in lines.items()})
