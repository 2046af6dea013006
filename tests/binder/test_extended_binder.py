"""Must show, on the emulator: plain `nvidia.com/gpu` pods of the binder's on a DRA-only node are
served through DRA (the DeviceClass names the resource), as kube-scheduler serves them: each gets
its own special claim, allocated and reserved for it, and a status naming it, before its Binding;
a failed write binds nothing and leaves no claim; a binder stopped after the claims were made
leaves its successor to finish with no GPU twice; nodes of the device plugin keep its path; and a
class other than ours leaves the pod waiting with the reason."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from binder_objects import node, pod, resource_slice
from binder_run import serving
from test_dra_binder import CFG, Recording, assert_no_gpu_twice, bound, devices

from e2e.probes import eventually
from webhook import keys
from webhook.binder.controller import Binder
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi
from webhook.kube.api import DEVICE_CLASSES, PODS, ApiError

REQUEST = "container-0-request-2"  # main's nvidia.com/gpu, after cpu and memory


def gpu_class(name: str = keys.DRA_DRIVER, resource: str = keys.GPU_RESOURCE
              ) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": "true"}}],
                     "extendedResourceName": resource}}


def seed(api: ApiServerEmulator, *, dra_only: bool = True, name: str = "dgx-a") -> None:
    api.seed(node(name, gpus=0 if dra_only else 8,
                  labels={keys.LABEL_GPU_ALLOCATION_ACK: "true"}))
    api.seed(resource_slice(name, range(8)))


async def create_gang(kube: KubeApi, count: int, gang: str = "g") -> None:
    for i in range(count):
        await kube.create(PODS, pod(f"{gang}-w{i}", gpus=1, gang=gang, min_member=count),
                          "team-a")


def special(api: ApiServerEmulator) -> dict[str, list[dict[str, Any]]]:
    """Pod name → the special claims made for it."""
    out: dict[str, list[dict[str, Any]]] = {}
    for c in api.objects("resourceclaims", "team-a"):
        if c["metadata"].get("annotations", {}).get(keys.EXTENDED_CLAIM_ANNOTATION) == "true":
            out.setdefault(c["metadata"]["ownerReferences"][0]["name"], []).append(c)
    return out


def assert_served_by_own_claim(api: ApiServerEmulator, count: int) -> None:
    claims = special(api)
    pods = {p["metadata"]["name"]: p for p in api.objects("pods", "team-a")}
    allocated = devices(api)
    assert len(pods) == count and sorted(claims) == sorted(pods)
    for name, p in pods.items():
        (c,) = claims[name]
        owner = c["metadata"]["ownerReferences"][0]
        assert owner["uid"] == p["metadata"]["uid"] and owner["controller"] is True
        assert c["metadata"]["name"].startswith(f"{name}-extended-resources-")
        assert [r["name"] for r in c["spec"]["devices"]["requests"]] == [REQUEST]
        pool, _, reserved = allocated[c["metadata"]["name"]]
        assert pool == p["spec"]["nodeName"] and reserved == [name]
        assert p["status"]["extendedResourceClaimStatus"] == {
            "resourceClaimName": c["metadata"]["name"],
            "requestMappings": [{"containerName": "main", "resourceName": keys.GPU_RESOURCE,
                                 "requestName": REQUEST}]}
        assert keys.ANN_GPU_ASSIGNMENT not in p["metadata"]["annotations"]
    assert_no_gpu_twice(api)


async def test_eight_plain_gpu_pods_on_a_dra_only_node_get_their_own_claims_in_one_cycle(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    seed(apiserver)
    apiserver.seed(gpu_class())
    binder = Recording(kube, CFG)
    async with serving(binder):
        await create_gang(kube, 8)
        await eventually(lambda: len(bound(apiserver)) == 8, within=10)
    assert len(binder.placing) == 1 and len(binder.placing[0].places[0].assignments) == 8
    assert binder.gated == []
    assert_served_by_own_claim(apiserver, 8)
    assert sorted(d for _, names, _ in devices(apiserver).values() for d in names) == [
        f"gpu-{i}" for i in range(8)]


async def test_a_node_of_the_device_plugin_keeps_its_path(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    seed(apiserver, dra_only=False)  # allocatable nvidia.com/gpu and a slice: the plugin's
    apiserver.seed(gpu_class())
    async with serving(Binder(kube, CFG)):
        await kube.create(PODS, pod("p", gpus=2), "team-a")
        await eventually(lambda: bound(apiserver) == {"p": "dgx-a"}, within=10)
    (p,) = apiserver.objects("pods", "team-a")
    assert keys.ANN_GPU_ASSIGNMENT in p["metadata"]["annotations"]
    assert "extendedResourceClaimStatus" not in p["status"] and special(apiserver) == {}


async def test_without_our_class_the_pod_waits_and_says_why_until_ours_serves_it(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    seed(apiserver)  # a DRA-only node, and no DeviceClass (as on 1.34: the field is dropped)

    def failures() -> list[str]:
        return [e["message"] for e in apiserver.objects("events", "team-a")
                if e["reason"] == "FailedScheduling"]

    async with serving(Binder(kube, CFG)):
        await kube.create(PODS, pod("p", gpus=1), "team-a")
        await eventually(lambda: any("no DeviceClass serves it through DRA" in m
                                     for m in failures()))
        await kube.create(DEVICE_CLASSES, gpu_class("gpu.example.com"))
        await eventually(lambda: any("DeviceClass gpu.example.com serves it through DRA" in m
                                     for m in failures()))
        assert bound(apiserver) == {} and special(apiserver) == {}
        await kube.delete(DEVICE_CLASSES, "gpu.example.com")
        await kube.create(DEVICE_CLASSES, gpu_class())
        await eventually(lambda: bound(apiserver) == {"p": "dgx-a"}, within=10)
    assert_served_by_own_claim(apiserver, 1)


class Failing(KubeApi):
    """Refuses with a 409 the first write of one kind for one pod, as a concurrent writer
    would: its claim's creation, its claim's status, or its own status."""

    def __init__(self, base: KubeApi, target: str, step: str) -> None:
        super().__init__(base.client)
        self.target, self.step, self.refused = target, step, 0

    def _refuse(self, step: str, name: str) -> None:
        if step == self.step and name.startswith(self.target) and not self.refused:
            self.refused += 1
            raise ApiError(409, "Conflict", "the object has been modified")

    async def create(self, resource: Any, obj: Any, namespace: str | None = None,
                     **kw: Any) -> dict[str, Any]:
        self._refuse("create", obj["metadata"].get("generateName", ""))
        return await super().create(resource, obj, namespace, **kw)

    async def replace(self, resource: Any, name: str, obj: Any, namespace: str | None = None,
                      **kw: Any) -> dict[str, Any]:
        if (obj.get("status") or {}).get("allocation"):
            self._refuse("claim", name)
        return await super().replace(resource, name, obj, namespace, **kw)

    async def patch(self, resource: Any, name: str, patch: Any, namespace: str | None = None,
                    **kw: Any) -> dict[str, Any]:
        if "extendedResourceClaimStatus" in str(patch):
            self._refuse("status", name)
        return await super().patch(resource, name, patch, namespace, **kw)


@pytest.mark.parametrize("step", ["create", "claim", "status"])
async def test_a_failed_write_binds_nothing_and_deletes_the_claims_made(
        apiserver: ApiServerEmulator, kube: KubeApi, step: str) -> None:
    seed(apiserver)
    apiserver.seed(gpu_class())
    await create_gang(kube, 4)
    api = Failing(kube, "g-w2", step)
    seen: list[tuple[int, int]] = []  # (special claims, pods bound) whenever a claim goes

    binder = Binder(api, CFG)
    through = binder.claims.on_event

    def on_event(event: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if event == "DELETED":
            seen.append((len(special(apiserver)), len(bound(apiserver))))
        through(event, obj, old)

    binder.claims.on_event = on_event  # type: ignore[method-assign]
    async with serving(binder):
        await eventually(lambda: len(bound(apiserver)) == 4, within=10)
    assert api.refused == 1
    # the first try's claims went (3 made when one creation failed, else 4), none bound
    assert len(seen) == (3 if step == "create" else 4) and all(b == 0 for _, b in seen)
    assert_served_by_own_claim(apiserver, 4)


class Stopping(KubeApi):
    """Kills the binder right after its n-th write of a kind (claim creates, or claim status
    writes) is answered: nothing after it is sent."""

    def __init__(self, base: KubeApi, kind: str, after: int) -> None:
        super().__init__(base.client)
        self.kind, self.after, self.writes = kind, after, 0
        self.victim: asyncio.Task[None] | None = None
        self._wire = asyncio.Lock()

    async def _write(self, kind: str, call: Callable[[], Awaitable[dict[str, Any]]]
                     ) -> dict[str, Any]:
        async with self._wire:
            if self.writes >= self.after:
                raise asyncio.CancelledError  # dead: never sent
            result = await call()
            if kind == self.kind:
                self.writes += 1
                if self.writes == self.after and self.victim is not None:
                    self.victim.cancel()
            return result

    async def create(self, resource: Any, obj: Any, namespace: str | None = None,
                     **kw: Any) -> dict[str, Any]:
        return await self._write("create", lambda: super(Stopping, self).create(
            resource, obj, namespace, **kw))

    async def replace(self, resource: Any, name: str, obj: Any, namespace: str | None = None,
                      **kw: Any) -> dict[str, Any]:
        kind = "status" if kw.get("subresource") == "status" else "finalizer"
        return await self._write(kind, lambda: super(Stopping, self).replace(
            resource, name, obj, namespace, **kw))

    async def create_subresource(self, *args: Any, **kw: Any) -> dict[str, Any]:
        raise asyncio.CancelledError  # no Binding is ever sent


@pytest.mark.parametrize(("kind", "after"), [("create", 3), ("create", 8), ("status", 8)])
async def test_a_binder_stopped_after_making_claims_leaves_its_successor_no_gpu_twice(
        apiserver: ApiServerEmulator, kube: KubeApi, kind: str, after: int) -> None:
    seed(apiserver)
    apiserver.seed(gpu_class())
    await create_gang(kube, 8)
    api = Stopping(kube, kind, after)
    binder = Binder(api, CFG)
    task = asyncio.create_task(binder.run())
    api.victim = task
    await asyncio.gather(task, return_exceptions=True)
    made = special(apiserver)
    assert sum(map(len, made.values())) == (after if kind == "create" else 8)
    assert len(devices(apiserver)) == (after if kind == "status" else 0)
    assert bound(apiserver) == {}
    async with serving(Binder(kube, CFG)):  # its successor
        await eventually(lambda: len(bound(apiserver)) == 8, within=10)
    assert_served_by_own_claim(apiserver, 8)
