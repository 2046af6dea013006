"""The binder with a KAI Topology object as its network levels (`--network-levels kai:NAME`),
on the real control plane: KAI's Topology CRD of ../shared/crds (installed with the cluster, its
CEL rules run by the API server), and a binder of its own scheduler name run in the test
against the API server, as the chart's binder service account (impersonated) with the Topology
rule of the chart's binder ClusterRole rendered for `binder.networkLevels: kai:NAME` (so a chart
that grants too little fails here). A gang that names another KAI Topology (KAI's
`kai.scheduler/topology`, as the webhook writes it into the request) is placed by that one.
The CRD installed only after the binder started is read with no restart of the binder.

No kubelet runs the nodes (their pods are bound and stay Pending); a taint only these pods
tolerate keeps every other test's pods off them."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from jobs import ensure_namespace
from real_helpers import (
    binder_as_chart,
    bound_whole,
    chart_binder_grant,
    crd_documents,
    delete_now,
    fake_node,
    gpu_pod,
    wait_established,
)

from e2e.node.cluster import NodeCluster
from e2e.probes import eventually
from webhook.binder.cli import network_levels
from webhook.binder.controller import Binder, BinderConfig
from webhook.kube import CRDS, NODES, PODS, ApiError, KubeApi
from webhook.kube.api import TOPOLOGIES
from webhook.topology import builtin
from webhook.topology.network import Levels

SCHEDULER = "muster-topologies"
NS = "net-topologies"
TOPOLOGY = "muster-test-fabric"
FLAG = f"kai:{TOPOLOGY}"
TAINT = {"key": "example.com/fake-node", "value": "topology-test", "effect": "NoSchedule"}
BLOCK, RACK = "example.com/block", "example.com/rack"
GRANT = "muster-test-topologies"
#: the version the shared CRD serves
KAI = next(r for r in TOPOLOGIES["kai"] if r.version == "v1alpha1")


def _topology(rack_alias: str) -> dict[str, Any]:
    return {"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology",
            "metadata": {"name": TOPOLOGY},
            "spec": {"levels": [{"nodeLabel": BLOCK, "alias": "block"},
                                {"nodeLabel": RACK, "alias": rack_alias},
                                {"nodeLabel": "kubernetes.io/hostname"}]}}


def _pod(name: str, gpus: int, *, level: str | None = None, topology: str | None = None,
         **kw: Any) -> dict[str, Any]:
    """A member; `topology` as the webhook writes KAI's kai.scheduler/topology."""
    network = None
    if level:
        network = {"level": level, "mode": "required"} | ({"topology": topology} if topology
                                                          else {})
    return gpu_pod(name, NS, SCHEDULER, gpus, network=network, **kw)


@contextlib.asynccontextmanager
async def _fabric(kube: KubeApi, node_cluster: NodeCluster, tmp_path: Path, **config: Any
                  ) -> AsyncIterator[Binder]:
    """One block of two racks of two nodes, and a binder reading KAI's Topologies (its own not
    there yet) as the chart's binder service account; all gone after, the Topologies too."""
    nodes = [fake_node(f"kt-r{r}-{i}", builtin("hgx-h100"), {BLOCK: "b0", RACK: f"r{r}"},
                       TAINT) for r in range(2) for i in range(2)]
    await ensure_namespace(kube, NS)
    grant = chart_binder_grant(tmp_path, FLAG, "kai.scheduler", GRANT)
    try:
        async with binder_as_chart(kube, node_cluster, BinderConfig(
                scheduler_name=SCHEDULER, backoff_initial=0.2, backoff_max=2.0, event_interval=5,
                network_levels=network_levels(FLAG), starvation_seconds=3600, **config),
                grant=grant, objects=[(NODES, n) for n in nodes], ns=NS) as binder:
            yield binder
    finally:
        for name in (TOPOLOGY, f"{TOPOLOGY}-wide"):
            await delete_now(kube, KAI.path(None, name))


@pytest.fixture
async def fabric(kube: KubeApi, node_cluster: NodeCluster, tmp_path: Path
                 ) -> AsyncIterator[Binder]:
    async with _fabric(kube, node_cluster, tmp_path) as binder:
        yield binder


async def _racks_of(kube: KubeApi, prefix: str, count: int) -> set[str]:
    return {n.rsplit("-", 1)[0] for n in await bound_whole(kube, NS, prefix, count)}


async def test_a_gang_follows_the_kai_topology_as_the_admin_edits_it(
        kube: KubeApi, fabric: Binder, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="webhook.binder.controller")
    # half of kt-r0-0 taken: rack r0 has 12 free GPUs, r1 16; by name alone the fewest nodes
    # would be kt-r0-1 and kt-r1-0, across the racks
    await kube.create(PODS, _pod("busy", 4, node="kt-r0-0"), namespace=NS)
    await kube.create(KAI, _topology("rack"))
    aliased = Levels((BLOCK, RACK), (("block", BLOCK), ("rack", RACK)))
    await eventually(lambda: fabric.plan_config.levels == aliased, within=30,
                     what="the binder's levels from the Topology")
    for i in range(2):
        await kube.create(PODS, _pod(f"in-rack-{i}", 8, gang="in-rack", members=2, level="rack"),
                          namespace=NS)
    assert await _racks_of(kube, "in-rack-", 2) == {"kt-r1"}

    # KAI's CRD refuses a change of the levels' labels (its CEL rule, run by the API server)...
    changed = await kube.get(KAI, TOPOLOGY)
    changed["spec"]["levels"][1]["nodeLabel"] = "example.com/row"
    with pytest.raises(ApiError, match="nodeLabel structure is immutable"):
        await kube.replace(KAI, TOPOLOGY, changed)
    # ...not an alias that is a level's label (KAI's webhook would): the binder keeps its levels
    bad = await kube.get(KAI, TOPOLOGY)
    bad["spec"]["levels"][1]["alias"] = BLOCK
    await kube.replace(KAI, TOPOLOGY, bad)
    warned = await eventually(lambda: [r.getMessage() for r in caplog.records
                                       if "keeps the levels last read" in r.getMessage()],
                              within=30, what="the bad edit's warning")
    assert warned[0].startswith(f"KAI Topology {TOPOLOGY} cannot be read: level 2: alias "
                                f"{BLOCK} is a level's node label"), warned
    assert fabric.plan_config.levels == aliased

    # a good edit renames the rack level; a gang that names it by its new alias, 2 members of
    # 8 GPUs, fits no rack now (r1 is taken): it waits until the first gang finishes
    good = await kube.get(KAI, TOPOLOGY)
    good["spec"]["levels"][1]["alias"] = "tor"
    await kube.replace(KAI, TOPOLOGY, good)
    await eventually(lambda: fabric.plan_config.levels.label("tor") == RACK, within=30,
                     what="the renamed alias")
    for i in range(2):
        await kube.create(PODS, _pod(f"in-tor-{i}", 8, gang="in-tor", members=2, level="tor"),
                          namespace=NS)
    await asyncio.sleep(2)
    assert not any(p["spec"].get("nodeName") for p in
                   (await kube.list(PODS, namespace=NS))["items"]
                   if p["metadata"]["name"].startswith("in-tor-"))
    for i in range(2):
        await delete_now(kube, PODS.path(NS, f"in-rack-{i}"))
    assert await _racks_of(kube, "in-tor-", 2) == {"kt-r1"}

    # another KAI Topology, which a gang names (its kai.scheduler/topology): there `unit` is
    # the block, so a gang of 3 whole nodes, which fits no rack, lands across the racks of the
    # block (kt-r0-1, kt-r1-*); under the binder's own Topology `unit` is no level
    await kube.create(KAI, {**_topology("rack"), "metadata": {"name": f"{TOPOLOGY}-wide"},
                            "spec": {"levels": [{"nodeLabel": BLOCK, "alias": "unit"}]}})
    await eventually(lambda: f"kai:{TOPOLOGY}-wide" in fabric.plan_config.topologies,
                     within=30, what="the second Topology read")
    for i in range(2):
        await delete_now(kube, PODS.path(NS, f"in-tor-{i}"))
    for i in range(3):
        await kube.create(PODS, _pod(f"in-unit-{i}", 8, gang="in-unit", members=3, level="unit",
                                     topology=f"kai:{TOPOLOGY}-wide"), namespace=NS)
    assert await _racks_of(kube, "in-unit-", 3) == {"kt-r0", "kt-r1"}


async def _crd_gone(kube: KubeApi, name: str) -> bool:
    try:
        await kube.get(CRDS, name)
    except ApiError as exc:
        if exc.not_found:
            return True
        raise
    return False


async def test_kais_topology_crd_installed_after_the_binder_started_is_read_without_a_restart(
        kube: KubeApi, node_cluster: NodeCluster, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """KAI's Topology CRD deleted from the API server, then a binder started: it says the CRD
    is missing. The admin installs it (../shared/crds, as the cluster had it) and creates the
    Topology: the binder reads its levels within its probe interval, and a gang that requires
    the `rack` alias is bound in one rack. The CRD is back whatever the outcome."""
    [crd] = [d for d in crd_documents() if d["spec"]["group"] == KAI.group
             and d["spec"]["names"]["plural"] == KAI.plural]
    name = crd["metadata"]["name"]
    caplog.set_level(logging.INFO, logger="webhook.binder")
    await kube.delete(CRDS, name)
    try:
        await eventually(lambda: _crd_gone(kube, name), within=60, what=f"CRD {name} deleted")
        async with _fabric(kube, node_cluster, tmp_path, crd_probe_seconds=1.0) as binder:
            said = [r.getMessage() for r in caplog.records]
            assert f"KAI Topology {TOPOLOGY}: the Topology CRD is not installed: no network " \
                "levels until it is" in said, said
            await kube.create(CRDS, copy.deepcopy(crd))
            await asyncio.to_thread(wait_established, node_cluster)
            await kube.create(KAI, _topology("rack"))
            aliased = Levels((BLOCK, RACK), (("block", BLOCK), ("rack", RACK)))
            await eventually(lambda: binder.plan_config.levels == aliased, within=30,
                             what="the binder's levels from the Topology of the late CRD")
            assert "resource now served: reading it" in [r.getMessage() for r in caplog.records]
            for i in range(2):
                await kube.create(PODS, _pod(f"late-{i}", 8, gang="late", members=2,
                                             level="rack"), namespace=NS)
            assert len(await _racks_of(kube, "late-", 2)) == 1
    finally:
        if await _crd_gone(kube, name):
            await kube.create(CRDS, copy.deepcopy(crd))
        await asyncio.to_thread(wait_established, node_cluster)
