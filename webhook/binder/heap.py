"""Keeps the binder's long-lived heap out of the cyclic garbage collector's full collections.

The service freezes the heap once its informers have synced (`gc.freeze`), but what the first
planning cycles build over the whole node set comes after: each node's state and its key in the
node groups, the choice tables' entry per node, the FitCache's indexes. Those survive into the
oldest generation, and every full collection walks them again: at 16,384 nodes a collection
every few cycles took a gang's planning cycle from 30-50 ms to 90-140 ms (the latency bench's
p99). `HeapFreezer` watches the full collections (`gc.callbacks`): once one takes longer than
its budget, what survived it is frozen at the next `settle`, which the service calls between
planning cycles. Later full collections then walk only what came after.

Freezing keeps the frozen objects from ever being collected as cycles: a cycle among them that
becomes garbage stays until the term ends (the service unfreezes then). The binder's caches hold
no cycles; and freezing happens only after a slow full collection, so rarely once the heap is
frozen."""

from __future__ import annotations

import gc
import time
from typing import Any


class HeapFreezer:
    """See the module's docstring. `budget`: seconds a full collection may take before its
    survivors are frozen."""

    def __init__(self, budget: float = 0.005) -> None:
        self.budget = budget
        self._started = 0.0
        self._due = False

    def __enter__(self) -> HeapFreezer:
        gc.callbacks.append(self._observe)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self._observe)

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        # runs inside the collector: it only notes, and freezes nothing there
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        elif time.perf_counter() - self._started > self.budget:
            self._due = True

    def settle(self) -> bool:
        """Freeze what survived a slow full collection since the last call (True if so)."""
        if not self._due:
            return False
        self._due = False
        gc.freeze()
        return True
