"""Helpers for the DRA tests (imported by name: pytest runs in importlib mode)."""

from __future__ import annotations

from typing import Any

from webhook import keys


def make_claim(name: str, uid: str, devices: list[str], *, pool: str, namespace: str = "ml",
               driver: str = keys.DRA_DRIVER, reserved: bool = True,
               allocated: bool = True) -> dict[str, Any]:
    """A ResourceClaim as the API server returns it, allocated the way kube-scheduler writes
    `status.allocation` (one result per device, request `gpus`)."""
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {"devices": {"results": [
            {"request": "gpus", "driver": driver, "pool": pool, "device": d} for d in devices]}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": f"{name}-pod", "uid": f"p-{uid}"}]
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": "gpu.muster.io", "count": len(devices)}}]}},
        "status": status,
    }
