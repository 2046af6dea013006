"""Which connection makes room for a new one at a full server (webhook/admission/slots.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from webhook.admission.slots import Room, SlotLimits, State, make_room


@dataclass(frozen=True)
class Conn:
    source: str
    state: State
    waiting_since: float


P, B, W = State.PENDING, State.BUSY, State.IDLE  # W: waiting (idle)
LIMITS = SlotLimits(max_connections=4, per_source=3, reserved=1)


def test_room_left_admits_without_closing_anything() -> None:
    assert make_room("a", [Conn("b", P, 1), Conn("c", W, 2)], LIMITS) == Room()


def test_when_full_the_connection_waiting_longest_goes_busy_ones_never() -> None:
    old_idle, young_pending = Conn("b", W, 1.0), Conn("c", P, 5.0)
    slots = [Conn("b", B, 0.0), young_pending, old_idle, Conn("d", B, 0.5)]
    assert make_room("a", slots, LIMITS) == Room(victim=old_idle)
    old_pending = Conn("c", P, 0.1)
    slots = [Conn("b", B, 0.0), old_pending, old_idle, Conn("d", B, 0.5)]
    assert make_room("a", slots, LIMITS) == Room(victim=old_pending)


def test_a_full_server_of_busy_connections_refuses() -> None:
    assert make_room("a", [Conn(s, B, 0) for s in "bcde"], LIMITS) == Room(refused="limit")


def test_not_yet_served_connections_never_take_the_reserve() -> None:
    """Three pending (max 4 - reserve 1): a new one displaces the oldest of them, not the idle
    one that waited longer, and even while a slot is free."""
    oldest, idle = Conn("c", P, 2.0), Conn("b", W, 0.0)
    pending = [oldest, Conn("d", P, 4.0), Conn("e", P, 5.0)]
    assert make_room("a", [idle, *pending], LIMITS) == Room(victim=oldest)
    assert make_room("a", pending, LIMITS) == Room(victim=oldest)  # the free slot is reserved


def test_a_source_at_its_cap_displaces_its_own_connections_only() -> None:
    mine = [Conn("a", B, 0.0), Conn("a", W, 3.0), Conn("a", P, 2.0)]
    older_other = Conn("b", W, 0.0)
    assert make_room("a", [*mine, older_other], LIMITS) == Room(victim=mine[2])
    busy = [Conn("a", B, t) for t in (1, 2, 3)]
    assert make_room("a", busy, LIMITS) == Room(refused="per_source")
    assert make_room("b", busy, LIMITS) == Room()


@pytest.mark.parametrize(("maximum", "per_source", "reserved"),
                         [(0, 1, 0), (4, 0, 0), (4, 1, 4), (4, 1, -1)])
def test_limits_that_leave_no_room_are_refused(maximum: int, per_source: int,
                                               reserved: int) -> None:
    with pytest.raises(ValueError, match="connection"):
        SlotLimits(maximum, per_source, reserved)
