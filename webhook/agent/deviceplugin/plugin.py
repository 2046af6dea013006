"""The kubelet device plugin (API v1beta1, gRPC over unix sockets) that honours the binder.

It advertises the node's GPUs by UUID. The binder's choice reaches the kubelet only through
GetPreferredAllocation, which answers with the GPUs the binder wrote into the pod's
`muster.io/gpu-assignment` (see `matcher`). Allocate hands a container exactly the devices the
kubelet allocated, never others (NVIDIA_VISIBLE_DEVICES, and CDI device names when configured):
the kubelet's accounting stays the one truth about who holds which GPU, as with NVIDIA's own
plugin. When the kubelet allocated other GPUs than the binder assigned, the container is
refused with the reason (the kubelet fails the pod: UnexpectedAdmissionError) and the pod gets
a Warning Event saying which. With the kubelet's PodResources socket, what each pod holds is
checked against its assignment after the fact (`audit`): periodically, and for the pod served
shortly after each Allocate; each mismatch is a Warning Event, a log line and a metric.
A kubelet restart deletes every socket in its directory and
recreates kubelet.sock: the plugin notices, serves again on a fresh socket and registers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from webhook import keys
from webhook.agent.deviceplugin import api_pb2, api_pb2_grpc
from webhook.agent.deviceplugin.audit import Finding, audit
from webhook.agent.deviceplugin.matcher import (
    Grant,
    Pending,
    choose,
    mismatch,
    pending,
    refusal,
    served,
)
from webhook.agent.podresources import client
from webhook.topology.model import Topology

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
#: how long a preference stands for the Allocate that follows it (the kubelet sends them back
#: to back, milliseconds apart)
_PROPOSAL_TTL_S = 1.0


class PodSource(Protocol):
    """The pods bound to this node, as raw API dicts, fresh enough to see a new assignment."""

    async def pods(self) -> list[dict[str, Any]]: ...

    async def acknowledge(self, pod: str, uid: str) -> None:
        """Mark pod `pod` ("namespace/name", with this uid) served: muster.io/gpu-allocated."""

    async def report(self, pod: str, uid: str, reason: str, message: str) -> None:
        """A Warning Event on pod `pod` ("namespace/name", with this uid); never raises."""


@dataclass(frozen=True, slots=True)
class PluginConfig:
    node: str
    kubelet_dir: Path = Path(DEVICE_PLUGIN_DIR)
    resource_name: str = keys.GPU_RESOURCE
    endpoint: str = "muster-gpu.sock"
    #: also hand out CDI device names ("<cdi_kind>=<uuid>")
    cdi: bool = False
    cdi_kind: str = "nvidia.com/gpu"
    #: how long Allocate waits for the pod's assignment to become visible
    assignment_wait_s: float = 10.0
    poll_s: float = 0.2
    #: how often kubelet.sock and our socket are checked (kubelet restarts)
    kubelet_check_s: float = 1.0
    #: a container with no assignment: "error" (refuse) or "kubelet" (the kubelet's own pick)
    unassigned: Literal["error", "kubelet"] = "error"
    #: the binder's spec.schedulerName: assignments on other pods are ignored
    scheduler_name: str = keys.DEFAULT_BINDER_SCHEDULER_NAME
    #: the kubelet's PodResources socket: None, no after-the-fact check
    pod_resources: Path | None = None
    #: how often every pod's holdings are checked, and how long after an Allocate its pod is
    #: (the kubelet records the allocation once our answer is back)
    audit_s: float = 60.0
    audit_after_allocate_s: float = 2.0


#: the Event reason on a pod whose container the kubelet gave other GPUs than the binder
MISMATCH_REASON = "GPUAssignmentMismatch"
#: the Event reason on a pod the kubelet records holding GPUs it should not (`audit`)
HOLDING_REASON = "GPUHoldingMismatch"


def device_list(topology: Topology) -> list[Any]:
    """ListAndWatch's devices: UUID as ID, health, NUMA node for the kubelet's topology manager."""
    out = []
    for gpu in topology.gpus:
        numa = (api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=gpu.numa_node)])
                if gpu.numa_node is not None else None)
        out.append(api_pb2.Device(ID=gpu.uuid, health=HEALTHY if gpu.healthy else UNHEALTHY,
                                  topology=numa))
    return out


class _Servicer(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, plugin: GpuDevicePlugin) -> None:
        self.plugin = plugin

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return api_pb2.DevicePluginOptions(pre_start_required=False,
                                           get_preferred_allocation_available=True)

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        seen = -1
        while True:
            devices, seen = await self.plugin.devices_after(seen)
            yield api_pb2.ListAndWatchResponse(devices=devices)

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        responses = []
        for creq in request.container_requests:
            ids = await self.plugin.preferred(list(creq.available_deviceIDs),
                                              list(creq.must_include_deviceIDs),
                                              creq.allocation_size)
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: Any, context: Any) -> Any:
        responses = []
        for creq in request.container_requests:
            try:
                uuids = await self.plugin.allocate(list(creq.devices_ids))
            except AllocationRefused as exc:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            responses.append(self.plugin.container_response(uuids))
        return api_pb2.AllocateResponse(container_responses=responses)

    async def PreStartContainer(self, request: Any, context: Any) -> Any:
        return api_pb2.PreStartContainerResponse()


@dataclass(frozen=True, slots=True)
class _Preference:
    """What the last GetPreferredAllocation found, for the Allocate that follows it."""

    size: int
    grant: Grant | None
    offer: Pending
    at: float  # event loop time


class AllocationRefused(Exception):
    """No pending pod's assignment matches what the kubelet asks for."""


class GpuDevicePlugin:
    def __init__(self, config: PluginConfig, topology: Topology, source: PodSource) -> None:
        self.config = config
        self.source = source
        self._topology = topology
        self._devices = device_list(topology)
        self._version = 0
        self._changed = asyncio.Condition()
        self._handed: set[tuple[str, str]] = set()
        self._preference: _Preference | None = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: grpc.aio.Server | None = None
        self._kubelet_id: tuple[int, int] | None = None
        self.registrations = 0  # successful Register calls (tests, metrics)
        self._reported: set[tuple[str, str, str]] = set()  # (uid, kind, message) of findings
        self.metrics = CollectorRegistry()
        self._found = Counter("muster_agent_gpu_holding_mismatches",
                              "Pods found holding other GPUs than the binder assigned, by kind",
                              ["kind"], registry=self.metrics)
        self._current = Gauge("muster_agent_gpu_holding_mismatches_current",
                              "Mismatches the last check found, by kind", ["kind"],
                              registry=self.metrics)

    @property
    def socket_path(self) -> Path:
        return self.config.kubelet_dir / self.config.endpoint

    # --- devices -----------------------------------------------------------------------------

    async def set_topology(self, topology: Topology) -> None:
        """New discovery result: ListAndWatch streams send the new list if it changed."""
        self._topology = topology
        devices = device_list(topology)
        if devices != self._devices:
            async with self._changed:
                self._devices = devices
                self._version += 1
                self._changed.notify_all()
            log.info("device list changed", extra={
                "unhealthy": [d.ID for d in devices if d.health != HEALTHY]})

    async def devices_after(self, seen: int) -> tuple[list[Any], int]:
        async with self._changed:
            await self._changed.wait_for(lambda: self._version != seen)
            return list(self._devices), self._version

    # --- allocation --------------------------------------------------------------------------

    async def _offer(self) -> Pending:
        pods = await self.source.pods()
        devices = {g.index: g.uuid for g in self._topology.gpus if g.uuid is not None}
        offer = pending(pods, self.config.node, devices, self._handed,
                        self.config.scheduler_name, resource=self.config.resource_name,
                        trust_admitted=self.config.unassigned == "kubelet")
        # forget containers of pods that have started or gone: they are never asked again
        self._handed = {(uid, c) for uid, c in self._handed if uid in offer.live}
        return offer

    async def _wait_for(self, count: int, wanted: list[str], wait_s: float,
                        available: list[str] | None = None) -> tuple[Grant | None, Pending, str]:
        """Poll the pods until a grant fits or `wait_s` passes; (grant, offer, API error)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        offer, error = Pending(()), ""
        while True:
            try:
                offer, error = await self._offer(), ""
            except Exception as exc:  # an API outage must end in a clear refusal, not a crash
                error = f"reading this node's pods failed: {exc}"
                log.warning("pod lookup failed", extra={"error": str(exc)})
            grant = choose(offer, count, wanted, available)
            if grant is not None or loop.time() >= deadline:
                return grant, offer, error
            await asyncio.sleep(self.config.poll_s)

    async def preferred(self, available: list[str], must: list[str], size: int) -> list[str]:
        async with self._lock:
            grant, offer, _ = await self._wait_for(size, [], self.config.assignment_wait_s,
                                                   available + must)
            self._preference = _Preference(size, grant, offer,
                                           asyncio.get_running_loop().time())
        if grant is not None and set(must) <= set(grant.uuids):
            return list(grant.uuids)
        # no assignment to honour: the kubelet's own default order
        return (must + [d for d in available if d not in must])[:size]

    async def allocate(self, requested: list[str]) -> list[str]:
        """The devices the container gets: exactly `requested`, the kubelet's allocation, once
        it matches the pod's assignment; AllocationRefused otherwise."""
        async with self._lock:
            grant, offer, wait_s = self._after_preference(requested)
            error = ""
            if grant is None:
                grant, offer, error = await self._wait_for(len(requested), requested, wait_s)
            if grant is None:
                message = refusal(offer, self.config.node, len(requested),
                                  self.config.unassigned == "kubelet")
                if message is None:
                    log.info("no assignment: kubelet's pick", extra={"devices": requested})
                    return list(requested)
                if error:
                    message = f"{message}; {error}"
                log.warning("allocate refused", extra={"reason": message})
                raise AllocationRefused(message)
            if set(grant.uuids) != set(requested):
                # Never a silent swap: handing the container the binder's GPUs would give it
                # devices the kubelet counts as another container's (or as free)
                message = mismatch(grant, requested)
                log.warning("allocate refused: the kubelet allocated other GPUs than the "
                            "binder assigned", extra={"pod": grant.pod, "reason": message})
                self._report(grant, message)
                raise AllocationRefused(message)
            if grant.again:  # same pod, same GPUs: the kubelet restarted before recording it
                log.warning("served again: the kubelet had lost its record of this container",
                            extra={"pod": grant.pod, "container": grant.container})
            else:
                self._handed.add((grant.uid, grant.container))
                if served(offer, grant, self._handed):
                    self._acknowledge(grant)
                    self._background(self._audit_later(grant.pod))
        log.info("allocated", extra={"pod": grant.pod, "container": grant.container,
                                     "gpus": list(requested)})
        return list(requested)

    def _after_preference(self, requested: list[str]) -> tuple[Grant | None, Pending, float]:
        """What the GetPreferredAllocation just before this Allocate leaves it: its grant, when
        the kubelet took exactly its GPUs (no second list of the pods for the same answer: half
        of each admission's cost); else how long to wait for an assignment, not at all when the
        preference has just waited in vain for one of this size."""
        pref, self._preference = self._preference, None
        wait_s = self.config.assignment_wait_s
        if pref is None or pref.size != len(requested):
            return None, Pending(()), wait_s
        age = asyncio.get_running_loop().time() - pref.at
        grant = pref.grant
        if grant is None:
            return None, Pending(()), 0.0 if age < wait_s + 1.0 else wait_s
        if (age <= _PROPOSAL_TTL_S and set(grant.uuids) == set(requested)
                and (grant.uid, grant.container) not in self._handed):
            return grant, pref.offer, wait_s
        return None, Pending(()), wait_s

    def _acknowledge(self, grant: Grant) -> None:
        """Tell the binder the pod is served, so it may bind this node's next GPU pod
        (webhook.binder.gate); in the background: the kubelet is waiting for our answer."""
        async def ack() -> None:
            try:
                await self.source.acknowledge(grant.pod, grant.uid)
            except Exception as exc:  # the binder's wait is bounded: a lost ack only slows it
                log.warning("could not mark the pod served", extra={
                    "pod": grant.pod, "error": str(exc)})
        self._background(ack())

    def _report(self, grant: Grant, message: str) -> None:
        """The Warning Event on the pod refused, in the background like the acknowledgement."""
        async def report() -> None:
            try:
                await self.source.report(grant.pod, grant.uid, MISMATCH_REASON, message)
            except Exception as exc:  # the kubelet's own failure Event carries the reason too
                log.warning("could not record the Event", extra={
                    "pod": grant.pod, "error": str(exc)})
        self._background(report())

    # --- after the fact: the kubelet's record (PodResources) against the assignments -------

    async def audit(self, pod: str | None = None) -> list[Finding]:
        """Compare what the kubelet says each pod holds with the binder's assignments (one pod,
        through Get where the kubelet serves it, else every pod); report what is new."""
        socket, resource = self.config.pod_resources, self.config.resource_name
        if socket is None:
            return []
        held = None
        if pod is not None:
            namespace, name = pod.split("/", 1)
            held = await client.of_pod(socket, resource, namespace, name)
        if held is None:
            held, pod = await client.listed(socket, resource), None
        devices = {g.index: g.uuid for g in self._topology.gpus if g.uuid is not None}
        findings = audit(held, await self.source.pods(), self.config.node, devices,
                         self.config.scheduler_name)
        self._record(findings, whole=pod is None)
        return findings

    def _record(self, findings: list[Finding], whole: bool) -> None:
        """Report each finding once (an Event, a log line, the counter); a whole-node check
        also sets the gauge and forgets what is fixed."""
        keys_now = {(f.uid, f.kind, f.message) for f in findings}
        for f in findings:
            if (f.uid, f.kind, f.message) in self._reported:
                continue
            log.warning("a pod holds other GPUs than the binder assigned",
                        extra={"pod": f.pod, "kind": f.kind, "reason": f.message})
            self._found.labels(f.kind).inc()
            if f.uid:
                self._background(self._event(f))
        if whole:
            self._reported = keys_now
            for kind in ("assignment", "foreign", "shared"):
                self._current.labels(kind).set(sum(f.kind == kind for f in findings))
        else:
            self._reported |= keys_now

    async def _event(self, finding: Finding) -> None:
        try:
            await self.source.report(finding.pod, finding.uid, HOLDING_REASON, finding.message)
        except Exception as exc:  # the log line and the metric carry it too
            log.warning("could not record the Event", extra={
                "pod": finding.pod, "error": str(exc)})

    async def _audit_later(self, pod: str) -> None:
        if self.config.pod_resources is None:
            return
        await asyncio.sleep(self.config.audit_after_allocate_s)
        try:
            await self.audit(pod)
        except Exception as exc:  # the periodic check tries again
            log.warning("checking the pod's GPUs failed", extra={"pod": pod, "error": str(exc)})

    async def audit_loop(self) -> None:
        """Check every pod's holdings every `audit_s` until cancelled."""
        while True:
            try:
                await self.audit()
            except Exception as exc:  # e.g. the kubelet restarting: next time
                log.warning("checking the pods' GPUs failed", extra={"error": str(exc)})
            await asyncio.sleep(self.config.audit_s)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def container_response(self, uuids: list[str]) -> Any:
        cdi = ([api_pb2.CDIDevice(name=f"{self.config.cdi_kind}={u}") for u in uuids]
               if self.config.cdi else [])
        return api_pb2.ContainerAllocateResponse(
            envs={VISIBLE_DEVICES_ENV: ",".join(uuids)}, cdi_devices=cdi)

    # --- serving and registration ------------------------------------------------------------

    async def serve(self) -> None:
        """(Re)start the gRPC server on a fresh socket."""
        await self.stop()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        log.info("device plugin serving", extra={"socket": str(self.socket_path)})

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0.5)
            self._server = None

    async def register(self) -> None:
        """Register with the kubelet; raises grpc.aio.AioRpcError if it refuses or is down."""
        target = f"unix://{self.config.kubelet_dir / KUBELET_SOCKET}"
        async with grpc.aio.insecure_channel(target) as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)
            await stub.Register(api_pb2.RegisterRequest(
                version=API_VERSION, endpoint=self.config.endpoint,
                resource_name=self.config.resource_name,
                options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
            ), timeout=5)
        self.registrations += 1
        log.info("registered with the kubelet", extra={
            "resource": self.config.resource_name, "endpoint": self.config.endpoint})

    def _kubelet_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.config.kubelet_dir / KUBELET_SOCKET)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns

    async def ensure_registered(self) -> bool:
        """One check: serve and register again if the kubelet restarted (new kubelet.sock) or
        our socket was removed. True when registered with the current kubelet."""
        current = self._kubelet_identity()
        if current is None:
            self._kubelet_id = None
            return False
        if current == self._kubelet_id and self.socket_path.exists() and self._server:
            return True
        if self._server is None or not self.socket_path.exists():
            await self.serve()
        try:
            await self.register()
        except grpc.aio.AioRpcError as exc:
            log.warning("registration failed; will retry", extra={
                "code": exc.code().name, "detail": exc.details()})
            return False
        self._kubelet_id = current
        return True

    async def run(self) -> None:
        """Serve until cancelled, re-registering across kubelet restarts."""
        try:
            while True:
                await self.ensure_registered()
                await asyncio.sleep(self.config.kubelet_check_s)
        finally:
            await self.stop()
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
