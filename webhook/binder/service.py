"""`muster bind` as a process: API client, optional leader election, metrics endpoint.

Each leadership term runs a fresh Binder, whose state is rebuilt from the cluster: taking over
from a dead leader is exactly the restart path (recovery rule in webhook.binder.planner).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from dataclasses import dataclass

from aiohttp import web

from webhook.binder.controller import Binder, BinderConfig
from webhook.binder.heap import HeapFreezer
from webhook.binder.metrics import CONTENT_TYPE_LATEST, Metrics
from webhook.kube.api import KubeApi
from webhook.kube.client import make_api_client
from webhook.kube.leader import LeaderElector, LeaseConfig
from webhook.signals import until_signalled

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    binder: BinderConfig
    lease: LeaseConfig | None = None  # None: no leader election (a single replica)
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"  # scraped from other pods


class BinderService:
    def __init__(self, api: KubeApi, config: ServiceConfig) -> None:
        self.api, self.config = api, config
        self.binder: Binder | None = None  # the current term's binder while leading
        self.metrics = Metrics(node_gpus=lambda: self.binder.gpu_counts() if self.binder
                               else {})
        self.elector = (LeaderElector(api, config.lease,
                                      on_started=lambda: self.metrics.is_leader.set(1),
                                      on_stopped=lambda: self.metrics.is_leader.set(0))
                        if config.lease is not None else None)
        self.terms = 0

    def _fence(self) -> bool:
        return self.elector is None or self.elector.is_leader

    async def _term(self) -> None:
        self.terms += 1
        binder = self.binder = Binder(self.api, self.config.binder, metrics=self.metrics,
                                      fence=self._fence)
        freeze = asyncio.create_task(_freeze_when_synced(binder))
        try:
            await binder.run()
        finally:
            self.binder = None
            freeze.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await freeze
            gc.unfreeze()  # the term's caches may be collected once it is over

    async def run(self) -> None:
        runner = await self._serve_metrics() if self.config.metrics_port is not None else None
        try:
            if self.elector is None:
                self.metrics.is_leader.set(1)
                await self._term()
            else:
                await self.elector.run(self._term)
        finally:
            if runner is not None:
                await runner.cleanup()

    async def _serve_metrics(self) -> web.AppRunner:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=self.metrics.render(),
                                headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", healthz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.config.metrics_host, self.config.metrics_port)
        await site.start()
        log.info("metrics listening", extra={"port": self.config.metrics_port})
        return runner


async def _freeze_when_synced(binder: Binder) -> None:
    """Once the informers have synced, move the caches (nodes, pods, choice tables) out of the
    cyclic GC's way: a full collection then scans only what the cycles allocate, not the whole
    heap (it paused the binder for up to 75 ms with 500 nodes, the slowest gangs of an arrival
    run). Objects are still freed by reference counting. Then, what the planning cycles build
    over the node set is frozen too, once a full collection finds it slow (`heap`); this task
    runs only between cycles (a cycle does not await)."""
    await binder.synced.wait()
    gc.freeze()
    log.debug("synced heap frozen for the garbage collector",
              extra={"objects": gc.get_freeze_count()})
    with HeapFreezer() as freezer:
        while True:
            await asyncio.sleep(1.0)
            if freezer.settle():
                log.debug("heap frozen after a slow full collection",
                          extra={"objects": gc.get_freeze_count()})


async def serve(kubeconfig: str | None, config: ServiceConfig) -> None:
    """Run until SIGTERM/SIGINT; the leader releases its Lease on the way out."""
    client = await make_api_client(kubeconfig)
    try:
        await until_signalled(BinderService(KubeApi(client), config).run())
    finally:
        await client.close()
