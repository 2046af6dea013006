"""An in-process Kubernetes API server emulator speaking the real wire format (CRUD, list,
watch, subresources, CRDs, admission webhooks over HTTPS) for tests, e2e and `muster demo`."""

from .admission import WebhookCall
from .errors import ApiStatusError
from .resources import ResourceType
from .server import ApiServerEmulator

__all__ = ["ApiServerEmulator", "ApiStatusError", "ResourceType", "WebhookCall"]
