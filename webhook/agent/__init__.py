"""Node agent: NVML discovery, Node publisher, kubelet device plugin.

Loaded lazily: `webhook.agent.cli` is imported by every `muster` command, so NVML's bindings load
only with a command that uses them, and gRPC and the Kubernetes client only with
`webhook.agent.runner`, `webhook.agent.publisher` and `webhook.agent.deviceplugin`. The fake NVML
and the fake kubelet are test doubles, in `webhook.doubles`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from webhook.lazy import lazy_getattr

if TYPE_CHECKING:
    from webhook.agent.discovery import Degradation, Discovery, discover
    from webhook.agent.nvml import Nvml, RealNvml
    from webhook.agent.nvmlrecord import NvmlRecord, record_nvml

_EXPORTS = {
    "Degradation": "webhook.agent.discovery",
    "Discovery": "webhook.agent.discovery",
    "discover": "webhook.agent.discovery",
    "Nvml": "webhook.agent.nvml",
    "RealNvml": "webhook.agent.nvml",
    "NvmlRecord": "webhook.agent.nvmlrecord",
    "record_nvml": "webhook.agent.nvmlrecord",
}

__all__ = ["Degradation", "Discovery", "Nvml", "NvmlRecord", "RealNvml", "discover",
           "record_nvml"]

__getattr__ = lazy_getattr(__name__, _EXPORTS)
