"""Watch streams: initial state, resume from a resourceVersion, 410 Expired, selectors,
bookmarks, timeouts, slow watchers; through kubernetes-asyncio's Watch and KubeApi.watch."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import (
    CONFIGMAPS,
    COSCHEDULING_PODGROUPS,
    PODS,
    ApiError,
    KubeApi,
    make_api_client,
)


def cm(name: str, labels: dict[str, str] | None = None, **data: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "data": data}


async def collect(kube: KubeApi, n: int, **kwargs: Any) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    async for kind, obj in kube.watch(CONFIGMAPS, "team-a", **kwargs):
        out.append((kind, obj["metadata"].get("name", "")))
        if len(out) >= n:
            break
    return out


async def test_typed_watch_stream_sees_initial_and_live_events(kubeconfig: Path,
                                                              kube: KubeApi) -> None:
    await kube.create(PODS, {"metadata": {"name": "before"}, "spec": {"containers": [
        {"name": "c", "image": "x"}]}}, "team-a")
    api_client = await make_api_client(str(kubeconfig))
    core = client.CoreV1Api(api_client)
    seen: list[tuple[str, str]] = []

    async def writer() -> None:
        await asyncio.sleep(0.05)
        await kube.create(PODS, {"metadata": {"name": "after"}, "spec": {"containers": [
            {"name": "c", "image": "x"}]}}, "team-a")
        await kube.delete(PODS, "before", "team-a")

    task = asyncio.create_task(writer())
    try:
        w = watch.Watch()
        async for ev in w.stream(core.list_namespaced_pod, "team-a", timeout_seconds=5):
            seen.append((ev["type"], ev["object"].metadata.name))
            if len(seen) == 3:
                w.stop()
                break
    finally:
        await task
        await api_client.close()
    assert seen == [("ADDED", "before"), ("ADDED", "after"), ("DELETED", "before")]


async def test_resume_from_resource_version(kube: KubeApi) -> None:
    first = await kube.create(CONFIGMAPS, cm("a"), "team-a")
    await kube.create(CONFIGMAPS, cm("b"), "team-a")
    await kube.patch(CONFIGMAPS, "a", {"data": {"k": "v"}}, "team-a")
    events = await collect(kube, 2, resource_version=first["metadata"]["resourceVersion"],
                           timeout_seconds=2)
    assert events == [("ADDED", "b"), ("MODIFIED", "a")]


async def test_too_old_resource_version_is_410_expired(tmp_path: Path) -> None:
    async with ApiServerEmulator(history=3) as api:
        api.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
        client_ = await make_api_client(str(api.write_kubeconfig(tmp_path / "kc")))
        kube = KubeApi(client_)
        try:
            first = await kube.create(CONFIGMAPS, cm("a"), "team-a")
            for i in range(5):
                await kube.patch(CONFIGMAPS, "a", {"data": {"i": str(i)}}, "team-a")
            with pytest.raises(ApiError) as err:
                await collect(kube, 1, resource_version=first["metadata"]["resourceVersion"])
            assert (err.value.status, err.value.reason) == (410, "Expired")
            assert err.value.message.startswith("too old resource version: ")
            # and the typed client sees the same ERROR event
            core = client.CoreV1Api(client_)
            with pytest.raises(ApiException) as exc:
                async for _ in watch.Watch().stream(
                        core.list_namespaced_config_map, "team-a", timeout_seconds=1,
                        resource_version=first["metadata"]["resourceVersion"]):
                    pass
            assert exc.value.status == 410
        finally:
            await client_.close()


async def test_selectors_filter_and_transitions(kube: KubeApi) -> None:
    async def writer() -> None:
        await asyncio.sleep(0.05)
        await kube.create(CONFIGMAPS, cm("x", {"app": "a"}), "team-a")
        await kube.create(CONFIGMAPS, cm("y", {"app": "b"}), "team-a")
        await kube.patch(CONFIGMAPS, "y", {"metadata": {"labels": {"app": "a"}}}, "team-a")
        await kube.patch(CONFIGMAPS, "x", {"metadata": {"labels": {"app": "c"}}}, "team-a")

    task = asyncio.create_task(writer())
    events = await collect(kube, 3, label_selector="app in (a)", timeout_seconds=3)
    await task
    # y enters the selection (ADDED), x leaves it (DELETED), as the apiserver's cacher reports
    assert events == [("ADDED", "x"), ("ADDED", "y"), ("DELETED", "x")]


async def test_field_selector_on_pods(kube: KubeApi) -> None:
    spec = {"containers": [{"name": "c", "image": "x"}]}
    await kube.create(PODS, {"metadata": {"name": "p1"}, "spec": spec}, "team-a")
    await kube.create(PODS, {"metadata": {"name": "p2"}, "spec": spec}, "team-a")
    await kube.bind("team-a", "p2", "node-1")
    unbound = await kube.list(PODS, "team-a", field_selector="spec.nodeName=")
    assert [p["metadata"]["name"] for p in unbound["items"]] == ["p1"]
    on_node = await kube.list(PODS, field_selector="spec.nodeName=node-1,status.phase=Pending")
    assert [p["metadata"]["name"] for p in on_node["items"]] == ["p2"]
    with pytest.raises(ApiError) as err:
        await kube.list(PODS, field_selector="spec.bogus=1")
    assert err.value.status == 400


async def test_bookmarks_and_timeout(tmp_path: Path) -> None:
    async with ApiServerEmulator(bookmark_interval=0.1) as api:
        client_ = await make_api_client(str(api.write_kubeconfig(tmp_path / "kc")))
        kube = KubeApi(client_)
        try:
            kinds = [k async for k, _ in kube.watch(CONFIGMAPS, "default", timeout_seconds=1,
                                                     allow_bookmarks=True)]
        finally:
            await client_.close()
    # the stream ends by itself after timeoutSeconds, with bookmarks in between
    assert kinds and set(kinds) == {"BOOKMARK"}


async def test_slow_watcher_is_dropped_with_410_and_never_blocks_writers(tmp_path: Path) -> None:
    async with ApiServerEmulator(watch_buffer=10) as api:
        client_ = await make_api_client(str(api.write_kubeconfig(tmp_path / "kc")))
        kube = KubeApi(client_)
        try:
            stream = kube.watch(CONFIGMAPS, "default", resource_version=str(api.store.rv))
            # the watch is open; write much more than its buffer before reading anything
            first = asyncio.ensure_future(stream.__anext__())
            await asyncio.sleep(0.05)
            for i in range(50):
                api.seed({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": f"c{i}", "namespace": "default"}})
            with pytest.raises(ApiError) as err:
                await first
                async for _ in stream:
                    pass
            assert err.value.status == 410
        finally:
            await client_.close()


async def test_legacy_watch_path_and_single_object_watch(apiserver: ApiServerEmulator,
                                                        kube: KubeApi) -> None:
    await kube.create(CONFIGMAPS, cm("a"), "team-a")
    await kube.create(CONFIGMAPS, cm("b"), "team-a")
    url = f"{apiserver.url}/api/v1/watch/namespaces/team-a/configmaps/b?timeoutSeconds=1"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        lines = [line async for line in resp.content]
    assert len(lines) == 1 and b'"name":"b"' in lines[0] and lines[0].startswith(b'{"type":"ADDED"')


async def test_list_pages_with_limit_and_continue(kube: KubeApi) -> None:
    for i in range(7):
        await kube.create(CONFIGMAPS, cm(f"c{i}"), "team-a")
    first = await kube.request("GET", "/api/v1/namespaces/team-a/configmaps", [("limit", "3")])
    assert [i["metadata"]["name"] for i in first["items"]] == ["c0", "c1", "c2"]
    assert first["metadata"]["remainingItemCount"] == 4 and first["metadata"]["continue"]
    everything = await kube.list(CONFIGMAPS, "team-a", limit=3)  # KubeApi follows continue
    assert [i["metadata"]["name"] for i in everything["items"]] == [f"c{i}" for i in range(7)]


async def test_deleting_a_crd_deletes_its_objects_with_events(apiserver: ApiServerEmulator,
                                                              kube: KubeApi) -> None:
    await kube.create(COSCHEDULING_PODGROUPS, {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "g"}, "spec": {"minMember": 2}}, "team-a")
    seen: list[tuple[str, str]] = []

    async def watch() -> None:
        async for kind, obj in kube.watch(COSCHEDULING_PODGROUPS, "team-a"):
            seen.append((kind, obj["metadata"]["name"]))

    task = asyncio.create_task(watch())
    await asyncio.sleep(0.1)
    await apiserver.delete("customresourcedefinitions", "podgroups.scheduling.x-k8s.io")
    await asyncio.wait_for(task, 5)  # the stream ends with the CRD
    assert seen == [("ADDED", "g"), ("DELETED", "g")]
    with pytest.raises(ApiError) as err:
        await kube.list(COSCHEDULING_PODGROUPS, "team-a")
    assert err.value.status == 404


async def test_a_streaming_list_sends_the_state_then_the_initial_events_end(kube: KubeApi
                                                                            ) -> None:
    await kube.create(CONFIGMAPS, cm("a"), "team-a")
    seen: list[tuple[str, str]] = []
    async for kind, obj in kube.watch(CONFIGMAPS, "team-a", send_initial_events=True):
        meta = obj["metadata"]
        if kind == "BOOKMARK":
            assert meta["annotations"] == {"k8s.io/initial-events-end": "true"}
            seen.append((kind, meta["resourceVersion"]))
            await kube.create(CONFIGMAPS, cm("b"), "team-a")
            continue
        seen.append((kind, meta["name"]))
        if meta["name"] == "b":
            break
    rv = seen[1][1]
    assert seen == [("ADDED", "a"), ("BOOKMARK", rv), ("ADDED", "b")] and int(rv) > 0


@pytest.mark.parametrize(("query", "message"), [
    ({"sendInitialEvents": "true", "allowWatchBookmarks": "true"},
     "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"),
    ({"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"},
     "sendInitialEvents requires setting allowWatchBookmarks to true"),
    ({"resourceVersionMatch": "NotOlderThan", "allowWatchBookmarks": "true"},
     "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"),
])
async def test_a_streaming_list_checks_its_options(kube: KubeApi, query: dict[str, str],
                                                   message: str) -> None:
    with pytest.raises(ApiError) as err:
        await kube.request("GET", CONFIGMAPS.path("team-a"),
                           [("watch", "true"), *query.items()])
    assert err.value.status == 422 and message in err.value.message
