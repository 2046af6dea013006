"""List + watch cache of raw objects, as client-go's informer: a `store` kept in sync, handlers
called for each change, reconnect with backoff, relist on 410 Gone emitting the differences."""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from .api import ApiError, KubeApi, Resource, object_key

log = logging.getLogger(__name__)

Handler = Callable[[str, dict[str, Any], dict[str, Any] | None], Awaitable[None] | None]


def _rv(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Informer:
    """`store` maps "ns/name" (or "name" when cluster-scoped) to the current object.

    Handlers get (event_type, obj, old_obj) with event_type ADDED / MODIFIED / DELETED; old_obj
    is the previous state for MODIFIED and DELETED. `synced` is set after the first list.
    """

    def __init__(self, api: KubeApi, resource: Resource, namespace: str | None = None,
                 label_selector: str | None = None, field_selector: str | None = None, *,
                 backoff_initial: float = 0.2, backoff_max: float = 10.0,
                 watch_timeout: int = 300) -> None:
        self.api = api
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.store: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        self.resource_version: str | None = None
        self.relists = 0
        self._handlers: list[Handler] = []
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._watch_timeout = watch_timeout
        self._task: asyncio.Task[None] | None = None

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    async def _notify(self, event: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        for handler in self._handlers:
            try:
                result = handler(event, obj, old)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("informer handler failed",
                              extra={"resource": self.resource.plural, "event": event})

    async def _relist(self) -> None:
        listed = await self.api.list(self.resource, self.namespace,
                                     label_selector=self.label_selector,
                                     field_selector=self.field_selector)
        fresh = {object_key(o): o for o in listed.get("items") or []}
        old_store, self.store = self.store, fresh
        self.resource_version = (listed.get("metadata") or {}).get("resourceVersion")
        self.relists += 1
        for key, gone in old_store.items():
            if key not in fresh:
                await self._notify("DELETED", gone, gone)
        for key, obj in fresh.items():
            old = old_store.get(key)
            if old is None:
                await self._notify("ADDED", obj, None)
            elif _rv(old) != _rv(obj):
                await self._notify("MODIFIED", obj, old)
        self.synced.set()

    async def _apply(self, event: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        old = self.store.get(key)
        if event == "DELETED":
            self.store.pop(key, None)
        else:
            self.store[key] = obj
            if old is None:
                event = "ADDED"
        self.resource_version = _rv(obj) or self.resource_version
        await self._notify(event, obj, old)

    async def run(self) -> None:
        """List, then watch from the list's resourceVersion, until cancelled."""
        backoff = self._backoff_initial
        while True:
            try:
                if self.resource_version is None:
                    await self._relist()
                events = 0
                async for event, obj in self.api.watch(
                        self.resource, self.namespace, resource_version=self.resource_version,
                        label_selector=self.label_selector, field_selector=self.field_selector,
                        timeout_seconds=self._watch_timeout, allow_bookmarks=True):
                    if event == "BOOKMARK":
                        self.resource_version = _rv(obj) or self.resource_version
                    else:
                        await self._apply(event, obj)
                    events += 1
                    backoff = self._backoff_initial
                if events:
                    continue  # the server ended the watch (timeout): resume from where we are
                # an empty watch: resume too, after the backoff so as never to spin
            except ApiError as exc:
                _reraise_if_cancelling()
                if exc.gone:
                    log.info("watch expired, relisting", extra={"resource": self.resource.plural})
                    self.resource_version = None
                    continue
                log.warning("list/watch failed", extra={"resource": self.resource.plural,
                                                        "status": exc.status,
                                                        "error": exc.message})
            except (OSError, ValueError) as exc:
                _reraise_if_cancelling()
                log.warning("list/watch failed", extra={"resource": self.resource.plural,
                                                        "error": repr(exc)})
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, self._backoff_max)

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name=f"informer-{self.resource.plural}")
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise

    async def __aenter__(self) -> Informer:
        self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()


def _reraise_if_cancelling() -> None:
    """A cancel can reach us dressed as another error (a client timeout firing at the same
    moment becomes TimeoutError, an OSError): never retry a watch whose task is being stopped."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
