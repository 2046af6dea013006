"""A scheduling cycle that fails (a bug in planning) is logged and counted, and the next one
starts from node groups made afresh: the groups the binder keeps across cycles may have been
left half-updated by the cycle cut short."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence

from binder_objects import job, node

from e2e.probes import eventually
from webhook.binder.controller import Binder
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi
from webhook.kube.api import PODS
from webhook.topology.gpu_choice import TableCache
from webhook.topology.groups import NodeGroups
from webhook.topology.hierarchy import place_gang
from webhook.topology.model import GangPlacement, GangRequest, NodeState, Unplaceable
from webhook.topology.network import Network


async def test_a_failed_cycle_is_retried_with_node_groups_made_afresh(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    apiserver.seed(node("dgx-a"))
    engine = functools.partial(place_gang, tables=TableCache())
    handed: list[NodeGroups | None] = []

    def place(nodes: Sequence[NodeState], gang: GangRequest, *, network: Network | None,
              groups: NodeGroups | None = None) -> GangPlacement | Unplaceable:
        handed.append(groups)
        if len(handed) == 1:
            raise RuntimeError("a bug in planning")
        return engine(nodes, gang, network=network, groups=groups)

    b = Binder(kube, place=place)
    task = asyncio.create_task(b.run())
    try:
        for p in job("j1"):
            await kube.create(PODS, p)
        await eventually(lambda: all(p["spec"].get("nodeName")
                                     for p in apiserver.objects("pods")), within=15)
        errors = next(s.value for m in b.metrics.placements.collect() for s in m.samples
                      if s.name.endswith("_total") and s.labels.get("outcome") == "error")
        assert errors == 1
        assert len(handed) >= 2 and handed[0] is not None and handed[1] is not None
        assert handed[1] is not handed[0]  # the failed cycle's groups were dropped
        assert handed[-1] is b.groups
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
