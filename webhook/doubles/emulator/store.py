"""The object store: objects per resource type, one global resourceVersion counter, a bounded
event history per resource for watch resume, and the fan-out of events to watchers.

Objects are stored as dicts that are never mutated afterwards, with their JSON pre-serialised:
lists and watch events are assembled from those bytes without re-encoding."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import expired
from .resources import ResourceType
from .selectors import Selector

ObjKey = tuple[str, str]  # (namespace or "", name)
TypeKey = tuple[str, str]  # (group, plural)


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class Stored:
    obj: dict[str, Any]
    raw: bytes
    rv: int


@dataclass
class Event:
    type: str  # ADDED | MODIFIED | DELETED
    rv: int
    new: Stored
    old: Stored | None = None  # previous state for MODIFIED, for selector transitions
    _line: bytes | None = field(default=None, repr=False)

    def line(self, as_type: str | None = None) -> bytes:
        if as_type is not None and as_type != self.type:
            return b'{"type":"' + as_type.encode() + b'","object":' + self.new.raw + b"}\n"
        if self._line is None:
            self._line = b'{"type":"' + self.type.encode() + b'","object":' + self.new.raw + b"}\n"
        return self._line


class Watcher:
    """One watch stream's buffer: bounded, so that a slow reader never blocks a writer; on
    overflow the buffer is dropped and the stream ends with 410 (the client relists)."""

    def __init__(self, namespace: str | None, selector: Selector, limit: int) -> None:
        self.namespace = namespace
        self.selector = selector
        self.limit = limit
        self.buf: deque[bytes] = deque()
        self.wake = asyncio.Event()
        self.failed: bytes | None = None  # final ERROR line, set on overflow
        self.closed = False

    def _visible(self, stored: Stored | None) -> bool:
        if stored is None:
            return False
        if self.namespace and stored.obj["metadata"].get("namespace") != self.namespace:
            return False
        return self.selector.empty or self.selector.matches(stored.obj)

    def offer(self, ev: Event) -> None:
        if self.failed is not None or self.closed:
            return
        now = self._visible(ev.new)
        if ev.type == "MODIFIED":
            before = self._visible(ev.old)
            if not now and not before:
                return
            # an object entering or leaving the selection is ADDED/DELETED for this watcher
            line = ev.line("MODIFIED" if now and before else ("ADDED" if now else "DELETED"))
        elif not now:
            return
        else:
            line = ev.line()
        if len(self.buf) >= self.limit:
            self.buf.clear()
            self.failed = dumps({"type": "ERROR", "object": expired_status(ev.rv)}) + b"\n"
        else:
            self.buf.append(line)
        self.wake.set()

    def close(self) -> None:
        self.closed = True
        self.wake.set()


def expired_status(rv: int) -> dict[str, Any]:
    err = expired(rv, rv)
    err.message = "The resourceVersion for the provided watch is too old."
    return err.to_status()


class Store:
    def __init__(self, history: int = 10_000, watch_buffer: int = 20_000) -> None:
        self.rv = 0
        self.history_size = history
        self.watch_buffer = watch_buffer
        self._objects: dict[TypeKey, dict[ObjKey, Stored]] = {}
        self._history: dict[TypeKey, deque[Event]] = {}
        #: rv of the newest event evicted from a type's history: watches from before it get 410
        self._evicted: dict[TypeKey, int] = {}
        self._watchers: dict[TypeKey, set[Watcher]] = {}
        self.by_uid: dict[str, tuple[TypeKey, ObjKey]] = {}
        self.dependents: dict[str, set[tuple[TypeKey, ObjKey]]] = {}

    # --- reads --------------------------------------------------------------------------------

    def table(self, tk: TypeKey) -> dict[ObjKey, Stored]:
        return self._objects.setdefault(tk, {})

    def get(self, tk: TypeKey, ns: str, name: str) -> Stored | None:
        return self._objects.get(tk, {}).get((ns, name))

    def items(self, tk: TypeKey, namespace: str | None = None,
              selector: Selector | None = None) -> Iterator[Stored]:
        table = self._objects.get(tk, {})
        for (ns, _), st in sorted(table.items()):
            if namespace and ns != namespace:
                continue
            if selector is not None and not selector.empty and not selector.matches(st.obj):
                continue
            yield st

    # --- writes -------------------------------------------------------------------------------

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def put(self, tk: TypeKey, obj: dict[str, Any], rv: int) -> Stored:
        """Store obj (whose metadata.resourceVersion is already str(rv)) and emit its event."""
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        table = self.table(tk)
        old = table.get(key)
        stored = Stored(obj, dumps(obj), rv)
        table[key] = stored
        if old is not None:
            self._unindex(tk, key, old.obj)
        self._index(tk, key, obj)
        self._emit(tk, Event("MODIFIED" if old else "ADDED", rv, stored, old))
        return stored

    def remove(self, tk: TypeKey, ns: str, name: str, final: dict[str, Any], rv: int) -> None:
        """Delete; `final` is the object as last seen with the deletion's resourceVersion."""
        old = self.table(tk).pop((ns, name), None)
        if old is not None:
            self._unindex(tk, (ns, name), old.obj)
        self._emit(tk, Event("DELETED", rv, Stored(final, dumps(final), rv)))

    def drop_type(self, tk: TypeKey) -> None:
        """A CRD went away: its objects vanish and its watchers end."""
        for key, st in self._objects.pop(tk, {}).items():
            self._unindex(tk, key, st.obj)
        for w in self._watchers.pop(tk, set()):
            w.close()
        self._history.pop(tk, None)

    def _index(self, tk: TypeKey, key: ObjKey, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.by_uid[meta["uid"]] = (tk, key)
        for ref in meta.get("ownerReferences") or []:
            self.dependents.setdefault(ref.get("uid", ""), set()).add((tk, key))

    def _unindex(self, tk: TypeKey, key: ObjKey, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.by_uid.pop(meta["uid"], None)
        for ref in meta.get("ownerReferences") or []:
            deps = self.dependents.get(ref.get("uid", ""))
            if deps is not None:
                deps.discard((tk, key))
                if not deps:
                    del self.dependents[ref.get("uid", "")]

    def _emit(self, tk: TypeKey, ev: Event) -> None:
        hist = self._history.setdefault(tk, deque())
        hist.append(ev)
        if len(hist) > self.history_size:
            self._evicted[tk] = hist.popleft().rv
        for w in list(self._watchers.get(tk, ())):
            w.offer(ev)

    # --- watch --------------------------------------------------------------------------------

    def watch(self, rt: ResourceType, namespace: str | None, selector: Selector,
              since: int | None) -> tuple[Watcher, list[bytes]]:
        """Register a watcher; returns it with the lines to send first: synthetic ADDED for
        current objects when `since` is None, else the history after `since` (410 when the
        history no longer reaches back that far). Synchronous, so nothing can slip between."""
        tk = rt.key
        if since is not None and since < self._evicted.get(tk, 0):
            raise expired(since, self._evicted[tk] + 1)
        w = Watcher(namespace, selector, self.watch_buffer)
        if since is None:
            first = [b'{"type":"ADDED","object":' + st.raw + b"}\n"
                     for st in self.items(tk, namespace, selector)]
        else:
            first = []
            for ev in self._history.get(tk, ()):
                if ev.rv > since:
                    w.offer(ev)
            first = list(w.buf)
            w.buf.clear()
            w.wake.clear()
        self._watchers.setdefault(tk, set()).add(w)
        return w, first

    def unwatch(self, rt: ResourceType, w: Watcher) -> None:
        self._watchers.get(rt.key, set()).discard(w)

    def close_watchers(self) -> None:
        for ws in self._watchers.values():
            for w in ws:
                w.close()
