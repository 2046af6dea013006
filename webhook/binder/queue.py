"""Per-gang retry state: backoff after a failed placement, starvation clock, timeout reports.

Pure bookkeeping with the clock passed in; the controller owns one instance.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Entry:
    since: float  # first failed placement
    attempts: int = 0
    next_try: float = 0.0
    generation: int = 0  # cluster generation at the last failure
    reserves: bool = False  # placeable on an empty cluster and starving: holds resources
    hold: bool = False  # the API refused a write: only the backoff's end makes it due
    timeout_reported: bool = False
    last_reason: str = ""


class GangQueue:
    """Backoff doubles from `initial` to `maximum`; any cluster change that may free resources
    (a new generation) makes every waiting gang due again, as kube-scheduler's queue moves
    unschedulable pods back on cluster events."""

    def __init__(self, initial: float = 1.0, maximum: float = 60.0) -> None:
        self.initial, self.maximum = initial, maximum
        self._entries: dict[str, _Entry] = {}

    def due(self, key: str, now: float, generation: int) -> bool:
        e = self._entries.get(key)
        return e is None or now >= e.next_try or (not e.hold and generation != e.generation)

    def next_deadline(self, after: float) -> float | None:
        """The earliest retry time later than `after` (the last cycle, which already retried
        everything due by then): waking for older ones would spin."""
        return min((e.next_try for e in self._entries.values() if e.next_try > after),
                   default=None)

    def waiting_since(self, key: str) -> float | None:
        e = self._entries.get(key)
        return None if e is None else e.since

    def reserves(self, key: str) -> bool:
        e = self._entries.get(key)
        return e is not None and e.reserves

    def failed(self, key: str, now: float, generation: int, reason: str, *,
               reserves: bool = False, hold: bool = False) -> bool:
        """Record a failed attempt; True when the reason is new (worth a fresh Event). `hold`:
        no cluster change makes it due before its backoff ends (a write the API refused, as
        kube-scheduler backs off a pod whose binding failed)."""
        e = self._entries.get(key)
        if e is None:
            e = self._entries[key] = _Entry(since=now)
        e.attempts += 1
        # the exponent is capped: a gang may wait for days (2**1024 overflows a float)
        e.next_try = now + min(self.maximum, self.initial * 2 ** min(e.attempts - 1, 40))
        e.generation = generation
        e.reserves = reserves
        e.hold = hold
        new = reason != e.last_reason
        e.last_reason = reason
        return new

    def mark_timeout_reported(self, key: str, now: float) -> bool:
        """True the first time a gang's timeout is reported."""
        e = self._entries.get(key)
        if e is None:
            e = self._entries[key] = _Entry(since=now)
        if e.timeout_reported:
            return False
        e.timeout_reported = True
        return True

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)

    def retain(self, live: set[str]) -> None:
        for key in [k for k in self._entries if k not in live]:
            del self._entries[key]
