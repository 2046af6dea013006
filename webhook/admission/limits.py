"""What one client may hold of the admission server: connections, time, body memory.

aiohttp reads headers and bodies without deadlines and accepts any number of connections, and
asyncio's TLS gives every connection a 256 KiB buffer from the moment it is accepted (security
review #24: 300 slow-header connections stayed open 46 s and more, 1,000 idle TLS connections
held 186 MiB, 40 unfinished bodies 418 MiB). So the server listens on plain TCP and does TLS
itself (`start_tls`), which lets it count each connection from accept, before any TLS work:

- at `max_connections` a new connection closes the one that waited longest, or is closed at
  once when every connection is serving a request; one source address holds `per_source`,
  not-yet-served connections leave `reserved` slots free (`ConnectionGuard`, the rules in
  webhook/admission/slots.py; security review #54: connections idling after one request and
  slow headers held every slot, refusing the API server's new connections);
- a connection must finish its TLS handshake and the headers of its first request within
  `header_timeout` of being accepted, or it is closed. Later requests on a kept-alive
  connection are bounded by aiohttp's keep-alive timeout (`muster serve --idle-timeout`);
- bodies being read hold at most `BodyBudget.limit` bytes together; the app gives each its
  `--body-timeout` to arrive, waiting for the budget included.

The metrics port (plain HTTP) is behind a guard of its own with the same rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import cast

from aiohttp import web

from webhook.admission.metrics import Metrics
from webhook.admission.slots import SlotLimits, State, make_room

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: how much a client can make the server buffer per connection while its body waits: the
#: kernel's receive buffer (Linux doubles it), TLS's read-ahead (asyncio's default: 256 KiB)
#: and aiohttp's body buffer (its `read_bufsize`, default 64 KiB). With the defaults a client
#: sending a body faster than it is read held 1.3 MiB, with these 0.45 MiB (bench_abuse.py)
READ_BUFFER = 16 * 1024
#: the end of a request's headers (aiohttp's parser accepts no other line ending)
_HEADERS_END = b"\r\n\r\n"


class ConnectionGuard:
    """A listening socket's protocol factory: each accepted TCP connection is a `_Connection`
    that hands the (decrypted, when `context` is given) stream to one of aiohttp's protocols
    (`handler()`, set by the GuardedSite). `track` is the app's middleware that tells which
    connections are serving a request (webhook/admission/slots.py)."""

    def __init__(self, context: ssl.SSLContext | None, limits: SlotLimits, *,
                 header_timeout: float, metrics: Metrics, listener: str) -> None:
        self.handler: Callable[[], asyncio.Protocol] | None = None
        self.context = context
        self.limits = limits
        self.header_timeout = header_timeout
        self.closed = metrics.connections_closed.labels  # (listener, reason)
        self.listener = listener
        #: every connection counted: from accept to its end, TLS handshake included
        self.open: set[_Connection] = set()
        #: the connections aiohttp serves, by the transport it writes to
        self.served: dict[asyncio.BaseTransport, _Connection] = {}
        metrics.open_connections.labels(listener).set_function(lambda: len(self.open))

    def __call__(self) -> _Connection:
        return _Connection(self)

    @web.middleware
    async def track(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = self.served.get(request.transport) if request.transport else None
        if conn is None:
            return await handler(request)
        loop = asyncio.get_running_loop()
        conn.request, conn.request_started = request, loop.time()
        try:
            return await handler(request)
        finally:
            conn.request = None
            conn.last_active = loop.time()

    def admit(self, conn: _Connection) -> bool:
        """Count a new connection, closing another to make room if needed; False: refused."""
        room = make_room(conn.source, self.open, self.limits)
        if room.refused is not None:
            self.closed(self.listener, room.refused).inc()
            return False
        if room.victim is not None:
            self.closed(self.listener, f"{room.victim.state.value}_evicted").inc()
            room.victim.close_now()
        self.open.add(conn)
        return True

    def abort_unserved(self) -> None:
        """At shutdown: close the connections aiohttp has not been given yet (still in their
        handshake); aiohttp's runner closes its own."""
        for conn in list(self.open):
            conn.abort_if_unserved()


class _Connection(asyncio.Protocol):
    """One TCP connection: counted, upgraded to TLS (when the guard has a context), then passed
    through to aiohttp's protocol (the plain-TCP transport's protocol until `start_tls`, then
    the TLS transport's). A slot of webhook/admission/slots.py."""

    __slots__ = ("_early", "_guard", "_handshaking", "_inner", "_raw", "_tail", "_timer",
                 "_tls", "accepted_at", "last_active", "request", "request_started", "source")

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard
        self._raw: asyncio.Transport | None = None
        self._tls: asyncio.Transport | None = None
        self._inner: asyncio.Protocol | None = None
        self._timer: asyncio.TimerHandle | None = None
        #: (held here: the event loop keeps only a weak reference to a task)
        self._handshaking: asyncio.Task[None] | None = None
        #: the last bytes seen while the first request's headers are not complete
        self._tail = b""
        #: decrypted bytes that came before aiohttp's protocol was connected
        self._early = b""
        self.source = ""
        self.accepted_at = self.last_active = self.request_started = 0.0
        #: the request in the app, if any (the app's middleware sets it)
        self.request: web.BaseRequest | None = None

    @property
    def state(self) -> State:
        if self._timer is not None:  # the first request's headers are not all here
            return State.PENDING
        if self.request is None:
            return State.IDLE
        # a request whose body is still coming is not served yet either
        return State.BUSY if self.request.content.is_eof() else State.PENDING

    @property
    def waiting_since(self) -> float:
        if self._timer is not None:
            return self.accepted_at
        return self.last_active if self.request is None else self.request_started

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        raw = cast(asyncio.Transport, transport)
        peer = raw.get_extra_info("peername")
        self.source = str(peer[0]) if peer else ""
        loop = asyncio.get_running_loop()
        self.accepted_at = self.last_active = loop.time()
        if not guard.admit(self):
            raw.abort()
            return
        self._raw = raw
        sock = raw.get_extra_info("socket")
        if sock is not None:  # so that one read hands TLS no more than this (see READ_BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, READ_BUFFER)
        self._timer = loop.call_later(guard.header_timeout, self._too_slow)
        if guard.context is None:
            self._serve(raw)
            return
        raw.pause_reading()  # nothing is read before TLS takes the stream over
        self._handshaking = loop.create_task(self._handshake(raw, guard.context))

    async def _handshake(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
        guard = self._guard
        try:
            tls = await asyncio.get_running_loop().start_tls(
                raw, self, context, server_side=True,
                ssl_handshake_timeout=guard.header_timeout,
                ssl_shutdown_timeout=guard.header_timeout)
        except Exception:  # a failed handshake (reset, timeout): start_tls closed the connection
            # and, as the TLS layer never connected this protocol, nothing calls connection_lost
            self._release()
            return
        if tls is None or self not in guard.open:  # closed meanwhile
            self._release()
            return
        self._tls = tls
        # (a method of asyncio's TLS transport that asyncio.Transport does not declare)
        getattr(tls, "set_read_buffer_limits", lambda **_: None)(high=READ_BUFFER)
        self._serve(tls)

    def _serve(self, transport: asyncio.Transport) -> None:
        """Connect aiohttp's protocol to the (decrypted) stream."""
        assert self._guard.handler is not None  # (set when the site started listening)
        self._inner = inner = self._guard.handler()
        self._guard.served[transport] = self
        inner.connection_made(transport)
        if self._early:
            early, self._early = self._early, b""
            inner.data_received(early)

    def data_received(self, data: bytes) -> None:
        self.last_active = asyncio.get_running_loop().time()
        if self._timer is not None:
            seen = self._tail + data
            if _HEADERS_END in seen:
                self._timer.cancel()
                self._timer = None
            else:
                self._tail = seen[-3:]
        if self._inner is None:
            self._early += data
        else:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def _release(self) -> None:
        """Give the slot back (once: a connection may end on more than one path)."""
        self._guard.open.discard(self)
        for transport in (self._tls, self._raw):
            if transport is not None:
                self._guard.served.pop(transport, None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _too_slow(self) -> None:
        self._timer = None
        self._guard.closed(self._guard.listener, "header_timeout").inc()
        self._abort()

    def close_now(self) -> None:
        """Make room for another connection: the slot is free at once."""
        self._release()
        self._abort()

    def abort_if_unserved(self) -> None:
        if self._inner is None:
            self._abort()

    def _abort(self) -> None:
        transport = self._tls or self._raw
        if transport is not None:
            transport.abort()  # no TLS goodbye to wait for: the client had its time


class GuardedSite(web.BaseSite):
    """aiohttp's TCPSite, listening through a ConnectionGuard."""

    __slots__ = ("_guard", "_host", "_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, guard: ConnectionGuard,
                 backlog: int) -> None:
        super().__init__(runner, backlog=backlog)
        self._host, self._port, self._guard = host, port, guard

    @property
    def name(self) -> str:
        scheme = "http" if self._guard.context is None else "https"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        self._guard.handler = self._runner.server
        self._server = await asyncio.get_running_loop().create_server(
            self._guard, self._host, self._port, backlog=self._backlog)

    async def stop(self) -> None:
        await super().stop()
        self._guard.abort_unserved()


class BodyBudget:
    """Bytes of request bodies being read at once, at most `limit`: a body waits (first come,
    first served) until what it may hold is free. A body declares its size up front
    (Content-Length) or is counted at the largest allowed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.free = limit
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    @contextlib.asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        size = min(size, self.limit)
        if self._waiting or size > self.free:
            await self._wait(size)
        else:
            self.free -= size
        try:
            yield
        finally:
            self.free += size
            self._wake()

    async def _wait(self, size: int) -> None:
        turn = asyncio.get_running_loop().create_future()
        entry = (size, turn)
        self._waiting.append(entry)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():  # granted as it was cancelled: give back
                self.free += size
            elif entry in self._waiting:
                self._waiting.remove(entry)
            self._wake()  # (it may have been first in line)
            raise

    def _wake(self) -> None:
        while self._waiting:
            size, turn = self._waiting[0]
            if not turn.done() and size > self.free:
                return
            self._waiting.popleft()
            if not turn.done():  # (a cancelled one is only dropped)
                self.free -= size
                turn.set_result(None)
