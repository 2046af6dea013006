"""Publish the discovered topology on the Node: annotation, class and model labels, degraded label,
and the allocation acknowledgement label.

`node_patch` is pure: discovery result + the Node as it is → the merge patch that brings the Node
up to date, or None when it already is (so re-discovery every few seconds costs a GET, not a
write). When NVML fails completely the last published topology stays (the hardware did not
change) and only the degraded label is set.

`muster.io/gpu-allocation-ack=true` means "this node's device plugin is registered with the
kubelet and serving, and marks each pod it served": the binder then binds the node's GPU pods
one at a time, each after the previous one's mark (webhook.binder.gate). The runner says when
that holds (`serving`); the label is never set before, and goes when it stops holding.

With the label the agent writes `muster.io/gpu-agent`, naming its own pod: the kubelet may
still call an old agent's plugin while a new one starts, so the binder places GPU pods on the
node only while the pod named there is Ready (webhook.binder.agents). The record stays when the
agent stops; the next agent to register replaces it. An agent without a device plugin (it
serves GPUs through DRA only) removes it: no plugin of this node's is for the binder to wait on,
and a record left by the device-plugin agent before it would keep GPU pods off the node.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

from webhook import keys
from webhook.agent.discovery import Discovery
from webhook.kube.api import NODES, KubeApi
from webhook.topology.builtin import NAMES, builtin
from webhook.topology.codec import encode, topology_class
from webhook.topology.model import Topology

log = logging.getLogger(__name__)


def identify(topology: Topology) -> Topology:
    """Name a discovered topology after the built-in node type of the same class, if any: the
    node then reads as "dgx1-v100" in the annotation and in `muster simulate`."""
    cls = topology_class(topology)
    for name in NAMES:
        if topology_class(builtin(name)) == cls:
            return dataclasses.replace(topology, name=name)
    return topology


def gpu_model(topology: Topology) -> str:
    """The node's GPU model: the most common one (nodes rarely mix models)."""
    models = Counter(g.model for g in topology.gpus if g.model)
    return models.most_common(1)[0][0] if models else ""


def desired(found: Discovery, serving: bool | None = None, agent: str | None = None, *,
            plugin: bool = True) -> tuple[dict[str, str | None], dict[str, str | None]]:
    """(labels, annotations) the Node should carry; None values are removed. `serving`: whether
    the device plugin is registered with the kubelet and serving (the acknowledgement label);
    None leaves that label as it is (not known yet). `agent`: this agent's pod, recorded while
    it serves (None: it cannot name its pod, and a record naming another is not left in place).
    `plugin`: whether this agent has a device plugin at all; without one neither the label nor
    the record is kept."""
    labels: dict[str, str | None] = {
        keys.LABEL_GPU_DEGRADED: "true" if found.degraded else None}
    annotations: dict[str, str | None] = {}
    if serving is not None:
        # the device plugin serves the kubelet and acknowledges each pod it served
        labels[keys.LABEL_GPU_ALLOCATION_ACK] = "true" if serving else None
    elif not plugin:
        labels[keys.LABEL_GPU_ALLOCATION_ACK] = None  # (one a killed plugin agent left)
    if serving:
        annotations[keys.ANN_GPU_AGENT] = agent
    elif not plugin:
        annotations[keys.ANN_GPU_AGENT] = None
    if found.topology is not None:
        topology = identify(found.topology)
        annotations[keys.ANN_NODE_TOPOLOGY] = encode(topology)
        labels[keys.LABEL_TOPOLOGY_CLASS] = topology_class(topology)
        model = keys.gpu_model_label_value(gpu_model(topology))
        labels[keys.LABEL_GPU_MODEL] = model or None
    return labels, annotations


def node_patch(found: Discovery, node: Mapping[str, Any], serving: bool | None = None,
               agent: str | None = None, *, plugin: bool = True) -> dict[str, Any] | None:
    """The JSON merge patch that makes `node` carry `found` (and the acknowledgement label and
    the agent's record as `serving` and `plugin` say), or None if it already does."""
    meta = node.get("metadata") or {}
    labels, annotations = desired(found, serving, agent, plugin=plugin)
    have_labels = meta.get("labels") or {}
    have_annotations = meta.get("annotations") or {}
    patch: dict[str, Any] = {}
    label_changes = {k: v for k, v in labels.items() if have_labels.get(k) != v}
    annotation_changes = {k: v for k, v in annotations.items() if have_annotations.get(k) != v}
    if label_changes:
        patch["labels"] = label_changes
    if annotation_changes:
        patch["annotations"] = annotation_changes
    return {"metadata": patch} if patch else None


class NodePublisher:
    """Writes discovery results onto one Node through the API server."""

    def __init__(self, api: KubeApi, node: str, agent: str | None = None, *,
                 plugin: bool = True) -> None:
        self.api = api
        self.node = node
        #: this agent's pod (keys.gpu_agent), recorded while it serves
        self.agent = agent
        #: whether the agent has a device plugin (without one, no record is kept)
        self.plugin = plugin
        self.writes = 0

    async def publish(self, found: Discovery, serving: bool | None = None) -> bool:
        """Patch the Node if it differs; True when a write was made. Raises ApiError."""
        current = await self.api.get(NODES, self.node)
        patch = node_patch(found, current, serving, self.agent, plugin=self.plugin)
        if patch is None:
            return False
        await self.api.patch(NODES, self.node, patch, patch_type="merge")
        self.writes += 1
        labels = patch["metadata"].get("labels") or {}
        log.info("published node topology", extra={
            "node": self.node, "degraded": found.degraded,
            "class": labels.get(keys.LABEL_TOPOLOGY_CLASS),
            "ack": labels.get(keys.LABEL_GPU_ALLOCATION_ACK, "unchanged"),
            "problems": [d.field for d in found.degradations][:10]})
        return True
