"""Kubelet device plugin API v1beta1 (generated api_pb2*) and the plugin that honours the binder."""

from webhook.agent.deviceplugin.plugin import (
    API_VERSION,
    DEVICE_PLUGIN_DIR,
    KUBELET_SOCKET,
    GpuDevicePlugin,
    PluginConfig,
    PodSource,
)

__all__ = ["API_VERSION", "DEVICE_PLUGIN_DIR", "KUBELET_SOCKET", "GpuDevicePlugin",
           "PluginConfig", "PodSource"]
