"""Which connection gives up its slot when a new one arrives at a full server (a pure decision).

The admission port is reachable by any pod, so the server cannot tell the API server's calls by
their address (a host-network API server, konnectivity and SNAT all change it). It tells them by
what they do, as nginx does when it runs out of connections (it closes the oldest kept-alive or
not yet talking ones, "reusable" connections) and as Envoy's overload manager does when it
shortens idle and handshake timeouts under pressure:

- a connection serving a request (`BUSY`: all of the request is in, the app works on it) is
  never closed to make room;
- one that is not served yet (`PENDING`: TLS handshake, request headers or request body not
  all here) or has been served and waits for its next request (`IDLE`) may be: the one that
  has waited longest goes first (pending: since it was accepted, or since its request's
  headers for a body still coming; idle: since it last sent a byte or got an answer). An API
  server, which sends whole requests, is served at once and stays fresh; a client holding a
  slot without using it, or sending slowly, is the first to lose it, at once, rather than
  at its timeout;
- not yet served connections hold at most `max_connections - reserved`: beyond that a new one
  displaces the oldest of them, never a served one, so a flood of new connections cannot push
  out the API server's kept-alive connections;
- one source address holds at most `per_source`: beyond that a new connection from it
  displaces that source's own oldest waiting connection, never another source's.

A new connection is refused only when every slot it could take is serving a request.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class State(enum.Enum):
    PENDING = "pending"
    BUSY = "busy"
    IDLE = "idle"


class Slot(Protocol):
    @property
    def source(self) -> str: ...
    @property
    def state(self) -> State: ...
    @property
    def waiting_since(self) -> float: ...


S = TypeVar("S", bound=Slot)


@dataclass(frozen=True, slots=True)
class SlotLimits:
    max_connections: int
    #: connections one source address may hold
    per_source: int
    #: slots that connections not served yet may not take
    reserved: int

    def __post_init__(self) -> None:
        if min(self.max_connections, self.per_source) < 1:
            raise ValueError("the connection limits must be at least 1")
        if not 0 <= self.reserved < self.max_connections:
            raise ValueError(f"the reserved connections ({self.reserved}) must be fewer than "
                             f"the maximum ({self.max_connections})")


@dataclass(frozen=True, slots=True)
class Room(Generic[S]):
    """Admit the new connection after closing `victim` (if any), or refuse it (`refused`:
    the reason, a metric label)."""

    victim: S | None = None
    refused: str | None = None


def make_room(source: str, slots: Collection[S], limits: SlotLimits) -> Room[S]:
    """What to do with a new connection from `source`, given the connections open."""
    own = [s for s in slots if s.source == source]
    if len(own) >= limits.per_source:
        return _evict(own, "per_source")
    pending = [s for s in slots if s.state is State.PENDING]
    if len(pending) >= limits.max_connections - limits.reserved:
        return _evict(pending, "limit")
    if len(slots) >= limits.max_connections:
        return _evict(slots, "limit")
    return Room()


def _evict(candidates: Collection[S], refusal: str) -> Room[S]:
    waiting = [s for s in candidates if s.state is not State.BUSY]
    if not waiting:
        return Room(refused=refusal)
    return Room(victim=min(waiting, key=lambda s: s.waiting_since))
