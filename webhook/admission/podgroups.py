"""PodGroup before the pod: create it once per gang, update it when the job changed.

Many pods of one job arrive together (the MPI operator creates all workers at once), so the
first write per PodGroup holds a per-key lock; the others wait and then find it in the cache of
PodGroups known to exist. A 409 AlreadyExists (another replica of this server, or a PodGroup
made before we started) is read and compared instead of failing. A PodGroup informer keeps the
cache honest: a deleted PodGroup is forgotten, an edited one is compared again.

A PodGroup is ours only when its controller is the job's object, uid included: mpi-operator
refuses a PodGroup it does not control (pkg/controller/mpi_job_controller.go,
getOrCreatePodGroups). One left by a deleted job of the same name (garbage collection not done
yet) is replaced at once: its owner is gone, so the garbage collector would delete it anyway.
One controlled by a live object, or by nothing, is never touched: the pod is refused with the
reason until it goes, as the operator's own sync keeps failing until then. One whose controller
cannot be read (the chart's RBAC reads job kinds only: another controller's object answers 403)
is not the job's either (the uid differs) and is never joined: the pod is admitted without a
gang, as for a missing queue, and says why. One the job controls
but Muster did not make (no app.kubernetes.io/managed-by: muster: the operator's own, e.g. from
mpi-operator's --gang-scheduling before a migration, or Kubeflow Trainer's) is the job's gang as
its maker wrote it: Muster writes only the objects it made.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.admission.metrics import Metrics
from webhook.kube import (
    COSCHEDULING_PODGROUPS,
    PODS,
    VOLCANO_PODGROUPS,
    ApiError,
    KubeApi,
    Resource,
)
from webhook.kube.owners import controller_ref, owner_resource
from webhook.policy import native
from webhook.policy.decision import PodGroupSpec, Withdrawal
from webhook.policy.native import GROUP as NATIVE_GROUP
from webhook.policy.podgroup import gang_objects, left_behind, made_by_muster

log = logging.getLogger(__name__)

Key = tuple[str, str, str, str]  # API group, kind, namespace, name
#: what is known of a PodGroup: its controller's uid (None: no controller), its spec, and whether
#: Muster made it
Known = tuple[str | None, Mapping[str, Any], bool]


@dataclass
class Ensured:
    """The outcome of making a gang's PodGroup exist."""

    #: for the pod's AdmissionResponse: the gang may not be in place yet
    warnings: list[str] = field(default_factory=list)
    #: the PodGroup belongs to something else: why the pod must wait (it is refused)
    refused: str | None = None
    #: a PodGroup of a deleted job was replaced by ours: what happened, for an Event
    replaced: str | None = None
    #: the name is taken by a PodGroup whose controller cannot be read: why the pod is admitted
    #: without a gang
    unreadable: str | None = None


def _ours(known: Known, spec: PodGroupSpec) -> bool:
    return known[0] == (spec.owner.uid if spec.owner is not None else None)


def _settled(known: Known, spec: PodGroupSpec, wanted: Mapping[str, Any]) -> bool:
    """Whether nothing is to be written: the job's object has every field we want, or the job's
    object was made by someone else (taken as it is)."""
    return _ours(known, spec) and (not known[2] or covers(known[1], wanted))


def resource_for(backend: str) -> Resource:
    return VOLCANO_PODGROUPS if backend == "volcano" else COSCHEDULING_PODGROUPS


def native_resources(api_version: str) -> tuple[Resource, Resource]:
    """The native Workload and PodGroup resources of one served scheduling.k8s.io version."""
    version = api_version.rpartition("/")[2]
    return (Resource(NATIVE_GROUP, version, "workloads", True, "Workload"),
            Resource(NATIVE_GROUP, version, "podgroups", True, "PodGroup"))


def resource_of(obj: Mapping[str, Any]) -> Resource:
    """Where one of `gang_objects`' objects is written."""
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    if group == NATIVE_GROUP:
        workloads, podgroups = native_resources(str(obj["apiVersion"]))
        return workloads if obj.get("kind") == "Workload" else podgroups
    return VOLCANO_PODGROUPS if group == VOLCANO_PODGROUPS.group else COSCHEDULING_PODGROUPS


def covers(current: Any, wanted: Mapping[str, Any]) -> bool:
    """Whether an existing spec already has every field we want (other fields, such as those
    the API server or another webhook defaults, are left alone)."""
    return isinstance(current, Mapping) and all(
        _covers(current.get(k), v) for k, v in wanted.items())


def _covers(current: Any, wanted: Any) -> bool:
    """`covers` below the top: structures field by field, and a map of plain values (e.g.
    minResources) as one value, so that a resource dropped from it is a change."""
    if isinstance(wanted, Mapping):
        if not any(isinstance(v, Mapping | list) for v in wanted.values()):
            return bool(current == wanted)
        return covers(current, wanted)
    if isinstance(wanted, list):
        return (isinstance(current, list) and len(current) == len(wanted)
                and all(_covers(c, w) for c, w in zip(current, wanted, strict=True)))
    return bool(current == wanted)


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    ref = controller_ref(obj)
    return None if ref is None else str(ref.get("uid") or "")


def _last_key(spec: PodGroupSpec) -> Key:
    """The key of the gang's last object, written once the others are in place (the PodGroup;
    a 1.35 native gang's Workload), without building the manifests."""
    if spec.backend == "kubernetes":
        api = spec.api_version or native.DEFAULT_API
        kind = "PodGroup" if native.has_podgroup_object(api) else "Workload"
        return NATIVE_GROUP, kind, spec.namespace, spec.name
    group = VOLCANO_PODGROUPS.group if spec.backend == "volcano" else COSCHEDULING_PODGROUPS.group
    return group, "PodGroup", spec.namespace, spec.name


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    return (group, str(obj.get("kind", "")), str(meta.get("namespace", "")),
            str(meta.get("name", "")))


class PodGroupWriter:
    def __init__(self, api: KubeApi, metrics: Metrics) -> None:
        self.api = api
        self.metrics = metrics
        #: PodGroups known to exist → (controller uid, spec) as last written or seen
        self.known: dict[Key, Known] = {}
        #: the last (known entry, wanted spec) found to match, by identity: the pods of one job
        #: share one PodGroupSpec object (the outcome memo), so most checks end here
        self._matched: dict[Key, tuple[Known, PodGroupSpec]] = {}
        self._locks: weakref.WeakValueDictionary[Key, asyncio.Lock] = (
            weakref.WeakValueDictionary())

    def observe(self, event: str, obj: Mapping[str, Any]) -> None:
        """PodGroup informer handler: forget deleted PodGroups, remember edited ones."""
        key = key_of(obj)
        if event == "DELETED":
            self.known.pop(key, None)
            self._matched.pop(key, None)
        elif isinstance(obj.get("spec"), Mapping):
            self.known[key] = (controller_uid(obj), obj["spec"], made_by_muster(obj))

    def current(self, spec: PodGroupSpec) -> bool:
        """Whether the gang's objects are known to exist as wanted (the common case: no write,
        no task)."""
        if spec.backend == "muster":  # no PodGroup object (gang_objects is empty)
            return True
        key = _last_key(spec)
        known = self.known.get(key)
        if known is None:
            return False
        matched = self._matched.get(key)
        if matched is not None and matched[0] is known and matched[1] is spec:
            return True
        for obj in gang_objects(spec):
            found = self.known.get(key_of(obj))
            if found is None or not _settled(found, spec, obj["spec"]):
                return False
        self._matched[key] = (known, spec)
        return True

    async def ensure(self, spec: PodGroupSpec, *, dry_run: bool) -> Ensured:
        """Make the gang's objects exist with this spec, in order (never raises)."""
        manifests = gang_objects(spec)
        if not manifests:
            return Ensured()
        if dry_run:
            self.metrics.podgroup_writes.labels("dry_run").inc()
            return Ensured()
        out = Ensured()
        for manifest in manifests:
            ensured = await self._ensure_one(spec, manifest)
            out.warnings += ensured.warnings
            out.replaced = out.replaced or ensured.replaced
            if ensured.refused or ensured.unreadable or ensured.warnings:  # the next waits
                out.refused, out.unreadable = ensured.refused, ensured.unreadable
                break
        return out

    async def withdraw(self, gone: Withdrawal) -> str | None:
        """Delete the PodGroup Muster made for a gang it stood aside from, unless
        `left_behind` keeps it; what was deleted and why, in words (None: nothing). Under the
        gang's write lock, so that a create still running for it on this replica (a deadline
        cut its pod's first pass short) lands first. API errors propagate."""
        if gone.backend not in ("volcano", "coscheduling"):
            return None  # no PodGroup object of Muster's (backend muster)
        resource = resource_for(gone.backend)
        key: Key = (resource.group, "PodGroup", gone.namespace, gone.name)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            for _ in range(3):  # a conflict: it changed between the read and the delete
                try:
                    existing = await self.api.get(resource, gone.name, namespace=gone.namespace)
                except ApiError as exc:
                    if exc.not_found:
                        return None
                    raise
                # every pod of the namespace: Volcano's key is an annotation, not selectable
                pods = (await self.api.list(PODS, namespace=gone.namespace)).get("items") or ()
                why = left_behind(existing, gone, pods)
                if why is None:
                    return None
                meta = existing["metadata"]
                try:
                    await self.api.delete(resource, gone.name, gone.namespace, preconditions={
                        "uid": meta["uid"], "resourceVersion": meta["resourceVersion"]})
                except ApiError as exc:
                    if exc.not_found:
                        return None
                    if exc.conflict:
                        continue
                    raise
                self.known.pop(key, None)
                self._matched.pop(key, None)
                self.metrics.podgroup_writes.labels("withdrawn").inc()
                log.info("PodGroup deleted: Muster stood aside", extra={
                    "podgroup": f"{gone.namespace}/{gone.name}", "by": gone.by})
                return f"PodGroup {gone.namespace}/{gone.name} deleted: {why}"
        return None

    async def _ensure_one(self, spec: PodGroupSpec, manifest: dict[str, Any]) -> Ensured:
        key = key_of(manifest)
        wanted: Mapping[str, Any] = manifest.get("spec") or {}
        known = self.known.get(key)
        if known is not None and _settled(known, spec, wanted):
            return Ensured()
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            known = self.known.get(key)
            if known is not None and _settled(known, spec, wanted):
                return Ensured()
            kind = manifest.get("kind", "PodGroup")
            where = f"{spec.namespace}/{spec.name}"
            try:
                result, detail = await self._write(resource_of(manifest), manifest, wanted)
            except ApiError as exc:
                self.metrics.podgroup_writes.labels("error").inc()
                log.warning("PodGroup write failed", extra={
                    "podgroup": where, "kind": kind, "status": exc.status, "error": str(exc)})
                return Ensured([f"muster: {kind} {where} could not be written (HTTP "
                                f"{exc.status}: {exc}); the gang waits until a later pod "
                                "writes it"])
            self.metrics.podgroup_writes.labels(result).inc()
            log.info("PodGroup ensured", extra={"podgroup": where, "kind": kind,
                                                "result": result})
            if result == "foreign":
                return Ensured(refused=detail)
            if result == "unreadable":
                return Ensured(unreadable=detail)
            if result != "kept":  # the informer records the object someone else made
                self.known[key] = (controller_uid(manifest), wanted, True)
            return Ensured(replaced=detail or None)

    async def _write(self, resource: Resource, manifest: dict[str, Any],
                     wanted: Mapping[str, Any]) -> tuple[str, str]:
        """(result, what happened in words): created, exists, updated, replaced, foreign,
        unreadable or kept (the job's, made by someone else: never written)."""
        meta = manifest["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        try:
            await self.api.create(resource, manifest, namespace=namespace)
            return "created", ""
        except ApiError as exc:
            if exc.status != 409:
                raise
        existing = await self.api.get(resource, name, namespace=namespace)
        if controller_uid(existing) != controller_uid(manifest):
            return await self._not_ours(resource, manifest, existing)
        if not made_by_muster(existing):
            return "kept", ""
        if covers(existing.get("spec") or {}, wanted):
            return "exists", ""
        await self.api.patch(resource, name, {"spec": dict(wanted)}, namespace=namespace,
                             patch_type="merge")
        return "updated", ""

    async def _not_ours(self, resource: Resource, manifest: dict[str, Any],
                        existing: Mapping[str, Any]) -> tuple[str, str]:
        """The name is taken by an object the job does not control: replaced (its controller
        is gone), foreign (alive, or none) or unreadable (its controller cannot be read)."""
        meta = manifest["metadata"]
        name, namespace, kind = meta["name"], meta["namespace"], manifest.get("kind")
        theirs, mine = controller_ref(existing), controller_ref(manifest) or {}
        who = (f"{theirs.get('kind')} {theirs.get('name')} (uid {theirs.get('uid')})"
               if theirs is not None else "no controller")
        foreign = (f"{kind} {namespace}/{name} already exists and is controlled by {who}, not "
                   f"by this {mine.get('kind')} (uid {mine.get('uid')}): Muster does not take "
                   f"over another gang; the pod is refused until that {kind} is gone or renamed")
        if theirs is None:
            return "foreign", foreign
        try:
            alive = await self._alive(theirs, namespace)
        except ApiError as exc:  # not the job's either way: its uid differs
            return "unreadable", (
                f"pod admitted without a gang: {kind} {namespace}/{name} is controlled by "
                f"{theirs.get('kind')} {theirs.get('name')}, which this webhook cannot read "
                f"(HTTP {exc.status}), not by this {mine.get('kind')}; the pod does not join it")
        if alive:
            return "foreign", foreign
        # a deleted job's PodGroup (same name): its garbage collection is due anyway
        try:
            await self.api.delete(resource, name, namespace, preconditions={
                "uid": existing["metadata"]["uid"]})
        except ApiError as exc:
            if not exc.not_found:
                raise
        await self.api.create(resource, manifest, namespace=namespace)
        return "replaced", (
            f"{kind} {namespace}/{name} of a deleted {theirs.get('kind')} "
            f"(uid {theirs.get('uid')}) replaced by this {mine.get('kind')}'s")

    async def _alive(self, ref: Mapping[str, Any], namespace: str) -> bool:
        """Whether the object `ref` names still exists (same uid). API errors propagate: an
        owner that cannot be read is never assumed gone."""
        try:
            obj = await self.api.get(owner_resource(ref), str(ref.get("name", "")),
                                     namespace=namespace)
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return bool((obj.get("metadata") or {}).get("uid") == ref.get("uid"))
