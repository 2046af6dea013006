"""Node agent: NVML discovery, Node publisher, kubelet device plugin.

Only the light, pure parts are re-exported here: `webhook.agent.cli` is imported by every `muster`
command, so gRPC and the Kubernetes client load only with `webhook.agent.runner`,
`webhook.agent.publisher` and `webhook.agent.deviceplugin`. The fake NVML and the fake kubelet are
test doubles, in `webhook.doubles`.
"""

from webhook.agent.discovery import Degradation, Discovery, discover
from webhook.agent.nvml import Nvml, RealNvml
from webhook.agent.nvmlrecord import NvmlRecord, record_nvml

__all__ = ["Degradation", "Discovery", "Nvml", "NvmlRecord", "RealNvml", "discover",
           "record_nvml"]
