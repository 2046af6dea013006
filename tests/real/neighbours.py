"""What the neighbour scenarios share: the node's free CPU, a pod that takes it, and the pods'
binding state, read the way a user would with kubectl."""

from __future__ import annotations

from typing import Any

from e2e.node import image
from e2e.node.cluster import NODE_NAME
from webhook.kube import NODES, PODS, KubeApi

_DONE = ("Succeeded", "Failed")
#: how long Kueue lets an admitted job's pods take to be ready before it evicts the job
KUEUE_PODS_READY_TIMEOUT = 40


def millicpu(quantity: str) -> int:
    """A CPU quantity ("2", "500m", "1.5") in millicores."""
    if quantity.endswith("m"):
        return int(quantity[:-1])
    return round(float(quantity) * 1000)


async def free_millicpu(kube: KubeApi) -> int:
    """The node's allocatable CPU less the requests of the pods bound to it."""
    node = await kube.get(NODES, NODE_NAME)
    free = millicpu(node["status"]["allocatable"]["cpu"])
    pods = await kube.list(PODS, field_selector=f"spec.nodeName={NODE_NAME}")
    for pod in pods["items"]:
        if pod["status"].get("phase") in _DONE:
            continue
        for c in pod["spec"]["containers"]:
            free -= millicpu(c.get("resources", {}).get("requests", {}).get("cpu", "0"))
    return free


def blocker(name: str, millicores: int) -> dict[str, Any]:
    """A plain pod (no job, no gang) that takes `millicores` of the node's CPU."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [{
                "name": "c", "image": f"{image.IMAGE_REPOSITORY}:{image.IMAGE_TAG}",
                "imagePullPolicy": "Never",
                "command": ["python", "-c", "import time; time.sleep(3600)"],
                "resources": {"requests": {"cpu": f"{millicores}m"}}}]}}


def bound(pods: list[dict[str, Any]]) -> list[str]:
    """The names of the pods that have a node."""
    return [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]
