"""Read what `muster gangs` and `muster explain` need from a cluster, with get and list only.

Every function takes a `Reader`: the read verbs of `KubeApi` and nothing else, so that a write
here does not type-check (and the tests hand in a reader that has no other method).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from webhook.analyze.gangstate import Obj
from webhook.kube.api import (
    CONFIGMAPS,
    COSCHEDULING_PODGROUPS,
    EVENTS,
    NAMESPACES,
    PODS,
    VOLCANO_PODGROUPS,
    ApiError,
    Resource,
)
from webhook.kube.owners import controller_ref, owner_resource
from webhook.policy import native
from webhook.policy.errors import PolicyError
from webhook.policy.loader import load_policy_texts
from webhook.policy.policyset import PolicySet

#: how far up the controller chain owners are read, as admission reads them: an LWS worker ->
#: StatefulSet -> leader Pod -> StatefulSet -> LeaderWorkerSet is 4
MAX_OWNER_DEPTH = 4


#: discovery's answer: each version of a group -> its resources' plurals (named before `Reader`,
#: whose method `list` hides the builtin in its body)
Served = dict[str, list[str]]


class Reader(Protocol):
    """The API calls these commands make: reads only."""

    async def get(self, resource: Resource, name: str, namespace: str | None = None,
                  subresource: str | None = None) -> dict[str, Any]: ...

    async def list(self, resource: Resource, namespace: str | None = None, *,
                   label_selector: str | None = None, field_selector: str | None = None,
                   limit: int | None = None) -> dict[str, Any]: ...

    async def served(self, group: str) -> Served: ...


@dataclass
class Scope:
    """One namespace (or all: `namespace` None) as these commands read it."""

    namespace: str | None
    pods: list[Obj] = field(default_factory=list)
    groups: list[Obj] = field(default_factory=list)  # PodGroups and Workloads
    events: list[Obj] = field(default_factory=list)
    namespace_labels: dict[str, str] = field(default_factory=dict)
    policies: PolicySet | None = None
    #: where the policies came from, or why there are none
    policy_source: str = ""


async def _listed(api: Reader, resource: Resource, namespace: str | None) -> list[Obj]:
    """The objects; none where the API server does not serve the resource (no CRD)."""
    try:
        found: list[Obj] = (await api.list(resource, namespace))["items"]
    except ApiError as exc:
        if exc.not_found:
            return []
        raise
    return found


async def _get(api: Reader, resource: Resource, name: str, namespace: str | None
               ) -> dict[str, Any] | None:
    try:
        return await api.get(resource, name, namespace)
    except ApiError as exc:
        if exc.not_found:
            return None
        raise


async def gang_groups(api: Reader, namespace: str | None) -> list[Obj]:
    """The PodGroups of Volcano and coscheduling, and the native gang objects in the version
    the cluster serves (its PodGroups, or before 1.36 its Workloads)."""
    out = [*await _listed(api, VOLCANO_PODGROUPS, namespace),
           *await _listed(api, COSCHEDULING_PODGROUPS, namespace)]
    served = native.pick_api(await api.served(native.GROUP))
    if served is not None:
        version = served.rpartition("/")[2]
        plural, kind = ("podgroups", "PodGroup") if native.has_podgroup_object(served) else \
            ("workloads", "Workload")
        out += await _listed(api, Resource(native.GROUP, version, plural, True, kind), namespace)
    return out


async def read_gangs(api: Reader, namespace: str | None) -> Scope:
    """What `muster gangs` lists from: the pods and gang objects."""
    return Scope(namespace, pods=await _listed(api, PODS, namespace),
                 groups=await gang_groups(api, namespace))


async def read_namespace(api: Reader, namespace: str, release_namespace: str, release: str
                         ) -> Scope:
    """What `muster explain` reads: the namespace's pods, gang objects, Events and labels,
    and the policies the webhook serves (its ConfigMap)."""
    scope = await read_gangs(api, namespace)
    scope.events = await _listed(api, EVENTS, namespace)
    ns = await _get(api, NAMESPACES, namespace, None)
    scope.namespace_labels = dict(((ns or {}).get("metadata") or {}).get("labels") or {})
    scope.policies, scope.policy_source = await read_policies(api, release_namespace, release)
    return scope


async def read_policies(api: Reader, namespace: str, release: str
                        ) -> tuple[PolicySet | None, str]:
    """The policies of the release's ConfigMap, as the webhook loads them, and where they are
    from (or why there are none)."""
    where = f"ConfigMap {namespace}/{release}-policies"
    try:
        config = await _get(api, CONFIGMAPS, f"{release}-policies", namespace)
    except ApiError as exc:
        if exc.status != 403:
            raise
        return None, f"{where} may not be read by this user: the rest is shown without it"
    if config is None:
        return None, (f"no {where}: is Muster installed there? (--release-namespace, "
                      "--release)")
    try:
        policies = load_policy_texts(config.get("data") or {})
    except PolicyError as exc:
        return None, f"{where} does not load ({exc.problems[0]}): muster policy check says why"
    return policies, f"{where}, {len(policies)} policies"


async def owner_chains(api: Reader, pods: Iterable[Obj]) -> dict[str, list[Obj]]:
    """Each pod's owners from its controller up to the root (pod uid -> objects), each owner
    read once; an owner that is gone ends its chain."""
    cache: dict[str, Obj | None] = {}
    out: dict[str, list[Obj]] = {}
    for pod in pods:
        chain: list[Obj] = []
        obj, ns = pod, str((pod.get("metadata") or {}).get("namespace") or "")
        while len(chain) < MAX_OWNER_DEPTH and (ref := controller_ref(obj)) is not None:
            uid = str(ref.get("uid") or "")
            if uid not in cache:
                cache[uid] = await _get(api, owner_resource(ref), str(ref.get("name")), ns)
            found = cache[uid]
            if found is None:
                break
            chain.append(found)
            obj = found
        out[str((pod.get("metadata") or {}).get("uid"))] = chain
    return out


async def below(api: Reader, refs: Iterable[Obj], namespace: str, name: str
                ) -> set[tuple[str, str]]:
    """(kind, name) of the objects `refs` names in `namespace` whose controller chain reaches
    an object named `name`; those gone, or owned by another, are left out."""
    found = [o for r in refs
             if (o := await _get(api, owner_resource(r), str(r.get("name")), namespace))]
    chains = await owner_chains(api, found)
    return {(str(o.get("kind")), str(o["metadata"].get("name"))) for o in found
            if any((c.get("metadata") or {}).get("name") == name
                   for c in chains.get(str(o["metadata"].get("uid")), ()))}


async def read_pod(api: Reader, namespace: str, name: str) -> Obj | None:
    return await _get(api, PODS, name, namespace)
