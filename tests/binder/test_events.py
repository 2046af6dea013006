"""What a waiting gang tells its users: Events and the PodScheduled condition."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from binder_objects import job, node, pod
from binder_run import serving

from e2e.probes import eventually
from webhook import keys
from webhook.binder.controller import Binder, BinderConfig
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi
from webhook.kube.api import PODS


def events(api: ApiServerEmulator, reason: str, prefix: str) -> list[dict[str, Any]]:
    return [e for e in api.objects("events", "team-a")
            if e["reason"] == reason and e["involvedObject"]["name"].startswith(prefix)]


async def test_timeout_and_invalid_gangs_are_reported(apiserver: ApiServerEmulator,
                                                      kube: KubeApi) -> None:
    apiserver.seed(node("dgx-a"))
    b = Binder(kube, BinderConfig(backoff_initial=0.05, backoff_max=0.2))
    async with serving(b):
        for p in job("late", timeout=1)[:3]:  # 3 of 5 members ever arrive
            await kube.create(PODS, p)
        bad = pod("bad-0", gang="bad", gpus=1)
        bad["metadata"]["annotations"][keys.ANN_GANG_MIN_MEMBER] = "lots"
        await kube.create(PODS, bad)
        invalid = await eventually(lambda: events(apiserver, "FailedScheduling", "bad-0"))
        assert "gang-min-member must be an integer" in invalid[0]["message"]
        timed_out = await eventually(lambda: len(events(apiserver, "GangScheduleTimeout",
                                                        "late")) == 3
                                     and events(apiserver, "GangScheduleTimeout", "late"),
                                     within=5)
        assert {e["involvedObject"]["name"] for e in timed_out} == {
            "late-worker-0", "late-worker-1", "late-worker-2"}
        assert "not scheduled within 1s" in timed_out[0]["message"]
        assert "3 of minMember 5" in timed_out[0]["message"]
        cond = await eventually(lambda: next((
            c for c in (apiserver.get("pods", "late-worker-0", "team-a") or {}).get(
                "status", {}).get("conditions") or () if c["type"] == "PodScheduled"), None))
        assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
        before = cycles(b)
        await asyncio.sleep(0.5)  # reported once, not on every cycle; and no busy loop
        assert cycles(b) - before < 25, "the binder spins while gangs wait"
        assert len(events(apiserver, "GangScheduleTimeout", "late-worker-0")) == 1
        assert events(apiserver, "GangScheduleTimeout", "late-worker-0")[0]["count"] == 1
        assert not any(p["spec"].get("nodeName") for p in apiserver.objects("pods"))


async def test_a_gang_short_of_members_says_so_once_it_is_old_enough(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    """A gang that lost a member (another controller failed it) or never got one waits for it:
    said once the gang is `members_event_after` old (before, its pods may still be coming),
    with the binder woken for it, then once an interval."""
    apiserver.seed(node("dgx-a"))
    b = Binder(kube, BinderConfig(members_event_after=2.0))
    created = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    async with serving(b):
        for p in job("short", workers=2, created=created)[:2]:  # 2 of its 3 members
            await kube.create(PODS, p)
        await asyncio.sleep(0.3)
        assert events(apiserver, "FailedScheduling", "short") == []  # young: they may come
        said = await eventually(lambda: len(events(apiserver, "FailedScheduling", "short")) == 2
                                and events(apiserver, "FailedScheduling", "short"), within=5)
        assert {e["message"] for e in said} == {
            "gang team-a/short cannot be placed: waiting for members: 2 of minMember 3 exist"}
        cond = await eventually(lambda: next((
            c for c in (apiserver.get("pods", "short-worker-0", "team-a") or {}).get(
                "status", {}).get("conditions") or () if c["type"] == "PodScheduled"), None))
        assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
        assert "2 of minMember 3" in cond["message"]
        await asyncio.sleep(0.3)  # once an interval (30 s), not on every cycle
        assert [e["count"] for e in events(apiserver, "FailedScheduling", "short")] == [1, 1]
        assert not any(p["spec"].get("nodeName") for p in apiserver.objects("pods"))


def cycles(b: Binder) -> float:
    return sum(s.value for m in b.metrics.registry.collect() for s in m.samples
               if s.name == "muster_binder_cycle_duration_seconds_count")


async def test_reports_go_out_report_concurrency_at_a_time_and_all_get_written(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    for n in ("dgx-a", "dgx-b"):
        apiserver.seed(node(n))
    b = Binder(kube, BinderConfig(report_concurrency=1))
    running = peak = 0
    emit = b.recorder.emit

    async def counted(*args: Any) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await asyncio.sleep(0.01)  # a slow Event write
            await emit(*args)
        finally:
            running -= 1

    b.recorder.emit = counted  # type: ignore[method-assign]
    async with serving(b):
        for p in job("j1") + job("j2"):
            await kube.create(PODS, p)
        await eventually(lambda: len(events(apiserver, "Scheduled", "j")) == 10, within=5)
        assert peak == 1
        assert all(p["spec"].get("nodeName") for p in apiserver.objects("pods"))
