"""The binder with Volcano's HyperNodes as its network levels (`--network-levels volcano`), on
the real control plane: the HyperNode CRD of ../shared/crds (installed with the cluster, its
CEL rules run by the API server), HyperNodes that select nodes by pattern and by label, and a
binder of its own scheduler name run in the test against the API server, so that the chart's
binder (label levels) and this one never share a pod. It acts as the chart's binder service
account (impersonated), whose Bindings alone the chart's annotation guard lets carry a GPU
assignment, with the HyperNode rule of the chart's binder ClusterRole rendered for
`binder.networkLevels: volcano` (so a chart that grants too little fails here).

The nodes carry no topology label at all: only the HyperNodes say which share a leaf. No kubelet
runs them (their pods are bound and stay Pending); a taint only these pods tolerate keeps every
other test's pods off them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from jobs import ensure_namespace
from real_helpers import (
    binder_as_chart,
    bound_whole,
    chart_binder_grant,
    delete_now,
    failed_scheduling,
    fake_node,
    gpu_pod,
)

from e2e.node.cluster import NodeCluster
from webhook import keys
from webhook.binder.controller import Binder, BinderConfig
from webhook.kube import NODES, PODS, KubeApi
from webhook.kube.api import VOLCANO_HYPERNODES
from webhook.topology import builtin
from webhook.topology.network import Levels

SCHEDULER = "muster-hypernodes"
NS = "net-hypernodes"
TAINT = {"key": "example.com/fake-node", "value": "hypernode-test", "effect": "NoSchedule"}
POOL = "example.com/pool"
GRANT = "muster-test-hypernodes"


def _node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return fake_node(name, builtin("hgx-h100"), labels, TAINT)


def _hypernode(name: str, tier: int, members: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
            "metadata": {"name": name},
            "spec": {"tier": tier, "tierName": ("leaf", "spine")[tier - 1], "members": members}}


#: leaf a by a pattern on the names, leaf b by a label, a spine over both
HYPERNODES = [
    _hypernode("hn-leaf-a", 1, [{"type": "Node",
                                 "selector": {"regexMatch": {"pattern": "^hn-a-"}}}]),
    _hypernode("hn-leaf-b", 1, [{"type": "Node",
                                 "selector": {"labelMatch": {"matchLabels": {POOL: "hn-b"}}}}]),
    _hypernode("hn-spine", 2, [{"type": "HyperNode", "selector": {"exactMatch": {"name": n}}}
                               for n in ("hn-leaf-a", "hn-leaf-b")]),
]


def _pod(name: str, gpus: int, **kw: Any) -> dict[str, Any]:
    return gpu_pod(name, NS, SCHEDULER, gpus, **kw)


@pytest.fixture
async def fabric(kube: KubeApi, node_cluster: NodeCluster, tmp_path: Path
                 ) -> AsyncIterator[Binder]:
    """The nodes (two per leaf), the HyperNodes, and a binder reading them as the chart's
    binder service account; all gone after."""
    nodes = [_node(f"hn-a-{i}", {}) for i in range(2)] + \
        [_node(f"hn-b-{i}", {POOL: "hn-b"}) for i in range(2)]
    await ensure_namespace(kube, NS)
    config = BinderConfig(scheduler_name=SCHEDULER, backoff_initial=0.2, backoff_max=2.0,
                          event_interval=5, network_levels=Levels(hypernodes=True),
                          starvation_seconds=3600)
    grant = chart_binder_grant(tmp_path, "volcano", "topology.volcano.sh", GRANT)
    objects = [*((NODES, n) for n in nodes), *((VOLCANO_HYPERNODES, h) for h in HYPERNODES)]
    async with binder_as_chart(kube, node_cluster, config, grant=grant, objects=objects,
                               ns=NS) as binder:
        yield binder


async def _nodes_of(kube: KubeApi, prefix: str, count: int) -> set[str]:
    return await bound_whole(kube, NS, prefix, count)


async def test_a_gang_lands_within_the_hypernode_with_room_and_waits_beyond_it(
        kube: KubeApi, fabric: Binder) -> None:
    # half of hn-a-0 taken: leaf a has 12 free GPUs, leaf b 16; by name alone the fewest nodes
    # would be hn-a-1 and hn-b-0, across the leaves
    await kube.create(PODS, _pod("busy", 4, node="hn-a-0"), namespace=NS)
    # Volcano's hard mode with highest tier 1, as the webhook writes it: one tier-1 HyperNode
    leaf = {"level": keys.network_tier_level(1), "mode": "required"}
    for i in range(2):
        await kube.create(PODS, _pod(f"in-leaf-{i}", 8, gang="in-leaf", members=2,
                                     network=leaf), namespace=NS)
    assert await _nodes_of(kube, "in-leaf-", 2) == {"hn-b-0", "hn-b-1"}

    # three whole nodes fit no leaf: the gang waits, and its Event names the HyperNode tier and
    # the roomiest leaf's free GPUs on nodes with room for a member (hn-a-0's 4 are not); this
    # gang names the tier by its tierName, as a KAI alias
    by_name = {"level": "leaf", "mode": "required"}
    for i in range(3):
        await kube.create(PODS, _pod(f"wide-{i}", 8, gang="wide", members=3, network=by_name),
                          namespace=NS)

    message = await failed_scheduling(kube, NS, "wide-", within=60)
    assert ("needs 24 GPUs (3 members x 8 GPUs) within one tier-1 HyperNode (leaf); the largest "
            "free one (HyperNode hn-leaf-a) has 8 free GPUs") in message, message
    assert not any(p["spec"].get("nodeName") for p in
                   (await kube.list(PODS, namespace=NS))["items"]
                   if p["metadata"]["name"].startswith("wide-"))

    # within the spine (hard, highest tier 2) the same gang would span both leaves: let the
    # leaf gang finish, then ask for the spine
    for i in range(2):
        await delete_now(kube, PODS.path(NS, f"in-leaf-{i}"))
    spine = {"level": keys.network_tier_level(1), "mode": "preferred",
             "maxLevel": keys.network_tier_level(2)}
    for i in range(3):
        await kube.create(PODS, _pod(f"spine-{i}", 8, gang="spine", members=3, network=spine),
                          namespace=NS)
    where = await _nodes_of(kube, "spine-", 3)
    assert len(where) == 3 and {n[:4] for n in where} == {"hn-a", "hn-b"}, where
