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


def lease(identity: str, release: bool = True) -> LeaseConfig:
    return LeaseConfig("muster-binder", "default", identity, DURATION, DEADLINE, RETRY, release)


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

    a, b = LeaderElector(kube, lease("a")), LeaderElector(kube, lease("b"))
    ta = asyncio.create_task(a.run(work("a")))  # type: ignore[arg-type]
    await eventually(lambda: a.is_leader)
    tb = asyncio.create_task(b.run(work("b")))  # type: ignore[arg-type]
    await asyncio.sleep(DURATION * 1.5)  # well past a lease duration: a keeps renewing
    assert a.is_leader and not b.is_leader and led == {"a": 1, "b": 0}
    spec = apiserver.get("leases", "muster-binder", "default")["spec"]  # type: ignore[index]
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 1
    assert spec["leaseTransitions"] == 0 and spec["renewTime"].endswith("Z")

    started = time.monotonic()
    ta.cancel()
    await asyncio.gather(ta, return_exceptions=True)
    await eventually(lambda: b.is_leader, within=DURATION)
    assert time.monotonic() - started < DURATION  # released: no need to wait for expiry
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
    await eventually(lambda: b.is_leader, within=DURATION + 4 * RETRY)
    waited = time.monotonic() - started
    # b measures expiry from when it last saw a renewal (client-go semantics): at most one
    # retry period before the crash, plus one retry period to notice
    assert DURATION - 2 * RETRY <= waited <= DURATION + 4 * RETRY
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
    started = time.monotonic()
    await asyncio.wait_for(stopped.wait(), DEADLINE + 2 * RETRY)
    assert time.monotonic() - started <= DEADLINE + 2 * RETRY
    assert not a.is_leader
    ta.cancel()
    await asyncio.gather(ta, return_exceptions=True)


async def test_two_binder_replicas_only_the_leader_binds(apiserver: ApiServerEmulator,
                                                         kube: KubeApi) -> None:
    apiserver.seed(node("dgx-a"))
    apiserver.seed(node("dgx-b"))
    cfg = BinderConfig(backoff_initial=0.05)
    one = BinderService(kube, ServiceConfig(cfg, lease("one")))
    two = BinderService(kube, ServiceConfig(cfg, lease("two")))
    t1 = asyncio.create_task(one.run())
    await eventually(lambda: holder(apiserver) == "one")
    t2 = asyncio.create_task(two.run())
    for p in job("j1"):
        await kube.create(PODS, p)
    await eventually(lambda: all(p["spec"].get("nodeName") for p in apiserver.objects("pods")))
    await eventually(lambda: bindings(one) == 5)  # the counter follows the last response
    assert one.terms == 1 and two.terms == 0 and two.binder is None and bindings(two) == 0

    started = time.monotonic()
    t1.cancel()  # graceful stop: releases the Lease
    await asyncio.gather(t1, return_exceptions=True)
    await eventually(lambda: two.binder is not None and two.binder.synced.is_set(),
                     within=DURATION)
    assert time.monotonic() - started < DURATION
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
