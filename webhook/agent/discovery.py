"""NVML → Topology: what the node's GPUs are and how they are wired.

`discover(nvml)` takes an `Nvml` (webhook.agent.nvml), real or fake. A failing NVML call
degrades the one field it was asked for (recorded in `Discovery.degradations` and logged), never
the whole run; only a failed nvmlInit/nvmlDeviceGetCount leaves no topology at all. Answers a
driver gives for features the hardware or driver lacks (NotSupported, FunctionNotFound,
InvalidArgument for link numbers past the GPU's last link) are facts, not failures, and degrade
nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pynvml

from webhook.agent.nvml import NODE_SET_WORDS, Nvml, mask_members
from webhook.topology.model import GPU, PCIeLevel, Topology

log = logging.getLogger(__name__)

#: "the driver/hardware does not have this": a fact about the node, not a failure
_ABSENT = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
#: nvmlDeviceGetNvLinkState for a link number the GPU does not have
_NO_SUCH_LINK = _ABSENT | {pynvml.NVML_ERROR_INVALID_ARGUMENT}

#: unidirectional GB/s of one link per NVLink generation (nvmlDeviceGetNvLinkVersion)
_NVLINK_GBPS = {
    pynvml.NVML_NVLINK_VERSION_1_0: 20.0,  # P100
    pynvml.NVML_NVLINK_VERSION_2_0: 25.0,  # V100
    pynvml.NVML_NVLINK_VERSION_2_2: 25.0,
    pynvml.NVML_NVLINK_VERSION_3_0: 25.0,  # A100
    pynvml.NVML_NVLINK_VERSION_3_1: 25.0,
    pynvml.NVML_NVLINK_VERSION_4_0: 25.0,  # H100
    pynvml.NVML_NVLINK_VERSION_5_0: 50.0,  # B200
}
DEFAULT_NVLINK_GBPS = 25.0
DEFAULT_PCIE_GEN = 3
#: UUID of a GPU that NVML lists but will not identify (keeps its index; never a real UUID)
UNKNOWN_UUID_PREFIX = "unknown-gpu-"

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Degradation:
    """One NVML answer that was missing or wrong, and what was assumed instead."""

    field: str  # e.g. "gpu[3].nvlink[2].state", "pcie[0][5]"
    code: int  # pynvml.NVML_ERROR_* (0 when NVML answered but the answer made no sense)
    message: str


@dataclass(frozen=True, slots=True)
class Discovery:
    topology: Topology | None  # None: NVML unusable (not initialised, no device count)
    degradations: tuple[Degradation, ...] = ()
    driver_version: str = ""

    @property
    def degraded(self) -> bool:
        """The node label muster.io/gpu-degraded: NVML failed somewhere or a GPU is unhealthy."""
        if self.topology is None or self.degradations:
            return True
        return any(not gpu.healthy for gpu in self.topology.gpus)


@dataclass
class _Probe:
    nvml: Nvml
    problems: list[Degradation] = field(default_factory=list)
    lost: set[int] = field(default_factory=set)

    def ask(self, where: str, gpu: int | None, fn: Callable[..., Any], *args: Any,
            facts: frozenset[int] = frozenset()) -> tuple[Any, int | None]:
        """(answer, None) or (None, error code); codes in `facts` are not degradations."""
        try:
            return fn(*args), None
        except pynvml.NVMLError as exc:
            code = int(exc.value)
        if code == pynvml.NVML_ERROR_GPU_IS_LOST and gpu is not None:
            self.lost.add(gpu)
        if code in facts:
            log.debug("nvml: not available", extra={"field": where, "code": code})
        else:
            self.degrade(where, code, str(pynvml.NVMLError(code)))
        return None, code

    def degrade(self, where: str, code: int, message: str) -> None:
        self.problems.append(Degradation(where, code, message))
        log.warning("nvml: degraded field", extra={"field": where, "code": code, "error": message})


def _pci_key(info: Any) -> tuple[int, int, int]:
    return int(info.domain), int(info.bus), int(info.device)


def discover(nvml: Nvml) -> Discovery:
    """Ask NVML for the node's GPUs, their PCIe levels, NVLinks and NVSwitch membership."""
    probe = _Probe(nvml)
    _, err = probe.ask("nvml.init", None, nvml.nvmlInit)
    if err is not None:
        return Discovery(None, tuple(probe.problems))
    try:
        return _discover(probe)
    finally:
        probe.ask("nvml.shutdown", None, nvml.nvmlShutdown)


def _discover(probe: _Probe) -> Discovery:
    nvml = probe.nvml
    driver, _ = probe.ask("driverVersion", None, nvml.nvmlSystemGetDriverVersion)
    count, err = probe.ask("deviceCount", None, nvml.nvmlDeviceGetCount)
    if err is not None:
        return Discovery(None, tuple(probe.problems), driver or "")

    handles: list[Any] = []
    fields: list[dict[str, Any]] = []
    for i in range(count):
        handle, _ = probe.ask(f"gpu[{i}].handle", i, nvml.nvmlDeviceGetHandleByIndex, i)
        handles.append(handle)
        fields.append(_gpu_fields(probe, i, handle) if handle is not None else {})
        if handle is None:
            probe.lost.add(i)

    by_pci = {f["pci_key"]: i for i, f in enumerate(fields) if "pci_key" in f}
    reach = [_probe_nvlinks(probe, i, h, by_pci, count) if h is not None else _Links()
             for i, h in enumerate(handles)]

    pcie = [[PCIeLevel.INTERNAL] * count for _ in range(count)]
    for i in range(count):
        for j in range(i + 1, count):
            level = _pcie_level(probe, i, j, handles[i], handles[j])
            pcie[i][j] = pcie[j][i] = level

    gpus = tuple(
        GPU(
            index=i,
            # a GPU whose UUID NVML would not give keeps its index, under a name no GPU has
            uuid=f.get("uuid", f"{UNKNOWN_UUID_PREFIX}{i}"),
            pci_bus_id=f.get("pci_bus_id", ""),
            model=f.get("model", ""),
            numa_node=f.get("numa_node"),
            memory_mib=f.get("memory_mib"),
            healthy=i not in probe.lost and "uuid" in f,
        )
        for i, f in enumerate(fields)
    )
    # a link seen from either end exists (one end may have been lost mid-discovery)
    nvlinks = tuple(
        tuple(0 if i == j else max(reach[i].peers.get(j, 0), reach[j].peers.get(i, 0))
              for j in range(count))
        for i in range(count))
    on_switch = frozenset(i for i in range(count) if reach[i].to_switch)
    gbps = min((_NVLINK_GBPS.get(r.version, DEFAULT_NVLINK_GBPS)
                for r in reach if r.version is not None), default=DEFAULT_NVLINK_GBPS)
    topology = Topology(
        gpus=gpus,
        nvlinks=nvlinks,
        pcie=tuple(tuple(row) for row in pcie),
        nvlink_gbps=gbps,
        nvswitch=on_switch,
        nvswitch_links=min((reach[i].to_switch for i in on_switch), default=0),
        # the slowest GPU's link generation bounds PCIe transfers between them
        pcie_gen=min((f["pcie_gen"] for f in fields if "pcie_gen" in f),
                     default=DEFAULT_PCIE_GEN),
    )
    return Discovery(topology, tuple(probe.problems), driver or "")


def _gpu_fields(probe: _Probe, i: int, handle: Any) -> dict[str, Any]:
    nvml = probe.nvml
    out: dict[str, Any] = {}
    uuid, _ = probe.ask(f"gpu[{i}].uuid", i, nvml.nvmlDeviceGetUUID, handle)
    if uuid:
        out["uuid"] = str(uuid)
    name, _ = probe.ask(f"gpu[{i}].model", i, nvml.nvmlDeviceGetName, handle)
    if name is not None:
        out["model"] = str(name)
    pci, _ = probe.ask(f"gpu[{i}].pciBusId", i, nvml.nvmlDeviceGetPciInfo, handle)
    if pci is not None:
        out["pci_bus_id"] = str(pci.busId)
        out["pci_key"] = _pci_key(pci)
    memory, _ = probe.ask(f"gpu[{i}].memory", i, nvml.nvmlDeviceGetMemoryInfo, handle)
    if memory is not None:
        out["memory_mib"] = int(memory.total) // _MIB
    # the NUMA node the GPU hangs off, as topo -m's "NUMA Affinity" column reads it
    # (nvmlDeviceGetNumaNodeId is the GPU memory's own node: NotSupported on x86 servers)
    mask, _ = probe.ask(f"gpu[{i}].numaNode", i, nvml.nvmlDeviceGetMemoryAffinity, handle,
                        NODE_SET_WORDS, pynvml.NVML_AFFINITY_SCOPE_NODE, facts=_ABSENT)
    nodes = mask_members(mask) if mask is not None else ()
    if len(nodes) == 1:  # none, or several equally near: no one node to name
        out["numa_node"] = nodes[0]
    gen, _ = probe.ask(f"gpu[{i}].pcieGen", i, nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle,
                       facts=_ABSENT)
    if gen is not None and int(gen) > 0:
        out["pcie_gen"] = int(gen)
    return out


@dataclass
class _Links:
    """What one GPU's NVLinks reach: peer index → link count, links into an NVSwitch."""

    peers: dict[int, int] = field(default_factory=dict)
    to_switch: int = 0
    version: int | None = None


def _probe_nvlinks(probe: _Probe, i: int, handle: Any,
                   by_pci: dict[tuple[int, int, int], int], count: int) -> _Links:
    nvml = probe.nvml
    out = _Links()
    asked_version = False
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        where = f"gpu[{i}].nvlink[{link}]"
        state, err = probe.ask(f"{where}.state", i, nvml.nvmlDeviceGetNvLinkState, handle, link,
                               facts=_NO_SUCH_LINK)
        if err == pynvml.NVML_ERROR_GPU_IS_LOST:
            return out
        if state != pynvml.NVML_FEATURE_ENABLED:
            continue
        if not asked_version:
            asked_version = True
            out.version, _ = probe.ask(f"{where}.version", i, nvml.nvmlDeviceGetNvLinkVersion,
                                       handle, link, facts=_ABSENT)
        rtype, _ = probe.ask(f"{where}.remoteType", i, nvml.nvmlDeviceGetNvLinkRemoteDeviceType,
                             handle, link, facts=_ABSENT)
        if rtype == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            out.to_switch += 1
            continue
        if rtype is not None and rtype != pynvml.NVML_NVLINK_DEVICE_TYPE_GPU:
            continue  # IBM NPU or unknown: no GPU peer behind this link
        remote, _ = probe.ask(f"{where}.remotePci", i, nvml.nvmlDeviceGetNvLinkRemotePciInfo,
                              handle, link)
        if remote is None:
            continue
        peer = by_pci.get(_pci_key(remote))
        if peer is not None and peer != i:
            out.peers[peer] = out.peers.get(peer, 0) + 1
        elif rtype is None and len(by_pci) == count:
            # no remote type (older driver): a link to a PCI device that is not one of our GPUs
            # ends at an NVSwitch (only knowable while every GPU's PCI id is known)
            out.to_switch += 1
        else:
            probe.degrade(f"{where}.remotePci", 0,
                          f"NVLink peer {remote.busId} is not a GPU NVML listed")
    return out


def _pcie_level(probe: _Probe, i: int, j: int, hi: Any, hj: Any) -> PCIeLevel:
    where = f"pcie[{i}][{j}]"
    if hi is None or hj is None:
        probe.degrade(where, pynvml.NVML_ERROR_GPU_IS_LOST, "GPU has no handle; assuming SYS")
        return PCIeLevel.SYS
    # a lost GPU here could be either one: health comes from each GPU's own calls
    value, err = probe.ask(where, None, probe.nvml.nvmlDeviceGetTopologyCommonAncestor, hi, hj)
    if err is not None:
        return PCIeLevel.SYS
    try:
        return PCIeLevel(int(value))
    except ValueError:
        probe.degrade(where, 0, f"unknown topology level {value}; assuming SYS")
        return PCIeLevel.SYS


def keep_identity(previous: Topology | None, current: Topology) -> Topology:
    """A GPU whose UUID NVML no longer gives (lost since) keeps the UUID it had, so that the
    kubelet sees that device turn unhealthy rather than a new device appear."""
    if previous is None or previous.size != current.size:
        return current
    gpus = tuple(
        replace(old, healthy=False) if _identified(old) and not _identified(new) else new
        for old, new in zip(previous.gpus, current.gpus, strict=True))
    return replace(current, gpus=gpus)


def _identified(gpu: GPU) -> bool:
    return gpu.uuid is not None and not gpu.uuid.startswith(UNKNOWN_UUID_PREFIX)
