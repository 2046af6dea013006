"""GPU health from NVML's critical XID events, as the NVIDIA device plugin watches them.

`XidWatcher.run` blocks (NVML's event wait is a C call), so the agent runs it in a thread and
passes each GPU fault to the event loop. XIDs that report an application's error rather than a
GPU fault are skipped (the NVIDIA plugin's default list); every other critical XID marks the GPU
unhealthy until the agent restarts.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass

import pynvml

from webhook.agent.nvml import EventSet, Nvml
from webhook.topology.model import Topology

log = logging.getLogger(__name__)

#: 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing,
#: 45 preemptive cleanup, 68 video processor exception, 109 context switch timeout: a faulty
#: application, not a faulty GPU
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True, slots=True)
class XidEvent:
    uuid: str
    xid: int


def mark_unhealthy(topology: Topology, uuids: Collection[str]) -> Topology:
    """The topology with the GPUs in `uuids` unhealthy."""
    if not any(g.uuid in uuids for g in topology.gpus):
        return topology
    return dataclasses.replace(topology, gpus=tuple(
        dataclasses.replace(g, healthy=False) if g.uuid in uuids else g for g in topology.gpus))


class XidWatcher:
    def __init__(self, nvml: Nvml, skip: Collection[int] = APPLICATION_XIDS,
                 wait_ms: int = 1000) -> None:
        self.nvml = nvml
        self.skip = frozenset(skip)
        self.wait_ms = wait_ms

    def run(self, stop: threading.Event, emit: Callable[[XidEvent], None]) -> None:
        """Watch until `stop` is set. NVML failing to start leaves health to re-discovery."""
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except pynvml.NVMLError as exc:
            log.warning("XID events unavailable: NVML did not start", extra={"error": str(exc)})
            return
        try:
            events = nvml.nvmlEventSetCreate()
            try:
                self._register(events)
                while not stop.is_set():
                    self._wait_one(events, emit, stop)
            finally:
                nvml.nvmlEventSetFree(events)
        except pynvml.NVMLError as exc:
            log.warning("XID event watch ended", extra={"error": str(exc)})
        finally:
            try:
                nvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                log.warning("nvmlShutdown failed", extra={"error": str(exc)})

    def _register(self, events: EventSet) -> None:
        nvml = self.nvml
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError,
                                              events)
            except pynvml.NVMLError as exc:
                # e.g. NotSupported on some boards: that GPU's faults show up at re-discovery
                log.warning("cannot watch XID events", extra={"gpu": index, "error": str(exc)})

    def _wait_one(self, events: EventSet, emit: Callable[[XidEvent], None],
                  stop: threading.Event) -> None:
        nvml = self.nvml
        try:
            data = nvml.nvmlEventSetWait_v2(events, self.wait_ms)
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_TIMEOUT:
                log.warning("XID event wait failed", extra={"error": str(exc)})
                stop.wait(self.wait_ms / 1000)  # do not spin on a persistent error
            return
        if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
            return
        xid = int(data.eventData)
        if xid in self.skip:
            log.info("application XID ignored", extra={"xid": xid})
            return
        try:
            uuid = str(nvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError as exc:
            log.warning("XID on a GPU NVML cannot name", extra={"xid": xid, "error": str(exc)})
            return
        log.warning("GPU fault: marking the GPU unhealthy", extra={"gpu": uuid, "xid": xid})
        emit(XidEvent(uuid, xid))
