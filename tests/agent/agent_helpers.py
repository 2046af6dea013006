"""Helpers for the agent tests (imported by name: pytest runs in importlib mode)."""

from __future__ import annotations

from typing import Any

from webhook import keys
from webhook.binder.assignment import encode_assignment
from webhook.topology.model import ContainerGpus, GpuAssignment, Topology

NODE = "gpu-node-1"


def make_pod(name: str, *, node: str = NODE, assign: dict[str, list[int]] | None = None,
             topology: Topology | None = None, created: str = "2026-01-01T00:00:00Z",
             phase: str = "Pending", assignment_node: str | None = None,
             scheduler: str = keys.DEFAULT_BINDER_SCHEDULER_NAME) -> dict[str, Any]:
    """A pod dict as the API server returns it, bound to `node` by `scheduler` (the binder),
    with the binder's assignment of GPU indices per container (UUIDs from `topology`)."""
    annotations = {}
    containers = []
    for cname, indices in (assign or {"main": []}).items():
        limits = {keys.GPU_RESOURCE: str(len(indices))}
        containers.append({"name": cname, "resources": {"limits": limits}})
    if assign is not None:
        assert topology is not None
        annotations[keys.ANN_GPU_ASSIGNMENT] = encode_assignment(GpuAssignment(
            node=assignment_node or node,
            containers={c: ContainerGpus(tuple(ix), tuple(topology.gpus[i].uuid for i in ix))
                        for c, ix in assign.items()}))
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                     "creationTimestamp": created, "annotations": annotations},
        "spec": {"nodeName": node, "schedulerName": scheduler, "containers": containers},
        "status": {"phase": phase},
    }


def attacker_pod(name: str = "attacker", *, gpus: int = 2, created: str = "2026-01-01T00:00:00Z",
                 scheduler: str = "default-scheduler") -> dict[str, Any]:
    """A pod a user bound to the node itself (spec.nodeName), asking for `gpus` GPUs with no
    assignment of its own."""
    pod = make_pod(name, created=created, scheduler=scheduler)
    pod["spec"]["containers"][0]["resources"]["limits"][keys.GPU_RESOURCE] = str(gpus)
    return pod


class ListedPods:
    """A PodSource over a list the test edits (the API-backed source is tested with the
    emulator in test_agent_kube.py)."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.lists = 0
        #: (pod, uid, reason, message) of every Event recorded
        self.events: list[tuple[str, str, str, str]] = []

    async def pods(self) -> list[dict[str, Any]]:
        self.lists += 1
        return list(self.items)

    async def acknowledge(self, pod: str, uid: str) -> None:
        for item in self.items:
            meta = item["metadata"]
            if f"{meta['namespace']}/{meta['name']}" == pod and meta["uid"] == uid:
                meta.setdefault("annotations", {})[keys.ANN_GPU_ALLOCATED] = item["spec"][
                    "nodeName"]

    async def report(self, pod: str, uid: str, reason: str, message: str) -> None:
        self.events.append((pod, uid, reason, message))
