"""What NVML answered on one node, as JSON: the fake NVML replays it, the recorder writes it.

One format serves both directions, so a file recorded on a real GPU node (`muster agent discover
--record FILE`) and the built-in profiles of `webhook.doubles.fakenvml` go through the same code.
Every answer is either the value pynvml returned or `{"error": <NVML return code>}`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import pynvml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from webhook.agent.nvml import NODE_SET_WORDS, DeviceHandle, Nvml, mask_members

log = logging.getLogger(__name__)

T = TypeVar("T")


class Err(BaseModel):
    """An NVML call that failed with this return code (pynvml.NVML_ERROR_*)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    error: int


class LinkRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    state: int | Err
    remote_pci_bus_id: str | Err | None = Field(default=None, alias="remotePciBusId")
    remote_type: int | Err | None = Field(default=None, alias="remoteType")


class DeviceRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    #: nvmlDeviceGetHandleByIndex failed: every other field is absent
    handle_error: int | None = Field(default=None, alias="handleError")
    uuid: str | Err = Err(error=pynvml.NVML_ERROR_UNKNOWN)
    name: str | Err = Err(error=pynvml.NVML_ERROR_UNKNOWN)
    pci_bus_id: str | Err = Field(default=Err(error=pynvml.NVML_ERROR_UNKNOWN), alias="pciBusId")
    memory_total: int | Err = Field(
        default=Err(error=pynvml.NVML_ERROR_UNKNOWN), alias="memoryTotal"
    )
    #: the NUMA nodes in nvmlDeviceGetMemoryAffinity's node-scope mask
    memory_affinity: list[int] | Err = Field(
        default=Err(error=pynvml.NVML_ERROR_NOT_SUPPORTED), alias="memoryAffinity"
    )
    max_pcie_gen: int | Err = Field(
        default=Err(error=pynvml.NVML_ERROR_NOT_SUPPORTED), alias="maxPcieLinkGeneration"
    )
    nvlink_version: int | Err = Field(
        default=Err(error=pynvml.NVML_ERROR_NOT_SUPPORTED), alias="nvlinkVersion"
    )
    #: links 0..len-1; every higher link number answers `links_beyond`
    links: list[LinkRecord] = Field(default_factory=list)
    links_beyond: Err = Field(
        default=Err(error=pynvml.NVML_ERROR_INVALID_ARGUMENT), alias="linksBeyond"
    )
    #: nvmlDeviceGetTopologyCommonAncestor(this, other) keyed by the other GPU's index
    common_ancestor: dict[int, int | Err] = Field(default_factory=dict, alias="commonAncestor")

    def link(self, number: int) -> LinkRecord:
        if number < len(self.links):
            return self.links[number]
        return LinkRecord(state=self.links_beyond)


class NvmlRecord(BaseModel):
    """Everything the discovery asks NVML, for one node."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    #: 2: NUMA from the memory affinity (v1 asked nvmlDeviceGetNumaNodeId: re-record)
    v: Literal[2] = 2
    source: str = ""
    init_error: int | None = Field(default=None, alias="initError")
    driver_version: str | Err = Field(
        default=Err(error=pynvml.NVML_ERROR_UNKNOWN), alias="driverVersion"
    )
    device_count: int | Err = Field(alias="deviceCount")
    devices: list[DeviceRecord] = Field(default_factory=list)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_defaults=False, indent=1)

    @classmethod
    def from_json(cls, text: str | bytes, name: str) -> NvmlRecord:
        """The record in `text`; ValueError in one line naming `name` and what is wrong."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "document"
            if first["loc"] == ("v",):
                raise ValueError(f"{name}: an NVML recording of format v={first['input']}; this "
                                 "Muster reads v=2: record it again with `muster agent discover "
                                 "--record`") from None
            raise ValueError(f"{name}: not an NVML recording: {where}: {first['msg']}") from None


def _answer(fn: Callable[..., T], *args: Any) -> T | Err:
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        return Err(error=int(exc.value))


def _anon_uuid(uuid: str, salt: str) -> str:
    digest = hashlib.sha256((salt + uuid).encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def record_nvml(nvml: Nvml, source: str = "", anonymise_salt: str | None = None) -> NvmlRecord:
    """Ask `nvml` (real or fake) everything discovery asks, keeping answers and errors.

    With `anonymise_salt`, UUIDs are replaced by salted hashes (stable within one file).
    """
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as exc:
        code = int(exc.value)
        return NvmlRecord(source=source, init_error=code, device_count=Err(error=code))
    try:
        driver = _answer(nvml.nvmlSystemGetDriverVersion)
        count = _answer(nvml.nvmlDeviceGetCount)
        handles: list[Any] = []
        devices: list[DeviceRecord] = []
        for index in range(count if isinstance(count, int) else 0):
            handle = _answer(nvml.nvmlDeviceGetHandleByIndex, index)
            handles.append(handle)
            if isinstance(handle, Err):
                devices.append(DeviceRecord(handle_error=handle.error))
                continue
            devices.append(_record_device(nvml, handle))
        for i, hi in enumerate(handles):
            if isinstance(hi, Err):
                continue
            for j, hj in enumerate(handles):
                if j != i and not isinstance(hj, Err):
                    devices[i].common_ancestor[j] = _answer(
                        nvml.nvmlDeviceGetTopologyCommonAncestor, hi, hj
                    )
    finally:
        try:
            nvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.warning("nvmlShutdown failed", extra={"error": str(exc)})
    rec = NvmlRecord(source=source, driver_version=driver, device_count=count, devices=devices)
    if anonymise_salt is not None:
        for dev in rec.devices:
            if isinstance(dev.uuid, str):
                dev.uuid = _anon_uuid(dev.uuid, anonymise_salt)
    return rec


def _record_device(nvml: Nvml, handle: DeviceHandle) -> DeviceRecord:
    memory = _answer(nvml.nvmlDeviceGetMemoryInfo, handle)
    pci = _answer(nvml.nvmlDeviceGetPciInfo, handle)
    affinity = _answer(nvml.nvmlDeviceGetMemoryAffinity, handle, NODE_SET_WORDS,
                       pynvml.NVML_AFFINITY_SCOPE_NODE)
    links: list[LinkRecord] = []
    for number in range(pynvml.NVML_NVLINK_MAX_LINKS):
        state = _answer(nvml.nvmlDeviceGetNvLinkState, handle, number)
        link = LinkRecord(state=state)
        if not isinstance(state, Err):
            remote = _answer(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, number)
            link.remote_pci_bus_id = remote if isinstance(remote, Err) else str(remote.busId)
            link.remote_type = _answer(nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, number)
        links.append(link)
    # collapse the trailing run of identical errors (links the GPU does not have)
    beyond = Err(error=pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if links and isinstance(links[-1].state, Err):
        beyond = links[-1].state
        while links and links[-1].state == beyond:
            links.pop()
    return DeviceRecord(
        uuid=_answer(nvml.nvmlDeviceGetUUID, handle),
        name=_answer(nvml.nvmlDeviceGetName, handle),
        pci_bus_id=pci if isinstance(pci, Err) else str(pci.busId),
        memory_total=memory if isinstance(memory, Err) else int(memory.total),
        memory_affinity=affinity if isinstance(affinity, Err) else list(mask_members(affinity)),
        max_pcie_gen=_answer(nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        nvlink_version=_answer(nvml.nvmlDeviceGetNvLinkVersion, handle, 0),
        links=links,
        links_beyond=beyond,
    )
