"""Running a Binder against the emulator for the length of a test body, and what it bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from webhook.binder.controller import Binder
from webhook.doubles.emulator import ApiServerEmulator


@asynccontextmanager
async def serving(binder: Binder, within: float = 5.0) -> AsyncIterator[Binder]:
    """`binder` running and synced for the body, stopped after it. A binder that fails before
    it has synced fails the test with its own error, not with a timeout."""
    task = asyncio.create_task(binder.run())
    synced = asyncio.create_task(binder.synced.wait())
    try:
        done, _ = await asyncio.wait({task, synced}, timeout=within,
                                     return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()  # its error, if it raised
            raise AssertionError("the binder stopped before it synced")
        if synced not in done:
            raise AssertionError(f"the binder did not sync within {within} s")
        yield binder
    finally:
        synced.cancel()
        task.cancel()
        await asyncio.gather(task, synced, return_exceptions=True)


def bound(apiserver: ApiServerEmulator, prefix: str, ns: str = "team-a") -> set[str]:
    """The nodes of the pods named `prefix...` in `ns`, once every one is bound (else none)."""
    found = {p["spec"].get("nodeName") for p in apiserver.objects("pods", ns)
             if p["metadata"]["name"].startswith(prefix)}
    return found if found and None not in found else set()
