"""The device plugin against the fake kubelet: real gRPC over real unix sockets."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import shutil
import tempfile
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_helpers import NODE, ListedPods, attacker_pod, make_pod

from webhook import keys
from webhook.agent.deviceplugin.plugin import AllocationRefused, GpuDevicePlugin, PluginConfig
from webhook.agent.deviceplugin.regen import OUTPUTS, ROOT, regenerate
from webhook.doubles.fakekubelet import FakeKubelet
from webhook.topology.model import Topology


@pytest.fixture
def pods() -> ListedPods:
    return ListedPods()


@pytest.fixture
async def plugin(sock_dir: Path, dgx1: Topology, pods: ListedPods,
                 kubelet: FakeKubelet) -> AsyncIterator[GpuDevicePlugin]:
    p = GpuDevicePlugin(PluginConfig(node=NODE, kubelet_dir=sock_dir, assignment_wait_s=0.6,
                                     poll_s=0.05, kubelet_check_s=0.05), dgx1, pods)
    yield p
    await p.stop()


def uuids(topo: Topology, *indices: int) -> set[str]:
    return {topo.gpus[i].uuid for i in indices}


async def test_registers_and_advertises_eight_gpus(
        plugin: GpuDevicePlugin, kubelet: FakeKubelet, dgx1: Topology) -> None:
    assert await plugin.ensure_registered()
    ep = await kubelet.wait_for("nvidia.com/gpu", count=8)
    assert kubelet.registrations == [("nvidia.com/gpu", "muster-gpu.sock")]
    assert ep.options.get_preferred_allocation_available
    assert ep.devices == {g.uuid: "Healthy" for g in dgx1.gpus}
    assert ep.numa[dgx1.gpus[0].uuid] == [0] and ep.numa[dgx1.gpus[7].uuid] == [1]


async def test_allocate_gives_exactly_the_assigned_gpus(
        plugin: GpuDevicePlugin, kubelet: FakeKubelet, dgx1: Topology, pods: ListedPods) -> None:
    pods.items.append(make_pod("worker-0", assign={"main": [0, 2, 3, 4]}, topology=dgx1))
    await plugin.ensure_registered()
    await kubelet.wait_for("nvidia.com/gpu", count=8)
    got = await kubelet.admit("nvidia.com/gpu", 4)
    visible = got.envs["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert len(visible) == 4 and set(visible) == uuids(dgx1, 0, 2, 3, 4)
    assert set(got.envs) == {"NVIDIA_VISIBLE_DEVICES"} and got.cdi_devices == []
    # GetPreferredAllocation steered the kubelet's own accounting to the same GPUs
    assert set(got.devices) == uuids(dgx1, 0, 2, 3, 4)
    assert pods.lists == 1  # the Allocate took the preference's answer without a second list
    assert pods.events == []


async def test_preference_steers_the_kubelet_to_the_binders_gpus(
        plugin: GpuDevicePlugin, dgx1: Topology, pods: ListedPods) -> None:
    """GetPreferredAllocation is the binder's only way to the kubelet: it answers the pod's
    assigned GPUs when the kubelet has them all free, else the kubelet's own default order."""
    pods.items += [
        make_pod("worker-0", assign={"main": [5, 6]}, topology=dgx1),
        # older, and not the binder's: a user's forged assignment steers nothing
        make_pod("forged", assign={"main": [0, 1]}, topology=dgx1,
                 scheduler="default-scheduler", created="2025-01-01T00:00:00Z")]
    # (running already: not waiting, so not in the way of the binder's pod)
    pods.items[1]["status"]["phase"] = "Running"
    every = [g.uuid for g in dgx1.gpus]
    assert set(await plugin.preferred(every, [], 2)) == uuids(dgx1, 5, 6)
    # a kubelet that holds GPU 6 for another container is not told to take it
    without_6 = [u for u in every if u != dgx1.gpus[6].uuid]
    plugin.config = dataclasses.replace(plugin.config, assignment_wait_s=0.1)
    assert await plugin.preferred(without_6, [], 2) == without_6[:2]


async def test_allocate_answers_exactly_the_kubelets_devices(
        plugin: GpuDevicePlugin, dgx1: Topology, pods: ListedPods) -> None:
    pods.items.append(make_pod("worker-0", assign={"main": [1, 0]}, topology=dgx1))
    every = [g.uuid for g in dgx1.gpus]
    kubelets = [every[0], every[1]]  # the kubelet's own order, not the assignment's
    assert await plugin.allocate(kubelets) == kubelets
    response = plugin.container_response(kubelets)
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(kubelets)


async def test_kubelet_allocating_other_gpus_than_assigned_is_refused_with_an_event(
        plugin: GpuDevicePlugin, kubelet: FakeKubelet, dgx1: Topology, pods: ListedPods) -> None:
    """Never a silent swap: the kubelet allocated GPUs 6 and 7, the binder assigned 0 and 1
    (which the kubelet gave another container): the container gets nothing, the kubelet is told
    why (it fails the pod), and the pod gets a Warning Event saying which GPUs."""
    pods.items.append(make_pod("worker-0", assign={"main": [0, 1]}, topology=dgx1))
    every = [g.uuid for g in dgx1.gpus]
    assert set(await plugin.preferred(every, [], 2)) == uuids(dgx1, 0, 1)
    with pytest.raises(AllocationRefused) as err:
        await plugin.allocate(every[6:8])  # the kubelet took other GPUs than it was told
    assert pods.lists == 2  # an Allocate unlike the preference looks afresh
    for uuid in (*every[6:8], *every[0:2]):
        assert uuid in str(err.value)
    await asyncio.sleep(0)  # the Event is written in the background
    [(pod, uid, reason, message)] = pods.events
    assert (pod, uid, reason) == ("ml/worker-0", "uid-worker-0", "GPUAssignmentMismatch")
    assert message == str(err.value)
    assert f"the kubelet allocated {', '.join(sorted(every[6:8]))}" in message
    assert f"the binder assigned {every[0]}, {every[1]}" in message
    # nothing was served: the pod is not marked, its container is not remembered as handed
    assert keys.ANN_GPU_ALLOCATED not in pods.items[0]["metadata"]["annotations"]

    # through the kubelet: it asks for the GPUs it has free, the binder's are taken
    await plugin.ensure_registered()
    await kubelet.wait_for("nvidia.com/gpu", count=8)
    kubelet.checkpoint.allocated["nvidia.com/gpu"] = set(every[0:2])  # another pod's
    plugin.config = dataclasses.replace(plugin.config, assignment_wait_s=0.1)
    with pytest.raises(grpc.aio.AioRpcError) as rpc:
        await kubelet.admit("nvidia.com/gpu", 2)
    assert rpc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "the binder assigned" in (rpc.value.details() or "")
    await asyncio.sleep(0)
    assert len(pods.events) == 2


async def test_pod_without_assignment_gets_a_clear_error_after_the_wait(
        plugin: GpuDevicePlugin, kubelet: FakeKubelet, pods: ListedPods) -> None:
    pods.items.append(make_pod("plain"))
    await plugin.ensure_registered()
    await kubelet.wait_for("nvidia.com/gpu", count=8)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.admit("nvidia.com/gpu", 1)
    assert loop.time() - start >= 0.6  # the bounded wait (GetPreferredAllocation + Allocate)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    detail = err.value.details() or ""
    assert "gpu-node-1" in detail and "ml/plain: no muster.io/gpu-assignment annotation" in detail
    assert pods.lists > 2  # it kept looking during the wait


async def test_assignment_that_appears_during_the_wait_is_used(
        plugin: GpuDevicePlugin, kubelet: FakeKubelet, dgx1: Topology, pods: ListedPods) -> None:
    pods.items.append(make_pod("late"))
    await plugin.ensure_registered()
    await kubelet.wait_for("nvidia.com/gpu", count=8)

    async def binder_writes() -> None:
        await asyncio.sleep(0.2)
        pods.items[0] = make_pod("late", assign={"main": [6, 7]}, topology=dgx1)

    task = asyncio.create_task(binder_writes())
    got = await kubelet.admit("nvidia.com/gpu", 2)
    await task
    assert set(got.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == uuids(dgx1, 6, 7)


async def test_containers_in_order_and_never_served_twice(
        plugin: GpuDevicePlugin, kubelet: FakeKubelet, dgx1: Topology, pods: ListedPods) -> None:
    pods.items += [
        make_pod("old", assign={"a": [0, 1], "b": [2]}, topology=dgx1,
                 created="2026-01-01T00:00:00Z"),
        make_pod("new", assign={"main": [4, 5]}, topology=dgx1, created="2026-01-01T00:00:05Z"),
        make_pod("running", assign={"main": [6, 7]}, topology=dgx1, phase="Running"),
    ]
    await plugin.ensure_registered()
    await kubelet.wait_for("nvidia.com/gpu", count=8)
    first = await kubelet.admit("nvidia.com/gpu", 2)  # oldest pod's first container
    assert set(first.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == uuids(dgx1, 0, 1)
    second = await kubelet.admit("nvidia.com/gpu", 2)  # "old"/a is served: now "new"
    assert set(second.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == uuids(dgx1, 4, 5)
    third = await kubelet.admit("nvidia.com/gpu", 1)  # "old"/b
    assert third.envs["NVIDIA_VISIBLE_DEVICES"] == dgx1.gpus[2].uuid
    with pytest.raises(grpc.aio.AioRpcError):  # the running pod's GPUs are not handed out
        await kubelet.admit("nvidia.com/gpu", 2)


async def test_assignment_for_another_node_is_refused(
        plugin: GpuDevicePlugin, kubelet: FakeKubelet, dgx1: Topology, pods: ListedPods) -> None:
    pods.items.append(make_pod("moved", assign={"main": [0]}, topology=dgx1,
                               assignment_node="gpu-node-2"))
    await plugin.ensure_registered()
    await kubelet.wait_for("nvidia.com/gpu", count=8)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.admit("nvidia.com/gpu", 1)
    assert "assigned GPUs on node 'gpu-node-2'" in (err.value.details() or "")


async def test_a_foreign_pod_admitted_first_is_refused_and_the_victim_then_served(
        plugin: GpuDevicePlugin, kubelet: FakeKubelet, dgx1: Topology, pods: ListedPods) -> None:
    """The nodeName attack, attacker first: the kubelet admits a user's pod bound with
    spec.nodeName and the binder's pod is bound during the wait. The attacker's container gets
    no GPU (before: the victim's two), and the victim, admitted next, gets its own."""
    pods.items.append(attacker_pod())
    await plugin.ensure_registered()
    await kubelet.wait_for("nvidia.com/gpu", count=8)

    async def binder_binds() -> None:
        await asyncio.sleep(0.2)
        pods.items.append(make_pod("victim", assign={"main": [4, 5]}, topology=dgx1,
                                   created="2026-01-01T00:00:01Z"))

    task = asyncio.create_task(binder_binds())
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.admit("nvidia.com/gpu", 2)
    await task
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    detail = err.value.details() or ""
    assert "ml/attacker (spec.schedulerName is 'default-scheduler'" in detail
    assert kubelet.checkpoint.allocated.get("nvidia.com/gpu", set()) == set()
    pods.items[0]["status"]["phase"] = "Failed"  # the kubelet fails a refused pod
    got = await kubelet.admit("nvidia.com/gpu", 2)
    assert set(got.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == uuids(dgx1, 4, 5)


async def test_a_victim_admitted_while_a_foreign_pod_waits_is_served_once_it_fails(
        plugin: GpuDevicePlugin, kubelet: FakeKubelet, dgx1: Topology, pods: ListedPods) -> None:
    """Victim first: the binder's pod is admitted while a user's GPU pod is pending beside it.
    No grant goes out while the ambiguity lasts; once the other pod fails within the wait the
    victim gets its GPUs, and had it not, the victim would have been refused, never swapped."""
    pods.items += [make_pod("victim", assign={"main": [4, 5]}, topology=dgx1),
                   attacker_pod(created="2026-01-01T00:00:01Z")]
    every = [g.uuid for g in dgx1.gpus]
    with pytest.raises(AllocationRefused, match="ml/attacker"):
        await plugin.allocate(every[4:6])
    await plugin.ensure_registered()
    await kubelet.wait_for("nvidia.com/gpu", count=8)

    async def attacker_fails() -> None:
        await asyncio.sleep(0.2)
        pods.items[1]["status"]["phase"] = "Failed"

    task = asyncio.create_task(attacker_fails())
    got = await kubelet.admit("nvidia.com/gpu", 2)
    await task
    assert set(got.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == uuids(dgx1, 4, 5)


async def test_unassigned_kubelet_mode_never_hands_a_foreign_pod_a_grant(
        sock_dir: Path, kubelet: FakeKubelet, dgx1: Topology, pods: ListedPods) -> None:
    """unassigned "kubelet": a foreign pod alone gets the kubelet's pick; beside a binder pod
    waiting for its grant it is refused (its pick could be the grant's GPUs). Once the kubelet
    has admitted it (container statuses), it no longer holds the binder's pod back."""
    plugin = GpuDevicePlugin(PluginConfig(node=NODE, kubelet_dir=sock_dir, unassigned="kubelet",
                                          assignment_wait_s=0.1, poll_s=0.05), dgx1, pods)
    pods.items.append(attacker_pod())
    try:
        await plugin.ensure_registered()
        await kubelet.wait_for("nvidia.com/gpu", count=8)
        alone = await kubelet.admit("nvidia.com/gpu", 2)
        free = [i for i, g in enumerate(dgx1.gpus) if g.uuid not in alone.devices][:2]
        pods.items.append(make_pod("victim", assign={"main": free}, topology=dgx1))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await kubelet.admit("nvidia.com/gpu", 2)
        pods.items[0]["status"]["containerStatuses"] = [{"name": "main"}]
        victim = await kubelet.admit("nvidia.com/gpu", 2)
    finally:
        await plugin.stop()
    assert alone.envs["NVIDIA_VISIBLE_DEVICES"].split(",") == alone.devices
    assert "ml/attacker" in (err.value.details() or "")
    assert set(victim.devices) == uuids(dgx1, *free)


async def test_restarted_kubelet_gets_the_plugin_back(
        plugin: GpuDevicePlugin, kubelet: FakeKubelet, dgx1: Topology, pods: ListedPods) -> None:
    run = asyncio.create_task(plugin.run())
    try:
        await kubelet.wait_for("nvidia.com/gpu", count=8)
        await kubelet.restart()  # deletes every socket, plugin's included, forgets the plugin
        assert not plugin.socket_path.exists()
        ep = await kubelet.wait_for("nvidia.com/gpu", count=8)
        assert len(kubelet.registrations) == 1  # the fresh kubelet's own record
        assert plugin.registrations == 2 and plugin.socket_path.exists()
        pods.items.append(make_pod("after", assign={"main": [3]}, topology=dgx1))
        got = await kubelet.admit("nvidia.com/gpu", 1)
        assert got.envs["NVIDIA_VISIBLE_DEVICES"] == dgx1.gpus[3].uuid
        assert ep.devices == {g.uuid: "Healthy" for g in dgx1.gpus}
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    assert not plugin.socket_path.exists()  # cleaned up on the way out


async def test_plugin_started_before_the_kubelet_registers_when_it_appears(
        dgx1: Topology, pods: ListedPods) -> None:
    directory = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    plugin = GpuDevicePlugin(PluginConfig(node=NODE, kubelet_dir=directory,
                                          kubelet_check_s=0.05), dgx1, pods)
    run = asyncio.create_task(plugin.run())
    kubelet = FakeKubelet(directory)
    try:
        await asyncio.sleep(0.2)
        assert plugin.registrations == 0
        await kubelet.start()
        await kubelet.wait_for("nvidia.com/gpu", count=8)
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await kubelet.stop()
        shutil.rmtree(directory, ignore_errors=True)


async def test_health_change_is_streamed(
        plugin: GpuDevicePlugin, kubelet: FakeKubelet, dgx1: Topology) -> None:
    await plugin.ensure_registered()
    await kubelet.wait_for("nvidia.com/gpu", count=8)
    sick = dataclasses.replace(dgx1, gpus=tuple(
        dataclasses.replace(g, healthy=g.index != 5) for g in dgx1.gpus))
    await plugin.set_topology(sick)
    ep = await kubelet.wait_for("nvidia.com/gpu", min_updates=2)
    assert ep.devices[dgx1.gpus[5].uuid] == "Unhealthy"
    assert sum(h == "Healthy" for h in ep.devices.values()) == 7
    await plugin.set_topology(sick)  # no change: nothing sent
    await asyncio.sleep(0.1)
    assert ep.updates == 2


async def test_cdi_names_and_custom_resource_name(
        sock_dir: Path, kubelet: FakeKubelet, dgx1: Topology, pods: ListedPods) -> None:
    pods.items.append(make_pod("cdi", assign={"main": [1, 5]}, topology=dgx1))
    plugin = GpuDevicePlugin(PluginConfig(node=NODE, kubelet_dir=sock_dir, cdi=True,
                                          resource_name="muster.io/gpu", endpoint="m.sock"),
                             dgx1, pods)
    try:
        await plugin.ensure_registered()
        await kubelet.wait_for("muster.io/gpu", count=8)
        got = await kubelet.admit("muster.io/gpu", 2)
    finally:
        await plugin.stop()
    assert sorted(got.cdi_devices) == sorted(f"nvidia.com/gpu={u}" for u in uuids(dgx1, 1, 5))
    assert set(got.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == uuids(dgx1, 1, 5)


async def test_unassigned_kubelet_mode_uses_the_kubelets_pick(
        sock_dir: Path, kubelet: FakeKubelet, dgx1: Topology, pods: ListedPods) -> None:
    plugin = GpuDevicePlugin(PluginConfig(node=NODE, kubelet_dir=sock_dir, unassigned="kubelet",
                                          assignment_wait_s=0.1, poll_s=0.05), dgx1, pods)
    try:
        await plugin.ensure_registered()
        await kubelet.wait_for("nvidia.com/gpu", count=8)
        got = await kubelet.admit("nvidia.com/gpu", 2)
    finally:
        await plugin.stop()
    assert got.envs["NVIDIA_VISIBLE_DEVICES"].split(",") == got.devices


async def test_kubelet_refuses_a_bad_resource_name(
        sock_dir: Path, kubelet: FakeKubelet, dgx1: Topology, pods: ListedPods) -> None:
    plugin = GpuDevicePlugin(PluginConfig(node=NODE, kubelet_dir=sock_dir,
                                          resource_name="gpu"), dgx1, pods)
    try:
        assert not await plugin.ensure_registered()
    finally:
        await plugin.stop()
    assert plugin.registrations == 0 and kubelet.registrations == []


def test_generated_grpc_modules_match_the_proto(tmp_path: Path) -> None:
    for generated in regenerate(tmp_path):
        committed = ROOT / generated.relative_to(tmp_path)
        assert generated.read_text() == committed.read_text(), (
            f"{committed} is stale: run python -m webhook.agent.deviceplugin.regen")
    assert len(OUTPUTS) == 2


class BrokenApi:
    """A PodSource whose API server is down."""

    async def pods(self) -> list[dict[str, Any]]:
        raise ConnectionError("connection refused")

    async def acknowledge(self, pod: str, uid: str) -> None:
        raise ConnectionError("connection refused")

    async def report(self, pod: str, uid: str, reason: str, message: str) -> None:
        raise ConnectionError("connection refused")


async def test_api_outage_gives_a_clear_refusal_not_a_crash(
        sock_dir: Path, kubelet: FakeKubelet, dgx1: Topology) -> None:
    plugin = GpuDevicePlugin(PluginConfig(node=NODE, kubelet_dir=sock_dir, assignment_wait_s=0.2,
                                          poll_s=0.05), dgx1, BrokenApi())
    try:
        await plugin.ensure_registered()
        await kubelet.wait_for("nvidia.com/gpu", count=8)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await kubelet.admit("nvidia.com/gpu", 2)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "reading this node's pods failed: connection refused" in (err.value.details() or "")
        # the plugin still serves: the device list stream is alive
        assert (await kubelet.wait_for("nvidia.com/gpu", count=8)).updates == 1
    finally:
        await plugin.stop()


async def test_allocate_after_a_fruitless_preference_does_not_wait_twice(
        plugin: GpuDevicePlugin, kubelet: FakeKubelet, pods: ListedPods) -> None:
    pods.items.append(make_pod("plain"))
    await plugin.ensure_registered()
    await kubelet.wait_for("nvidia.com/gpu", count=8)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(grpc.aio.AioRpcError):
        await kubelet.admit("nvidia.com/gpu", 1)
    assert 0.6 <= loop.time() - start < 1.1  # one wait of 0.6 s, not two


async def test_agent_restart_mid_pod_serves_the_next_container_not_the_first_again(
        sock_dir: Path, kubelet: FakeKubelet, dgx1: Topology, pods: ListedPods) -> None:
    pods.items.append(make_pod("two", assign={"a": [0, 1], "b": [2, 3]}, topology=dgx1))
    config = PluginConfig(node=NODE, kubelet_dir=sock_dir, assignment_wait_s=0.3, poll_s=0.05)
    first = GpuDevicePlugin(config, dgx1, pods)
    await first.ensure_registered()
    await kubelet.wait_for("nvidia.com/gpu", count=8)
    got_a = await kubelet.admit("nvidia.com/gpu", 2)
    assert set(got_a.devices) == uuids(dgx1, 0, 1)
    await first.stop()  # the agent restarts: what it handed out is forgotten
    second = GpuDevicePlugin(config, dgx1, pods)
    try:
        await second.ensure_registered()
        await kubelet.wait_for("nvidia.com/gpu", count=8)
        got_b = await kubelet.admit("nvidia.com/gpu", 2)
    finally:
        await second.stop()
    assert set(got_b.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == uuids(dgx1, 2, 3)


def test_pyproject_bounds_match_the_generated_code() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pb2 = (ROOT / OUTPUTS[0]).read_text()
    grpc_mod = (ROOT / OUTPUTS[1]).read_text()
    protobuf_made = re.search(r"Protobuf Python Version: ([\d.]+)", pb2)
    grpc_made = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", grpc_mod)
    assert protobuf_made and grpc_made
    major = protobuf_made[1].split(".")[0]
    assert f"protobuf>={protobuf_made[1]},<{int(major) + 1}" in deps
    assert f"grpcio>={grpc_made[1]}" in deps
