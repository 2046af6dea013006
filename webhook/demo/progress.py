"""The demo's steps as lines on stderr."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable


class Progress:
    """One line per step on stderr; a spinner while a step runs when stderr is a terminal."""

    def __init__(self, write: Callable[[str], None], tty: bool) -> None:
        self.write, self.tty, self.n = write, tty, 0
        self.skipped: list[str] = []
        #: a step's line said "interrupted" (Ctrl-C): the one line the interruption needs
        self.interrupted = False

    @contextlib.asynccontextmanager
    async def step(self, title: str) -> AsyncIterator[None]:
        self.n += 1
        start = time.monotonic()
        spinner = asyncio.create_task(self._spin(title)) if self.tty else None
        mark = "FAILED"
        try:
            yield
            mark = "ok"
        except asyncio.CancelledError:
            mark = "interrupted"  # Ctrl-C: asyncio.run cancels the demo, nothing failed
            self.interrupted = True
            raise
        finally:
            if spinner is not None:
                spinner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await spinner
            self.write(f"\r  [{self.n}] {title} ... {mark} ({time.monotonic() - start:.2f} s)\n")

    def skip(self, component: str, why: str) -> None:
        self.n += 1
        self.skipped.append(f"{component}: {why}")
        self.write(f"  [{self.n}] {component}: skipped — {why}\n")

    async def _spin(self, title: str) -> None:
        frames = "|/-\\"
        i = 0
        while True:
            self.write(f"\r  [{self.n}] {title} {frames[i % 4]}")
            i += 1
            await asyncio.sleep(0.1)
