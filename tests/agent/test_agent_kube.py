"""The agent against the API server emulator (kubernetes-asyncio over real HTTP) and the fake
kubelet (real gRPC): publishing the topology, and Allocate reading pods from the API."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from agent_helpers import NODE, make_pod

from e2e.cluster import free_port
from e2e.probes import eventually
from webhook import keys
from webhook.agent.deviceplugin.plugin import PluginConfig
from webhook.agent.discovery import Discovery, discover, keep_identity
from webhook.agent.publisher import node_patch
from webhook.agent.runner import Agent, AgentConfig, nvml_discoverer, static_discoverer
from webhook.doubles.emulator import ApiServerEmulator
from webhook.doubles.fakekubelet import FakeKubelet
from webhook.doubles.fakenvml import FakeNvml
from webhook.kube.api import NODES, KubeApi
from webhook.topology import builtin, decode, encode, topology_class
from webhook.topology.model import Topology

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(apiserver: ApiServerEmulator) -> ApiServerEmulator:
    apiserver.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    apiserver.seed({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": NODE, "labels": {keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED}}})
    return apiserver


def agent_config(sock_dir: Path, wait: float = 0.5) -> AgentConfig:
    return AgentConfig(node=NODE, rediscover_s=0.1, plugin=PluginConfig(
        node=NODE, kubelet_dir=sock_dir, assignment_wait_s=wait, poll_s=0.05,
        kubelet_check_s=0.05))


def node_meta(cluster: ApiServerEmulator) -> tuple[dict[str, str], dict[str, str]]:
    node = cluster.get("nodes", NODE)
    assert node is not None
    meta = node["metadata"]
    return meta.get("labels") or {}, meta.get("annotations") or {}


async def stopped(run: asyncio.Task[Any]) -> None:
    """Cancel an agent's run and wait until it has stopped (its shutdown writes done)."""
    run.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await run


async def test_published_annotation_is_exactly_the_builtin_dgx1_v100(
        cluster: ApiServerEmulator, kube: KubeApi, sock_dir: Path) -> None:
    agent = Agent(agent_config(sock_dir), nvml_discoverer(FakeNvml.profile("dgx1-v100")), kube)
    await agent.step()
    labels, annotations = node_meta(cluster)
    published = decode(annotations[keys.ANN_NODE_TOPOLOGY])
    assert published == builtin("dgx1-v100")  # name, UUIDs, links, PCIe, NUMA: everything
    assert labels[keys.LABEL_TOPOLOGY_CLASS] == topology_class(builtin("dgx1-v100"))
    assert labels[keys.LABEL_GPU_MODEL] == "Tesla-V100-SXM2-16GB"
    assert keys.LABEL_GPU_DEGRADED not in labels
    # no kubelet has accepted its device plugin: it acknowledges nothing, so the binder must
    # not wait for acknowledgements here
    assert keys.LABEL_GPU_ALLOCATION_ACK not in labels
    assert labels[keys.LABEL_GPU_TOPOLOGY] == "enabled"  # the admin's label is left alone
    await agent.step()
    assert agent.publisher.writes == 1  # nothing changed: nothing written


async def test_republishes_on_change_and_marks_degraded(
        cluster: ApiServerEmulator, kube: KubeApi, sock_dir: Path) -> None:
    healthy = discover(FakeNvml.profile("dgx1-v100"))
    lost = FakeNvml.profile("dgx1-v100")
    lost.lose_gpu_after(6, 5)
    results = [healthy, discover(lost), Discovery(None), healthy]
    agent = Agent(agent_config(sock_dir), lambda: results.pop(0), kube)

    await agent.step()
    labels, first = node_meta(cluster)
    assert keys.LABEL_GPU_DEGRADED not in labels

    await agent.step()  # GPU 6 fell off the bus
    labels, annotations = node_meta(cluster)
    assert labels[keys.LABEL_GPU_DEGRADED] == "true"
    gpus = decode(annotations[keys.ANN_NODE_TOPOLOGY]).gpus
    assert [g.index for g in gpus if not g.healthy] == [6]
    assert gpus[6].uuid == builtin("dgx1-v100").gpus[6].uuid

    await agent.step()  # NVML unusable: the last topology stays, the node is degraded
    labels, kept = node_meta(cluster)
    assert labels[keys.LABEL_GPU_DEGRADED] == "true"
    assert kept[keys.ANN_NODE_TOPOLOGY] == annotations[keys.ANN_NODE_TOPOLOGY]

    await agent.step()  # recovered
    labels, annotations = node_meta(cluster)
    assert keys.LABEL_GPU_DEGRADED not in labels
    assert annotations[keys.ANN_NODE_TOPOLOGY] == first[keys.ANN_NODE_TOPOLOGY]
    assert agent.publisher.writes == 3  # round 3 changed nothing: already degraded


async def test_static_topology_file_and_node_type(
        cluster: ApiServerEmulator, kube: KubeApi, sock_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "topology.json"
    path.write_text(encode(builtin("hgx-a100")))
    await Agent(agent_config(sock_dir), static_discoverer(str(path)), kube).step()
    labels, annotations = node_meta(cluster)
    assert decode(annotations[keys.ANN_NODE_TOPOLOGY]) == builtin("hgx-a100")
    assert labels[keys.LABEL_GPU_MODEL] == "NVIDIA-A100-SXM4-80GB"
    await Agent(agent_config(sock_dir), static_discoverer(node_type="dgx2"), kube).step()
    labels, _ = node_meta(cluster)
    assert labels[keys.LABEL_TOPOLOGY_CLASS] == topology_class(builtin("dgx2"))


async def create_pod(cluster: ApiServerEmulator, pod: dict[str, Any]) -> None:
    pod = dict(pod)
    pod.pop("status")
    await cluster.create("pods", pod)


async def test_allocate_reads_the_assignment_from_the_api(
        cluster: ApiServerEmulator, kube: KubeApi, sock_dir: Path, kubelet: FakeKubelet) -> None:
    agent = Agent(agent_config(sock_dir), nvml_discoverer(FakeNvml.profile("dgx1-v100")), kube)
    run = asyncio.create_task(agent.run())
    topo: Topology = builtin("dgx1-v100")
    try:
        ep = await kubelet.wait_for("nvidia.com/gpu", count=8)
        assert set(ep.devices) == {g.uuid for g in topo.gpus}
        await create_pod(cluster, make_pod("worker-0", assign={"main": [0, 2, 3, 4]},
                                           topology=topo))
        await create_pod(cluster, make_pod("worker-x", assign={"main": [1]}, topology=topo,
                                           node="other-node"))
        got = await kubelet.admit("nvidia.com/gpu", 4)
        visible = got.envs["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert sorted(visible) == sorted(topo.gpus[i].uuid for i in (0, 2, 3, 4))
        # served: the pod is marked for the binder, which may now bind the node's next GPU pod
        for _ in range(100):
            served = cluster.objects("pods", "ml")
            if any(keys.ANN_GPU_ALLOCATED in p["metadata"]["annotations"] for p in served):
                break
            await asyncio.sleep(0.02)
        marks = {p["metadata"]["name"]: p["metadata"]["annotations"].get(keys.ANN_GPU_ALLOCATED)
                 for p in cluster.objects("pods", "ml")}
        assert marks == {"worker-0": NODE, "worker-x": None}

        await create_pod(cluster, make_pod("no-assignment"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await kubelet.admit("nvidia.com/gpu", 1)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "ml/no-assignment: no muster.io/gpu-assignment" in (err.value.details() or "")
        assert "worker-x" not in (err.value.details() or "")  # another node's pod
    finally:
        await stopped(run)


async def test_a_mismatch_is_refused_with_a_warning_event_on_the_pod(
        cluster: ApiServerEmulator, kube: KubeApi, sock_dir: Path, kubelet: FakeKubelet) -> None:
    """The kubelet holds GPU 0 for another container: a pod whose assignment names GPU 0 gets
    no GPU at all (the kubelet fails it), and an Event from the agent says which GPUs."""
    agent = Agent(agent_config(sock_dir, wait=0.1),
                  nvml_discoverer(FakeNvml.profile("dgx1-v100")), kube)
    run = asyncio.create_task(agent.run())
    topo: Topology = builtin("dgx1-v100")
    try:
        await kubelet.wait_for("nvidia.com/gpu", count=8)
        kubelet.checkpoint.allocated["nvidia.com/gpu"] = {topo.gpus[0].uuid}
        await create_pod(cluster, make_pod("late", assign={"main": [0]}, topology=topo))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await kubelet.admit("nvidia.com/gpu", 1)
        assert f"the binder assigned {topo.gpus[0].uuid}" in (err.value.details() or "")
        events: list[dict[str, Any]] = []
        for _ in range(100):
            events = cluster.objects("events", "ml")
            if events:
                break
            await asyncio.sleep(0.02)
        [event] = events
        assert event["type"] == "Warning" and event["reason"] == "GPUAssignmentMismatch"
        late = cluster.get("pods", "late", "ml")
        assert late is not None
        assert event["involvedObject"]["name"] == "late"
        assert event["involvedObject"]["uid"] == late["metadata"]["uid"]
        assert event["source"] == {"component": "muster-agent", "host": NODE}
        assert f"the binder assigned {topo.gpus[0].uuid}" in event["message"]
        assert keys.ANN_GPU_ALLOCATED not in late["metadata"]["annotations"]
    finally:
        await stopped(run)


async def test_agent_process_end_to_end(cluster: ApiServerEmulator, sock_dir: Path,
                                        kubelet: FakeKubelet, tmp_path: Path) -> None:
    """`muster agent` as a process: publishes, registers, serves; SIGTERM ends it cleanly."""
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    topo = builtin("dgx1-v100")
    await create_pod(cluster, make_pod("w", assign={"main": [5, 6]}, topology=topo))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "webhook", "agent", "--node-name", NODE,
        "--kubeconfig", str(kubeconfig), "--fake-nvml", "dgx1-v100",
        "--kubelet-dir", str(sock_dir), "--rediscover-seconds", "0.5", "--cdi",
        "--pod-resources-socket", str(kubelet.pod_resources_socket),
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        await kubelet.wait_for("nvidia.com/gpu", count=8, within=30)
        got = await kubelet.admit("nvidia.com/gpu", 2)
        assert sorted(got.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(
            topo.gpus[i].uuid for i in (5, 6))
        assert sorted(got.cdi_devices) == sorted(f"nvidia.com/gpu={topo.gpus[i].uuid}"
                                                 for i in (5, 6))
        _, annotations = node_meta(cluster)
        assert json.loads(annotations[keys.ANN_NODE_TOPOLOGY])["name"] == "dgx1-v100"
        await eventually(lambda: _ack(cluster) == "true", within=10, what="the ack label")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, out.decode()
    assert "checking the pods' GPUs failed" not in out.decode()  # PodResources was read
    assert not (sock_dir / "muster-gpu.sock").exists()
    assert _ack(cluster) is None  # removed on the way out


def _ack(cluster: ApiServerEmulator) -> str | None:
    return node_meta(cluster)[0].get(keys.LABEL_GPU_ALLOCATION_ACK)


async def test_ack_label_means_registered_with_the_kubelet_and_serving(
        cluster: ApiServerEmulator, kube: KubeApi, sock_dir: Path) -> None:
    """Set once the kubelet accepted the plugin, gone when it has not been registered for the
    grace period, back when it is again, gone when the agent stops."""
    config = dataclasses.replace(agent_config(sock_dir), ack_grace_s=0.3)
    agent = Agent(config, static_discoverer(node_type="dgx1-v100"), kube)
    run = asyncio.create_task(agent.run())
    kubelet = FakeKubelet(sock_dir)
    try:
        await asyncio.sleep(0.5)  # published, plugin up, but no kubelet: never acknowledged
        assert node_meta(cluster)[1].get(keys.ANN_NODE_TOPOLOGY) and _ack(cluster) is None
        await kubelet.start()
        await kubelet.wait_for("nvidia.com/gpu", count=8, within=10)
        await eventually(lambda: _ack(cluster) == "true", within=5, what="the ack label")

        writes = agent.publisher.writes
        await kubelet.restart()  # a kubelet restart: registered again within the grace
        await kubelet.wait_for("nvidia.com/gpu", count=8, within=10)
        await asyncio.sleep(0.4)
        assert _ack(cluster) == "true" and agent.publisher.writes == writes

        await kubelet.stop()  # the kubelet is gone (kubelet.sock with it)
        await eventually(lambda: _ack(cluster) is None, within=5,
                         what="the ack label to go without a kubelet")
        await kubelet.start()
        await eventually(lambda: _ack(cluster) == "true", within=5,
                         what="the ack label back with the kubelet")
    finally:
        await stopped(run)
        await kubelet.stop()
    assert _ack(cluster) is None  # the agent stopped: nothing acknowledges pods any more
    assert not (sock_dir / "muster-gpu.sock").exists()


async def test_a_label_left_by_a_crashed_agent_goes_when_no_kubelet_takes_the_plugin(
        cluster: ApiServerEmulator, kube: KubeApi, sock_dir: Path) -> None:
    """A control plane with no kubelet (or one that never accepts the plugin): the binder must
    not wait 30 s per GPU pod for acknowledgements nobody will give."""
    await kube.patch(NODES, NODE, {"metadata": {"labels": {
        keys.LABEL_GPU_ALLOCATION_ACK: "true"}}}, patch_type="merge")
    config = dataclasses.replace(agent_config(sock_dir), ack_grace_s=0.3)
    agent = Agent(config, static_discoverer(node_type="dgx1-v100"), kube)
    run = asyncio.create_task(agent.run())
    try:
        await asyncio.sleep(0.1)
        assert _ack(cluster) == "true"  # within the grace: kept (it may be a kubelet restart)
        await eventually(lambda: _ack(cluster) is None, within=5,
                         what="the stale ack label to go")
    finally:
        await stopped(run)


POD = keys.gpu_agent("muster", "agent-new", "uid-new")


async def _readyz(http: aiohttp.ClientSession, port: int) -> int:
    async with http.get(f"http://127.0.0.1:{port}/readyz") as response:
        return response.status


def _record(cluster: ApiServerEmulator) -> str | None:
    return node_meta(cluster)[1].get(keys.ANN_GPU_AGENT)


async def test_the_agent_records_its_pod_and_is_ready_while_its_plugin_is_registered(
        cluster: ApiServerEmulator, kube: KubeApi, sock_dir: Path) -> None:
    """The binder places GPU pods on a node only while the agent pod its record names is Ready:
    a new agent replaces the old one's record once the kubelet took its plugin, is Ready only
    while it is registered, and leaves its record when it stops (the next agent replaces it)."""
    old = keys.gpu_agent("muster", "agent-old", "uid-old")
    await kube.patch(NODES, NODE, {"metadata": {"annotations": {keys.ANN_GPU_AGENT: old}}},
                     patch_type="merge")
    port = free_port()
    config = dataclasses.replace(agent_config(sock_dir), ack_grace_s=0.3, pod=POD,
                                 metrics_port=port, metrics_host="127.0.0.1")
    run = asyncio.create_task(Agent(config, static_discoverer(node_type="dgx1-v100"),
                                    kube).run())
    kubelet = FakeKubelet(sock_dir)
    async with aiohttp.ClientSession() as http:
        try:
            await eventually(lambda: node_meta(cluster)[1].get(keys.ANN_NODE_TOPOLOGY),
                             within=5, what="the topology published")
            assert await _readyz(http, port) == 503 and _record(cluster) == old
            await kubelet.start()
            await kubelet.wait_for("nvidia.com/gpu", count=8, within=10)
            await eventually(lambda: _record(cluster) == POD, within=5, what="its record")
            assert await _readyz(http, port) == 200
            await kubelet.stop()
            await eventually(lambda: _not_ready(http, port), within=5,
                             what="not ready without a kubelet")
        finally:
            await stopped(run)
            await kubelet.stop()
    assert _ack(cluster) is None and _record(cluster) == POD


async def _not_ready(http: aiohttp.ClientSession, port: int) -> bool:
    return await _readyz(http, port) == 503


@pytest.mark.parametrize(("serving", "record"), [(None, "kept"), (False, "kept"), (True, POD)])
def test_node_patch_records_the_agent_only_while_it_serves(serving: bool | None,
                                                           record: str) -> None:
    found = discover(FakeNvml.profile("dgx1-v100"))
    node = {"metadata": {"name": NODE, "annotations": {keys.ANN_GPU_AGENT: "kept"}}}
    patch = node_patch(found, node, serving, POD)
    assert patch is not None
    assert patch["metadata"]["annotations"].get(keys.ANN_GPU_AGENT, "kept") == record
    # an agent that cannot name its pod leaves no record naming another in place
    gone = node_patch(found, node, True, None)
    assert gone is not None and gone["metadata"]["annotations"][keys.ANN_GPU_AGENT] is None


def test_an_agent_without_a_device_plugin_keeps_no_record_nor_label() -> None:
    """Switched to DRA only: the record the device-plugin agent left would keep GPU pods off
    the node for good (no plugin will register to replace it)."""
    found = discover(FakeNvml.profile("dgx1-v100"))
    node = {"metadata": {"name": NODE, "annotations": {keys.ANN_GPU_AGENT: "old"},
                         "labels": {keys.LABEL_GPU_ALLOCATION_ACK: "true"}}}
    patch = node_patch(found, node, None, POD, plugin=False)
    assert patch is not None and patch["metadata"]["annotations"][keys.ANN_GPU_AGENT] is None
    assert patch["metadata"]["labels"][keys.LABEL_GPU_ALLOCATION_ACK] is None
    assert node_patch(found, node, None, POD)["metadata"]["annotations"].get(
        keys.ANN_GPU_AGENT, "kept") == "kept"  # (with a plugin not yet serving: kept)


@pytest.mark.parametrize(("serving", "label"), [(None, "kept"), (True, "true"), (False, None)])
def test_node_patch_sets_the_ack_label_only_as_told(serving: bool | None,
                                                    label: str | None) -> None:
    found = discover(FakeNvml.profile("dgx1-v100"))
    node = {"metadata": {"name": NODE, "labels": {keys.LABEL_GPU_ALLOCATION_ACK: "kept"}}}
    patch = node_patch(found, node, serving)
    assert patch is not None
    labels = patch["metadata"]["labels"]
    if label == "kept":
        assert keys.LABEL_GPU_ALLOCATION_ACK not in labels
    else:
        assert labels[keys.LABEL_GPU_ALLOCATION_ACK] == label
    # NVML unusable: the acknowledgement still follows the plugin, not the discovery
    gone = node_patch(Discovery(None), node, False)
    assert gone is not None and gone["metadata"]["labels"][keys.LABEL_GPU_ALLOCATION_ACK] is None


def test_lost_gpu_keeps_its_uuid_across_rediscovery() -> None:
    before = discover(FakeNvml.profile("dgx1-v100")).topology
    record = FakeNvml.profile("dgx1-v100").record
    record.devices[2].handle_error = 15  # GPU_IS_LOST at the very first call
    after = discover(FakeNvml(record)).topology
    assert before is not None and after is not None
    assert after.gpus[2].uuid == "unknown-gpu-2"
    kept = keep_identity(before, after)
    assert kept.gpus[2] == dataclasses.replace(before.gpus[2], healthy=False)
    assert kept.gpus[3] == after.gpus[3]
