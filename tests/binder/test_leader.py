"""Leader election on a coordination.k8s.io/v1 Lease, and two binder replicas."""

from __future__ import annotations

import asyncio
import time

import pytest
from binder_objects import job, node

from e2e.probes import eventually
from webhook.binder.controller import BinderConfig
from webhook.binder.service import BinderService, ServiceConfig
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi
from webhook.kube.api import LEASES, PODS
from webhook.kube.leader import LeaderElector, LeaseConfig

DURATION, DEADLINE, RETRY = 1.0, 0.6, 0.1
#: a Lease a successor could not take before it expires in a test's time: a handover within
#: it is the release's doing, however slow the machine
LONG = 60.0


def lease(identity: str, release: bool = True, duration: float = DURATION) -> LeaseConfig:
    return LeaseConfig("muster-binder", "default", identity, duration, DEADLINE * duration,
                       RETRY, release)


def holder(api: ApiServerEmulator) -> str | None:
    obj = api.get("leases", "muster-binder", "default")
    return None if obj is None else obj["spec"].get("holderIdentity")


def test_lease_timings_are_validated() -> None:
    with pytest.raises(ValueError, match="retry_period < renew_deadline < lease_duration"):
        LeaseConfig("l", "default", "me", lease_duration=5, renew_deadline=5, retry_period=1)


async def test_one_leader_then_graceful_release_hands_over_at_once(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    led: dict[str, int] = {"a": 0, "b": 0}

    def work(name: str) -> object:
        async def run() -> None:
            led[name] += 1
            await asyncio.Event().wait()
        return run

    a = LeaderElector(kube, lease("a", duration=LONG))
    b = LeaderElector(kube, lease("b", duration=LONG))
    ta = asyncio.create_task(a.run(work("a")))  # type: ignore[arg-type]
    await eventually(lambda: a.is_leader)
    tb = asyncio.create_task(b.run(work("b")))  # type: ignore[arg-type]
    await asyncio.sleep(10 * RETRY)  # b has asked ten times
    assert a.is_leader and not b.is_leader and led == {"a": 1, "b": 0}
    spec = apiserver.get("leases", "muster-binder", "default")["spec"]  # type: ignore[index]
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == LONG
    assert spec["leaseTransitions"] == 0 and spec["renewTime"].endswith("Z")

    ta.cancel()
    await asyncio.gather(ta, return_exceptions=True)
    # released: b need not wait the minute until the Lease expires
    await eventually(lambda: b.is_leader, within=LONG / 4)
    assert holder(apiserver) == "b" and led["b"] == 1
    assert apiserver.get("leases", "muster-binder", "default")["spec"][  # type: ignore[index]
        "leaseTransitions"] == 1
    tb.cancel()
    await asyncio.gather(tb, return_exceptions=True)
    assert not holder(apiserver)  # released on the way out


async def test_crashed_leader_is_replaced_after_the_lease_expires(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    async def idle() -> None:
        await asyncio.Event().wait()

    a = LeaderElector(kube, lease("a", release=False))
    b = LeaderElector(kube, lease("b"))
    ta = asyncio.create_task(a.run(idle))
    await eventually(lambda: a.is_leader)
    tb = asyncio.create_task(b.run(idle))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    ta.cancel()  # no release: as if the process died
    await asyncio.gather(ta, return_exceptions=True)
    assert holder(apiserver) == "a"
    await eventually(lambda: b.is_leader, within=10 * DURATION)
    waited = time.monotonic() - started
    # not before the Lease expired: b measures expiry from when it last saw a renewal
    # (client-go semantics), at most one retry period before the crash (a slow machine only
    # makes b later)
    assert waited >= DURATION - 2 * RETRY
    tb.cancel()
    await asyncio.gather(tb, return_exceptions=True)


async def test_work_stops_when_the_lease_is_taken_away(apiserver: ApiServerEmulator,
                                                       kube: KubeApi) -> None:
    stopped = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    a = LeaderElector(kube, lease("a"))
    ta = asyncio.create_task(a.run(work))
    await eventually(lambda: a.is_leader)
    for _ in range(20):  # an intruder keeps writing the Lease (e.g. an operator's kubectl)
        obj = await kube.get(LEASES, "muster-binder", "default")
        obj["spec"]["holderIdentity"] = "intruder"
        obj["spec"]["renewTime"] = obj["spec"]["renewTime"]  # unchanged time, new holder
        try:
            await kube.replace(LEASES, "muster-binder", obj, "default")
            break
        except Exception:  # a renewal raced us: read again
            await asyncio.sleep(0.01)
    # its next renewal sees the intruder, and the work stops
    await asyncio.wait_for(stopped.wait(), 10 * DURATION)
    assert not a.is_leader
    ta.cancel()
    await asyncio.gather(ta, return_exceptions=True)


async def test_two_binder_replicas_only_the_leader_binds(apiserver: ApiServerEmulator,
                                                         kube: KubeApi) -> None:
    apiserver.seed(node("dgx-a"))
    apiserver.seed(node("dgx-b"))
    cfg = BinderConfig(backoff_initial=0.05)
    one = BinderService(kube, ServiceConfig(cfg, lease("one", duration=LONG)))
    two = BinderService(kube, ServiceConfig(cfg, lease("two", duration=LONG)))
    t1 = asyncio.create_task(one.run())
    await eventually(lambda: holder(apiserver) == "one")
    t2 = asyncio.create_task(two.run())
    for p in job("j1"):
        await kube.create(PODS, p)
    await eventually(lambda: all(p["spec"].get("nodeName") for p in apiserver.objects("pods")))
    await eventually(lambda: bindings(one) == 5)  # the counter follows the last response
    assert one.terms == 1 and two.terms == 0 and two.binder is None and bindings(two) == 0

    t1.cancel()  # graceful stop: releases the Lease, so two need not wait the minute
    await asyncio.gather(t1, return_exceptions=True)
    await eventually(lambda: two.binder is not None and two.binder.synced.is_set(),
                     within=LONG / 4)
    for p in job("j2"):
        await kube.create(PODS, p)
    await eventually(lambda: all(p["spec"].get("nodeName") for p in apiserver.objects("pods")))
    await eventually(lambda: bindings(two) == 5)
    assert bindings(one) == 5
    assert sample(one, "muster_binder_leader") == 0 and sample(two, "muster_binder_leader") == 1
    t2.cancel()
    await asyncio.gather(t2, return_exceptions=True)


def sample(service: BinderService, name: str) -> float:
    return sum(s.value for metric in service.metrics.registry.collect()
               for s in metric.samples if s.name == name)


def bindings(service: BinderService) -> float:
    return sample(service, "muster_binder_bindings_total")
