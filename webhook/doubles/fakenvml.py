"""A fake NVML: the agent's `Nvml` interface (webhook.agent.nvml), answering from an NvmlRecord.

Discovery code cannot tell it from the real library: strings come back as `str` (pynvml decodes
them), PCI and memory answers are the real ctypes structures, and failures raise
`pynvml.NVMLError` with the real return codes. The answers come from a recorded JSON file
(`muster agent discover --record`) or a built-in profile; `lose_gpu_after` injects a GPU that
falls off the bus mid-discovery.
"""

from __future__ import annotations

import queue
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from webhook.agent.nvml import members_mask
from webhook.agent.nvmlrecord import DeviceRecord, Err, LinkRecord, NvmlRecord
from webhook.topology.builtin import DGX1_V100_NVLINKS, synthetic_uuid

T = TypeVar("T")

_BUS_ID = re.compile(
    r"^(?P<domain>[0-9a-fA-F]+):(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.\d$")


@dataclass(frozen=True, slots=True)
class FakeHandle:
    """Opaque device handle, as nvmlDeviceGetHandleByIndex's c_nvmlDevice_t."""

    index: int


@dataclass(frozen=True, slots=True)
class FakeEventData:
    """c_nvmlEventData_t's fields (a ctypes structure cannot hold a FakeHandle)."""

    device: FakeHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0
    computeInstanceId: int = 0


@dataclass(eq=False)
class FakeEventSet:
    devices: set[int] = field(default_factory=set)
    queue: queue.Queue[FakeEventData] = field(default_factory=queue.Queue)


def _pci_info(bus_id: str) -> Any:
    match = _BUS_ID.match(bus_id)
    if match is None:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    info = pynvml.nvmlPciInfo_t()
    info.busId = bus_id.encode()
    info.busIdLegacy = f"{int(match['domain'], 16):04x}:{match['bus']}:{match['dev']}.0".encode()
    info.domain = int(match["domain"], 16)
    info.bus = int(match["bus"], 16)
    info.device = int(match["dev"], 16)
    return info


def _value(answer: T | Err) -> T:
    if isinstance(answer, Err):
        raise pynvml.NVMLError(answer.error)
    return answer


class FakeNvml:
    """Stands in for `webhook.agent.nvml.RealNvml`. Not thread safe (neither is discovery)."""

    def __init__(self, record: NvmlRecord) -> None:
        self.record = record
        self.initialised = 0
        self.calls: list[str] = []
        self._lost: dict[int, int] = {}  # GPU index -> calls left before it is lost
        self._event_sets: list[FakeEventSet] = []

    @classmethod
    def from_file(cls, path: str | Path) -> FakeNvml:
        return cls(NvmlRecord.from_json(Path(path).read_bytes(), str(path)))

    @classmethod
    def profile(cls, name: str) -> FakeNvml:
        return cls(profile_record(name))

    def inject_xid(self, index: int, xid: int) -> None:
        """A critical XID on GPU `index`, delivered to every event set watching it."""
        for events in self._event_sets:
            if index in events.devices:
                events.queue.put(FakeEventData(FakeHandle(index),
                                               pynvml.nvmlEventTypeXidCriticalError, xid))

    def lose_gpu_after(self, index: int, calls: int) -> None:
        """After `calls` more NVML calls on this GPU, every call on it raises GPU_IS_LOST."""
        self._lost[index] = calls

    # --- helpers -----------------------------------------------------------------------------

    def _enter(self, fn: str, *handles: FakeHandle) -> None:
        self.calls.append(fn)
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        for handle in handles:
            if not isinstance(handle, FakeHandle):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            left = self._lost.get(handle.index)
            if left is not None:
                if left <= 0:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
                self._lost[handle.index] = left - 1

    def _device(self, fn: str, handle: FakeHandle) -> DeviceRecord:
        self._enter(fn, handle)
        return self.record.devices[handle.index]

    def _link(self, fn: str, handle: FakeHandle, link: int) -> LinkRecord:
        dev = self._device(fn, handle)
        if not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return dev.link(link)

    # --- the pynvml API ----------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.record.init_error is not None:
            raise pynvml.NVMLError(self.record.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return _value(self.record.driver_version)

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return _value(self.record.device_count)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.record.devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dev = self.record.devices[index]
        if dev.handle_error is not None:
            raise pynvml.NVMLError(dev.handle_error)
        if self._lost.get(index, 1) <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return FakeHandle(index)

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        return _value(self._device("nvmlDeviceGetUUID", handle).uuid)

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return _value(self._device("nvmlDeviceGetName", handle).name)

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> Any:
        return _pci_info(_value(self._device("nvmlDeviceGetPciInfo", handle).pci_bus_id))

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> Any:
        total = _value(self._device("nvmlDeviceGetMemoryInfo", handle).memory_total)
        return pynvml.c_nvmlMemory_t(total=total, free=total, used=0)

    def nvmlDeviceGetMemoryAffinity(self, handle: FakeHandle, node_set_size: int,
                                    scope: int) -> list[int]:
        nodes = _value(self._device("nvmlDeviceGetMemoryAffinity", handle).memory_affinity)
        if scope != pynvml.NVML_AFFINITY_SCOPE_NODE:  # only the node scope is recorded
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return members_mask(nodes, node_set_size)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeHandle) -> int:
        return _value(self._device("nvmlDeviceGetMaxPcieLinkGeneration", handle).max_pcie_gen)

    def nvmlDeviceGetNvLinkVersion(self, handle: FakeHandle, link: int) -> int:
        state = self._link("nvmlDeviceGetNvLinkVersion", handle, link).state
        _value(state)  # a link the GPU does not have answers like nvmlDeviceGetNvLinkState
        return _value(self.record.devices[handle.index].nvlink_version)

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> int:
        return _value(self._link("nvmlDeviceGetNvLinkState", handle, link).state)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: FakeHandle, link: int) -> Any:
        rec = self._link("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        _value(rec.state)
        if rec.remote_pci_bus_id is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _pci_info(_value(rec.remote_pci_bus_id))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: FakeHandle, link: int) -> int:
        rec = self._link("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        _value(rec.state)
        if rec.remote_type is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _value(rec.remote_type)

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._enter("nvmlEventSetCreate")
        events = FakeEventSet()
        self._event_sets.append(events)
        return events

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, types: int,
                                 events: FakeEventSet) -> None:
        self._device("nvmlDeviceRegisterEvents", handle)
        if types & pynvml.nvmlEventTypeXidCriticalError:
            events.devices.add(handle.index)

    def nvmlEventSetWait_v2(self, events: FakeEventSet, timeoutms: int) -> FakeEventData:
        self._enter("nvmlEventSetWait_v2")
        try:
            return events.queue.get(timeout=timeoutms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, events: FakeEventSet) -> None:
        self._enter("nvmlEventSetFree")
        self._event_sets.remove(events)

    def nvmlDeviceGetTopologyCommonAncestor(self, first: FakeHandle, second: FakeHandle) -> int:
        self._enter("nvmlDeviceGetTopologyCommonAncestor", first, second)
        if first.index == second.index:
            return int(pynvml.NVML_TOPOLOGY_INTERNAL)
        answer = self.record.devices[first.index].common_ancestor.get(second.index)
        if answer is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _value(answer)


# --- built-in profiles: real machines' answers ---------------------------------------------------

_DGX1_BUS = ("06", "07", "0A", "0B", "85", "86", "89", "8A")


def _bus(bus: str) -> str:
    return f"00000000:{bus}:00.0"


def _pcie_level(i: int, j: int, same_pair: int, same_socket: int) -> int:
    """8-GPU boards: GPUs (0,1) (2,3) (4,5) (6,7) share a switch, 0-3 and 4-7 a CPU socket."""
    if i // 2 == j // 2:
        return same_pair
    if i // 4 == j // 4:
        return same_socket
    return int(pynvml.NVML_TOPOLOGY_SYSTEM)


def _dgx1_v100(remote_type: str) -> NvmlRecord:
    devices = []
    for i in range(8):
        peers = [j for j in range(8) for _ in range(DGX1_V100_NVLINKS[i][j])]
        links = []
        for j in peers:
            rtype: int | Err | None
            if remote_type == "gpu":
                rtype = int(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)
            else:
                # R418-era drivers (what DGX-1 systems ran) lack the call entirely
                rtype = Err(error=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            links.append(LinkRecord(state=pynvml.NVML_FEATURE_ENABLED,
                                    remote_pci_bus_id=_bus(_DGX1_BUS[j]), remote_type=rtype))
        devices.append(DeviceRecord(
            uuid=synthetic_uuid("dgx1-v100", i),  # the node type's: the fake is exactly it
            name="Tesla V100-SXM2-16GB",
            pci_bus_id=_bus(_DGX1_BUS[i]),
            memory_total=16945512448,  # 16160 MiB, what a V100-SXM2-16GB reports
            memory_affinity=[i // 4],
            max_pcie_gen=3,
            nvlink_version=pynvml.NVML_NVLINK_VERSION_2_0,
            links=links,
            common_ancestor={j: _pcie_level(
                i, j, pynvml.NVML_TOPOLOGY_SINGLE, pynvml.NVML_TOPOLOGY_HOSTBRIDGE)
                            for j in range(8) if j != i},
        ))
    return NvmlRecord(source=f"profile dgx1-v100 (remote type: {remote_type})",
                      driver_version="418.165.02" if remote_type != "gpu" else "535.183.01",
                      device_count=8, devices=devices)


@dataclass(frozen=True, slots=True)
class _Hgx:
    """An 8-GPU HGX board: every GPU's NVLinks go into the board's NVSwitch chips."""

    name: str
    model: str
    bus: tuple[str, ...]
    #: each NVSwitch chip's PCI bus, and how many links every GPU has into it
    switches: tuple[tuple[str, int], ...]
    memory_total: int
    pcie_gen: int
    nvlink_version: int
    same_pair: int  # PCIe level of GPUs 2i and 2i + 1
    same_socket: int
    driver: str


_HGX_A100 = _Hgx(
    "hgx-a100", "NVIDIA A100-SXM4-80GB", ("07", "0F", "47", "4E", "87", "90", "B7", "BD"),
    tuple((bus, 2) for bus in ("C4", "C5", "C6", "C7", "C8", "C9")),  # 12 links into 6
    85899345920,  # 81920 MiB
    4, pynvml.NVML_NVLINK_VERSION_3_0, pynvml.NVML_TOPOLOGY_MULTIPLE, pynvml.NVML_TOPOLOGY_NODE,
    "535.183.01")
#: 18 NVLink 4 links into 4 third-generation NVSwitch chips (5 + 4 + 4 + 5), each GPU behind
#: its own PCIe switch (NODE within a socket)
_HGX_H100 = _Hgx(
    "hgx-h100", "NVIDIA H100 80GB HBM3", ("1B", "43", "52", "61", "9D", "C3", "D1", "DF"),
    (("A2", 5), ("A3", 4), ("A4", 4), ("A5", 5)),
    85520809984,  # 81559 MiB, what an H100 80GB HBM3 reports
    5, pynvml.NVML_NVLINK_VERSION_4_0, pynvml.NVML_TOPOLOGY_NODE, pynvml.NVML_TOPOLOGY_NODE,
    "550.54.15")


def _hgx(board: _Hgx) -> NvmlRecord:
    devices = []
    for i in range(8):
        links = [LinkRecord(state=pynvml.NVML_FEATURE_ENABLED, remote_pci_bus_id=_bus(bus),
                            remote_type=pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
                 for bus, count in board.switches for _ in range(count)]
        devices.append(DeviceRecord(
            uuid=synthetic_uuid(board.name, i),
            name=board.model,
            pci_bus_id=_bus(board.bus[i]),
            memory_total=board.memory_total,
            memory_affinity=[i // 4],
            max_pcie_gen=board.pcie_gen,
            nvlink_version=board.nvlink_version,
            links=links,
            common_ancestor={j: _pcie_level(i, j, board.same_pair, board.same_socket)
                             for j in range(8) if j != i},
        ))
    return NvmlRecord(source=f"profile {board.name}", driver_version=board.driver,
                      device_count=8, devices=devices)


PROFILES: dict[str, Callable[[], NvmlRecord]] = {
    # remote device type raises FunctionNotFound (old driver): discovery must use the fallback
    "dgx1-v100": lambda: _dgx1_v100("function-not-found"),
    # the same machine on a current driver, which answers the remote device type
    "dgx1-v100-r535": lambda: _dgx1_v100("gpu"),
    "hgx-a100": lambda: _hgx(_HGX_A100),
    "hgx-h100": lambda: _hgx(_HGX_H100),
}


def profile_record(name: str) -> NvmlRecord:
    try:
        return PROFILES[name]()
    except KeyError:
        raise ValueError(f"unknown fake NVML profile {name!r}; known: {sorted(PROFILES)}") from None


def fake_nvml(spec: str) -> FakeNvml:
    """What `--fake-nvml SPEC` names: a built-in profile or a file recorded with --record.

    `PROFILE@NAME` is the profile with GPU UUIDs of its own for NAME (a node's: the chart's
    `--fake-nvml=dgx1-v100@$(NODE_NAME)`), so the fake nodes of one cluster share no UUID, as
    real GPUs never do."""
    profile, _, owner = spec.partition("@")
    if profile in PROFILES:
        record = profile_record(profile)
        if owner:
            record = record.model_copy(update={"devices": [
                d.model_copy(update={"uuid": synthetic_uuid(f"{profile}@{owner}", i)})
                for i, d in enumerate(record.devices)]})
        return FakeNvml(record)
    if Path(spec).is_file():
        return FakeNvml.from_file(spec)
    raise ValueError(f"--fake-nvml {spec!r}: neither a profile ({', '.join(PROFILES)}), "
                     "a profile@NAME, nor a recorded file")
