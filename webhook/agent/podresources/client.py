"""Read the kubelet's PodResources API (v1, a unix socket): the devices of one resource that each
container holds, as the kubelet's device manager recorded them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from webhook.agent.podresources import api_pb2, api_pb2_grpc

SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Held:
    """One container's devices of the resource, as the kubelet records them."""

    pod: str  # namespace/name
    container: str
    devices: tuple[str, ...]


def _held(pods: Iterable[Any], resource: str) -> list[Held]:
    return [Held(f"{p.namespace}/{p.name}", c.name,
                 tuple(i for d in c.devices if d.resource_name == resource for i in d.device_ids))
            for p in pods for c in p.containers]


async def listed(socket: Path, resource: str) -> list[Held]:
    """Every container of the kubelet's active pods, with its devices of `resource`."""
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        response = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=_TIMEOUT_S)
    return _held(response.pod_resources, resource)


async def of_pod(socket: Path, resource: str, namespace: str, name: str) -> list[Held] | None:
    """One pod's containers (Get); None where the kubelet does not answer it (Get is served
    from 1.27 behind the KubeletPodResourcesGet gate, refused as "disabled" with code Unknown
    when the gate is off; a pod it does not know is refused the same way): the caller lists."""
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        try:
            response = await stub.Get(api_pb2.GetPodResourcesRequest(
                pod_name=name, pod_namespace=namespace), timeout=_TIMEOUT_S)
        except grpc.aio.AioRpcError:
            return None
    return _held([response.pod_resources], resource)
