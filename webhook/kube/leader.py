"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics.

A candidate takes the Lease when it is free, released (empty holderIdentity) or not renewed for
leaseDurationSeconds as observed on the candidate's own clock (clocks of replicas are never
compared). Every write carries the resourceVersion read just before, so two candidates racing
for the same Lease cannot both win: the loser gets 409 Conflict. The leader renews every
`retry_period`; when it has not managed to renew for `renew_deadline` it stops leading at once
(its work is cancelled before another replica can take over, because renew_deadline <
lease_duration). On graceful shutdown the leader releases the Lease so a standby takes over at
once instead of after the lease duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from webhook.kube.api import LEASES, ApiError, KubeApi
from webhook.kube.times import micro_time

log = logging.getLogger(__name__)

Work = Callable[[], Coroutine[Any, Any, None]]


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    name: str
    namespace: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    #: release the Lease when stopped (graceful shutdown); a crash never releases
    release_on_stop: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("need 0 < retry_period < renew_deadline < lease_duration")


class LeaderElector:
    """`await elector.run(work)`: campaign, run `work()` while leading, cancel it the moment
    leadership is lost, campaign again; until cancelled (then release if configured)."""

    def __init__(self, api: KubeApi, config: LeaseConfig,
                 on_started: Callable[[], None] | None = None,
                 on_stopped: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.config = api, config
        self.on_started, self.on_stopped = on_started, on_stopped
        self._clock = clock
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # last successful acquire/renew, local clock

    @property
    def is_leader(self) -> bool:
        """True only while our last renewal is recent enough that nobody else can hold it."""
        return (self._renewed_at is not None
                and self._clock() - self._renewed_at < self.config.renew_deadline)

    async def run(self, work: Work) -> None:
        try:
            while True:
                await self._acquire()
                await self._lead(work)
        finally:
            if self._renewed_at is not None and self.config.release_on_stop:
                await asyncio.shield(self._release())
            self._renewed_at = None

    async def _acquire(self) -> None:
        while True:
            if await self._try_acquire_or_renew():
                break
            await asyncio.sleep(self.config.retry_period)
        log.info("became leader", extra={"lease": self.config.name,
                                         "identity": self.config.identity})

    async def _lead(self, work: Work) -> None:
        task: asyncio.Task[None] = asyncio.create_task(work(),
                                                       name=f"leader-work:{self.config.name}")
        if self.on_started is not None:
            self.on_started()
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=self.config.retry_period)
                if task.done():
                    break
                renewed = await self._renew_until_deadline()
                if not renewed:
                    log.warning("lost leadership", extra={"lease": self.config.name,
                                                          "identity": self.config.identity})
                    break
        finally:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if self.on_stopped is not None:
                self.on_stopped()
        self._renewed_at = None
        failure = None if task.cancelled() else task.exception()
        if failure is not None:
            raise failure

    async def _renew_until_deadline(self) -> bool:
        """Renew, retrying every retry_period until renew_deadline after the last renewal."""
        while True:
            if await self._try_acquire_or_renew():
                return True
            if not self.is_leader:
                return False
            await asyncio.sleep(self.config.retry_period / 2)

    async def _try_acquire_or_renew(self) -> bool:
        cfg = self.config
        now_wall, now = time.time(), self._clock()
        try:
            lease = await self.api.get(LEASES, cfg.name, namespace=cfg.namespace)
        except ApiError as exc:
            if not exc.not_found:
                log.warning("lease read failed", extra={"lease": cfg.name, "status": exc.status,
                                                        "error": exc.message})
                return False
            return await self._write(None, now, now_wall)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"),
                  (lease.get("metadata") or {}).get("resourceVersion"))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
        if holder and holder != cfg.identity and self._observed_at + duration > now:
            return False  # held by someone else and not expired on our clock
        return await self._write(lease, now, now_wall)

    async def _write(self, lease: dict[str, Any] | None, now: float, now_wall: float) -> bool:
        cfg = self.config
        stamp = micro_time(now_wall)
        spec: dict[str, Any] = {
            "holderIdentity": cfg.identity,
            "leaseDurationSeconds": max(1, round(cfg.lease_duration)),
            "renewTime": stamp,
        }
        try:
            if lease is None:
                spec.update(acquireTime=stamp, leaseTransitions=0)
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                        "spec": spec}
                await self.api.create(LEASES, body, namespace=cfg.namespace)
            else:
                old = lease.get("spec") or {}
                ours = old.get("holderIdentity") == cfg.identity
                transitions = int(old.get("leaseTransitions") or 0)
                spec["acquireTime"] = old.get("acquireTime") if ours else stamp
                spec["leaseTransitions"] = transitions if ours else transitions + 1
                body = {**lease, "spec": {**old, **spec}}
                await self.api.replace(LEASES, cfg.name, body, namespace=cfg.namespace)
        except ApiError as exc:
            if exc.status not in (409, 404):
                log.warning("lease write failed", extra={"lease": cfg.name,
                                                         "status": exc.status,
                                                         "error": exc.message})
            return False
        self._renewed_at = now
        return True

    async def _release(self) -> None:
        cfg = self.config
        try:
            lease = await self.api.get(LEASES, cfg.name, namespace=cfg.namespace)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != cfg.identity:
                return
            stamp = micro_time()
            body = {**lease, "spec": {**spec, "holderIdentity": None, "leaseDurationSeconds": 1,
                                      "renewTime": stamp, "acquireTime": stamp}}
            await self.api.replace(LEASES, cfg.name, body, namespace=cfg.namespace)
            log.info("released leadership", extra={"lease": cfg.name, "identity": cfg.identity})
        except ApiError as exc:
            log.warning("lease release failed", extra={"lease": cfg.name, "error": str(exc)})
