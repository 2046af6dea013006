"""The resources the binder reads that a cluster may not serve, and CRDs installed after it.

A CRD the API server does not serve when the binder starts (the coscheduling PodGroup, Volcano's
HyperNode, Kueue's or KAI's Topology) is looked for again every `interval` seconds and read from
the moment it is served: an admin who installs scheduler-plugins or Volcano after Muster does
not restart the binder for it. DRA's resources, built into the API server, are read when they
are served at start, as kube-scheduler reads them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from webhook.kube.api import ApiError, KubeApi, Resource
from webhook.kube.informer import Handler, Informer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Source:
    """A resource the binder reads where it is served: the first served of `versions`."""

    versions: tuple[Resource, ...]
    handler: Handler
    #: what its absence means, logged at `level`
    missing: str
    level: int = logging.INFO
    #: a CRD: looked for again until it is served
    late: bool = True
    #: called before its informer starts (the binder's state for "served, nothing listed yet")
    found: Callable[[], None] | None = None


async def first_served(api: KubeApi, versions: tuple[Resource, ...]) -> Resource | None:
    """The first of a resource's versions the API server serves."""
    for resource in versions:
        try:
            await api.list(resource, limit=1)
        except ApiError as exc:
            if not exc.not_found:
                raise
            continue
        return resource
    return None


class Sources:
    """The informers of the optional resources served, and the CRDs awaited."""

    def __init__(self, api: KubeApi, interval: float) -> None:
        self.api = api
        self.interval = interval
        #: the CRDs not served yet
        self.awaited: list[Source] = []

    async def informers(self, sources: list[Source]) -> list[Informer]:
        """An informer for each source served now; the CRDs that are not are awaited (in place
        of those awaited before)."""
        informers: list[Informer] = []
        self.awaited = []
        for source in sources:
            served = await first_served(self.api, source.versions)
            if served is None:
                log.log(source.level, source.missing,
                        extra={"resource": source.versions[0].plural})
                if source.late:
                    self.awaited.append(source)
                continue
            informers.append(self._informer(source, served))
        return informers

    async def await_late(self, start: Callable[[Informer], None]) -> None:
        """Look for the awaited CRDs every `interval` seconds, and `start` an informer for each
        once it is served; returns when none is awaited."""
        while self.awaited:
            await asyncio.sleep(self.interval)
            for source in list(self.awaited):
                try:
                    served = await first_served(self.api, source.versions)
                except ApiError as exc:  # asked again at the next interval
                    log.warning("could not ask whether a resource is served", extra={
                        "resource": source.versions[0].plural, "error": str(exc)})
                    continue
                if served is None:
                    continue
                self.awaited.remove(source)
                log.info("resource now served: reading it", extra={
                    "resource": f"{served.plural}.{served.group}"})
                start(self._informer(source, served))

    def _informer(self, source: Source, resource: Resource) -> Informer:
        if source.found is not None:
            source.found()
        informer = Informer(self.api, resource)
        informer.add_handler(source.handler)
        return informer
