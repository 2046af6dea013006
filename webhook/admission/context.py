"""Cluster context for admission, from caches: namespace labels, owner objects, PodGroups.

- Namespaces: an informer (list + watch); a request never calls the API for labels.
- Owners (MPIJob, Job, PyTorchJob, ...): fetched on first use, cached by uid for a short TTL so
  that a scaled job is noticed quickly, with concurrent lookups of one owner sharing one GET (20
  workers of a job arriving together make one request).
- PodGroups: `PodGroupWriter`, invalidated by PodGroup informers started on first use of a
  backend (a cluster without Volcano never gets a failing watch on its CRD).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from webhook import keys
from webhook.admission.metrics import Metrics
from webhook.admission.podgroups import Ensured, PodGroupWriter, native_resources, resource_for
from webhook.kube import (
    CONFIGMAPS,
    NAMESPACES,
    PRIORITY_CLASSES,
    VOLCANO_QUEUES,
    ApiError,
    EventRecorder,
    Informer,
    KubeApi,
)
from webhook.kube.owners import controller_ref, owner_resource
from webhook.policy import native
from webhook.policy.decision import PodGroupSpec, Withdrawal
from webhook.policy.native import NativeVerdict, check_served
from webhook.policy.queues import QueueVerdict, check_queue, state_of
from webhook.policy.workload import NO_PRIORITIES, Priorities

log = logging.getLogger(__name__)

#: how far up the controller chain owners are fetched: pod → Job → MPIJob is 2, pod → Job →
#: JobSet → TrainJob 3, an LWS worker → StatefulSet → leader Pod → StatefulSet → LWS 4
MAX_OWNER_DEPTH = 4
#: how long a missing or unreadable owner is remembered as such
NEGATIVE_TTL = 2.0
#: the owner cache drops its expired entries when it reaches this size or more
PRUNE_MIN = 256
#: how often a cluster without Volcano's Queue CRD is probed again
QUEUE_PROBE_INTERVAL = 60.0
#: how long what the cluster serves of the Workload API is trusted before it is asked again
NATIVE_PROBE_INTERVAL = 60.0


class OwnerCache:
    def __init__(self, api: KubeApi, ttl: float) -> None:
        self.api = api
        self.ttl = ttl
        self._entries: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self._inflight: dict[str, asyncio.Future[dict[str, Any] | None]] = {}
        self.fetches = 0
        #: size at which expired entries are next dropped: twice what was left the last time,
        #: so a prune's cost is spread over as many inserts
        self._prune_at = PRUNE_MIN

    def peek(self, ref: Mapping[str, Any]) -> tuple[bool, dict[str, Any] | None]:
        """(fresh entry present, its object) without waiting: the common path has no await."""
        entry = self._entries.get(str(ref.get("uid", "")))
        if entry is not None and entry[0] > time.monotonic():
            return True, entry[1]
        return False, None

    async def get(self, ref: Mapping[str, Any], namespace: str) -> dict[str, Any] | None:
        uid = str(ref.get("uid", ""))
        now = time.monotonic()
        entry = self._entries.get(uid)
        if entry is not None and entry[0] > now:
            return entry[1]
        pending = self._inflight.get(uid)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[dict[str, Any] | None] = (
            asyncio.get_running_loop().create_future())
        self._inflight[uid] = future
        try:
            obj = await self._fetch(ref, namespace)
            ttl = self.ttl if obj is not None else NEGATIVE_TTL
            self._entries[uid] = (time.monotonic() + ttl, obj)
            self._prune(now)
            future.set_result(obj)
            return obj
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here: waiters re-raise it, nobody else must
            raise
        finally:
            del self._inflight[uid]

    async def _fetch(self, ref: Mapping[str, Any], namespace: str) -> dict[str, Any] | None:
        self.fetches += 1
        resource = owner_resource(ref)
        try:
            obj = await self.api.get(resource, str(ref.get("name", "")), namespace=namespace)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        meta = obj.get("metadata") or {}
        if ref.get("uid") and meta.get("uid") != ref.get("uid"):
            return None  # same name, another object: the pod's owner is gone
        return obj

    def __len__(self) -> int:
        return len(self._entries)

    def _prune(self, now: float) -> None:
        """Drop expired entries (never read again: `get` fetches anew). Done once the cache
        has doubled, it holds about the owners of the last ttl, not thousands of jobs long
        past, which every full garbage collection would walk through."""
        if len(self._entries) >= self._prune_at:
            for uid in [u for u, (exp, _) in self._entries.items() if exp <= now]:
                del self._entries[uid]
            self._prune_at = max(2 * len(self._entries), PRUNE_MIN)


async def policies_configmap_ref(api: KubeApi, namespace: str, name: str) -> dict[str, Any]:
    """The policies ConfigMap for an Event's involvedObject (a minimal one if it cannot be read)."""
    try:
        return await api.get(CONFIGMAPS, name, namespace=namespace)
    except ApiError:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace}}


class KubeContext:
    def __init__(self, api: KubeApi, metrics: Metrics, *, owner_ttl: float = 5.0,
                 recorder: EventRecorder | None = None) -> None:
        self.api = api
        self.namespaces = Informer(api, NAMESPACES)
        self.owner_cache = OwnerCache(api, owner_ttl)
        self.podgroups = PodGroupWriter(api, metrics)
        self.recorder = recorder
        self.queues = Informer(api, VOLCANO_QUEUES)
        self.priority_classes = Informer(api, PRIORITY_CLASSES)
        self.priority_classes.add_handler(lambda *_: self._forget_priorities())
        self._priorities: Priorities | None = None
        self._informers: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._queues_absent_until = 0.0
        #: (what discovery found of scheduling.k8s.io, until when it is trusted)
        self._native: tuple[dict[str, list[str]], float] | None = None
        metrics.cache_objects.labels("namespaces").set_function(
            lambda: len(self.namespaces.store))
        metrics.cache_objects.labels("owners").set_function(lambda: len(self.owner_cache))
        metrics.cache_objects.labels("podgroups").set_function(
            lambda: len(self.podgroups.known))

    def ready(self) -> bool:
        return self.namespaces.synced.is_set()

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        if not self.namespaces.synced.is_set():
            return None
        obj = self.namespaces.store.get(namespace)
        if obj is None:
            return None
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return labels if isinstance(labels, Mapping) else {}

    def cached_owners(self, pod: Mapping[str, Any], namespace: str) -> list[
            dict[str, Any]] | None:
        """The owner chain when every link is cached and found; None sends the caller to
        `owners` (which fetches, and explains a missing owner with a warning)."""
        owners: list[dict[str, Any]] = []
        current: Mapping[str, Any] = pod
        for _ in range(MAX_OWNER_DEPTH):
            ref = controller_ref(current)
            if ref is None:
                return owners
            fresh, obj = self.owner_cache.peek(ref)
            if not fresh or obj is None:
                return None
            owners.append(obj)
            current = obj
        return owners

    async def owners(self, pod: Mapping[str, Any], namespace: str, deadline: float
                     ) -> tuple[list[dict[str, Any]], list[str], Mapping[str, Any] | None]:
        """(owner chain, warnings, the reference whose read failed or did not finish by
        `deadline`): a failed read is not a missing owner, and admission treats the two apart
        (see Admitter)."""
        owners: list[dict[str, Any]] = []
        current: Mapping[str, Any] = pod
        for _ in range(MAX_OWNER_DEPTH):
            ref = controller_ref(current)
            if ref is None:
                break
            try:
                async with asyncio.timeout_at(deadline):
                    obj = await self.owner_cache.get(ref, namespace)
            except TimeoutError:
                return owners, [f"muster: owner {ref.get('kind')}/{ref.get('name')} was not "
                                "read in time; decided from the pod alone"], ref
            except Exception as exc:  # API or connection error: decide without the owner
                log.warning("owner lookup failed", extra={
                    "owner": f"{namespace}/{ref.get('kind')}/{ref.get('name')}",
                    "error": repr(exc)})
                return owners, [f"muster: owner {ref.get('kind')}/{ref.get('name')} could not "
                                "be read; decided from the pod alone"], ref
            if obj is None:
                return owners, [f"muster: owner {ref.get('kind')}/{ref.get('name')} not found; "
                                "decided from the pod alone"], None
            owners.append(obj)
            current = obj
        return owners, [], None

    def priorities(self) -> Priorities:
        """PriorityClass values (none until listed: replicas then count as equal)."""
        if not self.priority_classes.synced.is_set():
            return NO_PRIORITIES
        if self._priorities is None:  # rebuilt after any PriorityClass event
            self._priorities = Priorities({
                name: obj["value"] for name, obj in self.priority_classes.store.items()
                if isinstance(obj.get("value"), int)})
        return self._priorities

    def _forget_priorities(self) -> None:
        self._priorities = None

    def pod_group_current(self, spec: PodGroupSpec) -> bool:
        return self.podgroups.current(spec)

    async def ensure_pod_group(self, spec: PodGroupSpec, *, dry_run: bool) -> Ensured:
        self._watch_podgroups(spec)
        return await self.podgroups.ensure(spec, dry_run=dry_run)

    async def withdraw_pod_group(self, gone: Withdrawal) -> str | None:
        return await self.podgroups.withdraw(gone)

    async def queue_verdict(self, spec: PodGroupSpec, deadline: float) -> QueueVerdict | None:
        """The Volcano gang's queue checked against the Queues informer; None when the Queues
        are not known (Volcano's Queue CRD not installed, or not listed in time)."""
        states = await self._queue_states(deadline)
        if states is None:
            return None
        ns = self.namespaces.store.get(spec.namespace) or {}
        ns_queue = ((ns.get("metadata") or {}).get("annotations") or {}).get(
            keys.VOLCANO_QUEUE_ANNOTATION)
        return check_queue(spec, states, ns_queue if isinstance(ns_queue, str) else None)

    async def native_verdict(self, spec: PodGroupSpec, deadline: float) -> NativeVerdict | None:
        """The native gang's API shape from discovery; None when discovery failed or did not
        answer in time (the gang is then written in the shape it has, and a failure warns)."""
        loop = asyncio.get_running_loop()
        if self._native is None or loop.time() >= self._native[1]:
            try:
                async with asyncio.timeout_at(deadline):
                    served = await self.api.served(native.GROUP)
            except (ApiError, TimeoutError) as exc:
                log.warning("Workload API discovery failed", extra={"error": repr(exc)})
                return None
            self._native = (served, loop.time() + NATIVE_PROBE_INTERVAL)
        return check_served(spec, self._native[0])

    async def _queue_states(self, deadline: float) -> dict[str, str] | None:
        loop = asyncio.get_running_loop()
        if not self.queues.synced.is_set():
            if loop.time() < self._queues_absent_until:
                return None
            if "queues" not in self._informers:
                try:  # one probe: a cluster without Volcano's Queue CRD must not wait here
                    async with asyncio.timeout_at(deadline):
                        await self.api.list(VOLCANO_QUEUES, limit=1)
                except (ApiError, TimeoutError) as exc:
                    if isinstance(exc, ApiError) and exc.not_found:
                        self._queues_absent_until = loop.time() + QUEUE_PROBE_INTERVAL
                    return None
                self._informers["queues"] = asyncio.create_task(
                    self.queues.run(), name="volcano-queues")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(min(deadline, loop.time() + 2.0)):
                    await self.queues.synced.wait()
            if not self.queues.synced.is_set():
                return None
        return {name: state_of(obj) for name, obj in self.queues.store.items()}

    def report(self, objects: list[Mapping[str, Any]], reason: str, message: str, *,
               type_: str = "Warning", once_as: str | None = None) -> None:
        """Events on each object, in the background (never delays the answer); `once_as`
        names the Event so that the webhook's replicas record it once (EventRecorder.emit)."""
        recorder = self.recorder
        if recorder is None:
            return
        for obj in objects:
            task = asyncio.create_task(recorder.emit(obj, type_, reason, message[:1024],
                                                     once_as=once_as))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _watch_podgroups(self, spec: PodGroupSpec) -> None:
        if spec.backend == "kubernetes":
            api = native.api_of(spec)
            workloads, podgroups = native_resources(api)
            wanted = [workloads, podgroups] if native.has_podgroup_object(api) else [workloads]
        else:
            wanted = [resource_for(spec.backend)]
        for resource in wanted:
            name = f"{resource.group}/{resource.version}/{resource.plural}"
            if name in self._informers:
                continue
            informer = Informer(self.api, resource)
            informer.add_handler(lambda event, obj, _old: self.podgroups.observe(event, obj))
            self._informers[name] = asyncio.create_task(informer.run(), name=name)

    async def run(self) -> None:
        self._informers["priorityclasses"] = asyncio.create_task(
            self.priority_classes.run(), name="priorityclasses")
        try:
            await self.namespaces.run()
        finally:
            for task in self._informers.values():
                task.cancel()
            for task in self._informers.values():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
