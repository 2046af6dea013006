"""PodGroup before the pod: create it once per gang, update it when the job changed.

Many pods of one job arrive together (the MPI operator creates all workers at once), so the
first write per PodGroup holds a per-key lock; the others wait and then find it in the cache of
PodGroups known to exist. A 409 AlreadyExists (another replica of this server, or a PodGroup
made before we started) is read and compared instead of failing. A PodGroup informer keeps the
cache honest: a deleted PodGroup is forgotten, an edited one is compared again.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Mapping
from typing import Any

from webhook.admission.metrics import Metrics
from webhook.keys import COSCHEDULING_API, VOLCANO_API
from webhook.kube import COSCHEDULING_PODGROUPS, VOLCANO_PODGROUPS, ApiError, KubeApi, Resource
from webhook.policy import podgroup_manifest
from webhook.policy.decision import PodGroupSpec
from webhook.policy.podgroup import podgroup_spec

log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # API group, namespace, name


def resource_for(backend: str) -> Resource:
    return VOLCANO_PODGROUPS if backend == "volcano" else COSCHEDULING_PODGROUPS


def covers(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether an existing spec already has every field we want (other fields are left alone)."""
    return all(current.get(k) == v for k, v in wanted.items())


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    group = str(obj.get("apiVersion", "")).split("/")[0]
    return group, str(meta.get("namespace", "")), str(meta.get("name", ""))


class PodGroupWriter:
    def __init__(self, api: KubeApi, metrics: Metrics) -> None:
        self.api = api
        self.metrics = metrics
        #: PodGroups known to exist → their spec as last written or seen
        self.known: dict[Key, Mapping[str, Any]] = {}
        #: the last (known spec, wanted spec) found to match, by identity: the pods of one job
        #: share one PodGroupSpec object (the outcome memo), so most checks end here
        self._matched: dict[Key, tuple[Mapping[str, Any], PodGroupSpec]] = {}
        self._locks: weakref.WeakValueDictionary[Key, asyncio.Lock] = (
            weakref.WeakValueDictionary())

    def observe(self, event: str, obj: Mapping[str, Any]) -> None:
        """PodGroup informer handler: forget deleted PodGroups, remember edited ones."""
        key = key_of(obj)
        if event == "DELETED":
            self.known.pop(key, None)
            self._matched.pop(key, None)
        elif isinstance(obj.get("spec"), Mapping):
            self.known[key] = obj["spec"]

    def current(self, spec: PodGroupSpec) -> bool:
        """Whether the PodGroup is known to exist as wanted (the common case: no write, no task)."""
        if spec.backend == "muster":  # no PodGroup object (podgroup_manifest is None)
            return True
        # key_of(podgroup_manifest(spec)) without building the manifest
        group = (VOLCANO_API if spec.backend == "volcano" else COSCHEDULING_API)[0]
        key = (group, spec.namespace, spec.name)
        known = self.known.get(key)
        if known is None:
            return False
        matched = self._matched.get(key)
        if matched is not None and matched[0] is known and matched[1] is spec:
            return True
        if not covers(known, podgroup_spec(spec)):
            return False
        self._matched[key] = (known, spec)
        return True

    async def ensure(self, spec: PodGroupSpec, *, dry_run: bool) -> list[str]:
        """Make the PodGroup exist with this spec; warnings (never raises) when it could not."""
        manifest = podgroup_manifest(spec)
        if manifest is None:
            return []
        if dry_run:
            self.metrics.podgroup_writes.labels("dry_run").inc()
            return []
        key = key_of(manifest)
        wanted: Mapping[str, Any] = manifest.get("spec") or {}
        known = self.known.get(key)
        if known is not None and covers(known, wanted):
            return []
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            known = self.known.get(key)
            if known is not None and covers(known, wanted):
                return []
            try:
                result = await self._write(resource_for(spec.backend), manifest, wanted)
            except ApiError as exc:
                self.metrics.podgroup_writes.labels("error").inc()
                log.warning("PodGroup write failed", extra={
                    "podgroup": f"{spec.namespace}/{spec.name}", "status": exc.status,
                    "error": str(exc)})
                return [f"muster: PodGroup {spec.namespace}/{spec.name} could not be written "
                        f"(HTTP {exc.status}); the gang waits until a later pod writes it"]
            self.metrics.podgroup_writes.labels(result).inc()
            self.known[key] = wanted
            log.info("PodGroup ensured", extra={"podgroup": f"{spec.namespace}/{spec.name}",
                                                "result": result})
            return []

    async def _write(self, resource: Resource, manifest: dict[str, Any],
                     wanted: Mapping[str, Any]) -> str:
        meta = manifest["metadata"]
        try:
            await self.api.create(resource, manifest, namespace=meta["namespace"])
            return "created"
        except ApiError as exc:
            if exc.status != 409:
                raise
        existing = await self.api.get(resource, meta["name"], namespace=meta["namespace"])
        if covers(existing.get("spec") or {}, wanted):
            return "exists"
        await self.api.patch(resource, meta["name"], {"spec": dict(wanted)},
                             namespace=meta["namespace"], patch_type="merge")
        return "updated"
