"""Informer: list then watch, handlers, reconnect after the watch ends, 410 relist emitting the
differences, and surviving an API server that goes away and comes back."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from e2e.probes import eventually
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import CONFIGMAPS, NAMESPACES, ApiError, Informer, KubeApi, make_api_client


def cm(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "data": {}}


async def test_list_then_watch_with_handlers(kube: KubeApi) -> None:
    await kube.create(CONFIGMAPS, cm("before"), "team-a")
    seen: list[tuple[str, str, str | None]] = []

    async def handler(event: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        seen.append((event, obj["metadata"]["name"],
                     None if old is None else old["metadata"]["resourceVersion"]))

    informer = Informer(kube, CONFIGMAPS, "team-a", label_selector="app!=skip")
    informer.add_handler(handler)
    async with informer:
        await asyncio.wait_for(informer.synced.wait(), 5)
        assert set(informer.store) == {"team-a/before"}
        first = await kube.create(CONFIGMAPS, cm("after"), "team-a")
        await kube.create(CONFIGMAPS, cm("skipped", app="skip"), "team-a")
        await kube.patch(CONFIGMAPS, "after", {"data": {"k": "v"}}, "team-a")
        await kube.delete(CONFIGMAPS, "before", "team-a")
        await eventually(lambda: len(seen) == 4)
    assert seen == [("ADDED", "before", None), ("ADDED", "after", None),
                    ("MODIFIED", "after", first["metadata"]["resourceVersion"]),
                    ("DELETED", "before", seen[3][2])]
    assert set(informer.store) == {"team-a/after"}
    assert informer.store["team-a/after"]["data"] == {"k": "v"}


async def test_relist_after_410_emits_the_differences(tmp_path: Path) -> None:
    async with ApiServerEmulator(history=2) as api:
        client = await make_api_client(str(api.write_kubeconfig(tmp_path / "kc")))
        kube = KubeApi(client)
        events: list[tuple[str, str]] = []
        informer = Informer(kube, CONFIGMAPS, "default", watch_timeout=1)
        informer.add_handler(lambda e, o, _old: events.append((e, o["metadata"]["name"])))
        try:
            await kube.create(CONFIGMAPS, cm("stays"), "default")
            await kube.create(CONFIGMAPS, cm("goes"), "default")
            async with informer:
                await asyncio.wait_for(informer.synced.wait(), 5)
                # Cut the watch off and, while it is down, change more than the history holds:
                # the informer's resourceVersion is now too old and only a relist can recover.
                await informer.stop()
                api.seed({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "new", "namespace": "default"}})
                await kube.delete(CONFIGMAPS, "goes", "default")
                for i in range(3):
                    await kube.patch(CONFIGMAPS, "stays", {"data": {"i": str(i)}}, "default")
                events.clear()
                relists = informer.relists
                informer.start()
                await eventually(lambda: informer.relists > relists)
                await eventually(lambda: len(events) >= 3)
            assert sorted(events) == [("ADDED", "new"), ("DELETED", "goes"),
                                      ("MODIFIED", "stays")]
            assert set(informer.store) == {"default/new", "default/stays"}
        finally:
            await client.close()


async def test_survives_api_server_restart(tmp_path: Path) -> None:
    api = ApiServerEmulator()
    await api.start()
    port = api.port
    client = await make_api_client(str(api.write_kubeconfig(tmp_path / "kc")))
    kube = KubeApi(client)
    informer = Informer(kube, NAMESPACES, backoff_initial=0.05, backoff_max=0.2)
    try:
        async with informer:
            await asyncio.wait_for(informer.synced.wait(), 5)
            await api.stop()
            # a new server on the same port, with fresh state (resourceVersions restart)
            api = ApiServerEmulator(port=port)
            api.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fresh"}})
            for _ in range(20):
                api.seed({"apiVersion": "v1", "kind": "Namespace",
                          "metadata": {"generateName": "filler-"}})
            await api.start()
            await api.create("namespaces", {"metadata": {"name": "later"}})
            await eventually(lambda: "later" in informer.store, within=10)
            assert "fresh" in informer.store
    finally:
        await client.close()
        await api.stop()


async def test_api_error_fields(kube: KubeApi) -> None:
    try:
        await kube.get(CONFIGMAPS, "nope", "team-a")
    except ApiError as err:
        assert err.not_found and not err.conflict and err.reason == "NotFound"
    else:
        raise AssertionError("expected ApiError")


async def test_bookmarks_advance_the_resource_version(tmp_path: Path) -> None:
    async with ApiServerEmulator(bookmark_interval=0.05) as api:
        client = await make_api_client(str(api.write_kubeconfig(tmp_path / "kc")))
        informer = Informer(KubeApi(client), CONFIGMAPS, "team-x")
        try:
            async with informer:
                await asyncio.wait_for(informer.synced.wait(), 5)
                listed = int(informer.resource_version or 0)
                # writes elsewhere move the global resourceVersion; bookmarks carry it here
                api.seed({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "elsewhere", "namespace": "default"}})
                await eventually(lambda: int(informer.resource_version or 0) > listed)
                assert informer.store == {}
        finally:
            await client.close()

