"""An informer must stop when cancelled, even when the cancel reaches it dressed as another error.

A client-side timeout that fires together with a cancel turns the CancelledError into a
TimeoutError (an OSError) in the watch; the informer retries OSErrors, so without care it would
swallow the cancel and never stop (a binder losing leadership would keep its watches running).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from webhook.kube import PODS, Informer


class RetriedAfterCancel(BaseException):
    """Ends a buggy informer's retry loop, so the test fails instead of hanging."""


class CancelBecomesTimeout:
    """The two calls an Informer makes; the watch hangs until cancelled, then raises what a
    client timer firing at that instant raises."""

    def __init__(self) -> None:
        self.watching = asyncio.Event()
        self.watches = 0

    async def list(self, *_: Any, **__: Any) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": "1"}, "items": []}

    async def watch(self, *_: Any, **__: Any) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.watches += 1
        if self.watches > 1:
            raise RetriedAfterCancel
        self.watching.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise TimeoutError from None
        yield ("ADDED", {})  # pragma: no cover - never reached


async def test_a_cancel_converted_to_timeout_still_stops_the_informer() -> None:
    api = CancelBecomesTimeout()
    informer = Informer(api, PODS)  # type: ignore[arg-type]
    task = asyncio.create_task(informer.run())
    await asyncio.wait_for(api.watching.wait(), 5)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert task in done
    assert task.cancelled(), f"the informer swallowed the cancel and retried: {task!r}"
    assert api.watches == 1
