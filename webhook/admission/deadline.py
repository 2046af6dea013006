"""The API server's `?timeout=` (a Go duration, e.g. "5s", "1m0s", "500ms") as an answer budget."""

from __future__ import annotations

import functools
import re
from urllib.parse import parse_qs

DEFAULT_TIMEOUT_S = 10.0  # the API server's default webhook timeoutSeconds
MAX_TIMEOUT_S = 30.0  # the largest timeoutSeconds the API accepts
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_go_duration(text: str) -> float | None:
    """Seconds for a Go duration string; None when it is not one."""
    text = text.strip()
    if not text:
        return None
    pos, total = 0, 0.0
    while pos < len(text):
        match = _PART.match(text, pos)
        if match is None:
            return None
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    return total


@functools.lru_cache(maxsize=64)  # the API server sends the same few URLs, e.g. "timeout=10s"
def budget_for_query(query_string: str, margin: float) -> float:
    """`budget` for a raw query string such as "timeout=10s"."""
    values = parse_qs(query_string).get("timeout")
    return budget(values[-1] if values else None, margin)


def budget(timeout_param: str | None, margin: float) -> float:
    """Seconds the server may spend before it must answer: the timeout minus a safety margin.

    The margin covers the network and the API server's own bookkeeping; the budget never drops
    below a fifth of the timeout so that a short timeout still allows cached decisions.
    """
    timeout = parse_go_duration(timeout_param) if timeout_param else None
    if timeout is None or timeout <= 0:
        timeout = DEFAULT_TIMEOUT_S
    timeout = min(timeout, MAX_TIMEOUT_S)
    return max(timeout - margin, timeout / 5)
