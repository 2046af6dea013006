"""A Kueue or KAI Topology object in the cluster as the binder's network levels
(`--network-levels kai:NAME` / `kueue:NAME`): the flag, what each event of the object does to
the levels (a bad edit or a deletion keeps the last good ones), a gang placed by the levels of
the KAI Topology it names, and the binder through the emulator, which serves both Topology CRDs
of ../shared/crds."""

from __future__ import annotations

import json
from typing import Any

import pytest
from binder_objects import BLOCK, RACK, SCHED, job, racked_nodes
from binder_run import serving

from e2e.probes import eventually
from webhook.binder.cli import network_levels
from webhook.binder.controller import Binder, BinderConfig
from webhook.binder.fit import FitCache
from webhook.binder.nodes import parse_node
from webhook.binder.planner import Plan, PlanConfig, plan
from webhook.binder.pods import parse_pod
from webhook.binder.queue import GangQueue
from webhook.binder.topologies import Read, TopologyView, listed
from webhook.doubles.emulator import ApiServerEmulator
from webhook.failures import UsageError
from webhook.kube import KubeApi
from webhook.kube.api import CRDS, PODS, TOPOLOGIES
from webhook.topology.hierarchy import place_gang
from webhook.topology.network import Levels, TopologyRef

KAI = TopologyRef("kai", "cluster")


def topology(name: str = "cluster", *levels: dict[str, str],
             api_version: str = "kai.scheduler/v1alpha1") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "Topology", "metadata": {"name": name},
            "spec": {"levels": list(levels) or [{"nodeLabel": BLOCK, "alias": "block"},
                                                {"nodeLabel": RACK, "alias": "rack"}]}}


ALIASED = Levels((BLOCK, RACK), (("block", BLOCK), ("rack", RACK)))


def test_the_flag_names_a_kueue_or_kai_topology() -> None:
    assert network_levels("kai:cluster") == Levels(topology=KAI)
    assert network_levels(" kueue:default.tas ") == \
        Levels(topology=TopologyRef("kueue", "default.tas"))
    for bad in ("kai:", "kai:Cluster", "kueue:a_b", f"kai:{'a' * 254}"):
        with pytest.raises(UsageError, match="a Topology's name is a DNS subdomain"):
            network_levels(bad)
    with pytest.raises(UsageError, match="is not a node label key"):
        network_levels("slurm:cluster")  # (no such API: read as a label, which it is not)


@pytest.mark.parametrize("api_version", ["kai.scheduler/v1", "kai.scheduler/v1alpha1",
                                         "kueue.x-k8s.io/v1beta2", "kueue.x-k8s.io/v1beta1"])
def test_the_named_object_gives_the_levels_in_each_version(api_version: str) -> None:
    view = TopologyView(KAI)
    read = view.on_event("ADDED", topology(api_version=api_version))
    assert read.changed and not read.problem
    assert view.levels == read.levels == ALIASED and view.seen
    assert view.on_event("MODIFIED", topology(api_version=api_version)) == \
        Read(KAI, ALIASED, changed=False)


def test_every_topology_is_read_the_binders_own_gives_its_levels() -> None:
    view = TopologyView(KAI)
    read = view.on_event("ADDED", topology("other", {"nodeLabel": RACK}))
    assert read == Read(TopologyRef("kai", "other"), Levels((RACK,)), changed=True)
    assert view.levels == Levels() and not view.seen
    view.on_event("ADDED", topology())
    assert view.levels == ALIASED and view.named() == {"kai:other": Levels((RACK,)),
                                                       "kai:cluster": ALIASED}


def test_a_bad_edit_or_a_deletion_keeps_the_last_good_levels() -> None:
    view = TopologyView(KAI)
    view.on_event("ADDED", topology())
    # KAI's CRD lets an alias name a level's node label (its webhook refuses it)
    bad = topology("cluster", {"nodeLabel": BLOCK}, {"nodeLabel": RACK, "alias": BLOCK})
    read = view.on_event("MODIFIED", bad)
    assert not read.changed and read.levels == ALIASED
    assert read.problem == (f"KAI Topology cluster cannot be read: level 2: alias {BLOCK} is a "
                            "level's node label")
    for broken in ({**bad, "kind": "HyperNode"}, {**bad, "spec": {"levels": []}},
                   {**bad, "spec": None}):
        read = view.on_event("MODIFIED", broken)
        assert read.problem and read.levels == ALIASED
    read = view.on_event("DELETED", topology())
    assert read.problem == "KAI Topology cluster was deleted"
    assert view.levels == ALIASED
    # an edit that reads replaces them (KAI lets aliases change)
    renamed = topology("cluster", {"nodeLabel": BLOCK}, {"nodeLabel": RACK, "alias": "tor"})
    read = view.on_event("ADDED", renamed)
    assert read.changed and view.levels == Levels((BLOCK, RACK),
                                                                       (("tor", RACK),))
    assert listed(view.levels) == f"{BLOCK} > {RACK} (alias tor)" and listed(Levels()) == "none"


def _topo(level: str) -> str:
    return json.dumps({"v": 1, "mode": "preferred",
                       "network": {"level": level, "mode": "required"}})


@pytest.mark.parametrize("crd_later", [False, True], ids=["crd-installed", "crd-installed-later"])
async def test_the_binder_follows_a_kai_topology_as_it_changes(
        apiserver: ApiServerEmulator, kube: KubeApi, caplog: pytest.LogCaptureFixture,
        shared_crds: list[dict[str, Any]], crd_later: bool) -> None:
    """Through the emulator: a gang that requires the `rack` alias waits while no Topology
    says what it is (no node has a label `rack`), and lands in one rack once the KAI Topology
    is created; a bad edit and the deletion are logged, and the levels stay. Also where KAI's
    Topology CRD is installed only after the binder started (webhook.binder.sources)."""
    kai = TOPOLOGIES["kai"][-1]  # (the shared CRD serves v1alpha1)
    [crd] = [c for c in shared_crds if c["spec"]["group"] == kai.group
             and c["spec"]["names"]["plural"] == kai.plural]
    if crd_later:
        await kube.delete(CRDS, crd["metadata"]["name"])
    for n in racked_nodes():
        apiserver.seed(n)
    caplog.set_level("INFO", logger="webhook.binder.controller")
    b = Binder(kube, BinderConfig(backoff_initial=0.05, backoff_max=0.2,
                                  network_levels=network_levels("kai:cluster"),
                                  crd_probe_seconds=0.1))
    async with serving(b):
        assert any(r.getMessage().startswith("KAI Topology cluster not found")
                   for r in caplog.records)
        for p in job("j", workers=2, gpus=8, topology=_topo("rack")):
            await kube.create(PODS, p)

        def waits() -> list[str]:
            return [w.reason for w in b.last_plan.waits if "GPUs" in w.reason] \
                if b.last_plan else []
        [reason] = await eventually(waits, within=5)
        assert "no node has the label rack" in reason, reason
        if crd_later:
            await kube.create(CRDS, crd)
        await kube.create(kai, topology())

        def racks() -> set[tuple[str, ...]]:
            found = [p["spec"].get("nodeName") for p in apiserver.objects("pods", "team-a")
                     if p["metadata"]["name"].startswith("j-")]
            return {tuple(n.split("-")[:2]) for n in found} if None not in found else set()
        assert len(await eventually(racks, within=5)) == 1
        assert b.plan_config.levels == ALIASED
        said = [r.getMessage() for r in caplog.records]
        assert f"network levels from KAI Topology cluster (the binder's own): {BLOCK} (alias " \
            f"block) > {RACK} (alias rack)" in said

        obj = await kube.get(kai, "cluster")
        obj["spec"]["levels"][1]["alias"] = BLOCK
        await kube.replace(kai, "cluster", obj)
        await kube.delete(kai, "cluster")

        def warned() -> list[str]:
            return [m for m in (r.getMessage() for r in caplog.records)
                    if "the binder keeps the levels last read" in m]
        bad, gone = await eventually(lambda: w if len(w := warned()) == 2 else None, within=5)
        assert bad.startswith(f"KAI Topology cluster cannot be read: level 2: alias {BLOCK}")
        assert gone.startswith("KAI Topology cluster was deleted")
        assert b.plan_config.levels == ALIASED


async def test_the_binder_reads_a_kueue_topology(apiserver: ApiServerEmulator,
                                                 kube: KubeApi) -> None:
    """Kueue's Topology in its newest served version: its levels become the binder's."""
    apiserver.seed(topology("tas", {"nodeLabel": BLOCK}, {"nodeLabel": RACK},
                            {"nodeLabel": "kubernetes.io/hostname"},
                            api_version="kueue.x-k8s.io/v1beta2"))
    b = Binder(kube, BinderConfig(network_levels=network_levels("kueue:tas")))
    async with serving(b):
        assert b.plan_config.levels == Levels((BLOCK, RACK))


def _plan(pods: list[dict[str, Any]], config: PlanConfig) -> Plan:
    return plan([parse_pod(p) for p in pods], {n["metadata"]["name"]: parse_node(n)
                                               for n in racked_nodes()},
                None, config=config, queue=GangQueue(), fit=FitCache(), place=place_gang,
                now=1795237200.0)


def _gang(topology: str) -> list[dict[str, Any]]:
    """Three whole nodes that ask for the level `unit` of `topology`, as KAI's annotations
    are written to the request."""
    return job("j", workers=3, gpus=8, topology=json.dumps({
        "v": 1, "mode": "preferred",
        "network": {"level": "unit", "mode": "required", "topology": topology}}))


@pytest.mark.parametrize(("api", "topology", "placed", "why"), [
    # `unit` is a block there (4 nodes) and a rack here (2 nodes)
    ("kai", "kai:blocks", True, ""),
    ("kai", "kai:racks", False, "within one example.com/rack domain"),
    ("kai", "kai:gone", False, "it names KAI Topology gone, which the binder has not read"),
    # a binder that reads no KAI Topology places by its own levels, which have no `unit`
    ("", "kai:blocks", False, "no node has the label unit"),
    ("kueue", "kai:blocks", False, "no node has the label unit"),
])
def test_a_gang_is_placed_by_the_levels_of_the_topology_it_names(
        api: str, topology: str, placed: bool, why: str) -> None:
    config = PlanConfig(SCHED, topology_api=api, topologies={
        "kai:blocks": Levels((BLOCK,), (("unit", BLOCK),)),
        "kai:racks": Levels((BLOCK, RACK), (("unit", RACK),))})
    p = _plan(_gang(topology), config)
    assert bool(p.places) == placed
    if placed:
        blocks = {a.node.split("-")[0] for _, a in p.places[0].assignments if a is not None}
        assert len(blocks) == 1
    else:
        assert any(why in w.reason for w in p.waits), [w.reason for w in p.waits]


async def test_the_binder_places_a_gang_by_the_kai_topology_it_names(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    """Through the emulator: the binder's own Topology has no level `unit`; the one the gang
    names (its `kai.scheduler/topology`, in the request) makes it a block."""
    for n in racked_nodes():
        apiserver.seed(n)
    apiserver.seed(topology())
    apiserver.seed(topology("wide", {"nodeLabel": BLOCK, "alias": "unit"}))
    b = Binder(kube, BinderConfig(backoff_initial=0.05, backoff_max=0.2,
                                  network_levels=network_levels("kai:cluster")))
    async with serving(b):
        for p in _gang("kai:wide"):
            await kube.create(PODS, p)

        def blocks() -> set[str]:
            found = [p["spec"].get("nodeName") for p in apiserver.objects("pods", "team-a")
                     if p["metadata"]["name"].startswith("j-")]
            return {n.split("-")[0] for n in found} if None not in found else set()
        assert len(await eventually(blocks, within=5)) == 1
        assert b.plan_config.levels == ALIASED
