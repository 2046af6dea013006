"""After the fact: what the kubelet records each pod holding (PodResources) against the binder's
assignments; the pure comparison, then the plugin reading the fake kubelet's PodResources."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent_helpers import NODE, ListedPods, attacker_pod, make_pod

from webhook import keys
from webhook.agent.deviceplugin.audit import audit
from webhook.agent.deviceplugin.plugin import HOLDING_REASON, GpuDevicePlugin, PluginConfig
from webhook.agent.podresources import regen
from webhook.agent.podresources.client import Held
from webhook.doubles.fakekubelet import FakeKubelet
from webhook.topology.model import Topology

SCHEDULER = keys.DEFAULT_BINDER_SCHEDULER_NAME


def devices(topo: Topology) -> dict[int, str]:
    return {g.index: g.uuid for g in topo.gpus}


def u(topo: Topology, *indices: int) -> tuple[str, ...]:
    return tuple(topo.gpus[i].uuid for i in indices)


def found_total(plugin: GpuDevicePlugin, kind: str) -> float | None:
    return plugin.metrics.get_sample_value("muster_agent_gpu_holding_mismatches_total",
                                           {"kind": kind})


def current(plugin: GpuDevicePlugin, kind: str) -> float | None:
    return plugin.metrics.get_sample_value("muster_agent_gpu_holding_mismatches_current",
                                           {"kind": kind})


def test_pods_holding_exactly_their_assignment_are_fine(dgx1: Topology) -> None:
    pods = [make_pod("a", assign={"main": [0, 1]}, topology=dgx1, phase="Running"),
            attacker_pod("other", gpus=1)]
    held = [Held("ml/a", "main", u(dgx1, 1, 0)), Held("ml/other", "main", u(dgx1, 7)),
            Held("ml/cpu", "main", ())]
    assert audit(held, pods, NODE, devices(dgx1), SCHEDULER) == []


def test_a_binder_pod_holding_other_gpus_than_assigned(dgx1: Topology) -> None:
    pods = [make_pod("a", assign={"main": [0, 1]}, topology=dgx1, phase="Running")]
    [found] = audit([Held("ml/a", "main", u(dgx1, 0, 2))], pods, NODE, devices(dgx1), SCHEDULER)
    assert (found.pod, found.uid, found.kind) == ("ml/a", "uid-a", "assignment")
    assert found.message == (f"ml/a: container 'main' holds {', '.join(sorted(u(dgx1, 0, 2)))},"
                             f" the binder assigned {', '.join(sorted(u(dgx1, 0, 1)))}")


def test_a_foreign_pod_holding_a_binder_pods_gpus(dgx1: Topology) -> None:
    """The nodeName attack, had it got through: the attacker holds the victim's GPUs."""
    pods = [make_pod("victim", assign={"main": [4, 5]}, topology=dgx1),
            attacker_pod()]
    held = [Held("ml/attacker", "main", u(dgx1, 4, 5))]
    [found] = audit(held, pods, NODE, devices(dgx1), SCHEDULER)
    assert (found.pod, found.uid, found.kind) == ("ml/attacker", "uid-attacker", "foreign")
    assert found.message.endswith("which the binder assigned to ml/victim")
    # a finished binder pod's GPUs are free: whoever holds them now takes nothing
    pods[0]["status"]["phase"] = "Succeeded"
    assert audit(held, pods, NODE, devices(dgx1), SCHEDULER) == []


def test_a_gpu_held_twice(dgx1: Topology) -> None:
    held = [Held("ml/x", "main", u(dgx1, 3)), Held("ns2/y", "c", u(dgx1, 3, 6))]
    found = audit(held, [], NODE, devices(dgx1), SCHEDULER)
    assert [(f.pod, f.uid, f.kind) for f in found] == [("ml/x", "", "shared"),
                                                         ("ns2/y", "", "shared")]
    assert found[0].message == f"{u(dgx1, 3)[0]} is held by 2 containers: ml/x/main, ns2/y/c"


async def test_the_plugin_reports_a_mismatch_once_by_event_metric_and_log(
        sock_dir: Path, kubelet: FakeKubelet, dgx1: Topology) -> None:
    pods = ListedPods()
    pods.items += [make_pod("victim", assign={"main": [4, 5]}, topology=dgx1),
                   attacker_pod()]
    plugin = GpuDevicePlugin(PluginConfig(node=NODE, kubelet_dir=sock_dir,
                                          pod_resources=kubelet.pod_resources_socket), dgx1, pods)
    kubelet.pod_resources[("ml", "attacker")] = {"main": {"nvidia.com/gpu": list(u(dgx1, 4))}}
    kubelet.pod_resources[("ml", "victim")] = {"main": {"nvidia.com/gpu": list(u(dgx1, 5)),
                                                        "example.com/nic": ["nic-0"]}}
    found = await plugin.audit()
    assert sorted(f.kind for f in found) == ["assignment", "foreign"]
    assert found_total(plugin, "foreign") == 1
    assert current(plugin, "assignment") == 1
    assert await plugin.audit() == found  # the same findings: reported once
    await plugin.audit("ml/victim")  # one pod, through Get
    for _ in range(3):
        await asyncio.sleep(0)
    assert sorted((p, r) for p, _, r, _ in pods.events) == [
        ("ml/attacker", HOLDING_REASON), ("ml/victim", HOLDING_REASON)]
    assert found_total(plugin, "assignment") == 1
    # fixed: the gauge goes back to 0; a kubelet without Get is listed instead
    kubelet.pod_resources = {("ml", "victim"): {"main": {"nvidia.com/gpu": list(u(dgx1, 4, 5))}}}
    kubelet.serve_get = False
    assert await plugin.audit("ml/victim") == []
    assert await plugin.audit() == []
    assert current(plugin, "foreign") == 0


def test_generated_pod_resources_modules_match_the_proto(tmp_path: Path) -> None:
    for generated in regen.regenerate(tmp_path):
        committed = regen.ROOT / generated.relative_to(tmp_path)
        assert generated.read_text() == committed.read_text(), (
            f"{committed} is stale: run python -m webhook.agent.podresources.regen")
