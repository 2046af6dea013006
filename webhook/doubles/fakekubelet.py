"""A fake kubelet device manager: the real gRPC protocol on real unix sockets, for tests and e2e.

Like the kubelet it serves `Registration` on `<dir>/kubelet.sock`; when a plugin registers it
dials the plugin's socket, asks its options and follows its `ListAndWatch` stream. `admit`
allocates devices for a container the way the kubelet's device manager does: free healthy
devices, the plugin's GetPreferredAllocation if offered, then Allocate. `restart` does what a
kubelet restart does to the directory: every socket is deleted and kubelet.sock is recreated.

What was allocated, to which pod, and which pods were started is kept, as the device manager's
`kubelet_internal_checkpoint` is, in a file beside kubelet.sock that outlives the process: a
restarted kubelet starts a pod whose containers were allocated before the restart with the
checkpointed devices, without asking the plugin again, and never starts a pod twice.

It also serves the PodResources API v1 (`List`, and `Get` unless `serve_get` is off, as a
kubelet with the KubeletPodResourcesGet gate off) on `pod-resources.sock` beside kubelet.sock,
from `pod_resources`, which tests fill: (namespace, name) → container → resource → device IDs.

`start_pods` is the kubelet's pod admission: it starts each pod bound to its node that asks for
the resource, container by container, once, and lets go of the devices of the pods that left
the node or ended (an evicted pod's GPUs are the next pod's). Given a `StatusWriter`, it is
the kubelet's status manager too: each pod bound to the node is reported Running with its
`status.startTime` (what the binder prices a preemption victim by), or Failed with reason
UnexpectedAdmissionError where the device plugin refused it, as a kubelet reports it; a write
the API server did not take is made again on the next pass.

Runnable as a process: `python -m webhook.doubles.fakekubelet --dir DIR` serves and prints one JSON
line per event (registered, devices); `--admit N` (repeatable) admits containers once devices
have arrived and prints the allocation; `--kubeconfig K --node N` starts the node's pods as they
are bound and prints one `started` (or `refused`) line per pod.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from webhook import atomicfile
from webhook.agent.deviceplugin import api_pb2, api_pb2_grpc
from webhook.agent.deviceplugin.plugin import API_VERSION, HEALTHY, KUBELET_SOCKET
from webhook.agent.podresources import api_pb2 as pr_pb2
from webhook.agent.podresources import api_pb2_grpc as pr_grpc
from webhook.quantity import whole

if TYPE_CHECKING:
    from webhook.kube import KubeApi

log = logging.getLogger(__name__)

# the kubelet's check of extended resource names: <domain>/<name>, not kubernetes.io
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
#: the device manager's checkpoint, beside kubelet.sock
CHECKPOINT = "kubelet_internal_checkpoint"
#: lists the pods bound to the node
PodLister = Callable[[], Awaitable[list[dict[str, Any]]]]
#: writes a pod's status (the pod as listed, the status to merge into it)
StatusWriter = Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]]


@dataclass
class Endpoint:
    """One registered plugin, as the kubelet's device manager tracks it."""

    resource: str
    socket: Path
    options: Any
    channel: grpc.aio.Channel
    stub: Any
    devices: dict[str, str] = field(default_factory=dict)  # ID -> health
    numa: dict[str, list[int]] = field(default_factory=dict)
    updates: int = 0
    watcher: asyncio.Task[None] | None = None


@dataclass(frozen=True, slots=True)
class Admission:
    """What the kubelet would give the container runtime for one container."""

    devices: list[str]  # what the device manager recorded as allocated
    envs: dict[str, str]
    cdi_devices: list[str]


@dataclass
class PodRecord:
    """A pod's entry in the checkpoint: its containers' allocations, in admission order."""

    admissions: list[Admission] = field(default_factory=list)
    started: bool = False
    #: why the device manager refused the pod (None: it was admitted)
    refusal: str | None = None


class Checkpoint:
    """The device manager's checkpoint file: devices given out per resource, and per pod uid.
    Written whole (to a temporary file, then renamed) after every change, as the kubelet does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.allocated: dict[str, set[str]] = {}
        self.pods: dict[str, PodRecord] = {}
        if path.exists():
            data = json.loads(path.read_text())
            self.allocated = {r: set(ids) for r, ids in data["allocated"].items()}
            self.pods = {uid: PodRecord([Admission(**a) for a in rec["admissions"]],
                                        rec["started"], rec.get("refusal"))
                         for uid, rec in data["pods"].items()}

    def save(self) -> None:
        data = {"allocated": {r: sorted(ids) for r, ids in self.allocated.items()},
                "pods": {uid: {"admissions": [{"devices": a.devices, "envs": a.envs,
                                                "cdi_devices": a.cdi_devices}
                                               for a in rec.admissions],
                               "started": rec.started, "refusal": rec.refusal}
                         for uid, rec in self.pods.items()}}
        atomicfile.write(self.path, json.dumps(data).encode())


class _Registration(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def Register(self, request: Any, context: Any) -> Any:
        if request.version != API_VERSION:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"unsupported device plugin API version {request.version!r}")
        if not _RESOURCE.match(request.resource_name):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"invalid extended resource name {request.resource_name!r}")
        # the kubelet answers first and connects to the plugin afterwards
        asyncio.get_running_loop().create_task(self.kubelet.connect(request))
        return api_pb2.Empty()


#: (namespace, name) → container → resource → device IDs
PodDevices = dict[tuple[str, str], dict[str, dict[str, list[str]]]]


class _PodResources(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def _pod(self, namespace: str, name: str) -> Any:
        containers = self.kubelet.pod_resources[(namespace, name)]
        return pr_pb2.PodResources(name=name, namespace=namespace, containers=[
            pr_pb2.ContainerResources(name=c, devices=[
                pr_pb2.ContainerDevices(resource_name=r, device_ids=ids)
                for r, ids in resources.items()]) for c, resources in containers.items()])

    async def List(self, request: Any, context: Any) -> Any:
        return pr_pb2.ListPodResourcesResponse(pod_resources=[
            self._pod(ns, name) for ns, name in self.kubelet.pod_resources])

    async def Get(self, request: Any, context: Any) -> Any:
        # the kubelet's answers: code Unknown, for a disabled Get and for a pod it does not know
        if not self.kubelet.serve_get:
            await context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        key = (request.pod_namespace, request.pod_name)
        if key not in self.kubelet.pod_resources:
            await context.abort(grpc.StatusCode.UNKNOWN, f"pod {key} not found")
        return pr_pb2.GetPodResourcesResponse(pod_resources=self._pod(*key))


class FakeKubelet:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.endpoints: dict[str, Endpoint] = {}
        self.registrations: list[tuple[str, str]] = []  # (resource, endpoint) per Register
        #: survives plugin re-registration and kubelet restarts, in memory and on disk
        self.checkpoint = Checkpoint(directory / CHECKPOINT)
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._server: grpc.aio.Server | None = None
        self._changed = asyncio.Condition()
        self.pod_resources: PodDevices = {}
        self.serve_get = True

    @property
    def socket(self) -> Path:
        return self.dir / KUBELET_SOCKET

    @property
    def pod_resources_socket(self) -> Path:
        return self.dir / "pod-resources.sock"

    async def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.add_insecure_port(f"unix://{self.pod_resources_socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        for ep in self.endpoints.values():
            if ep.watcher is not None:
                ep.watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ep.watcher
            await ep.channel.close()
        self.endpoints.clear()
        if self._server is not None:
            await self._server.stop(grace=0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    async def restart(self) -> None:
        """A kubelet restart: forget every plugin, delete every socket, recreate kubelet.sock."""
        await self.stop()
        for path in self.dir.glob("*.sock"):
            path.unlink()
        self.registrations.clear()
        await self.start()

    async def connect(self, request: Any) -> None:
        socket = self.dir / request.endpoint
        old = self.endpoints.pop(request.resource_name, None)
        if old is not None and old.watcher is not None:
            old.watcher.cancel()
            await old.channel.close()
        channel = grpc.aio.insecure_channel(f"unix://{socket}")
        stub = api_pb2_grpc.DevicePluginStub(channel)
        options = await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
        ep = Endpoint(request.resource_name, socket, options, channel, stub)
        ep.watcher = asyncio.get_running_loop().create_task(self._watch(ep))
        self.endpoints[request.resource_name] = ep
        self.registrations.append((request.resource_name, request.endpoint))
        await self.events.put({"event": "registered", "resource": request.resource_name,
                               "endpoint": request.endpoint})

    async def _watch(self, ep: Endpoint) -> None:
        try:
            async for update in ep.stub.ListAndWatch(api_pb2.Empty()):
                async with self._changed:
                    ep.devices = {d.ID: d.health for d in update.devices}
                    ep.numa = {d.ID: [n.ID for n in d.topology.nodes] for d in update.devices}
                    ep.updates += 1
                    self._changed.notify_all()
                await self.events.put({"event": "devices", "resource": ep.resource,
                                       "devices": ep.devices})
        except grpc.aio.AioRpcError as exc:
            # the plugin went away: the kubelet marks its devices unhealthy until it re-registers
            log.info("ListAndWatch ended", extra={"resource": ep.resource, "code": exc.code().name})
            async with self._changed:
                ep.devices = dict.fromkeys(ep.devices, "Unhealthy")
                self._changed.notify_all()

    async def wait_for(self, resource: str, *, count: int | None = None,
                       min_updates: int = 1, within: float = 10.0) -> Endpoint:
        """Wait until `resource` is registered and has sent `min_updates` device lists (with
        `count` devices when given)."""
        def ready() -> bool:
            ep = self.endpoints.get(resource)
            return (ep is not None and ep.updates >= min_updates
                    and (count is None or len(ep.devices) == count))
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(ready), within)
        return self.endpoints[resource]

    async def admit(self, resource: str, count: int, pod_uid: str | None = None) -> Admission:
        """Allocate `count` devices for one container (of the pod `pod_uid`, checkpointed under
        it), as the kubelet's device manager does.

        Once the plugin is asked, its answer is recorded even when this kubelet is told to stop
        meanwhile: a plugin may act on an Allocate (Muster's agent marks the pod served), so a
        kubelet that asked and forgot would start the pod on nothing."""
        ep = self.endpoints[resource]
        taken = self.checkpoint.allocated.setdefault(resource, set())
        free = sorted(d for d, h in ep.devices.items() if h == HEALTHY and d not in taken)
        if len(free) < count:
            raise RuntimeError(f"{resource}: {count} requested, {len(free)} free")
        chosen = free[:count]
        if ep.options.get_preferred_allocation_available:
            pref = await ep.stub.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(
                container_requests=[api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=free, allocation_size=count)]), timeout=30)
            # as the device manager (devicesToAllocate): what the plugin prefers and is free,
            # then the kubelet's own pick for the rest; the plugin only steers
            chosen = [d for d in dict.fromkeys(pref.container_responses[0].deviceIDs)
                      if d in free][:count]
            chosen += [d for d in free if d not in chosen][:count - len(chosen)]
        allocate = asyncio.ensure_future(self._allocate(ep, chosen, pod_uid))
        try:
            return await asyncio.shield(allocate)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await allocate
            raise

    async def _allocate(self, ep: Endpoint, chosen: list[str], pod_uid: str | None
                        ) -> Admission:
        resp = await ep.stub.Allocate(api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=chosen)]), timeout=30)
        cresp = resp.container_responses[0]
        got = Admission(chosen, dict(cresp.envs), [c.name for c in cresp.cdi_devices])
        self.checkpoint.allocated.setdefault(ep.resource, set()).update(chosen)
        if pod_uid is not None:
            self.checkpoint.pods.setdefault(pod_uid, PodRecord()).admissions.append(got)
        self.checkpoint.save()
        return got

    async def start_pods(self, pods: PodLister,
                         resource: str, poll_s: float = 0.05,
                         write_status: StatusWriter | None = None
                         ) -> AsyncIterator[dict[str, Any]]:
        """Start every pending pod that `pods` lists (those bound to this node) and that asks for
        `resource`: admit its containers in the kubelet's order (init containers, then spec
        order), once. Containers allocated before a restart keep their checkpointed devices.
        Yields one event per such pod. With `write_status`, every pod it lists is also reported
        started (or refused) to the API server (the module's docstring)."""
        while True:
            try:
                listed = await pods()
            except Exception as exc:  # the kubelet keeps going through an API outage
                log.warning("listing this node's pods failed", extra={"error": str(exc)})
                listed = []
            else:
                self._release(listed, resource)
            for pod in listed:
                started = await self._start(pod, resource)
                if started is None:
                    continue
                event, refusal = started
                if event is not None:
                    # out before the status write: a stop at that write's await loses no line
                    # (the checkpoint already says started, so a restarted kubelet prints none)
                    yield event
                await _report(write_status, pod, refusal)
            await asyncio.sleep(poll_s)

    def _release(self, listed: list[dict[str, Any]], resource: str) -> None:
        """Let go of the devices of the pods no longer on the node (deleted, evicted) or ended,
        as the device manager does once their containers stopped (this kubelet runs none): the
        next pod may be given them."""
        alive = {p["metadata"]["uid"] for p in listed if not p["metadata"].get("deletionTimestamp")
                 and (p.get("status") or {}).get("phase", "Pending") in ("Pending", "Running")}
        gone = [uid for uid in self.checkpoint.pods if uid not in alive]
        if not gone:
            return
        held = self.checkpoint.allocated.setdefault(resource, set())
        for uid in gone:
            for admission in self.checkpoint.pods.pop(uid).admissions:
                held.difference_update(admission.devices)
        self.checkpoint.save()

    async def _start(self, pod: dict[str, Any], resource: str
                     ) -> tuple[dict[str, Any] | None, str | None] | None:
        """Start `pod` unless it is no longer pending: the event to print (None when it was
        started before or asks the device manager for nothing) and its refusal, if any."""
        meta = pod["metadata"]
        if (meta.get("deletionTimestamp")
                or (pod.get("status") or {}).get("phase", "Pending") != "Pending"):
            return None
        record = self.checkpoint.pods.get(meta["uid"])
        counts = [n for n in (_asks(c, resource) for c in [
            *pod["spec"].get("initContainers", ()), *pod["spec"]["containers"]]) if n]
        if (record is not None and record.started) or not counts:
            # started before (its status not taken yet), or nothing for the device manager
            return None, record.refusal if record is not None else None
        name = f"{meta['namespace']}/{meta['name']}"
        done = list(record.admissions) if record is not None else []
        refusal = None
        try:
            got = done + [await self.admit(resource, n, meta["uid"]) for n in counts[len(done):]]
        except grpc.aio.AioRpcError as exc:
            event = {"event": "refused", "pod": name, "code": exc.code().name,
                     "detail": exc.details()}
            refusal = exc.details()
        else:
            event = {"event": "started", "pod": name,
                     "envs": [a.envs for a in got], "devices": [a.devices for a in got]}
        record = self.checkpoint.pods.setdefault(meta["uid"], PodRecord())
        record.started, record.refusal = True, refusal
        self.checkpoint.save()
        return event, refusal


def pod_status(pod: dict[str, Any], refusal: str | None, now: float) -> dict[str, Any]:
    """The status a kubelet reports for `pod` once it has started it (`refusal` None) or once
    its device manager refused it: Failed, reason UnexpectedAdmissionError, as the kubelet's
    pod admission rejects a pod whose Allocate failed."""
    if refusal is not None:
        return {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                "message": f"Pod was rejected: Allocate failed due to {refusal}, which is "
                           "unexpected"}
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    ours = ("Initialized", "ContainersReady", "Ready")
    kept = [c for c in (pod.get("status") or {}).get("conditions") or ()
            if c.get("type") not in ours]
    return {"phase": "Running", "startTime": at, "conditions": [*kept, *(
        {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": at}
        for t in ours)]}


async def _report(write_status: StatusWriter | None, pod: dict[str, Any],
                  refusal: str | None) -> None:
    if write_status is None:
        return
    try:
        await write_status(pod, pod_status(pod, refusal, time.time()))
    except Exception as exc:  # as the kubelet's status manager: tried again on the next pass
        log.warning("writing a pod's status failed",
                    extra={"pod": pod["metadata"]["name"], "error": str(exc)})


def _asks(container: dict[str, Any], resource: str) -> int:
    res = container.get("resources") or {}
    value = (res.get("limits") or {}).get(resource, (res.get("requests") or {}).get(resource))
    return whole(value) if value is not None else 0


def node_io(kube: KubeApi, node: str) -> tuple[PodLister, StatusWriter]:
    """How the node's kubelet reads the pods bound to it and writes their status."""
    from webhook.kube.api import PODS  # noqa: PLC0415

    async def pods() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (await kube.list(
            PODS, field_selector=f"spec.nodeName={node}")).get("items") or []
        return items

    async def write(pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        # its uid: never the status of a later pod of the same name
        await kube.patch(PODS, meta["name"], {"metadata": {"uid": meta["uid"]}, "status": status},
                         meta["namespace"], subresource="status")
    return pods, write


async def _main(directory: Path, admit: list[int], resource: str,
                kubeconfig: str | None = None, node: str | None = None) -> int:
    kubelet = FakeKubelet(directory)
    await kubelet.start()
    out = sys.stdout
    try:
        if admit:
            await kubelet.wait_for(resource, within=60)
        for count in admit:
            try:
                got = await kubelet.admit(resource, count)
                out.write(json.dumps({"event": "admitted", "count": count,
                                      "devices": got.devices, "envs": got.envs,
                                      "cdi": got.cdi_devices}) + "\n")
            except grpc.aio.AioRpcError as exc:
                out.write(json.dumps({"event": "refused", "count": count,
                                      "code": exc.code().name, "detail": exc.details()}) + "\n")
            out.flush()
        if kubeconfig and node:
            from webhook.kube import KubeApi, make_api_client  # noqa: PLC0415

            client = await make_api_client(kubeconfig)
            pods, write = node_io(KubeApi(client), node)
            try:
                await kubelet.wait_for(resource, within=60)
                async for event in kubelet.start_pods(pods, resource, write_status=write):
                    out.write(json.dumps(event) + "\n")
                    out.flush()
            finally:
                await client.close()
        while True:
            event = await kubelet.events.get()
            out.write(json.dumps(event) + "\n")
            out.flush()
    finally:
        await kubelet.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m webhook.doubles.fakekubelet")
    parser.add_argument("--dir", type=Path, required=True, help="device plugin directory")
    parser.add_argument("--resource", default="nvidia.com/gpu")
    parser.add_argument("--admit", type=int, action="append", default=[],
                        help="admit a container asking for N devices (repeatable)")
    parser.add_argument("--kubeconfig", help="with --node: start the node's pods as they are bound")
    parser.add_argument("--node")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_until_sigterm(_main(args.dir, args.admit, args.resource,
                                                args.kubeconfig, args.node)))
    return 0


async def _until_sigterm(main: Awaitable[int]) -> int:
    """SIGTERM cancels `main` at its next await, as the kubelet shuts down on it: an Allocate
    already sent is still recorded (`FakeKubelet.admit`)."""
    task = asyncio.ensure_future(main)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
