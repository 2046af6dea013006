"""Times as the API server writes them: metav1.Time and metav1.MicroTime, RFC 3339 in UTC. (The
emulator and the fake kubelet, which stand in for the API server and the kubelet, write their
own: a test double that shares the client's code cannot catch its mistakes.)"""

from __future__ import annotations

import time
from datetime import UTC, datetime


def rfc3339(t: float | None = None) -> str:
    """metav1.Time, to the second: `t` (Unix seconds), or now."""
    return _utc(t).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(t: float | None = None) -> str:
    """metav1.MicroTime: to the microsecond."""
    return _utc(t).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _utc(t: float | None) -> datetime:
    return datetime.fromtimestamp(time.time() if t is None else t, UTC)
