"""Must show: kill the binder at random points while 50 gangs are being placed, restart it, and
check every pod: no GPU assigned twice, no gang left bound below minMember."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
from collections import defaultdict
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from binder_objects import gpu_claims, node, pod

from e2e.probes import eventually
from webhook import keys
from webhook.binder.controller import Binder, BinderConfig
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi
from webhook.kube.api import PODS

REPO = Path(__file__).resolve().parents[2]
CFG = BinderConfig(backoff_initial=0.05, backoff_max=0.2, event_interval=60)


def gangs(rng: random.Random, count: int = 50) -> list[dict[str, Any]]:
    """Jobs of 1-4 workers with 1-2 GPUs each, plus a launcher for some: more than fits."""
    pods = []
    for g in range(count):
        workers, gpus = rng.randint(1, 4), rng.choice((1, 1, 2))
        launcher = rng.random() < 0.5
        members = workers + launcher
        name = f"g{g:02d}"
        pods += [pod(f"{name}-w{i}", gang=name, min_member=members, gpus=gpus, cpu="2")
                 for i in range(workers)]
        if launcher:
            pods.append(pod(f"{name}-launcher", gang=name, min_member=members, gpus=0))
    rng.shuffle(pods)
    return pods


def check_invariants(api: ApiServerEmulator, settled: bool) -> dict[str, int]:
    pods = api.objects("pods", "team-a")
    claims = gpu_claims(pods)
    seen: dict[tuple[str, int], str] = {}
    for node_name, index, name in claims:
        assert (node_name, index) not in seen, \
            f"GPU {index} on {node_name} assigned to {seen[(node_name, index)]} and {name}"
        seen[(node_name, index)] = name
    by_gang: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in pods:
        by_gang[p["metadata"]["annotations"][keys.ANN_GANG_NAME]].append(p)
    state = {"bound": 0, "pending": 0, "partial": 0}
    for gang, members in by_gang.items():
        minimum = int(members[0]["metadata"]["annotations"][keys.ANN_GANG_MIN_MEMBER])
        bound = [p for p in members if p["spec"].get("nodeName")]
        annotated = [p for p in members
                     if keys.ANN_GPU_ASSIGNMENT in p["metadata"]["annotations"]]
        recorded = {name for p in bound for name in json.loads(p["metadata"]["annotations"].get(
            keys.ANN_GANG_PLACEMENT, '{"members": {}}'))["members"]}
        for p in bound:
            assert keys.ANN_GPU_ASSIGNMENT in p["metadata"]["annotations"], \
                f"{p['metadata']['name']} bound without an assignment"
        unreserved = [p["metadata"]["name"] for p in members
                      if not p["spec"].get("nodeName") and p["metadata"]["name"] not in recorded]
        if bound and len(bound) < minimum:
            # only possible between a crash and recovery: the bound members' record must
            # reserve every other member, so that recovery can finish the gang
            assert not settled, f"gang {gang} ended with {len(bound)}/{minimum} bound"
            assert not unreserved, f"gang {gang} partially bound, {unreserved} unreserved"
        if settled:
            assert len(bound) in (0, len(members)), f"gang {gang}: {len(bound)} bound"
        assert len(annotated) == len(bound), f"gang {gang}: an unbound member was annotated"
        state["bound" if bound else "pending"] += 1
        state["partial"] += 0 < len(bound) < len(members)
    return state


def settled(api: ApiServerEmulator) -> bool:
    try:
        check_invariants(api, settled=True)
    except AssertionError:
        return False
    return True


class CrashingApi(KubeApi):
    """Kills the binder right after its n-th pod write (a Binding, or a patch) is answered. The
    writes go out one at a time, as over a slow link, so that a kill can fall between two
    Bindings of one gang (the binder sends them together): after it nothing more is sent."""

    def __init__(self, base: KubeApi, crash_after: int) -> None:
        super().__init__(base.client)
        self.crash_after = crash_after
        self.writes = 0
        self.victim: asyncio.Task[None] | None = None
        self._wire = asyncio.Lock()

    async def _write(self, send: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
        try:
            await self._wire.acquire()
        except asyncio.CancelledError:
            send.close()
            raise
        try:
            if self.writes >= self.crash_after:
                send.close()
                raise asyncio.CancelledError  # dead: never sent
            result = await send
            self.writes += 1
            if self.writes == self.crash_after and self.victim is not None:
                self.victim.cancel()
            return result
        finally:
            self._wire.release()

    async def patch(self, resource: Any, name: str, patch: Any, namespace: str | None = None,
                    **kw: Any) -> dict[str, Any]:
        send = super().patch(resource, name, patch, namespace, **kw)
        if resource == PODS and kw.get("subresource") is None:
            return await self._write(send)
        return await send

    async def create_subresource(self, resource: Any, name: str, subresource: str,
                                 body: Any, namespace: str | None = None) -> dict[str, Any]:
        return await self._write(
            super().create_subresource(resource, name, subresource, body, namespace))


async def test_killing_the_binder_at_random_points_never_breaks_a_gang(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    rng = random.Random(5)
    for n in range(6):
        apiserver.seed(node(f"dgx-{n}"))
    await create_all(kube, gangs(rng))
    interrupted = 0
    for _ in range(16):
        api = CrashingApi(kube, crash_after=rng.randint(1, 14))
        binder = Binder(api, CFG)
        task = asyncio.create_task(binder.run())
        api.victim = task
        # also kill by the clock now and then, wherever the binder happens to be
        await asyncio.wait({task}, timeout=rng.uniform(0.05, 1.0))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        after = check_invariants(apiserver, settled=False)
        interrupted += after["partial"] > 0
        if after["pending"] > after["bound"]:
            await finish_some_jobs(apiserver, kube, rng, 0.2)  # jobs end, placements resume
    assert interrupted > 0, "no kill landed between two Bindings of one gang"
    binder = Binder(kube, CFG)
    task = asyncio.create_task(binder.run())
    try:
        await eventually(lambda: settled(apiserver) and binder.synced.is_set()
                         and not binder.writing, within=20)
        await asyncio.sleep(0.3)
        state = check_invariants(apiserver, settled=True)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert state["bound"] > 0 and state["pending"] > 0


async def finish_some_jobs(api: ApiServerEmulator, kube: KubeApi, rng: random.Random,
                           share: float) -> None:
    """Delete every pod of some gangs that have a bound member (whole jobs end)."""
    pods = api.objects("pods", "team-a")
    running = {p["metadata"]["annotations"][keys.ANN_GANG_NAME] for p in pods
               if p["spec"].get("nodeName")}
    done = {g for g in sorted(running) if rng.random() < share}
    for p in pods:
        if p["metadata"]["annotations"][keys.ANN_GANG_NAME] in done:
            await kube.delete(PODS, p["metadata"]["name"], "team-a")


async def create_all(kube: KubeApi, pods: list[dict[str, Any]]) -> None:
    for p in pods:
        await kube.create(PODS, p)
        await asyncio.sleep(0.005)


async def test_sigkill_of_the_binder_process(apiserver: ApiServerEmulator, kubeconfig: Path,
                                             kube: KubeApi) -> None:
    """The same with a real process and SIGKILL: no finally blocks, no cleanup."""
    rng = random.Random(11)
    for n in range(4):
        apiserver.seed(node(f"dgx-{n}"))
    for p in gangs(rng, 30):
        await kube.create(PODS, p)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for _ in range(4):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "webhook", "bind", "--kubeconfig", str(kubeconfig),
            "--backoff-max", "0.2", env=env, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
        # let it start up, then kill it somewhere in its first placements
        await eventually(lambda: any(p["spec"].get("nodeName")
                                     for p in apiserver.objects("pods", "team-a")), within=20)
        await asyncio.sleep(rng.uniform(0.0, 0.1))
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        check_invariants(apiserver, settled=False)
        await finish_some_jobs(apiserver, kube, rng, 0.5)  # room for the next round
    binder = Binder(kube, CFG)
    task = asyncio.create_task(binder.run())
    try:
        await eventually(lambda: settled(apiserver) and binder.synced.is_set()
                         and not binder.writing, within=20)
        check_invariants(apiserver, settled=True)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
