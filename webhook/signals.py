"""Long-running commands stop on SIGTERM (how the kubelet stops a pod) or SIGINT (Ctrl-C)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine
from typing import Any


async def until_signalled(work: Coroutine[Any, Any, Any]) -> None:
    """Run `work` until it ends or a signal cancels it; its own cleanup (finally blocks, a leader
    releasing its Lease) runs inside the cancellation."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):  # platforms without signal handlers
            loop.add_signal_handler(sig, task.cancel)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.remove_signal_handler(sig)
