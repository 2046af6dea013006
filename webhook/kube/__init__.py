"""Kubernetes client helpers on kubernetes-asyncio: raw-JSON API access, informers, events.
They work the same against a real kube-apiserver and against webhook.doubles.emulator."""

from .api import (
    CONFIGMAPS,
    COSCHEDULING_PODGROUPS,
    CRDS,
    DEPLOYMENTS,
    ENDPOINT_SLICES,
    EVENTS,
    JOBS,
    LEASES,
    MPIJOBS,
    MUTATING_WEBHOOKS,
    NAMESPACES,
    NODES,
    PDBS,
    PODS,
    PRIORITY_CLASSES,
    SECRETS,
    SERVICES,
    VALIDATING_WEBHOOKS,
    VOLCANO_PODGROUPS,
    VOLCANO_QUEUES,
    ApiError,
    KubeApi,
    Resource,
    object_key,
)
from .client import make_api_client
from .events import EventRecorder
from .informer import Informer

__all__ = [
    "CONFIGMAPS", "COSCHEDULING_PODGROUPS", "CRDS", "DEPLOYMENTS", "ENDPOINT_SLICES", "EVENTS",
    "JOBS", "LEASES", "MPIJOBS", "MUTATING_WEBHOOKS", "NAMESPACES", "NODES", "PDBS", "PODS",
    "PRIORITY_CLASSES", "SECRETS", "SERVICES",
    "VALIDATING_WEBHOOKS", "VOLCANO_PODGROUPS", "VOLCANO_QUEUES", "ApiError", "EventRecorder",
    "Informer", "KubeApi", "Resource", "make_api_client", "object_key",
]
