"""Every job kind on the emulator, under the shipped policies: the pods of one job (one
LeaderWorkerSet group) join one PodGroup of the right size, made before the first of them.
The same scenarios run on the real node in tests/real/test_job_kinds.py."""

from __future__ import annotations

import pytest

from e2e import jobkind_scenarios as scenarios
from e2e import jobkinds
from e2e.cluster import LocalCluster, RealCluster, namespace
from webhook import keys
from webhook.kube import COSCHEDULING_PODGROUPS, NAMESPACES


@pytest.fixture
async def cluster_with_teams(cluster: LocalCluster | RealCluster) -> LocalCluster | RealCluster:
    for ns in (scenarios.VOLCANO_NS, scenarios.COSCHEDULING_NS):
        await cluster.kube.create(NAMESPACES, namespace(ns))
    return cluster


async def test_every_job_kind_gets_one_gang_per_job(
        cluster_with_teams: LocalCluster | RealCluster) -> None:
    """All kinds in one installation (each start of the e2e cluster takes seconds)."""
    kube = cluster_with_teams.kube
    tier = scenarios.Tier(kube, controllers=False, container=jobkinds.DEFAULT_CONTAINER)
    for kind, submit in scenarios.SCENARIOS.items():
        gangs = await submit(tier, f"{kind}-1")
        for gang in gangs:
            ns = scenarios.COSCHEDULING_NS if gang.resource is COSCHEDULING_PODGROUPS \
                else scenarios.VOLCANO_NS
            await scenarios.check(kube, ns, gang)
    (init,) = await scenarios.initializer_pods(kube, "trainjob-1")
    assert keys.COSCHEDULING_GROUP_LABEL not in (init["metadata"].get("labels") or {})
