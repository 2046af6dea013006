"""The NVML the agent is given: the calls it makes, as an interface (go-gpuallocator's
`WithNvmlLib(nvml.Interface)`), and the real library behind it.

Discovery, the recorder and the XID watcher take an `Nvml`; `muster agent` builds `RealNvml`, or
with `--fake-nvml` the fake of `webhook.doubles.fakenvml`. Both keep pynvml's names, arguments
and answers (strings as `str`, PCI and memory answers as structures with its field names), and
both fail with `pynvml.NVMLError` carrying NVML's return code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, TypeAlias

import pynvml

#: opaque handles: what nvmlDeviceGetHandleByIndex and nvmlEventSetCreate return
DeviceHandle: TypeAlias = Any
EventSet: TypeAlias = Any

#: 64-bit words of the NUMA node set asked of nvmlDeviceGetMemoryAffinity: 1,024 nodes, the
#: kernel's largest MAX_NUMNODES on x86-64
NODE_SET_WORDS = 16


def mask_members(words: Sequence[int]) -> tuple[int, ...]:
    """The bit numbers set in an NVML affinity mask (64-bit words, lowest first)."""
    return tuple(64 * w + b for w, word in enumerate(words) for b in range(64) if word >> b & 1)


def members_mask(members: Iterable[int], words: int) -> list[int]:
    """`mask_members`'s inverse: the mask of `words` words with these bits set."""
    out = [0] * words
    for m in members:
        if 0 <= m < 64 * words:
            out[m // 64] |= 1 << (m % 64)
    return out


class Nvml(Protocol):
    """Every NVML call the agent makes. Blocking: the agent calls them in threads."""

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlSystemGetDriverVersion(self) -> str: ...

    def nvmlDeviceGetCount(self) -> int: ...

    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> DeviceHandle: ...

    def nvmlDeviceGetUUID(self, handle: DeviceHandle, /) -> str: ...

    def nvmlDeviceGetName(self, handle: DeviceHandle, /) -> str: ...

    def nvmlDeviceGetPciInfo(self, handle: DeviceHandle, /) -> Any: ...

    def nvmlDeviceGetMemoryInfo(self, handle: DeviceHandle, /) -> Any: ...

    def nvmlDeviceGetMemoryAffinity(self, handle: DeviceHandle, node_set_size: int, scope: int,
                                    /) -> Sequence[int]: ...

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: DeviceHandle, /) -> int: ...

    def nvmlDeviceGetNvLinkVersion(self, handle: DeviceHandle, link: int, /) -> int: ...

    def nvmlDeviceGetNvLinkState(self, handle: DeviceHandle, link: int, /) -> int: ...

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: DeviceHandle, link: int, /) -> Any: ...

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: DeviceHandle, link: int, /) -> int: ...

    def nvmlDeviceGetTopologyCommonAncestor(self, first: DeviceHandle, second: DeviceHandle,
                                            /) -> int: ...

    def nvmlEventSetCreate(self) -> EventSet: ...

    def nvmlDeviceRegisterEvents(self, handle: DeviceHandle, types: int, events: EventSet,
                                 /) -> None: ...

    def nvmlEventSetWait_v2(self, events: EventSet, timeout_ms: int, /) -> Any: ...

    def nvmlEventSetFree(self, events: EventSet, /) -> None: ...


class RealNvml:
    """NVIDIA's libnvidia-ml through nvidia-ml-py (pynvml), loaded on nvmlInit, not here."""

    def nvmlInit(self) -> None:
        pynvml.nvmlInit()

    def nvmlShutdown(self) -> None:
        pynvml.nvmlShutdown()

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(pynvml.nvmlSystemGetDriverVersion())

    def nvmlDeviceGetCount(self) -> int:
        return int(pynvml.nvmlDeviceGetCount())

    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> DeviceHandle:
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def nvmlDeviceGetUUID(self, handle: DeviceHandle, /) -> str:
        return str(pynvml.nvmlDeviceGetUUID(handle))

    def nvmlDeviceGetName(self, handle: DeviceHandle, /) -> str:
        return str(pynvml.nvmlDeviceGetName(handle))

    def nvmlDeviceGetPciInfo(self, handle: DeviceHandle, /) -> Any:
        return pynvml.nvmlDeviceGetPciInfo(handle)

    def nvmlDeviceGetMemoryInfo(self, handle: DeviceHandle, /) -> Any:
        return pynvml.nvmlDeviceGetMemoryInfo(handle)

    def nvmlDeviceGetMemoryAffinity(self, handle: DeviceHandle, node_set_size: int, scope: int,
                                    /) -> Sequence[int]:
        return [int(w) for w in pynvml.nvmlDeviceGetMemoryAffinity(handle, node_set_size, scope)]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: DeviceHandle, /) -> int:
        return int(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))

    def nvmlDeviceGetNvLinkVersion(self, handle: DeviceHandle, link: int, /) -> int:
        return int(pynvml.nvmlDeviceGetNvLinkVersion(handle, link))

    def nvmlDeviceGetNvLinkState(self, handle: DeviceHandle, link: int, /) -> int:
        return int(pynvml.nvmlDeviceGetNvLinkState(handle, link))

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: DeviceHandle, link: int, /) -> Any:
        return pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: DeviceHandle, link: int, /) -> int:
        return int(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))

    def nvmlDeviceGetTopologyCommonAncestor(self, first: DeviceHandle, second: DeviceHandle,
                                            /) -> int:
        return int(pynvml.nvmlDeviceGetTopologyCommonAncestor(first, second))

    def nvmlEventSetCreate(self) -> EventSet:
        return pynvml.nvmlEventSetCreate()

    def nvmlDeviceRegisterEvents(self, handle: DeviceHandle, types: int, events: EventSet,
                                 /) -> None:
        pynvml.nvmlDeviceRegisterEvents(handle, types, events)

    def nvmlEventSetWait_v2(self, events: EventSet, timeout_ms: int, /) -> Any:
        return pynvml.nvmlEventSetWait_v2(events, timeout_ms)

    def nvmlEventSetFree(self, events: EventSet, /) -> None:
        pynvml.nvmlEventSetFree(events)
