"""Which GPUs to prepare for a ResourceClaim, and the CDI spec that hands them to a container:
pure functions of the claim as the API server returned it, the node's devices and the claims
already prepared here (the driver's checkpoint).

A claim is prepared only when it is the one the kubelet named (same UID), allocated, reserved
for some consumer, and its results for this driver are all in this node's pool and name GPUs the
node has. Results of other drivers are theirs to prepare. A GPU already prepared for another
claim is never prepared again (`conflicts`), unless that claim no longer holds it
(`still_holds`: the API says it is gone or allocated elsewhere).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook import keys

CDI_VERSION = "0.5.0"  # spec-level containerEdits and env: in every CDI release containerd reads
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"


class Refused(Exception):
    """The claim cannot be prepared here; the message goes back to the kubelet."""


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    uuid: str


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]


def _ref(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def plan(claim: Mapping[str, Any], namespace: str, name: str, uid: str, *, node: str,
         gpus: Mapping[str, str]) -> PreparedClaim:
    """The devices to prepare for `claim` (the object read from the API) that the kubelet asked
    for by namespace, name and uid; `gpus`: device name → GPU UUID of this node. Raises Refused
    with the reason."""
    ref = _ref(namespace, name)
    meta = claim.get("metadata") or {}
    if meta.get("uid") != uid:
        raise Refused(f"ResourceClaim {ref}: its uid is {meta.get('uid')}, the kubelet asked "
                      f"for {uid} (deleted and re-created)")
    status = claim.get("status") or {}
    allocation = status.get("allocation")
    if not allocation:
        raise Refused(f"ResourceClaim {ref} is not allocated")
    if not status.get("reservedFor"):
        raise Refused(f"ResourceClaim {ref} is reserved for no consumer")
    results = [r for r in (allocation.get("devices") or {}).get("results") or ()
               if r.get("driver") == keys.DRA_DRIVER]
    if not results:
        raise Refused(f"ResourceClaim {ref} has no device of driver {keys.DRA_DRIVER} allocated")
    devices = []
    for result in results:
        pool, device = result.get("pool", ""), result.get("device", "")
        if pool != node:
            raise Refused(f"ResourceClaim {ref}: device {device} is allocated from pool "
                          f"{pool!r}, not this node's ({node!r})")
        if device not in gpus:
            raise Refused(f"ResourceClaim {ref}: device {device} is not a healthy GPU of node "
                          f"{node} (it has {', '.join(sorted(gpus)) or 'none'})")
        devices.append(PreparedDevice(result.get("request", ""), pool, device, gpus[device]))
    seen = [d.uuid for d in devices]
    if len(set(seen)) != len(seen):
        raise Refused(f"ResourceClaim {ref} names one GPU twice")
    return PreparedClaim(namespace, name, tuple(devices))


def conflicts(prepared: Mapping[str, PreparedClaim], uid: str, wanted: PreparedClaim
              ) -> dict[str, str]:
    """GPU UUID → UID of another prepared claim holding it, for the GPUs `wanted` needs."""
    held = {d.uuid: other for other, c in prepared.items() if other != uid for d in c.devices}
    return {d.uuid: held[d.uuid] for d in wanted.devices if d.uuid in held}


def still_holds(claim: Mapping[str, Any] | None, uid: str, node: str, device: str) -> bool:
    """Whether the claim read from the API (None: not found) is still the prepared one, with
    `device` of this node's pool allocated to it."""
    if claim is None or (claim.get("metadata") or {}).get("uid") != uid:
        return False
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return any(r.get("driver") == keys.DRA_DRIVER and r.get("pool") == node
               and r.get("device") == device
               for r in (allocation.get("devices") or {}).get("results") or ())


def refusal_for_conflicts(ref: str, taken: Mapping[str, str],
                          prepared: Mapping[str, PreparedClaim]) -> str:
    holders = ", ".join(f"{gpu} (held by ResourceClaim "
                        f"{_ref(prepared[other].namespace, prepared[other].name)}, uid {other})"
                        for gpu, other in sorted(taken.items()))
    return (f"ResourceClaim {ref}: GPUs already prepared for another live claim: {holders}; "
            "a GPU is never handed to two claims")


def cdi_device_name(uid: str, device: str) -> str:
    return f"{uid}-{device}"


def cdi_device_ids(uid: str, claim: PreparedClaim) -> list[str]:
    return [f"{keys.CDI_KIND}={cdi_device_name(uid, d.device)}" for d in claim.devices]


def _env(device: str) -> str:
    return device.replace("-", "_").upper()  # gpu-3 -> GPU_3


def cdi_spec(uid: str, claim: PreparedClaim) -> dict[str, Any]:
    """One CDI spec per claim. NVIDIA_VISIBLE_DEVICES (read by the NVIDIA container toolkit) is a
    spec-level edit, so a container given any of the claim's devices sees exactly the claim's
    GPUs; each device carries its own UUID too (CDI refuses a device with no edits)."""
    uuids = ",".join(d.uuid for d in claim.devices)
    return {
        "cdiVersion": CDI_VERSION,
        "kind": keys.CDI_KIND,
        "containerEdits": {"env": [f"{VISIBLE_DEVICES_ENV}={uuids}"]},
        "devices": [{"name": cdi_device_name(uid, d.device),
                     "containerEdits": {"env": [f"MUSTER_{_env(d.device)}={d.uuid}"]}}
                    for d in claim.devices],
    }


def cdi_file_name(uid: str) -> str:
    return f"{keys.CDI_KIND.replace('/', '-')}-{uid}.json"


# --- the checkpoint: claims prepared on this node, as JSON ---------------------------------------

CHECKPOINT_VERSION = 1


def encode_checkpoint(prepared: Mapping[str, PreparedClaim]) -> bytes:
    doc = {"version": CHECKPOINT_VERSION, "claims": {
        uid: {"namespace": c.namespace, "name": c.name,
              "devices": [{"request": d.request, "pool": d.pool, "device": d.device,
                           "uuid": d.uuid} for d in c.devices]}
        for uid, c in sorted(prepared.items())}}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def decode_checkpoint(data: bytes) -> dict[str, PreparedClaim]:
    """Raises ValueError on a checkpoint this version cannot read."""
    doc = json.loads(data)
    if not isinstance(doc, dict) or doc.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"not a version {CHECKPOINT_VERSION} DRA checkpoint")
    return {uid: PreparedClaim(c["namespace"], c["name"], tuple(
        PreparedDevice(d["request"], d["pool"], d["device"], d["uuid"]) for d in c["devices"]))
        for uid, c in doc["claims"].items()}
