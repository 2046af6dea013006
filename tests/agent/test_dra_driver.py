"""The DRA driver over real gRPC on unix sockets, driven by a test-side client as the kubelet
drives it (registration, then NodePrepareResources / NodeUnprepareResources), reading claims
from the API server emulator; and the ResourceSlice publisher against the emulator."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from dra_helpers import make_claim

from e2e.probes import eventually
from webhook import keys
from webhook.agent.deviceplugin.plugin import PluginConfig
from webhook.agent.dra import dra_pb2, dra_pb2_grpc, pluginregistration_pb2
from webhook.agent.dra import pluginregistration_pb2_grpc as reg_grpc
from webhook.agent.dra.claims import cdi_file_name, decode_checkpoint
from webhook.agent.dra.driver import DraConfig, DraDriver, KubeClaims
from webhook.agent.dra.publisher import SlicePublisher
from webhook.agent.dra.regen import ROOT, regenerate
from webhook.agent.dra.slices import slice_name
from webhook.agent.runner import Agent, AgentConfig, nvml_discoverer
from webhook.doubles.emulator import ApiServerEmulator
from webhook.doubles.fakenvml import FakeNvml
from webhook.failures import CommandFailed
from webhook.kube.api import RESOURCE_CLAIMS, KubeApi
from webhook.topology.model import Topology

NODE = "gpu-node-1"


@pytest.fixture
def dirs() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # short: unix socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


def config(dirs: Path) -> DraConfig:
    return DraConfig(node=NODE, registry_dir=dirs / "reg", plugin_dir=dirs / "plugin",
                     cdi_dir=dirs / "cdi", check_s=0.05)


@pytest.fixture
def cluster(apiserver: ApiServerEmulator) -> ApiServerEmulator:
    apiserver.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    return apiserver


class Kubelet:
    """What the kubelet does with a DRA driver, as a plain gRPC client."""

    def __init__(self, registration: Path) -> None:
        self.registration = registration

    async def register(self) -> Any:
        async with grpc.aio.insecure_channel(f"unix://{self.registration}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5)
            await stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
        return info

    async def prepare(self, endpoint: str, *claims: tuple[str, str, str]) -> dict[str, Any]:
        async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
            reply = await dra_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra_pb2.NodePrepareResourcesRequest(claims=[
                    dra_pb2.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]),
                timeout=5)
        return dict(reply.claims)

    async def unprepare(self, endpoint: str, *claims: tuple[str, str, str]) -> dict[str, Any]:
        async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
            reply = await dra_pb2_grpc.DRAPluginStub(channel).NodeUnprepareResources(
                dra_pb2.NodeUnprepareResourcesRequest(claims=[
                    dra_pb2.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]),
                timeout=5)
        return dict(reply.claims)


@pytest.fixture
async def running(dirs: Path, kube: KubeApi, dgx1: Topology,
                  cluster: ApiServerEmulator) -> AsyncIterator[DraDriver]:
    driver = DraDriver(config(dirs), KubeClaims(kube))
    driver.set_topology(dgx1)
    task = asyncio.create_task(driver.run())
    await eventually(driver.config.registration_socket.exists, 5, what="the driver serving")
    yield driver
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def seed(cluster: ApiServerEmulator, name: str, devices: list[str], **kw: Any) -> str:
    """Store the claim; its UID is the one the emulator gives it, as an API server would."""
    uid: str = cluster.seed(make_claim(name, "", devices, **{"pool": NODE, **kw}))[
        "metadata"]["uid"]
    return uid


def cdi(dirs: Path, uid: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((dirs / "cdi" / cdi_file_name(uid)).read_text())
    return loaded


def test_generated_grpc_modules_match_the_protos(tmp_path: Path) -> None:
    for generated in regenerate(tmp_path):
        committed = ROOT / generated.relative_to(tmp_path)
        assert generated.read_text() == committed.read_text(), (
            f"{committed} is stale: run python -m webhook.agent.dra.regen")


async def test_registration_names_the_v1_dra_service_and_its_socket(
        running: DraDriver) -> None:
    info = await Kubelet(running.config.registration_socket).register()
    assert (info.type, info.name) == ("DRAPlugin", "gpu.muster.io")
    assert info.endpoint == str(running.config.dra_socket)
    assert list(info.supported_versions) == ["v1.DRAPlugin"]
    assert running.registered is True


async def test_prepare_writes_cdi_with_exactly_the_allocated_gpus_and_is_idempotent(
        running: DraDriver, cluster: ApiServerEmulator, dirs: Path, dgx1: Topology) -> None:
    u_a = seed(cluster, "a", ["gpu-3", "gpu-0"])
    kubelet = Kubelet(running.config.registration_socket)
    endpoint = (await kubelet.register()).endpoint
    first = await kubelet.prepare(endpoint, ("ml", "a", u_a))
    assert first[u_a].error == ""
    got = [(d.device_name, d.pool_name, list(d.request_names), list(d.cdi_device_ids))
           for d in first[u_a].devices]
    assert got == [("gpu-3", NODE, ["gpus"], [f"muster.io/gpu={u_a}-gpu-3"]),
                   ("gpu-0", NODE, ["gpus"], [f"muster.io/gpu={u_a}-gpu-0"])]
    spec = cdi(dirs, u_a)
    uuids = f"{dgx1.gpus[3].uuid},{dgx1.gpus[0].uuid}"
    assert spec["kind"] == "muster.io/gpu" and spec["cdiVersion"]
    assert spec["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={uuids}"]
    assert sorted(d["name"] for d in spec["devices"]) == [f"{u_a}-gpu-0", f"{u_a}-gpu-3"]

    again = await kubelet.prepare(endpoint, ("ml", "a", u_a))
    assert again[u_a] == first[u_a]
    assert cdi(dirs, u_a) == spec

    gone = await kubelet.unprepare(endpoint, ("ml", "a", u_a))
    assert gone[u_a].error == ""
    assert not (dirs / "cdi" / cdi_file_name(u_a)).exists()
    assert (await kubelet.unprepare(endpoint, ("ml", "a", u_a)))[u_a].error == ""


async def test_claims_that_are_not_ours_to_prepare_are_refused_one_by_one(
        running: DraDriver, cluster: ApiServerEmulator, dirs: Path) -> None:
    u_ok = seed(cluster, "ok", ["gpu-1"])
    u_u = seed(cluster, "unallocated", ["gpu-2"], allocated=False)
    u_e = seed(cluster, "elsewhere", ["gpu-2"], pool="gpu-node-2")
    u_n = seed(cluster, "nobody", ["gpu-2"], reserved=False)
    kubelet = Kubelet(running.config.registration_socket)
    answers = await kubelet.prepare(str(running.config.dra_socket), ("ml", "ok", u_ok),
                                    ("ml", "unallocated", u_u), ("ml", "elsewhere", u_e),
                                    ("ml", "nobody", u_n), ("ml", "missing", "uid-m"),
                                    ("ml", "ok", "uid-stale"))
    assert answers[u_ok].error == "" and len(answers[u_ok].devices) == 1
    assert "not allocated" in answers[u_u].error
    assert "not this node's" in answers[u_e].error
    assert "reserved for no consumer" in answers[u_n].error
    assert "does not exist" in answers["uid-m"].error
    assert "re-created" in answers["uid-stale"].error
    written = sorted(p.name for p in (dirs / "cdi").iterdir())
    assert written == [cdi_file_name(u_ok)]


async def test_a_gpu_of_a_live_claim_is_never_prepared_for_another(
        running: DraDriver, cluster: ApiServerEmulator, dirs: Path) -> None:
    u_a = seed(cluster, "a", ["gpu-3"])
    u_b = seed(cluster, "b", ["gpu-4", "gpu-3"])
    kubelet = Kubelet(running.config.registration_socket)
    endpoint = str(running.config.dra_socket)
    assert (await kubelet.prepare(endpoint, ("ml", "a", u_a)))[u_a].error == ""
    refused = (await kubelet.prepare(endpoint, ("ml", "b", u_b)))[u_b]
    assert f"held by ResourceClaim ml/a, uid {u_a}" in refused.error
    assert not refused.devices
    assert not (dirs / "cdi" / cdi_file_name(u_b)).exists()
    # the holder unprepared: the GPU is free
    await kubelet.unprepare(endpoint, ("ml", "a", u_a))
    assert (await kubelet.prepare(endpoint, ("ml", "b", u_b)))[u_b].error == ""


async def test_a_holder_the_api_no_longer_has_gives_its_gpu_back(
        running: DraDriver, cluster: ApiServerEmulator, dirs: Path) -> None:
    u_a = seed(cluster, "a", ["gpu-5"])
    u_b = seed(cluster, "b", ["gpu-5"])
    kubelet = Kubelet(running.config.registration_socket)
    endpoint = str(running.config.dra_socket)
    assert (await kubelet.prepare(endpoint, ("ml", "a", u_a)))[u_a].error == ""
    await cluster.delete("resourceclaims", "a", "ml")  # gone without an unprepare
    assert (await kubelet.prepare(endpoint, ("ml", "b", u_b)))[u_b].error == ""
    assert set(running.prepared) == {u_b}
    assert not (dirs / "cdi" / cdi_file_name(u_a)).exists()


async def test_a_restart_mid_prepare_resumes_from_the_checkpoint(
        dirs: Path, kube: KubeApi, cluster: ApiServerEmulator, dgx1: Topology) -> None:
    u_a = seed(cluster, "a", ["gpu-6", "gpu-7"])
    u_b = seed(cluster, "b", ["gpu-7"])
    first = DraDriver(config(dirs), KubeClaims(kube))
    first.set_topology(dgx1)
    assert (await first.prepare_one("ml", "a", u_a)).error == ""
    # the agent died after the checkpoint and before the CDI spec was written
    (dirs / "cdi" / cdi_file_name(u_a)).unlink()

    again = DraDriver(config(dirs), KubeClaims(kube))
    again.set_topology(dgx1)
    assert set(again.prepared) == {u_a}
    task = asyncio.create_task(again.run())
    try:
        await eventually(again.config.dra_socket.exists, 5, what="the driver serving")
        kubelet = Kubelet(again.config.registration_socket)
        endpoint = str(again.config.dra_socket)
        answer = (await kubelet.prepare(endpoint, ("ml", "a", u_a)))[u_a]
        assert answer.error == ""
        assert [d.device_name for d in answer.devices] == ["gpu-6", "gpu-7"]
        assert cdi(dirs, u_a)["containerEdits"]["env"] == [
            f"NVIDIA_VISIBLE_DEVICES={dgx1.gpus[6].uuid},{dgx1.gpus[7].uuid}"]
        refused = (await kubelet.prepare(endpoint, ("ml", "b", u_b)))[u_b]
        assert f"uid {u_a}" in refused.error
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_an_unreadable_checkpoint_stops_the_driver(dirs: Path, kube: KubeApi) -> None:
    cfg = config(dirs)
    cfg.plugin_dir.mkdir(parents=True)
    cfg.checkpoint.write_text("{not json")
    with pytest.raises(CommandFailed, match="which GPUs it prepared"):
        DraDriver(cfg, KubeClaims(kube))


async def test_the_slice_is_created_kept_updated_and_alone(
        cluster: ApiServerEmulator, kube: KubeApi, dgx1: Topology) -> None:
    def slice_of(driver: str, node: str, name: str) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": name}, "spec": {
                    "driver": driver, "nodeName": node, "devices": [],
                    "pool": {"name": node, "generation": 4, "resourceSliceCount": 1}}}

    cluster.seed(slice_of(keys.DRA_DRIVER, NODE, "old-name"))  # an earlier agent's
    cluster.seed(slice_of(keys.DRA_DRIVER, "gpu-node-2", "other-node"))
    cluster.seed(slice_of("gpu.nvidia.com", NODE, "other-driver"))
    publisher = SlicePublisher(kube, NODE)
    assert await publisher.publish(dgx1, {})
    names = {s["metadata"]["name"] for s in cluster.objects("resourceslices")}
    assert names == {slice_name(NODE), "other-node", "other-driver"}
    live = cluster.get("resourceslices", slice_name(NODE))
    assert live is not None
    assert live["spec"]["pool"]["generation"] == 5  # past the deleted slice's pool generation
    assert len(live["spec"]["devices"]) == 8

    lists = 0
    real_list = kube.list

    async def counted(*args: Any, **kwargs: Any) -> dict[str, Any]:
        nonlocal lists
        lists += 1
        return await real_list(*args, **kwargs)
    kube.list = counted  # type: ignore[method-assign]
    assert not await publisher.publish(dgx1, {})  # nothing changed: nothing written
    assert lists == 0  # between sweeps a round reads its own slice only
    cluster.seed(slice_of(keys.DRA_DRIVER, NODE, "overlapping"))  # another agent's, since
    for _ in range(publisher.sweep_every - 2):
        await publisher.publish(dgx1, {})
    assert lists == 0 and cluster.get("resourceslices", "overlapping") is not None
    assert await publisher.publish(dgx1, {})  # the next sweep deletes it
    assert lists == 1 and cluster.get("resourceslices", "overlapping") is None

    gpus = list(dgx1.gpus)
    gpus[2] = dataclasses.replace(gpus[2], healthy=False)
    assert await publisher.publish(dataclasses.replace(dgx1, gpus=tuple(gpus)), {})
    live = cluster.get("resourceslices", slice_name(NODE))
    assert live is not None
    assert live["spec"]["pool"]["generation"] == 6
    assert "gpu-2" not in [d["name"] for d in live["spec"]["devices"]]

    await cluster.delete("resourceslices", slice_name(NODE))  # deleted by hand: made again
    assert await publisher.publish(dgx1, {})
    assert cluster.get("resourceslices", slice_name(NODE)) is not None


async def test_the_agent_with_dra_only_publishes_its_slice_and_serves_the_kubelet(
        cluster: ApiServerEmulator, kube: KubeApi, dirs: Path) -> None:
    cfg = AgentConfig(node=NODE, rediscover_s=0.1, device_plugin=False, dra=config(dirs),
                      plugin=PluginConfig(node=NODE, kubelet_dir=dirs / "dp"))
    agent = Agent(cfg, nvml_discoverer(FakeNvml.profile("hgx-a100")), kube)
    run = asyncio.create_task(agent.run())
    try:
        live = await eventually(lambda: cluster.get("resourceslices", slice_name(NODE)), 5,
                                what="the ResourceSlice")
        assert [d["name"] for d in live["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
        info = await eventually(Kubelet(config(dirs).registration_socket).register, 5,
                                what="the registration")
        assert info.name == keys.DRA_DRIVER
        assert agent.plugin is None  # no device plugin: nothing registers nvidia.com/gpu
        assert not (dirs / "dp").exists()
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)


async def test_muster_agent_dra_process_prepares_a_claim(
        cluster: ApiServerEmulator, dirs: Path, tmp_path: Path) -> None:
    """`muster agent --dra --no-device-plugin` as a process: the slice, the registration, one
    prepare through its socket; SIGTERM ends it cleanly and removes its sockets."""
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    cfg = config(dirs)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "webhook", "agent", "--node-name", NODE,
        "--kubeconfig", str(kubeconfig), "--fake-nvml", "dgx1-v100", "--no-device-plugin",
        "--dra", "--dra-registry-dir", str(cfg.registry_dir),
        "--dra-plugin-dir", str(cfg.plugin_dir), "--cdi-dir", str(cfg.cdi_dir),
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        await eventually(lambda: cluster.get("resourceslices", slice_name(NODE)), 30,
                         what="the ResourceSlice")
        await eventually(cfg.registration_socket.exists, 10, what="the registration socket")
        kubelet = Kubelet(cfg.registration_socket)
        endpoint = (await kubelet.register()).endpoint
        u_a = seed(cluster, "a", ["gpu-1"])
        answer = (await kubelet.prepare(endpoint, ("ml", "a", u_a)))[u_a]
        assert answer.error == ""
        assert [list(d.cdi_device_ids) for d in answer.devices] == [
            [f"muster.io/gpu={u_a}-gpu-1"]]
        assert (cfg.cdi_dir / cdi_file_name(u_a)).exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, out.decode()
    assert not cfg.registration_socket.exists() and not cfg.dra_socket.exists()
    assert set(decode_checkpoint(cfg.checkpoint.read_bytes())) == {u_a}  # outlives the agent


async def test_sysfs_is_walked_again_only_when_the_gpus_change(
        cluster: ApiServerEmulator, kube: KubeApi, dirs: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    walks: list[int] = []

    def counted(topology: Topology) -> dict[int, str]:
        walks.append(len(topology.gpus))
        return {}
    monkeypatch.setattr("webhook.agent.runner.pcie_roots", counted)
    cfg = AgentConfig(node=NODE, device_plugin=False, dra=config(dirs),
                      plugin=PluginConfig(node=NODE, kubelet_dir=dirs / "dp"))
    nvml = FakeNvml.profile("hgx-a100")
    agent = Agent(cfg, nvml_discoverer(nvml), kube)
    await agent.step()
    await agent.step()
    assert walks == [8]
    agent.discoverer = nvml_discoverer(FakeNvml.profile("dgx1-v100"))  # other GPUs, other buses
    await agent.step()
    assert len(walks) == 2


async def test_a_claim_deallocated_while_its_pod_terminates_is_unprepared_from_the_checkpoint(
        running: DraDriver, cluster: ApiServerEmulator, kube: KubeApi, dirs: Path) -> None:
    """The kubelet unprepares after the pod's containers stopped; by then the claim may have
    lost its allocation (its consumer gone, deallocated by the controller): what the driver
    undoes is what it prepared, from its checkpoint, not what the claim says now."""
    u_a = seed(cluster, "a", ["gpu-2"])
    kubelet = Kubelet(running.config.registration_socket)
    endpoint = str(running.config.dra_socket)
    assert (await kubelet.prepare(endpoint, ("ml", "a", u_a)))[u_a].error == ""
    claim = await kube.get(RESOURCE_CLAIMS, "a", namespace="ml")
    claim["status"] = {}  # deallocated, no consumer
    await kube.replace(RESOURCE_CLAIMS, "a", claim, "ml", subresource="status")

    assert (await kubelet.unprepare(endpoint, ("ml", "a", u_a)))[u_a].error == ""
    assert running.prepared == {}
    assert not (dirs / "cdi" / cdi_file_name(u_a)).exists()
    assert decode_checkpoint(running.config.checkpoint.read_bytes()) == {}
    u_b = seed(cluster, "b", ["gpu-2"])  # the GPU went back
    assert (await kubelet.prepare(endpoint, ("ml", "b", u_b)))[u_b].error == ""


async def test_a_claim_allocated_from_a_stale_slice_is_refused_not_prepared(
        running: DraDriver, cluster: ApiServerEmulator, kube: KubeApi, dirs: Path,
        dgx1: Topology) -> None:
    """A scheduler allocated gpu-4 from the slice as it was; the GPU failed since (an XID):
    the slice drops it at the next generation, and a prepare of the old allocation is refused
    with the reason (the kubelet retries; the pod waits) rather than handing out a bad GPU."""
    publisher = SlicePublisher(kube, NODE)
    await publisher.publish(dgx1, {})
    u_a = seed(cluster, "a", ["gpu-4"])  # allocated from generation 1
    gpus = list(dgx1.gpus)
    gpus[4] = dataclasses.replace(gpus[4], healthy=False)
    failed = dataclasses.replace(dgx1, gpus=tuple(gpus))
    running.set_topology(failed)
    assert await publisher.publish(failed, {})
    live = cluster.get("resourceslices", slice_name(NODE))
    assert live is not None and live["spec"]["pool"]["generation"] == 2
    assert "gpu-4" not in [d["name"] for d in live["spec"]["devices"]]

    kubelet = Kubelet(running.config.registration_socket)
    answer = (await kubelet.prepare(str(running.config.dra_socket), ("ml", "a", u_a)))[u_a]
    assert "device gpu-4 is not a healthy GPU of node" in answer.error
    assert not answer.devices
    assert not (dirs / "cdi" / cdi_file_name(u_a)).exists()
