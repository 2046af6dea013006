"""What the webhook logs of the pods it admitted failing open or with warnings, sampled.

Such a pod may run without its gang (another scheduler places it), and its creator, a job
controller, rarely shows the AdmissionResponse's warnings to anyone. A line in the webhook's log
names the pod, its job and why; at most one line per reason and namespace each `interval`
seconds, with the count left out since, so that a flood of bad pods costs a line every few
seconds, and one team's flood does not hide another's pod.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from webhook.kube.owners import controller_ref
from webhook.lru import Lru

log = logging.getLogger(__name__)


class Sampled:
    """At most one of each key per `interval` seconds (the `size` keys said last remembered)."""

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic,
                 size: int = 1024) -> None:
        self.interval = interval
        self._clock = clock
        #: key -> (when last said, how many left out since)
        self._last: Lru[tuple[str, ...], tuple[float, int]] = Lru(size)

    def allow(self, *key: str) -> int | None:
        """None: leave this one out; else how many of the key were left out before it."""
        now = self._clock()
        said, left_out = self._last.get(key) or (float("-inf"), 0)
        if now - said < self.interval:
            self._last.put(key, (said, left_out + 1))
            return None
        self._last.put(key, (now, 0))
        return left_out


class OutcomeLog:
    def __init__(self, sampled: Sampled | None = None) -> None:
        self.sampled = sampled or Sampled()

    def admitted(self, uid: str, namespace: str, pod: Mapping[str, Any], *,
                 fail_open: str | None, warnings: Sequence[str]) -> None:
        """A pod admitted failing open (a warning) or with warnings (info)."""
        left_out = self.sampled.allow(fail_open or "warned", namespace)
        if left_out is None:
            return
        extra = _named(uid, namespace, pod, warnings, left_out)
        if fail_open:
            log.warning("pod admitted failing open", extra={**extra, "reason": fail_open})
        else:
            log.info("pod admitted with warnings", extra=extra)

    def refused_closed(self, uid: str, namespace: str, pod: Mapping[str, Any], *, reason: str,
                       warnings: Sequence[str]) -> None:
        """A pod of a fail-closed namespace refused where it would have been admitted failing
        open: its controller creates it again."""
        left_out = self.sampled.allow("closed:" + reason, namespace)
        if left_out is not None:
            log.warning("pod refused failing closed", extra={
                **_named(uid, namespace, pod, warnings, left_out), "reason": reason})


def _named(uid: str, namespace: str, pod: Mapping[str, Any], warnings: Sequence[str],
           left_out: int) -> dict[str, Any]:
    """The log fields that name a pod, its job and what was said."""
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    ref = controller_ref(pod)
    return {"uid": uid, "namespace": namespace,
            "pod": meta.get("name") or meta.get("generateName"),
            "owner": f"{ref.get('kind')}/{ref.get('name')}" if ref else None,
            "warnings": [w[:300] for w in warnings[:5]], "left_out": left_out}
