"""Read the cluster into a `Snapshot` (read-only: get and list)."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

from webhook import keys
from webhook.analyze.findings import (
    BACKEND_CRDS,
    HYPERNODE_CRD,
    KUEUE_CRD,
    Snapshot,
    coscheduling_schedulers,
    not_enforced,
)
from webhook.binder.agents import AgentPod, parse_agent
from webhook.binder.evict import PREEMPTED, PREEMPTING
from webhook.kube import (
    CONFIGMAPS,
    COSCHEDULING_PODGROUPS,
    CRDS,
    DEPLOYMENTS,
    ENDPOINT_SLICES,
    EVENTS,
    LEASES,
    MUTATING_WEBHOOKS,
    NAMESPACES,
    NODES,
    PODS,
    SECRETS,
    VOLCANO_PODGROUPS,
    VOLCANO_QUEUES,
    ApiError,
    KubeApi,
    Resource,
)
from webhook.kube.api import KUEUE_QUEUES, TOPOLOGIES, VOLCANO_HYPERNODES
from webhook.kube.owners import controller_ref, owner_kind, owner_resource
from webhook.policy import native
from webhook.policy.audit import EVENT_REASON
from webhook.policy.errors import PolicyError
from webhook.policy.loader import load_policy_texts
from webhook.topology.network import Levels, LevelsError, TopologyRef, parse_levels_flag

#: the label that ties an EndpointSlice to its Service
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


async def _listed(api: KubeApi, resource: Resource, namespace: str | None = None
                  ) -> list[dict[str, Any]] | None:
    """The objects, or None where the API server does not serve the resource."""
    try:
        found: list[dict[str, Any]] = (await api.list(resource, namespace))["items"]
    except ApiError as exc:
        if exc.not_found:
            return None
        raise
    return found


async def _items(api: KubeApi, resource: Resource, namespace: str | None = None
                 ) -> list[dict[str, Any]]:
    return await _listed(api, resource, namespace) or []


async def _get(api: KubeApi, resource: Resource, name: str, namespace: str | None = None
               ) -> dict[str, Any] | None:
    try:
        return await api.get(resource, name, namespace=namespace)
    except ApiError as exc:
        if exc.not_found:
            return None
        raise


async def _pods(api: KubeApi, scheduler: str) -> list[dict[str, Any]]:
    """The unbound pods of one scheduler."""
    found: list[dict[str, Any]] = (await api.list(PODS, field_selector=(
        f"spec.schedulerName={scheduler},spec.nodeName=")))["items"]
    return found


async def _agent_pods(api: KubeApi, namespace: str, release: str,
                      nodes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The release's agent pods, and the pods the nodes' GPU-agent records name in other
    namespaces (an agent installed apart), each read once."""
    found: list[dict[str, Any]] = (await api.list(PODS, namespace, label_selector=(
        f"app.kubernetes.io/instance={release},app.kubernetes.io/component=agent")))["items"]
    elsewhere = set()
    for node in nodes:
        record = parse_agent(((node.get("metadata") or {}).get("annotations") or {}).get(
            keys.ANN_GPU_AGENT))
        if isinstance(record, AgentPod) and record.namespace != namespace:
            elsewhere.add((record.namespace, record.name))
    for ns, name in sorted(elsewhere):
        pod = await _get(api, PODS, name, ns)
        if pod is not None:
            found.append(pod)
    return found


async def _topology(api: KubeApi, ref: TopologyRef) -> dict[str, Any] | None:
    """The Topology object `ref` names, in the first of its API's versions served (None where
    neither it nor its CRD is there)."""
    for resource in TOPOLOGIES[ref.api]:
        found = await _get(api, resource, ref.name)
        if found is not None:
            return found
    return None


async def _served(api: KubeApi, versions: tuple[Resource, ...]) -> list[dict[str, Any]]:
    """The objects, from the first of their API's versions served (none where none is)."""
    for resource in versions:
        found = await _listed(api, resource)
        if found is not None:
            return found
    return []


def _flag(container: Mapping[str, Any], flag: str) -> str:
    """The value a container's args give `flag`, as `--flag=value` or `--flag value` ("" when
    they do not)."""
    args = [str(a) for a in container.get("args") or ()]
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name == flag:
            return value if eq else (args[i + 1] if i + 1 < len(args) else "")
    return ""


def serving_secret(deployment: Mapping[str, Any] | None) -> str | None:
    """The Secret the webhook's certificate comes from: the volume mounted where its
    `--tls-cert-file` is (the chart's `certs.external.secretName`, or its own `-tls`)."""
    template = (((deployment or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    volumes = {v.get("name"): v for v in template.get("volumes") or ()}
    for container in template.get("containers") or ():
        cert = _flag(container, "--tls-cert-file")
        for mount in container.get("volumeMounts") or () if cert else ():
            path = str(mount.get("mountPath") or "").rstrip("/")
            if path and cert.startswith(f"{path}/"):
                name = (volumes.get(mount.get("name")) or {}).get("secret", {}).get("secretName")
                return str(name) if name else None
    return None


def binder_levels(deployment: Mapping[str, Any]) -> Levels:
    """The levels the binder's `--network-levels` declares (none when it is absent, a file,
    or cannot be read: the binder refuses to start on those)."""
    template = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in template.get("containers") or ():
        if declared := _flag(container, "--network-levels"):
            try:
                return parse_levels_flag(declared)
            except LevelsError:
                return Levels()
    return Levels()


async def collect(api: KubeApi, namespace: str, release: str, stuck_after: float = 120.0
                  ) -> Snapshot:
    webhook = f"{release}-webhook"
    s = Snapshot(namespace=namespace, webhook_configuration=f"0-{release}", service=webhook,
                 binder_lease=f"{release}-binder", stuck_after=stuck_after)
    s.crds = frozenset(c["metadata"]["name"] for c in await _items(api, CRDS))
    config = await _get(api, CONFIGMAPS, f"{release}-policies", namespace)
    if config is not None:
        try:
            s.policies = load_policy_texts(config.get("data") or {})
        except PolicyError:
            s.policies = None  # the webhook refuses it too; `muster policy check` says why
    if BACKEND_CRDS["volcano"] in s.crds:
        s.queues = {q["metadata"]["name"]: q for q in await _items(api, VOLCANO_QUEUES)}
    s.native_api = native.pick_api(await api.served(native.GROUP))
    s.mutating = await _items(api, MUTATING_WEBHOOKS)
    s.endpoint_slices = (await api.list(ENDPOINT_SLICES, namespace, label_selector=(
        f"{SERVICE_NAME_LABEL}={webhook}")))["items"]
    s.serving_secret = serving_secret(await _get(api, DEPLOYMENTS, webhook, namespace)) \
        or f"{webhook}-tls"
    secret = await _get(api, SECRETS, s.serving_secret, namespace)
    if secret is not None and (secret.get("data") or {}).get("tls.crt"):
        s.serving_cert = base64.b64decode(secret["data"]["tls.crt"])
    s.nodes = await _items(api, NODES)
    owners: dict[str, Mapping[str, Any]] = {}
    podgroups: list[tuple[str, dict[str, Any]]] = []
    for crd, resource in ((BACKEND_CRDS["volcano"], VOLCANO_PODGROUPS),
                          (BACKEND_CRDS["coscheduling"], COSCHEDULING_PODGROUPS)):
        if crd not in s.crds:
            continue
        for pg in await _items(api, resource):
            ref = controller_ref(pg)
            kind = owner_kind(ref) if ref is not None else ""
            if ref is not None:
                owners.setdefault(kind, ref)
            podgroups.append((kind, pg))
    s.podgroups = podgroups
    jobs: dict[str, dict[str, Any]] = {}
    for ref in owners.values():
        for job in await _items(api, owner_resource(ref)):
            jobs[str(job["metadata"].get("uid"))] = job
    s.jobs = jobs
    binder = await _get(api, DEPLOYMENTS, f"{release}-binder", namespace)
    s.binder_deployed = binder is not None
    s.levels = binder_levels(binder) if binder is not None else Levels()
    if s.levels.hypernodes and HYPERNODE_CRD in s.crds:
        s.hypernodes = await _items(api, VOLCANO_HYPERNODES)
    if s.levels.topology is not None:
        s.topology = await _topology(api, s.levels.topology)
    s.namespaces = await _items(api, NAMESPACES)
    if KUEUE_CRD in s.crds:
        s.kueue = {plural: await _served(api, versions)
                   for plural, versions in KUEUE_QUEUES.items()}
    s.waiting_pods = await _pods(api, keys.DEFAULT_BINDER_SCHEDULER_NAME)
    for scheduler in sorted(coscheduling_schedulers(s.policies)):
        s.unscheduled_pods = [*s.unscheduled_pods, *await _pods(api, scheduler)]
    if not_enforced(s.policies):
        s.audit_events = (await api.list(EVENTS, field_selector=f"reason={EVENT_REASON}"))[
            "items"]
    if s.binder_deployed:
        s.preemption_events = [e for reason in (PREEMPTED, PREEMPTING) for e in (
            await api.list(EVENTS, field_selector=f"reason={reason}"))["items"]]
    s.agent_pods = await _agent_pods(api, namespace, release, s.nodes)
    lease = await _get(api, LEASES, s.binder_lease, namespace)
    s.leases = {s.binder_lease: lease} if lease is not None else {}
    return s
