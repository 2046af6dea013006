"""Node agent: NVML discovery, Node publisher, kubelet device plugin, fake NVML and fake kubelet.

Only the light, pure parts are re-exported here: `webhook.agent.cli` is imported by every `muster`
command, so gRPC and the Kubernetes client load only with `webhook.agent.runner`,
`webhook.agent.publisher` and `webhook.agent.deviceplugin`.
"""

from webhook.agent.discovery import Degradation, Discovery, discover
from webhook.agent.fakenvml import FakeNvml
from webhook.agent.nvmlrecord import NvmlRecord, record_nvml

__all__ = ["Degradation", "Discovery", "FakeNvml", "NvmlRecord", "discover", "record_nvml"]
