"""Must show, on the emulator: the binder allocates the ResourceClaims of the DRA pods it places
before binding them, one gang at once past the one-pod-per-node gate; a conflict on a claim
binds nothing of the gang and releases what it allocated; a claim someone else allocated is
neither reused nor its GPUs handed out; and a binder killed between claim writes and Bindings
leaves no GPU assigned twice: its successor binds the gang there or releases it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from binder_objects import claim, dra_pod, node, pod, resource_slice
from binder_run import serving

from e2e.probes import eventually
from webhook import keys
from webhook.binder.claims import allocated_status
from webhook.binder.controller import Binder, BinderConfig
from webhook.binder.planner import Plan
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi
from webhook.kube.api import PODS, RESOURCE_CLAIMS, ApiError

CFG = BinderConfig(backoff_initial=0.05, backoff_max=0.2, event_interval=60)


def seed_dra_node(api: ApiServerEmulator, name: str = "dgx-a") -> None:
    """A DRA-only node (no nvidia.com/gpu) whose agent acknowledges served pods: the gate would
    let one GPU pod at a time in if DRA pods went through it."""
    api.seed(node(name, gpus=0, labels={keys.LABEL_GPU_ALLOCATION_ACK: "true"}))
    api.seed(resource_slice(name, range(8)))


async def create_gang(kube: KubeApi, count: int, gang: str = "g") -> None:
    for i in range(count):
        await kube.create(RESOURCE_CLAIMS, claim(f"{gang}-w{i}-gpu"), "team-a")
    for i in range(count):
        await kube.create(PODS, dra_pod(f"{gang}-w{i}", [f"{gang}-w{i}-gpu"], gang=gang,
                                        min_member=count), "team-a")


def bound(api: ApiServerEmulator) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in api.objects("pods", "team-a")
            if p["spec"].get("nodeName")}


def devices(api: ApiServerEmulator) -> dict[str, tuple[str, list[str], list[str]]]:
    """claim → (pool, devices, reserved pod names) of every allocated claim."""
    out = {}
    for c in api.objects("resourceclaims", "team-a"):
        status = c.get("status") or {}
        if status.get("allocation"):
            results = status["allocation"]["devices"]["results"]
            out[c["metadata"]["name"]] = (results[0]["pool"], [r["device"] for r in results],
                                          [r["name"] for r in status.get("reservedFor") or ()])
    return out


def assert_no_gpu_twice(api: ApiServerEmulator) -> None:
    held = [(pool, d) for pool, names, _ in devices(api).values() for d in names]
    assert len(held) == len(set(held)), f"a GPU is allocated twice: {sorted(held)}"


class Recording(Binder):
    """Keeps the plan of every cycle that placed something, the pods its one-pod-per-node gate
    held, and how many cycles found a gang invalid (a member's claim not made yet)."""

    def __init__(self, api: KubeApi, config: BinderConfig) -> None:
        super().__init__(api, config)
        self.placing: list[Plan] = []
        self.gated: list[str] = []
        self.invalid = 0
        through = self.gate.bind

        async def gate(node_name: str, key: str, bind: Callable[[], Awaitable[None]]) -> None:
            self.gated.append(key)
            await through(node_name, key, bind)

        self.gate.bind = gate  # type: ignore[method-assign]

    def cycle(self) -> Plan:
        result = super().cycle()
        if result.places:
            self.placing.append(result)
        self.invalid += any(w.kind == "invalid" for w in result.waits)
        return result


async def test_a_gang_of_eight_dra_pods_is_placed_in_one_cycle_on_distinct_gpus(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    seed_dra_node(apiserver)
    binder = Recording(kube, CFG)
    async with serving(binder):
        await create_gang(kube, 8)
        await eventually(lambda: len(bound(apiserver)) == 8, within=10)
    assert len(binder.placing) == 1 and len(binder.placing[0].places[0].assignments) == 8
    assert binder.gated == []  # the kubelet names each claim to the driver: none waits
    allocated = devices(apiserver)
    assert sorted(d for _, names, _ in allocated.values() for d in names) == [
        f"gpu-{i}" for i in range(8)]
    for i in range(8):
        pool, _, reserved = allocated[f"g-w{i}-gpu"]
        assert pool == "dgx-a" and reserved == [f"g-w{i}"]
    for c in apiserver.objects("resourceclaims", "team-a"):  # as kube-scheduler's allocations
        assert c["metadata"]["finalizers"] == [keys.CLAIM_FINALIZER]
    for p in apiserver.objects("pods", "team-a"):  # the claims are the record
        assert keys.ANN_GPU_ASSIGNMENT not in p["metadata"]["annotations"]
        assert keys.ANN_GANG_PLACEMENT in p["metadata"]["annotations"]


class Racing(KubeApi):
    """Before the binder's allocation of `target` reaches the API server, someone else
    allocates that claim (as kube-scheduler would for a pod of its own)."""

    def __init__(self, base: KubeApi, target: str) -> None:
        super().__init__(base.client)
        self.target, self.raced = target, False

    async def replace(self, resource: Any, name: str, obj: Any, namespace: str | None = None,
                      **kw: Any) -> dict[str, Any]:
        if resource == RESOURCE_CLAIMS and name == self.target and not self.raced:
            self.raced = True
            theirs = await self.get(RESOURCE_CLAIMS, name, namespace)
            theirs["status"] = allocated_status({}, "dgx-a", [("gpus", 0)], "other", "uid-o")
            await super().replace(resource, name, theirs, namespace, subresource="status")
        return await super().replace(resource, name, obj, namespace, **kw)


async def test_a_conflict_on_one_claim_binds_nothing_and_releases_the_others(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    seed_dra_node(apiserver)
    api = Racing(kube, "g-w3-gpu")
    async with serving(Binder(api, CFG)):
        await create_gang(kube, 8)
        await eventually(lambda: api.raced and list(devices(apiserver)) == ["g-w3-gpu"],
                         what="every claim but the raced one released")
        await asyncio.sleep(0.5)  # the claim someone else allocated is not reused
        assert bound(apiserver) == {} and list(devices(apiserver)) == ["g-w3-gpu"]
        reasons = [e["message"] for e in apiserver.objects("events", "team-a")
                   if e["reason"] == "FailedScheduling"]
        assert any("ResourceClaim g-w3-gpu is already allocated" in m for m in reasons)
        # its owner lets go: the gang is planned again and placed whole
        theirs = await kube.get(RESOURCE_CLAIMS, "g-w3-gpu", "team-a")
        theirs["status"] = {}
        await kube.replace(RESOURCE_CLAIMS, "g-w3-gpu", theirs, "team-a", subresource="status")
        await eventually(lambda: len(bound(apiserver)) == 8, within=10)
    assert len(devices(apiserver)) == 8
    assert_no_gpu_twice(apiserver)


async def test_gpus_of_claims_someone_else_allocated_are_not_handed_out(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    seed_dra_node(apiserver)
    apiserver.seed(claim("theirs", count=2, status=allocated_status(
        {}, "dgx-a", [("gpus", 0), ("gpus", 1)], "other", "uid-o")))
    async with serving(Binder(kube, CFG)):
        await create_gang(kube, 7, "big")
        await create_gang(kube, 6, "fits")
        await eventually(lambda: len(bound(apiserver)) == 6)
        await asyncio.sleep(0.3)
    assert sorted(bound(apiserver)) == [f"fits-w{i}" for i in range(6)]
    assert_no_gpu_twice(apiserver)


class Crashing(KubeApi):
    """Kills the binder right after its n-th claim status write is answered: nothing after
    it is sent (claim writes go one at a time, each claim's finalizer before its status)."""

    def __init__(self, base: KubeApi, crash_after: int) -> None:
        super().__init__(base.client)
        self.crash_after, self.writes = crash_after, 0
        self.victim: asyncio.Task[None] | None = None
        self._wire = asyncio.Lock()

    async def replace(self, resource: Any, name: str, obj: Any, namespace: str | None = None,
                      **kw: Any) -> dict[str, Any]:
        async with self._wire:
            if self.writes >= self.crash_after:
                raise asyncio.CancelledError  # dead: never sent
            result = await super().replace(resource, name, obj, namespace, **kw)
            if kw.get("subresource") != "status":
                return result  # the finalizer added before the allocation
            self.writes += 1
            if self.writes == self.crash_after and self.victim is not None:
                self.victim.cancel()
            return result

    async def create_subresource(self, *args: Any, **kw: Any) -> dict[str, Any]:
        raise asyncio.CancelledError  # no Binding is ever sent


@pytest.mark.parametrize("written", [3, 8])
async def test_a_binder_killed_between_claims_and_bindings_leaves_no_gpu_twice(
        apiserver: ApiServerEmulator, kube: KubeApi, written: int) -> None:
    seed_dra_node(apiserver)
    await create_gang(kube, 8)
    api = Crashing(kube, written)
    binder = Binder(api, CFG)
    task = asyncio.create_task(binder.run())
    api.victim = task
    await asyncio.gather(task, return_exceptions=True)
    before = devices(apiserver)
    assert len(before) == written and bound(apiserver) == {}
    async with serving(Binder(kube, CFG)):  # its successor
        await eventually(lambda: len(bound(apiserver)) == 8, within=10)
    after = devices(apiserver)
    assert len(after) == 8
    assert_no_gpu_twice(apiserver)
    if written == 8:  # every claim was allocated: the gang is bound where they say
        assert after == before


async def test_a_claim_the_binder_cannot_allocate_is_an_event_and_a_condition(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    seed_dra_node(apiserver)
    await kube.create(RESOURCE_CLAIMS, claim("nic", device_class="nic.example.com"), "team-a")
    await kube.create(PODS, dra_pod("p", ["nic"]), "team-a")
    async with serving(Binder(kube, CFG)):
        event = await eventually(lambda: [e for e in apiserver.objects("events", "team-a")
                                          if e["reason"] == "FailedScheduling"])
        pod = await eventually(lambda: [p for p in apiserver.objects("pods", "team-a")
                                        if p["status"].get("conditions")])
    assert "asks for device class 'nic.example.com'" in event[0]["message"]
    (condition,) = pod[0]["status"]["conditions"]
    assert condition["reason"] == "Unschedulable" and bound(apiserver) == {}


async def create_template_gang(kube: KubeApi, count: int) -> None:
    """Gang `t` of `count` pods whose one claim comes from a ResourceClaimTemplate: their
    status names no claim yet."""
    for i in range(count):
        obj = dra_pod(f"t-w{i}", ["unused"], gang="t", min_member=count)
        obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        obj["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
        await kube.create(PODS, obj, "team-a")


async def make_template_claims(kube: KubeApi, count: int) -> None:
    """What the resourceclaim controller does for gang `t`: each claim, then the pod's status
    naming it."""
    for i in range(count):
        await kube.create(RESOURCE_CLAIMS, claim(f"t-w{i}-gpu-x1"), "team-a")
        obj = await kube.get(PODS, f"t-w{i}", "team-a")
        obj["status"]["resourceClaimStatuses"] = [{"name": "gpu",
                                                   "resourceClaimName": f"t-w{i}-gpu-x1"}]
        await kube.replace(PODS, f"t-w{i}", obj, "team-a", subresource="status")


async def test_pods_whose_template_claims_are_not_made_yet_wait_then_go_whole(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    """Found on the real kubelet: pods from a ResourceClaimTemplate reach the binder before the
    resourceclaim controller made their claims (status.resourceClaimStatuses empty). They must
    wait, not be bound as pods without GPUs; once the claims exist and are named, the gang is
    placed whole with them."""
    seed_dra_node(apiserver)
    async with serving(Binder(kube, CFG)):
        await create_template_gang(kube, 4)
        await asyncio.sleep(1.0)  # several cycles
        assert bound(apiserver) == {}
        await make_template_claims(kube, 4)
        await eventually(lambda: len(bound(apiserver)) == 4, within=10)
    allocated = devices(apiserver)
    assert sorted(allocated) == [f"t-w{i}-gpu-x1" for i in range(4)]
    assert all(reserved == [f"t-w{i}"] for i, (_, _, reserved) in
               enumerate(allocated[k] for k in sorted(allocated)))
    assert_no_gpu_twice(apiserver)


async def test_a_gang_waiting_for_its_claims_is_placed_as_they_appear_not_after_a_backoff(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    """Found on the real kubelet (61.8 s from last create to Running): every cycle that found
    the gang without its template claims counted as a failed placement, so by the time the
    claims came its backoff had grown to the 60 s maximum. Waiting for its own objects is no
    failed try: with the default backoff (1 s doubling to 60 s) and a dozen cycles that found
    it invalid, it is placed within seconds of its claims."""
    seed_dra_node(apiserver)
    binder = Recording(kube, BinderConfig(event_interval=60))
    async with serving(binder):
        await create_template_gang(kube, 4)
        for i in range(12):  # other pods arriving: each a cycle that finds the gang invalid
            await kube.create(PODS, pod(f"other-{i}", scheduler="default-scheduler"), "team-a")
            await eventually(lambda n=i: binder.invalid > n, within=5)
        await make_template_claims(kube, 4)
        await eventually(lambda: len([n for n in bound(apiserver) if n.startswith("t-")]) == 4,
                         within=5)
    assert_no_gpu_twice(apiserver)


class Forbidding(KubeApi):
    """Refuses every update of a claim's metadata (the finalizer), as an API server whose
    binder role lacks `update` on resourceclaims does, until told otherwise."""

    def __init__(self, base: KubeApi) -> None:
        super().__init__(base.client)
        self.refusing, self.refused = True, 0

    async def replace(self, resource: Any, name: str, obj: Any, namespace: str | None = None,
                      **kw: Any) -> dict[str, Any]:
        if self.refusing and resource == RESOURCE_CLAIMS and "subresource" not in kw:
            self.refused += 1
            raise ApiError(403, "Forbidden", f'resourceclaims "{name}" is forbidden')
        return await super().replace(resource, name, obj, namespace, **kw)


async def test_a_refused_claim_write_backs_off_says_why_and_binds_nothing(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    """Found on the real cluster, with a role missing `update` on claims: every refusal let go
    of the gang's planned claims, which made it due again at once, so it was retried as fast
    as the API answered, with nothing said. A refusal that is no conflict now backs off (each
    release of its claims notwithstanding) and is a FailedScheduling Event with the error."""
    seed_dra_node(apiserver)
    api = Forbidding(kube)
    async with serving(Binder(api, BinderConfig(backoff_initial=0.4, backoff_max=0.4,
                                                event_interval=60))):
        await create_gang(kube, 4)
        await eventually(lambda: api.refused > 0)
        await asyncio.sleep(1.0)
        # one gang's claims per try: 4 refusals at 0 s, 0.4 s, 0.8 s (and perhaps 1.2 s)
        assert 0 < api.refused <= 16, api.refused
        assert bound(apiserver) == {} and devices(apiserver) == {}
        events = [e["message"] for e in apiserver.objects("events", "team-a")
                  if e["reason"] == "FailedScheduling"]
        assert any("a write was refused: 403 Forbidden" in m for m in events), events
        api.refusing = False
        await eventually(lambda: len(bound(apiserver)) == 4, within=5)
    assert_no_gpu_twice(apiserver)
