"""Raw-JSON access to any Kubernetes resource through kubernetes-asyncio's ApiClient.

Objects stay plain dicts (the wire format): no model classes, the same code for CRDs, and much
faster for large lists and watches."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient

from webhook import keys
from webhook.lru import Lru

log = logging.getLogger(__name__)

PATCH_TYPES = {"merge": "application/merge-patch+json",
               "json": "application/json-patch+json",
               "strategic": "application/strategic-merge-patch+json"}


@dataclass(frozen=True)
class Resource:
    """Where a resource lives in the API: group ("" for core), version, plural."""

    group: str
    version: str
    plural: str
    namespaced: bool = True
    kind: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base


PODS = Resource("", "v1", "pods", True, "Pod")
NODES = Resource("", "v1", "nodes", False, "Node")
NAMESPACES = Resource("", "v1", "namespaces", False, "Namespace")
CONFIGMAPS = Resource("", "v1", "configmaps", True, "ConfigMap")
SECRETS = Resource("", "v1", "secrets", True, "Secret")
SERVICES = Resource("", "v1", "services", True, "Service")
EVENTS = Resource("", "v1", "events", True, "Event")
LEASES = Resource("coordination.k8s.io", "v1", "leases", True, "Lease")
JOBS = Resource("batch", "v1", "jobs", True, "Job")
DEPLOYMENTS = Resource("apps", "v1", "deployments", True, "Deployment")
ENDPOINT_SLICES = Resource("discovery.k8s.io", "v1", "endpointslices", True, "EndpointSlice")
VOLCANO_PODGROUPS = Resource(*keys.VOLCANO_API, namespaced=True, kind="PodGroup")
COSCHEDULING_PODGROUPS = Resource(*keys.COSCHEDULING_API, namespaced=True, kind="PodGroup")
PRIORITY_CLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", False, "PriorityClass")
VOLCANO_QUEUES = Resource("scheduling.volcano.sh", "v1beta1", "queues", False, "Queue")
VOLCANO_HYPERNODES = Resource("topology.volcano.sh", "v1alpha1", "hypernodes", False, "HyperNode")
#: the Topology objects `--network-levels kueue:NAME` or `kai:NAME` names, each API's versions
#: newest first (the binder reads the first one served)
TOPOLOGIES = {api: tuple(Resource(group, version, "topologies", False, "Topology")
                         for version in versions)
              for api, group, versions in (("kueue", "kueue.x-k8s.io", ("v1beta2", "v1beta1")),
                                           ("kai", "kai.scheduler", ("v1", "v1alpha1")))}
#: Kueue's queues and flavors, in the versions it serves, newest first
KUEUE_QUEUES = {plural: tuple(Resource("kueue.x-k8s.io", version, plural, namespaced, kind)
                              for version in ("v1beta2", "v1beta1"))
                for plural, namespaced, kind in (
                    ("resourceflavors", False, "ResourceFlavor"),
                    ("clusterqueues", False, "ClusterQueue"),
                    ("localqueues", True, "LocalQueue"))}
MPIJOBS = Resource("kubeflow.org", "v2beta1", "mpijobs", True, "MPIJob")
MUTATING_WEBHOOKS = Resource("admissionregistration.k8s.io", "v1",
                             "mutatingwebhookconfigurations", False,
                             "MutatingWebhookConfiguration")
VALIDATING_WEBHOOKS = Resource("admissionregistration.k8s.io", "v1",
                               "validatingwebhookconfigurations", False,
                               "ValidatingWebhookConfiguration")
RESOURCE_SLICES = Resource("resource.k8s.io", "v1", "resourceslices", False, "ResourceSlice")
RESOURCE_CLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims", True, "ResourceClaim")
DEVICE_CLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", False, "DeviceClass")
PDBS = Resource("policy", "v1", "poddisruptionbudgets", True, "PodDisruptionBudget")
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", False,
                "CustomResourceDefinition")


class ApiError(Exception):
    """A failed API call: HTTP `status` (0 when the server could not be reached), and the
    `reason` and `message` of the Status body."""

    def __init__(self, status: int, reason: str, message: str,
                 body: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = dict(body or {})

    @classmethod
    def from_body(cls, status: int, raw: bytes) -> ApiError:
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if isinstance(body, dict) and body.get("kind") == "Status":
            return cls(int(body.get("code") or status), str(body.get("reason") or ""),
                       str(body.get("message") or ""), body)
        return cls(status, "", raw.decode("utf-8", "replace")[:500])

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        """409: AlreadyExists on create or Conflict (stale resourceVersion) on update."""
        return self.status == 409

    @property
    def gone(self) -> bool:
        return self.status == 410


def _said(exc: BaseException) -> str:
    """What a connection error says ("Cannot connect to host ..."), its type when it says
    nothing (a bare TimeoutError)."""
    return str(exc) or type(exc).__name__


#: distinct API server warnings remembered, each logged once while it is
WARNINGS_KEPT = 256
#: RFC 9111 warn-code, warn-agent and quoted warn-text, as kube-apiserver writes them
_WARNING = re.compile(r'\s*\d{3}\s+\S+\s+"((?:[^"\\]|\\.)*)"')


def warning_text(header: str) -> str:
    """The text of one Warning header (`299 - "v1 Endpoints is deprecated ..."`), the header
    itself where it is not of that form."""
    found = _WARNING.match(header)
    return re.sub(r"\\(.)", r"\1", found.group(1)) if found else header.strip()


def _query(**params: Any) -> list[tuple[str, str]]:
    out = []
    for key, value in params.items():
        if value is None or value is False:
            continue
        out.append((key, "true" if value is True else str(value)))
    return out


class KubeApi:
    """get / list / create / replace / patch / delete / create_subresource / watch on raw
    dicts. Every failure raises ApiError.

    The API server's warnings (a deprecated API, an admission webhook's or policy's warning)
    are logged, each text once while it is among the last WARNINGS_KEPT, as client-go logs
    them; `warnings` maps each to the first call that drew it."""

    def __init__(self, api_client: ApiClient) -> None:
        self.client = api_client
        self.warnings: Lru[str, str] = Lru(WARNINGS_KEPT)

    async def _open(self, method: str, path: str, query: list[tuple[str, str]], *,
                    body: Any = None, content_type: str = "application/json",
                    request_timeout: float | None = None) -> aiohttp.ClientResponse:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            resp: aiohttp.ClientResponse = await self.client.call_api(
                path, method, query_params=query, header_params=headers, body=body,
                auth_settings=["BearerToken"], _preload_content=False,
                _request_timeout=request_timeout)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ApiError(0, "ConnectionError", f"{method} {path}: {_said(exc)}") from exc
        for header in resp.headers.getall("Warning", ()):
            self._warned(warning_text(header), f"{method} {path}")
        if not 200 <= resp.status < 300:
            try:
                raw = await resp.read()
            finally:
                resp.release()
            raise ApiError.from_body(resp.status, raw)
        return resp

    def _warned(self, text: str, call: str) -> None:
        if self.warnings.get(text) is None:
            self.warnings.put(text, call)
            log.warning("API server warning: %s", text, extra={"call": call})

    async def request(self, method: str, path: str, query: list[tuple[str, str]] | None = None,
                      *, body: Any = None, content_type: str = "application/json",
                      request_timeout: float | None = None) -> Any:
        """One call; returns the decoded JSON body."""
        resp = await self._open(method, path, query or [], body=body, content_type=content_type,
                                request_timeout=request_timeout)
        try:
            raw = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(0, "ConnectionError", f"{method} {path}: {_said(exc)}") from exc
        finally:
            resp.release()
        return json.loads(raw) if raw else None

    async def served(self, group: str) -> dict[str, list[str]]:
        """Discovery: each version of API `group` the server serves -> its resources' plurals
        (subresources left out); {} when it serves none."""
        try:
            found = await self.request("GET", f"/apis/{group}")
        except ApiError as exc:
            if exc.not_found:
                return {}
            raise
        out: dict[str, list[str]] = {}
        for entry in (found or {}).get("versions") or ():
            version = str(entry.get("version") or "")
            listing = await self.request("GET", f"/apis/{group}/{version}")
            out[version] = [str(r.get("name")) for r in (listing or {}).get("resources") or ()
                            if "/" not in str(r.get("name"))]
        return out

    async def get(self, resource: Resource, name: str,
                  namespace: str | None = None, subresource: str | None = None
                  ) -> dict[str, Any]:
        result: dict[str, Any] = await self.request(
            "GET", resource.path(namespace, name, subresource))
        return result

    async def list(self, resource: Resource, namespace: str | None = None, *,
                   label_selector: str | None = None, field_selector: str | None = None,
                   limit: int | None = None) -> dict[str, Any]:
        """The whole List (all pages when `limit` pages it): items, metadata.resourceVersion.

        kube-apiserver leaves apiVersion and kind out of a built-in List's items (a watch event
        and a GET carry them): they are set here, so every object a caller holds names its
        kind."""
        query = _query(labelSelector=label_selector, fieldSelector=field_selector, limit=limit)
        result: dict[str, Any] = await self.request("GET", resource.path(namespace), query)
        while (result.get("metadata") or {}).get("continue"):
            page = await self.request("GET", resource.path(namespace),
                                      [*query, ("continue", result["metadata"]["continue"])])
            result["items"].extend(page.get("items") or [])
            result["metadata"] = page.get("metadata") or {}
        for item in result.get("items") or ():
            item.setdefault("apiVersion", resource.api_version)
            item.setdefault("kind", resource.kind)
        return result

    async def create(self, resource: Resource, obj: Mapping[str, Any],
                     namespace: str | None = None, *, dry_run: bool = False,
                     field_manager: str | None = None) -> dict[str, Any]:
        ns = namespace or (obj.get("metadata") or {}).get("namespace")
        result: dict[str, Any] = await self.request(
            "POST", resource.path(ns), _query(dryRun="All" if dry_run else None,
                                              fieldManager=field_manager), body=dict(obj))
        return result

    async def replace(self, resource: Resource, name: str, obj: Mapping[str, Any],
                      namespace: str | None = None, *, subresource: str | None = None,
                      dry_run: bool = False) -> dict[str, Any]:
        """PUT: optimistic concurrency on obj's metadata.resourceVersion (409 when stale)."""
        ns = namespace or (obj.get("metadata") or {}).get("namespace")
        result: dict[str, Any] = await self.request(
            "PUT", resource.path(ns, name, subresource),
            _query(dryRun="All" if dry_run else None), body=dict(obj))
        return result

    async def patch(self, resource: Resource, name: str, patch: Any,
                    namespace: str | None = None, *, patch_type: str = "merge",
                    subresource: str | None = None, dry_run: bool = False,
                    field_manager: str | None = None) -> dict[str, Any]:
        """patch_type: "merge" (RFC 7386), "json" (RFC 6902 list) or "strategic"."""
        result: dict[str, Any] = await self.request(
            "PATCH", resource.path(namespace, name, subresource),
            _query(dryRun="All" if dry_run else None, fieldManager=field_manager),
            body=patch, content_type=PATCH_TYPES[patch_type])
        return result

    async def delete(self, resource: Resource, name: str, namespace: str | None = None, *,
                     propagation_policy: str | None = None,
                     preconditions: Mapping[str, str] | None = None,
                     dry_run: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation_policy:
            body["propagationPolicy"] = propagation_policy
        if preconditions:
            body["preconditions"] = dict(preconditions)
        if dry_run:
            body["dryRun"] = ["All"]
        result: dict[str, Any] = await self.request(
            "DELETE", resource.path(namespace, name), body=body)
        return result

    async def create_subresource(self, resource: Resource, name: str, subresource: str,
                                 body: Mapping[str, Any],
                                 namespace: str | None = None) -> dict[str, Any]:
        """POST to a subresource, e.g. pods/binding."""
        result: dict[str, Any] = await self.request(
            "POST", resource.path(namespace, name, subresource), body=dict(body))
        return result

    async def bind(self, namespace: str, pod: str, node: str, *, uid: str | None = None,
                   annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Binding of a pod to a node, as a scheduler does (409 if already bound)."""
        meta: dict[str, Any] = {"name": pod, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if annotations:
            meta["annotations"] = dict(annotations)
        return await self.create_subresource(PODS, pod, "binding", {
            "apiVersion": "v1", "kind": "Binding", "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}, namespace)

    async def watch(self, resource: Resource, namespace: str | None = None, *,
                    resource_version: str | None = None, label_selector: str | None = None,
                    field_selector: str | None = None, timeout_seconds: int | None = None,
                    allow_bookmarks: bool = True, send_initial_events: bool = False
                    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(type, object) for ADDED / MODIFIED / DELETED / BOOKMARK until the server ends the
        stream; an ERROR event raises ApiError (410 Gone: the resourceVersion is too old).
        `send_initial_events`: a streaming list (WatchList): the current objects as ADDED, then
        a BOOKMARK annotated `k8s.io/initial-events-end`, then changes.
        Leaving early? Close it (`contextlib.aclosing`) so the connection goes at once."""
        streaming = {"sendInitialEvents": True, "resourceVersionMatch": "NotOlderThan"} \
            if send_initial_events else {}
        query = _query(watch=True, resourceVersion=resource_version,
                       labelSelector=label_selector, fieldSelector=field_selector,
                       timeoutSeconds=timeout_seconds,
                       allowWatchBookmarks=allow_bookmarks or send_initial_events, **streaming)
        resp = await self._open("GET", resource.path(namespace), query)
        try:
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n" in buf:
                    line, _, buf = buf.partition(b"\n")
                    if line.strip():
                        yield _event(line)
            if buf.strip():
                yield _event(buf)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(0, "ConnectionError", f"watch {resource.plural}: {_said(exc)}") from exc
        finally:
            resp.release()


def _event(line: bytes) -> tuple[str, dict[str, Any]]:
    try:
        ev = json.loads(line)
    except ValueError as exc:
        raise ApiError(0, "InvalidWatchEvent", f"undecodable watch line: {line[:200]!r}") \
            from exc
    obj = ev.get("object") or {}
    if ev.get("type") == "ERROR":
        raise ApiError(int(obj.get("code") or 500), str(obj.get("reason") or ""),
                       str(obj.get("message") or ""), obj)
    return str(ev.get("type")), obj


def object_key(obj: Mapping[str, Any]) -> str:
    """"namespace/name" or "name" for cluster-scoped objects: the informer store's key."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def label_selector(labels: Mapping[str, str] | Sequence[str]) -> str:
    """{"a": "b"} → "a=b"; ["a", "!b"] kept as written."""
    if isinstance(labels, Mapping):
        return ",".join(f"{k}={v}" for k, v in labels.items())
    return ",".join(labels)
