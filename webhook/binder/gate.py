"""One GPU pod in the kubelet's hands at a time, per node.

The kubelet's Allocate call names devices, never the pod. It admits the pods of one watch update
in an order nobody outside it can see: it sorts them by creationTimestamp, which has a one-second
grain. So when two pods that are both waiting for GPUs reach a node together, the device plugin
cannot tell which one a call is for. The right GPUs can then land on the wrong pod of a job.

Where the node's agent acknowledges each pod it served (node label muster.io/gpu-allocation-ack;
pod annotation muster.io/gpu-allocated), the binder binds a node's next GPU pod only when no
earlier one is still waiting for the kubelet. The earlier pod must be acknowledged, no longer
Pending, or deleted. HAMi's and gpushare's schedulers lock the node in the same way. A pod that
the kubelet never admits holds its node for at most `timeout` seconds. The agent sets the label
only while its device plugin is registered with the kubelet; when the label goes (kubelet gone,
agent stopped) nothing acknowledges the node's pods any more: its holds are dropped at once
(`release_node`) and binds queued for it go on (`acks` says which nodes acknowledge), rather than
each waiting out the timeout.

The state comes from the informer, not from memory. A binder that restarts therefore still waits
for the pods that its predecessor bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from webhook.binder.pods import PodInfo

log = logging.getLogger(__name__)


def holds_node(pod: PodInfo) -> bool:
    """A bound pod with GPUs from the binder that the kubelet has not served yet."""
    return (pod.node_name is not None and pod.assignment is not None and pod.gpus > 0
            and pod.pending and not pod.allocated)


class AllocationGate:
    def __init__(self, timeout: float, *, on_timeout: Callable[[str, str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 acks: Callable[[str], bool] = lambda _node: True) -> None:
        self.timeout = timeout
        #: whether a node's agent acknowledges served pods now (its label)
        self._acks = acks
        self._on_timeout = on_timeout
        self._clock = clock
        self._held: dict[str, dict[str, float]] = {}  # node -> {pod key: held since}
        self._locks: dict[str, asyncio.Lock] = {}
        self._changed = asyncio.Event()

    def held(self, node: str) -> list[str]:
        return sorted(self._held.get(node, ()))

    def observe(self, pod: PodInfo) -> None:
        """An informer update. A pod that is not bound changes nothing: an event from before
        our Binding must not release the hold that the Binding took."""
        if pod.node_name is None:
            return
        if holds_node(pod):
            self._hold(pod.node_name, pod.key)
        else:
            self.release(pod.key, pod.node_name)

    def release(self, key: str, node: str | None = None) -> None:
        nodes = [node] if node is not None else list(self._held)
        for name in nodes:
            held = self._held.get(name)
            if held is not None and held.pop(key, None) is not None:
                if not held:
                    del self._held[name]
                self._notify()

    def release_node(self, node: str) -> None:
        """The node no longer acknowledges served pods: nothing holds it, and binds waiting for
        it go on now."""
        held = self._held.pop(node, None)
        if held:
            log.info("node stopped acknowledging served pods; not waiting for them",
                     extra={"node": node, "pods": sorted(held)})
            self._notify()

    def _hold(self, node: str, key: str) -> None:
        self._held.setdefault(node, {}).setdefault(key, self._clock())

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _clear(self, node: str) -> None:
        """Wait until no pod holds `node` or the node no longer acknowledges served pods; a hold
        older than the timeout is dropped."""
        while True:
            changed = self._changed
            held = self._held.get(node)
            if not held or not self._acks(node):
                return
            now = self._clock()
            for key, since in list(held.items()):
                if now - since >= self.timeout:
                    log.warning("GPU pod not acknowledged by the node agent in time; binding "
                                "the next pod anyway", extra={"node": node, "pod": key,
                                                              "seconds": self.timeout})
                    if self._on_timeout is not None:
                        self._on_timeout(node, key)
                    self.release(key, node)
            if node not in self._held:
                return
            wait = min(self.timeout - (now - s) for s in self._held[node].values())
            try:
                async with asyncio.timeout(max(wait, 0.0)):
                    await changed.wait()
            except TimeoutError:
                pass

    async def bind(self, node: str, key: str, bind: Callable[[], Awaitable[None]]) -> None:
        """Run `bind` for the pod `key` once `node` is clear; the pod then holds the node until
        the informer shows it served. Callers on one node go in their call order (FIFO lock)."""
        lock = self._locks.setdefault(node, asyncio.Lock())
        async with lock:
            await self._clear(node)
            if not self._acks(node):  # it stopped acknowledging: nothing to wait for
                await bind()
                return
            self._hold(node, key)  # before the Binding: the informer may show it served at once
            try:
                await bind()
            except BaseException:
                self.release(key, node)
                raise
