"""The kubelet side of the DRA driver: plugin registration and the DRAPlugin service (gRPC over
unix sockets), preparing claims as CDI specs.

The kubelet's plugin watcher finds `<driver>-reg.sock` in plugins_registry, calls GetInfo (which
names the DRA socket and the v1 service) and NotifyRegistrationStatus. It then calls
NodePrepareResources with the claims of a pod about to start: each is read from the API server
and checked (`claims.plan`), recorded in the checkpoint, then written as a CDI spec whose device
IDs go back to the kubelet. The checkpoint is written before the CDI spec, so no GPU is exposed
without being recorded, and a restart finds every claim it prepared: preparing one again gives
the same answer, and a GPU recorded for another live claim is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc

from webhook import atomicfile, keys
from webhook.agent.dra import dra_pb2, dra_pb2_grpc, pluginregistration_pb2
from webhook.agent.dra import pluginregistration_pb2_grpc as reg_grpc
from webhook.agent.dra.claims import (
    PreparedClaim,
    Refused,
    cdi_device_ids,
    cdi_file_name,
    cdi_spec,
    conflicts,
    decode_checkpoint,
    encode_checkpoint,
    plan,
    refusal_for_conflicts,
    still_holds,
)
from webhook.agent.dra.slices import device_name
from webhook.failures import CommandFailed
from webhook.kube.api import RESOURCE_CLAIMS, ApiError, KubeApi
from webhook.topology.model import Topology

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
#: what the kubelet (1.34+) looks for in `supported_versions`: its own short name of the v1 API
#: (k8s.io/kubelet's dra/v1 DRAPluginService), not the gRPC service's full name, which a real
#: kubelet refused ("none of services supported by the plugin ... are supported by the kubelet
#: [v1.DRAPlugin v1beta1.DRAPlugin]"); it then calls the methods by their full gRPC names
SERVICE = "v1.DRAPlugin"


class ClaimSource(Protocol):
    async def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ResourceClaim, or None when it does not exist."""


class KubeClaims:
    def __init__(self, api: KubeApi) -> None:
        self.api = api

    async def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.api.get(RESOURCE_CLAIMS, name, namespace)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise


@dataclass(frozen=True, slots=True)
class DraConfig:
    node: str
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugin_dir: Path = Path(f"/var/lib/kubelet/plugins/{keys.DRA_DRIVER}")
    cdi_dir: Path = Path("/var/run/cdi")
    check_s: float = 1.0

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{keys.DRA_DRIVER}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / "dra.sock"

    @property
    def checkpoint(self) -> Path:
        return self.plugin_dir / "checkpoint.json"


@dataclass(slots=True)
class Answer:
    """One claim's outcome: its devices, or why it was refused."""

    devices: list[Any] = field(default_factory=list)
    error: str = ""


class DraDriver:
    def __init__(self, config: DraConfig, claims: ClaimSource) -> None:
        self.config = config
        self.claims = claims
        self.gpus: dict[str, str] = {}  # device name -> GPU UUID
        #: claims prepared here, by UID; CommandFailed if the checkpoint is unreadable (a
        #: driver that forgot what it prepared could hand a GPU out twice)
        self.prepared: dict[str, PreparedClaim] = {}
        if config.checkpoint.exists():
            try:
                self.prepared = decode_checkpoint(config.checkpoint.read_bytes())
            except (ValueError, KeyError, TypeError) as exc:
                raise CommandFailed(f"{config.checkpoint} is unreadable ({exc}): the driver will "
                                 "not start without knowing which GPUs it prepared") from exc
        self.registered: bool | None = None  # the kubelet's last NotifyRegistrationStatus
        self._lock = asyncio.Lock()
        self._servers: list[grpc.aio.Server] = []

    def set_topology(self, topology: Topology) -> None:
        self.gpus = {device_name(g.index): g.uuid for g in topology.gpus
                     if g.uuid is not None and g.healthy}

    # --- prepare and unprepare ---------------------------------------------------------------

    def _save(self) -> None:
        atomicfile.write(self.config.checkpoint, encode_checkpoint(self.prepared), 0o600)

    def _write_cdi(self, uid: str, claim: PreparedClaim) -> None:
        data = json.dumps(cdi_spec(uid, claim), indent=1).encode()
        atomicfile.write(self.config.cdi_dir / cdi_file_name(uid), data)

    def _forget(self, uid: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.config.cdi_dir / cdi_file_name(uid)).unlink()
        if self.prepared.pop(uid, None) is not None:
            self._save()

    async def _released(self, taken: dict[str, str]) -> None:
        """Forget the holders of `taken` that the API says no longer hold their GPU (the claim
        was deleted, or its allocation changed, without an unprepare reaching us)."""
        for gpu, other in sorted(taken.items()):
            holder = self.prepared.get(other)
            if holder is None:
                continue
            device = next(d.device for d in holder.devices if d.uuid == gpu)
            obj = await self.claims.claim(holder.namespace, holder.name)
            if not still_holds(obj, other, self.config.node, device):
                log.warning("forgetting a prepared claim that no longer holds its GPU", extra={
                    "claim": f"{holder.namespace}/{holder.name}", "uid": other, "gpu": gpu})
                self._forget(other)

    async def prepare_one(self, namespace: str, name: str, uid: str) -> Answer:
        async with self._lock:
            try:
                claim = self.prepared.get(uid)
                if claim is None:
                    claim = await self._admit(namespace, name, uid)
                self._write_cdi(uid, claim)  # again after a restart between the two writes
            except Refused as exc:
                log.warning("claim refused", extra={"claim": f"{namespace}/{name}",
                                                    "reason": str(exc)})
                return Answer(error=str(exc))
            except ApiError as exc:
                return Answer(error=f"reading ResourceClaim {namespace}/{name} failed: {exc}")
        return Answer(devices=[
            dra_pb2.Device(request_names=[d.request] if d.request else [], pool_name=d.pool,
                           device_name=d.device, cdi_device_ids=[cdi_id])
            for d, cdi_id in zip(claim.devices, cdi_device_ids(uid, claim), strict=True)])

    async def _admit(self, namespace: str, name: str, uid: str) -> PreparedClaim:
        obj = await self.claims.claim(namespace, name)
        if obj is None:
            raise Refused(f"ResourceClaim {namespace}/{name} does not exist")
        wanted = plan(obj, namespace, name, uid, node=self.config.node, gpus=self.gpus)
        taken = conflicts(self.prepared, uid, wanted)
        if taken:
            await self._released(taken)
            taken = conflicts(self.prepared, uid, wanted)
        if taken:
            raise Refused(refusal_for_conflicts(f"{namespace}/{name}", taken, self.prepared))
        self.prepared[uid] = wanted
        self._save()
        log.info("claim prepared", extra={"claim": f"{namespace}/{name}", "uid": uid, "gpus": [
            d.uuid for d in wanted.devices]})
        return wanted

    async def unprepare_one(self, uid: str) -> str:
        async with self._lock:
            try:
                self._forget(uid)
            except OSError as exc:
                return f"unpreparing claim {uid} failed: {exc}"
        return ""

    # --- serving -----------------------------------------------------------------------------

    async def serve(self) -> None:
        """(Re)start both servers on fresh sockets: the DRA service first, so that the kubelet
        finds it as soon as registration names it."""
        await self.stop()
        for path, add in ((self.config.dra_socket, self._add_dra),
                          (self.config.registration_socket, self._add_registration)):
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            server = grpc.aio.server()
            add(server)
            server.add_insecure_port(f"unix://{path}")
            await server.start()
            self._servers.append(server)
        log.info("DRA driver serving", extra={"driver": keys.DRA_DRIVER,
                                              "socket": str(self.config.dra_socket)})

    def _add_dra(self, server: grpc.aio.Server) -> None:
        dra_pb2_grpc.add_DRAPluginServicer_to_server(_DraServicer(self), server)

    def _add_registration(self, server: grpc.aio.Server) -> None:
        reg_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(self), server)

    async def stop(self) -> None:
        servers, self._servers = self._servers, []
        for server in servers:
            await server.stop(grace=0.5)

    async def ensure_serving(self) -> None:
        if not self._servers or not (self.config.dra_socket.exists()
                                     and self.config.registration_socket.exists()):
            await self.serve()

    async def run(self) -> None:
        """Serve until cancelled; a socket removed (the kubelet's directories wiped) is served
        again, which makes the plugin watcher register the driver again."""
        try:
            while True:
                try:
                    await self.ensure_serving()
                except OSError as exc:
                    log.warning("DRA driver could not serve; will retry", extra={
                        "error": str(exc)})
                await asyncio.sleep(self.config.check_s)
        finally:
            await self.stop()
            for path in (self.config.registration_socket, self.config.dra_socket):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


class _RegistrationServicer(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=keys.DRA_DRIVER, endpoint=str(self.driver.config.dra_socket),
            supported_versions=[SERVICE])

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.driver.registered = request.plugin_registered
        if request.plugin_registered:
            log.info("DRA driver registered with the kubelet", extra={"driver": keys.DRA_DRIVER})
        else:
            log.warning("the kubelet refused the DRA driver", extra={"error": request.error})
        return pluginregistration_pb2.RegistrationStatusResponse()


class _DraServicer(dra_pb2_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        response = dra_pb2.NodePrepareResourcesResponse()
        for c in request.claims:
            answer = await self.driver.prepare_one(c.namespace, c.name, c.uid)
            entry = response.claims[c.uid]
            entry.error = answer.error
            entry.devices.extend(answer.devices)
        return response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        response = dra_pb2.NodeUnprepareResourcesResponse()
        for c in request.claims:
            response.claims[c.uid].error = await self.driver.unprepare_one(c.uid)
        return response
