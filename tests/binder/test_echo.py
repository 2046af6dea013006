"""An update the planner cannot act on (the echo of our own write, a resourceVersion bump)
starts no scheduling cycle; one it can act on still does."""

from __future__ import annotations

import asyncio

from binder_objects import job, node, pod

from e2e.probes import eventually
from webhook import keys
from webhook.binder.controller import Binder
from webhook.binder.pods import parse_pod, parse_time
from webhook.binder.snapshot import Snapshot
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi
from webhook.kube.api import PODS


def test_put_says_whether_a_plan_can_see_the_change() -> None:
    snap = Snapshot("muster-binder")
    first = parse_pod(pod("a", gang="g", gpus=1, rv="1"))
    assert snap.put(first)  # new
    assert not snap.put(first)  # the same object
    assert not snap.put(parse_pod(pod("a", gang="g", gpus=1, rv="7")))  # only its version
    bound = pod("a", gang="g", gpus=1, rv="8", node_name="dgx-a", phase="Running",
                started="2026-11-21T05:00:00Z")
    assert snap.put(parse_pod(bound))
    # its job says when it last saved: the gang's price as a victim, read at the next cycle
    # that something else starts, never a cycle of its own
    bound["metadata"]["annotations"][keys.ANN_LAST_CHECKPOINT] = "2026-11-21T06:00:00Z"
    bound["metadata"]["resourceVersion"] = "9"
    assert not snap.put(parse_pod(bound))
    (gang,) = snap.running_gangs(None, 0).values()
    assert [m.checkpointed for m in gang.members] == [parse_time("2026-11-21T06:00:00Z")]


async def test_an_update_the_planner_cannot_use_starts_no_cycle(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    apiserver.seed(node("dgx-a"))
    b = Binder(kube)
    task = asyncio.create_task(b.run())
    try:
        for p in job("j1"):
            await kube.create(PODS, p)
        await eventually(lambda: all(p["spec"].get("nodeName")
                                     for p in apiserver.objects("pods")))
        await asyncio.sleep(0.3)  # the informer shows the Bindings; their cycles run
        before = _count(b)
        await kube.patch(PODS, "j1-launcher", {"metadata": {"annotations": {"note": "x"}}},
                         "team-a")
        await kube.patch(PODS, "j1-worker-0", {"metadata": {"annotations": {
            keys.ANN_LAST_CHECKPOINT: "2026-11-21T06:00:00Z"}}}, "team-a")
        await asyncio.sleep(0.3)
        assert _count(b) == before
        await kube.patch(PODS, "j1-launcher", {"metadata": {"labels": {  # a gang field
            keys.COSCHEDULING_GROUP_LABEL: "other"}}}, "team-a")
        await eventually(lambda: _count(b) > before)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _count(b: Binder) -> float:
    return next(s.value for m in b.metrics.cycle_seconds.collect() for s in m.samples
                if s.name.endswith("_count"))
