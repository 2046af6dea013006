"""The ResourceClaims the binder sees, and its writes of their status.

As with pods (controller._Assumed), a claim the binder allocated counts as allocated from the
moment it is planned until the informer shows a newer version of it, so that a lagging cache
never hands a GPU out twice. Writes carry the resourceVersion the plan read: a 409 means someone
else wrote the claim first (kube-scheduler allocated it, its user deleted it), and the gang is
planned again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from webhook import keys
from webhook.binder.claims import ClaimInfo, allocated_status, parse_claim, released_status
from webhook.binder.pods import PodInfo
from webhook.kube.api import RESOURCE_CLAIMS, ApiError, KubeApi

log = logging.getLogger(__name__)

#: one claim's allocation: the pod it is for, the node, and its (request, GPU index) pairs
ClaimWrite = tuple[PodInfo, str, ClaimInfo, tuple[tuple[str, int], ...]]


#: a resourceVersion no informer event reaches: the assumption stays until our write's answer
_NEVER = 2**63


def _rv(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


class ClaimState:
    def __init__(self, api: KubeApi, *, changed: Callable[[str], None],
                 check_fence: Callable[[], None]) -> None:
        self.api = api
        self._changed = changed  # told the key of a claim whose view changed
        self._check_fence = check_fence  # raises when this replica may no longer write
        self._seen: dict[str, tuple[ClaimInfo, dict[str, Any]]] = {}
        #: key → (claim as we wrote or are writing it, its object when written, informer
        #: versions below this predate our write)
        self._assumed: dict[str, tuple[ClaimInfo, dict[str, Any] | None, int]] = {}

    def get(self, key: str) -> ClaimInfo | None:
        """The claim as the planner is to see it: our write if the informer lags."""
        assumed = self._assumed.get(key)
        if assumed is not None:
            return assumed[0]
        seen = self._seen.get(key)
        return seen[0] if seen is not None else None

    def on_event(self, event: str, obj: dict[str, Any], _old: dict[str, Any] | None) -> None:
        info = parse_claim(obj)
        if event == "DELETED":
            self._seen.pop(info.key, None)
            self._assumed.pop(info.key, None)
        else:
            self._seen[info.key] = (info, obj)
            assumed = self._assumed.get(info.key)
            if assumed is not None and _rv(info.resource_version) >= assumed[2]:
                del self._assumed[info.key]
        self._changed(info.key)

    def _assume(self, info: ClaimInfo, obj: dict[str, Any] | None, min_rv: int) -> None:
        self._assumed[info.key] = (info, obj, min_rv)
        self._changed(info.key)

    def _unassume(self, key: str) -> None:
        if self._assumed.pop(key, None) is not None:
            self._changed(key)

    def assume_allocated(self, writes: Sequence[ClaimWrite]) -> None:
        """Show the planned allocations at once: a later version than the one read is either
        our write or the one that beat it."""
        for pod, node, info, devices in writes:
            self._assume(replace(info, node=node, devices=devices, allocated=True,
                                 reserved_for=((pod.name, pod.uid),), consumers=1),
                         None, _rv(info.resource_version) + 1)

    def _object(self, key: str) -> dict[str, Any]:
        assumed = self._assumed.get(key)
        if assumed is not None and assumed[1] is not None:
            return assumed[1]
        return self._seen[key][1]

    async def _put_status(self, info: ClaimInfo, status: dict[str, Any],
                          obj: dict[str, Any] | None = None) -> None:
        """PUT the claim's status on `obj` (as last seen or written), with the resourceVersion
        `info` was read at unless `obj` is our own later write."""
        self._check_fence()
        if obj is None:
            obj = self._object(info.key)
            obj = {**obj, "metadata": {**obj["metadata"],
                                       "resourceVersion": info.resource_version}}
        stored = await self.api.replace(RESOURCE_CLAIMS, info.name, {**obj, "status": status},
                                        info.namespace, subresource="status")
        written = parse_claim(stored)
        self._assume(written, stored, _rv(written.resource_version))

    async def _protected(self, info: ClaimInfo) -> dict[str, Any] | None:
        """Add kube-scheduler's finalizer before allocating, as it does; the claim as written,
        or None when it had it. Until the status is written the planned allocation stays
        shown: the finalizer's own echo is not the allocation, nor a rival's write."""
        obj = self._object(info.key)
        finalizers = list(obj["metadata"].get("finalizers") or ())
        if keys.CLAIM_FINALIZER in finalizers:
            return None
        held = self._assumed.get(info.key)
        if held is not None:
            self._assume(held[0], None, _NEVER)
        self._check_fence()
        body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": info.resource_version,
                                    "finalizers": [*finalizers, keys.CLAIM_FINALIZER]}}
        return await self.api.replace(RESOURCE_CLAIMS, info.name, body, info.namespace)

    async def _allocate(self, write: ClaimWrite) -> None:
        pod, node, info, devices = write
        try:
            obj = await self._protected(info)
            status = allocated_status((obj or self._object(info.key)).get("status") or {},
                                      node, devices, pod.name, pod.uid)
            await self._put_status(info, status, obj)
        except BaseException:
            self._unassume(info.key)
            raise

    async def allocate(self, writes: Sequence[ClaimWrite]) -> list[ApiError]:
        """Write every allocation at once; the API's refusals, none when all were written.
        Otherwise none is left: those written are released, and the informer's view of the
        others is shown again."""
        results = await asyncio.gather(*(self._allocate(w) for w in writes),
                                       return_exceptions=True)
        failed = [(w, r) for w, r in zip(writes, results, strict=True)
                  if isinstance(r, BaseException)]
        if not failed:
            return []
        for (_, _, info, _), error in failed:
            log.info("claim not allocated", extra={"claim": info.key, "error": str(error)})
        written = [w for w, r in zip(writes, results, strict=True) if r is None]
        await asyncio.gather(*(self.release(info.key, pod.uid) for pod, _, info, _ in written),
                             return_exceptions=True)
        for _, error in failed:
            if not isinstance(error, ApiError):
                raise error  # cancelled or fenced: the next leader recovers from the claims
        return [e for _, e in failed if isinstance(e, ApiError)]

    async def create(self, body: dict[str, Any]) -> ClaimInfo:
        """Create a claim (a pod's special claim) and show it at once."""
        self._check_fence()
        namespace = str(body["metadata"]["namespace"])
        stored = await self.api.create(RESOURCE_CLAIMS, body, namespace)
        info = parse_claim(stored)
        self._assume(info, stored, _rv(info.resource_version))
        return info

    async def delete(self, key: str) -> None:
        """Delete a claim the binder made (its uid as precondition), its finalizer removed
        first as kube-scheduler does: its devices are free at once. Already gone is fine."""
        info = self.get(key)
        if info is None:
            return
        self._check_fence()
        try:
            obj = self._object(key)
            finalizers = list(obj["metadata"].get("finalizers") or ())
            if keys.CLAIM_FINALIZER in finalizers:
                finalizers.remove(keys.CLAIM_FINALIZER)
                await self.api.replace(RESOURCE_CLAIMS, info.name, {**obj, "metadata": {
                    **obj["metadata"], "finalizers": finalizers}}, info.namespace)
            await self.api.delete(RESOURCE_CLAIMS, info.name, info.namespace,
                                  preconditions={"uid": info.uid})
        except ApiError as exc:
            if not exc.not_found:
                raise
        self._seen.pop(key, None)
        self._assumed.pop(key, None)
        self._changed(key)

    async def let_go(self, key: str, pod_uid: str) -> None:
        """Give up the claim's allocation for the unbound pod: a special claim made for the pod
        is deleted (as kube-scheduler's Unreserve does), any other released."""
        info = self.get(key)
        if info is not None and info.extended_for is not None and \
                info.extended_for[1] == pod_uid:
            await self.delete(key)
        else:
            await self.release(key, pod_uid)

    async def release(self, key: str, pod_uid: str) -> None:
        """Remove the claim's allocation if it is still reserved for the pod alone (the caller
        knows the pod is not bound)."""
        info = self.get(key)
        if info is None or not info.reserved_only_for(pod_uid):
            return
        try:
            await self._put_status(info, released_status(self._object(key).get("status") or {}))
        except ApiError as exc:
            # the claim changed: the next cycle sees it and releases it again if need be
            log.info("claim not released", extra={"claim": key, "error": str(exc)})
            raise
