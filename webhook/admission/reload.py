"""Policies from a mounted directory, reloaded on change; a broken update never replaces a good set.

A ConfigMap volume is updated by the kubelet atomically: it writes a new hidden `..<timestamp>`
directory and swaps the `..data` symlink, the visible files being symlinks through `..data`. So
the content digest of the visible files (symlinks followed) changes exactly when the ConfigMap
does. Polling a digest every couple of seconds needs no inotify dependency and also catches
edits made by hand to a plain directory.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Generic, TypeVar

from webhook.admission.metrics import Metrics

log = logging.getLogger(__name__)

T = TypeVar("T")
Loader = Callable[[Sequence[Path]], T]
#: called with the loader's message and its problem count when an update is refused (e.g. to
#: emit a Kubernetes Event)
OnRefused = Callable[[str, int], Awaitable[None]]
#: how many problems a loader's error holds (one per line unless the loader says otherwise)
ProblemCount = Callable[[Exception], int]
#: the longest Event message written (events.k8s.io/v1 refuses a longer note)
EVENT_NOTE_LIMIT = 1024
#: the most characters of a refused update's message logged (the loader bounds it already;
#: this keeps one log line bounded whatever the loader says)
LOG_LIMIT = 64 * 1024


def _lines(exc: Exception) -> int:
    return len(str(exc).splitlines())


def refusal_note(message: str, count: int | None = None, limit: int = EVENT_NOTE_LIMIT) -> str:
    """An Event's message for a refused update: how many problems (`count`, else one per line
    of the loader's message), then each line that fits whole, then how many more there are."""
    problems = [line for line in message.splitlines() if line.strip()] or ["no message"]
    count = count if count is not None else len(problems)
    head = (f"policy update refused, previous policies stay active: {count} "
            f"problem{'s' if count > 1 else ''}")
    shown = [head]
    for i, problem in enumerate(problems):
        more = (f"... and {count - i} more in the webhook's log (muster policy check lists "
                "them)")
        last = i == len(problems) - 1
        if len("\n".join([*shown, problem] if last else [*shown, problem, more])) > limit:
            return "\n".join([*shown, more])[:limit]
        shown.append(problem)
    return "\n".join(shown)


def _files(path: Path) -> Iterator[Path]:
    if not path.is_dir():
        yield path
        return
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.name.startswith("."):  # ..data, ..2026_11_21..., editor swap files
            continue
        sub = Path(entry.path)
        if entry.is_dir():
            yield from _files(sub)
        elif entry.is_file():
            yield sub


#: hex digits of the digest a metric shows: enough to tell policy sets apart
DIGEST_SHOWN = 16


def digest(paths: Sequence[Path]) -> str:
    """Digest of names and contents of every visible file under `paths` (missing → distinct)."""
    h = hashlib.sha256()
    for root in paths:
        try:
            for f in _files(root):
                h.update(str(f).encode() + b"\0" + f.read_bytes() + b"\0")
        except OSError as exc:
            h.update(f"unreadable {root}: {exc.__class__.__name__}".encode())
    return h.hexdigest()


class PolicyStore(Generic[T]):
    """The active policy set and its reload loop."""

    def __init__(
        self,
        paths: Sequence[Path],
        loader: Loader[T],
        *,
        error_types: tuple[type[Exception], ...],
        metrics: Metrics,
        count: Callable[[T], int],
        on_refused: OnRefused | None = None,
        problems: ProblemCount = _lines,
    ) -> None:
        self.paths = list(paths)
        self._loader = loader
        self._error_types = error_types
        self._metrics = metrics
        self._count = count
        self._on_refused = on_refused
        self._problems = problems
        self.current: T | None = None
        self.last_error: str | None = None
        self._digest: str | None = None  # of the content last tried, good or bad

    async def reload(self) -> bool:
        """Load if the content changed since the last try; True when a new set became active."""
        new_digest = await asyncio.to_thread(digest, self.paths)
        if new_digest == self._digest:
            return False
        self._digest = new_digest
        try:
            loaded = await asyncio.to_thread(self._loader, self.paths)
        except self._error_types as exc:
            await self._refuse(str(exc), self._problems(exc))
            return False
        except OSError as exc:
            await self._refuse(f"cannot read policies: {exc}", 1)
            return False
        self.current = loaded
        self.last_error = None
        self._metrics.reloads.labels("success").inc()
        self._metrics.policies_loaded.set(self._count(loaded))
        self._metrics.policy_loaded_at.set(time.time())
        self._metrics.policy_set.clear()  # one sample: the active set's
        self._metrics.policy_set.labels(new_digest[:DIGEST_SHOWN]).set(1)
        log.info("policies loaded", extra={"policies": self._count(loaded),
                                           "paths": [str(p) for p in self.paths]})
        return True

    async def _refuse(self, message: str, problems: int) -> None:
        message = message if len(message) <= LOG_LIMIT else message[:LOG_LIMIT - 3] + "..."
        self.last_error = message
        self._metrics.reloads.labels("error").inc()
        kept = "the previous policies stay active" if self.current is not None else (
            "no policies are active")
        log.error("policy update refused, %s", kept,
                  extra={"error": message, "problems": problems})
        if self._on_refused is not None:
            await self._on_refused(message, problems)

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reload()
            except Exception:  # the watcher must outlive any surprise; the old set stays
                log.exception("policy reload failed unexpectedly")
