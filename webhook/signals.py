"""Long-running commands stop on SIGTERM (how the kubelet stops a pod) or SIGINT (Ctrl-C); a
command that runs to its end (`muster demo`) stops cleanly on Ctrl-C whenever it comes."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")


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


def run_interruptible(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """`asyncio.run(main())`, where Ctrl-C at any point cancels `main`, whose cleanup then runs,
    and ends in KeyboardInterrupt once the loop is closed. asyncio.run's own handler is only
    installed once the loop exists: a Ctrl-C before that (or while it closes the loop) raised
    inside asyncio, leaving a half-made loop and a coroutine never awaited to complain at exit.
    A second Ctrl-C raises at once, as asyncio.run's does."""
    ctrl_c = _CtrlC()
    previous = signal.signal(signal.SIGINT, ctrl_c)
    try:
        result = asyncio.run(ctrl_c.run(main))
    except asyncio.CancelledError:
        if not ctrl_c.pressed:
            raise
    finally:
        signal.signal(signal.SIGINT, previous)
    if ctrl_c.pressed:
        raise KeyboardInterrupt
    return result


class _CtrlC:
    """SIGINT as a request to cancel the main task (signal handlers run in the main thread,
    between two bytecodes: the loop may be anywhere in its cycle)."""

    def __init__(self) -> None:
        self.pressed = False
        self.task: asyncio.Task[Any] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True
        if self.task is not None and self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.task.cancel)

    async def run(self, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
        self.loop, self.task = asyncio.get_running_loop(), asyncio.current_task()
        if self.pressed:  # before the loop ran: start nothing
            raise asyncio.CancelledError
        return await main()
