"""What one client may hold of the admission server: connections, time, body memory.

aiohttp reads headers and bodies without deadlines and accepts any number of connections, and
asyncio's TLS gives every connection a 256 KiB buffer from the moment it is accepted (security
review #24: 300 slow-header connections stayed open 46 s and more, 1,000 idle TLS connections
held 186 MiB, 40 unfinished bodies 418 MiB). So the server listens on plain TCP and does TLS
itself (`start_tls`), which lets it count each connection from accept, before any TLS work:

- over `max_connections` a new connection is closed at once (`ConnectionGuard`);
- a connection must finish its TLS handshake and the headers of its first request within
  `header_timeout` of being accepted, or it is closed. Later requests on a kept-alive
  connection are bounded by aiohttp's keep-alive timeout (`muster serve --idle-timeout`);
- bodies being read hold at most `BodyBudget.limit` bytes together; the app gives each its
  `--body-timeout` to arrive, waiting for the budget included.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import cast

from aiohttp import web

from webhook.admission.metrics import Metrics

#: how much a client can make the server buffer per connection while its body waits: the
#: kernel's receive buffer (Linux doubles it), TLS's read-ahead (asyncio's default: 256 KiB)
#: and aiohttp's body buffer (its `read_bufsize`, default 64 KiB). With the defaults a client
#: sending a body faster than it is read held 1.3 MiB, with these 0.45 MiB (bench_abuse.py)
READ_BUFFER = 16 * 1024
#: the end of a request's headers (aiohttp's parser accepts no other line ending)
_HEADERS_END = b"\r\n\r\n"


class ConnectionGuard:
    """The listening socket's protocol factory: each accepted TCP connection is a `_Connection`
    that hands the decrypted stream to one of aiohttp's protocols (`handler()`)."""

    def __init__(self, handler: Callable[[], asyncio.Protocol], context: ssl.SSLContext, *,
                 max_connections: int, header_timeout: float, metrics: Metrics) -> None:
        self.handler = handler
        self.context = context
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.metrics = metrics
        #: every connection counted: from accept to connection_lost, TLS handshake included
        self.open: set[_Connection] = set()

    def __call__(self) -> _Connection:
        return _Connection(self)

    def abort_unserved(self) -> None:
        """At shutdown: close the connections aiohttp has not been given yet (still in their
        handshake); aiohttp's runner closes its own."""
        for conn in list(self.open):
            conn.abort_if_unserved()


class _Connection(asyncio.Protocol):
    """One TCP connection: counted, upgraded to TLS, then passed through to aiohttp's protocol
    (the plain-TCP transport's protocol until `start_tls`, then the TLS transport's)."""

    __slots__ = ("_early", "_guard", "_handshaking", "_inner", "_raw", "_tail", "_timer",
                 "_tls")

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

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        raw = cast(asyncio.Transport, transport)
        if len(guard.open) >= guard.max_connections:
            guard.metrics.connections_closed.labels("limit").inc()
            raw.abort()
            return
        guard.open.add(self)
        self._raw = raw
        sock = raw.get_extra_info("socket")
        if sock is not None:  # so that one read hands TLS no more than this (see READ_BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, READ_BUFFER)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(guard.header_timeout, self._too_slow)
        raw.pause_reading()  # nothing is read before TLS takes the stream over
        self._handshaking = loop.create_task(self._handshake(raw))

    async def _handshake(self, raw: asyncio.Transport) -> None:
        guard = self._guard
        try:
            tls = await asyncio.get_running_loop().start_tls(
                raw, self, guard.context, server_side=True,
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
        self._inner = inner = guard.handler()
        inner.connection_made(tls)
        if self._early:
            early, self._early = self._early, b""
            inner.data_received(early)

    def data_received(self, data: bytes) -> None:
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
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _too_slow(self) -> None:
        self._timer = None
        self._guard.metrics.connections_closed.labels("header_timeout").inc()
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
        return f"https://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
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
