"""Running a Binder against the emulator for the length of a test body, and what it bound;
or one planning cycle over raw objects, and where it put each pod."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from webhook import keys
from webhook.binder.controller import Binder
from webhook.binder.fit import FitCache
from webhook.binder.nodes import parse_node
from webhook.binder.planner import Plan, PlanConfig, plan
from webhook.binder.pods import parse_pod
from webhook.binder.queue import GangQueue
from webhook.doubles.emulator import ApiServerEmulator
from webhook.topology.hierarchy import place_gang

#: the planning cycle's config when a test names none
CFG = PlanConfig(scheduler_name=keys.DEFAULT_BINDER_SCHEDULER_NAME)


def planned(pods: list[dict[str, Any]], objs: list[dict[str, Any]],
            config: PlanConfig = CFG, fit: FitCache | None = None) -> Plan:
    """One planning cycle from scratch over the pods and nodes, as raw objects (with `fit`:
    that cache, to see what it kept)."""
    return plan([parse_pod(p) for p in pods],
                {n["metadata"]["name"]: parse_node(n) for n in objs}, None, config=config,
                queue=GangQueue(), fit=fit or FitCache(), place=place_gang, now=1795237200.0)


def where(p: Plan) -> dict[str, str]:
    """pod name -> the node the plan puts it on."""
    return {pd.name: a.node for place in p.places for pd, a in place.assignments}


@asynccontextmanager
async def serving(binder: Binder, within: float = 5.0) -> AsyncIterator[Binder]:
    """`binder` running and synced for the body, stopped after it. A binder that fails before
    it has synced fails the test with its own error, not with a timeout."""
    task = asyncio.create_task(binder.run())
    synced = asyncio.create_task(binder.synced.wait())
    try:
        done, _ = await asyncio.wait({task, synced}, timeout=within,
                                     return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()  # its error, if it raised
            raise AssertionError("the binder stopped before it synced")
        if synced not in done:
            raise AssertionError(f"the binder did not sync within {within} s")
        yield binder
    finally:
        synced.cancel()
        task.cancel()
        await asyncio.gather(task, synced, return_exceptions=True)


def bound(apiserver: ApiServerEmulator, prefix: str, ns: str = "team-a") -> set[str]:
    """The nodes of the pods named `prefix...` in `ns`, once every one is bound (else none)."""
    found = {p["spec"].get("nodeName") for p in apiserver.objects("pods", ns)
             if p["metadata"]["name"].startswith(prefix)}
    return found if found and None not in found else set()
