"""What the binder needs from a node, parsed once per node resourceVersion."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook import keys
from webhook.binder.agents import AgentPod, parse_agent
from webhook.binder.pods import Toleration
from webhook.quantity import QuantityError, cpu_milli, whole
from webhook.topology.codec import decode
from webhook.topology.model import Topology
from webhook.topology.network import nvlink_domain

DEFAULT_MAX_PODS = 110


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = ""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    cpu_milli: int = 0
    memory_bytes: int = 0
    pods: int = DEFAULT_MAX_PODS
    gpus: int = 0  # allocatable nvidia.com/gpu
    topology: Topology | None = None
    #: why the node's topology annotation could not be used (None when absent or fine)
    topology_error: str | None = None
    #: its agent acknowledges served pods: bind its GPU pods one at a time (binder.gate)
    acks_allocation: bool = False
    #: the GPU indices its ResourceSlice of our driver publishes (empty: it serves no DRA)
    dra_gpus: frozenset[int] = frozenset()
    #: the agent pod its record names (muster.io/gpu-agent; the text when it names none)
    agent: AgentPod | str | None = None
    #: why its GPU pods wait for its agent (webhook.binder.agents; set by the controller from
    #: the pod `agent` names): None when they need not
    agent_wait: str | None = None
    #: the multi-node NVLink domain its labels put it in (`network.nvlink_domain`)
    nvlink_domain: str | None = None

    @property
    def gpu_capacity(self) -> int:
        """The most GPUs the kubelet hands out here, through the device plugin or DRA (the
        same GPUs when a node serves both)."""
        return max(self.gpus, len(self.dra_gpus))

    @property
    def healthy_gpus(self) -> frozenset[int]:
        if self.topology is None:
            return frozenset()
        return frozenset(g.index for g in self.topology.gpus if g.healthy)


@functools.lru_cache(maxsize=256)
def _decode(annotation: str) -> Topology | str:
    """Identical nodes publish identical annotations: decode each text once."""
    try:
        return decode(annotation)
    except ValueError as exc:
        return str(exc)


def parse_node(obj: Mapping[str, Any]) -> NodeInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    alloc: Mapping[str, Any] = status.get("allocatable") or status.get("capacity") or {}

    def quantity(name: str, default: int, parse: Any = whole) -> int:
        try:
            return int(parse(alloc[name])) if name in alloc else default
        except QuantityError:
            return 0  # an unreadable allocatable offers nothing rather than everything

    labels: dict[str, str] = dict(meta.get("labels") or {})
    topology: Topology | None = None
    error: str | None = None
    text = (meta.get("annotations") or {}).get(keys.ANN_NODE_TOPOLOGY)
    if text:
        decoded = _decode(text)
        if isinstance(decoded, str):
            error = decoded
        else:
            topology = decoded
    return NodeInfo(
        name=str(meta.get("name") or ""),
        labels=labels,
        nvlink_domain=nvlink_domain(labels),
        taints=tuple(Taint(str(t.get("key") or ""), str(t.get("value") or ""),
                           str(t.get("effect") or "")) for t in spec.get("taints") or ()),
        unschedulable=bool(spec.get("unschedulable", False)),
        cpu_milli=quantity("cpu", 0, cpu_milli),
        memory_bytes=quantity("memory", 0),
        pods=quantity("pods", DEFAULT_MAX_PODS),
        gpus=quantity(keys.GPU_RESOURCE, 0),
        topology=topology,
        topology_error=error,
        acks_allocation=labels.get(keys.LABEL_GPU_ALLOCATION_ACK) == "true",
        agent=parse_agent((meta.get("annotations") or {}).get(keys.ANN_GPU_AGENT)),
    )


def slice_gpus(obj: Mapping[str, Any]) -> tuple[str, frozenset[int]] | None:
    """(node, GPU indices) a ResourceSlice of our driver publishes; None for any other slice."""
    spec = obj.get("spec") or {}
    if spec.get("driver") != keys.DRA_DRIVER or not spec.get("nodeName"):
        return None
    indices = (keys.dra_device_index(str(d.get("name", ""))) for d in spec.get("devices") or ())
    return str(spec["nodeName"]), frozenset(i for i in indices if i is not None)


def tolerates(tolerations: tuple[Toleration, ...], taint: Taint) -> bool:
    for t in tolerations:
        if t.effect and t.effect != taint.effect:
            continue
        if t.operator == "Exists" and (not t.key or t.key == taint.key):
            return True
        if t.operator in ("Equal", "") and t.key == taint.key and t.value == taint.value:
            return True
    return False
