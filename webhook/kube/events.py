"""Kubernetes Events (core/v1) for the objects a component acts on, aggregated like client-go's
recorder: a repeat of the same event bumps `count` and `lastTimestamp` instead of adding one."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from .api import EVENTS, ApiError, KubeApi
from .times import rfc3339

log = logging.getLogger(__name__)

_CACHE_SIZE = 4096


def involved_object(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    ref = {"kind": obj.get("kind", ""), "apiVersion": obj.get("apiVersion", ""),
           "name": meta.get("name", ""), "uid": meta.get("uid", ""),
           "resourceVersion": meta.get("resourceVersion", "")}
    if meta.get("namespace"):
        ref["namespace"] = meta["namespace"]
    return {k: v for k, v in ref.items() if v}


class EventRecorder:
    def __init__(self, api: KubeApi, component: str, instance: str = "") -> None:
        self.api = api
        self.component = component
        self.instance = instance
        # aggregation key → (event namespace, event name, count)
        self._seen: OrderedDict[tuple[str, ...], tuple[str, str, int]] = OrderedDict()

    async def emit(self, obj: Mapping[str, Any], type_: str, reason: str,
                   message: str, *, once_as: str | None = None) -> None:
        """Record an Event about obj ("Normal" or "Warning"). Never raises: a failed Event is
        logged, the caller's work goes on. `once_as`: the Event's name, the same in every
        replica, so that what several replicas see happens once in the cluster (the second
        create is a conflict, and nothing more is done)."""
        try:
            if once_as is None:
                await self._emit(obj, type_, reason, message)
            else:
                await self._create(involved_object(obj), once_as, type_, reason, message)
        except ApiError as exc:
            if once_as is None or not exc.conflict:
                log.warning("event not recorded", extra={"reason": reason, "error": str(exc)})
        except (OSError, ValueError, KeyError) as exc:
            log.warning("event not recorded", extra={"reason": reason, "error": str(exc)})

    async def _emit(self, obj: Mapping[str, Any], type_: str, reason: str,
                    message: str) -> None:
        ref = involved_object(obj)
        namespace = ref.get("namespace") or "default"
        key = (ref.get("kind", ""), namespace, ref.get("name", ""), ref.get("uid", ""),
               type_, reason, message)
        now = rfc3339()
        seen = self._seen.get(key)
        if seen is not None:
            ev_ns, ev_name, count = seen
            try:
                await self.api.patch(EVENTS, ev_name, {"count": count + 1, "lastTimestamp": now},
                                     ev_ns)
                self._remember(key, (ev_ns, ev_name, count + 1))
                return
            except ApiError as exc:
                if not exc.not_found:
                    raise
        name = f"{ref.get('name', 'object')}.{time.time_ns():x}"
        await self._create(ref, name, type_, reason, message)
        self._remember(key, (namespace, name, 1))

    async def _create(self, ref: Mapping[str, Any], name: str, type_: str, reason: str,
                      message: str) -> None:
        namespace = ref.get("namespace") or "default"
        now = rfc3339()
        await self.api.create(EVENTS, {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": dict(ref), "reason": reason, "message": message, "type": type_,
            "source": {"component": self.component, **({"host": self.instance}
                                                       if self.instance else {})},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": self.component, "reportingInstance": self.instance},
            namespace)

    def _remember(self, key: tuple[str, ...], value: tuple[str, str, int]) -> None:
        self._seen[key] = value
        self._seen.move_to_end(key)
        while len(self._seen) > _CACHE_SIZE:
            self._seen.popitem(last=False)
