"""The owner cache keeps about the owners of the last ttl: expired entries (never read again)
are dropped once it has doubled, not only past thousands of jobs."""

from __future__ import annotations

import asyncio

from webhook.admission.context import NEGATIVE_TTL, PRUNE_MIN, OwnerCache
from webhook.kube import CONFIGMAPS, KubeApi


async def test_expired_owners_are_dropped_as_the_cache_doubles(kube: KubeApi) -> None:
    await kube.create(CONFIGMAPS, {"metadata": {"name": "owner"}, "data": {}}, namespace="default")
    cache = OwnerCache(kube, ttl=60)
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner"}
    for i in range(PRUNE_MIN * 3):  # each uid its own entry: another uid reads as absent,
        await cache.get({**ref, "uid": f"uid-{i}"}, "default")  # remembered NEGATIVE_TTL
        if i == PRUNE_MIN:
            await asyncio.sleep(NEGATIVE_TTL + 0.1)  # the first PRUNE_MIN + 1 expire
    # pruned at PRUNE_MIN (none expired: next at 2 x), at 2 x PRUNE_MIN (the first PRUNE_MIN
    # + 1 dropped), then not again: what is left is what came after the pause
    assert len(cache) == 2 * PRUNE_MIN - 1
    assert cache.fetches == PRUNE_MIN * 3
