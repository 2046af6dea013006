"""`ApiServerEmulator`: the Kubernetes REST API over real HTTP (aiohttp), on the store."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime as dt
import json
import logging
import ssl
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from aiohttp import web

from webhook.yamlpos import SafeLoader

from . import defaults, errors, eviction, shapes
from .admission import (
    DEFAULT_USER,
    AdmissionChain,
    Attributes,
    WebhookCall,
    configuration_errors,
)
from .affinity import merge_label_keys
from .errors import ApiStatusError
from .patch import apply_patch_body
from .protobuf import ProtobufError, decode_body
from .resources import (
    CRDS,
    DEPRECATED,
    LABEL_NAMED,
    MUTATING,
    NAMESPACES,
    PODS,
    PRIORITY_CLASSES,
    RETURNS_DELETED_OBJECT,
    VALIDATING,
    Registry,
    ResourceType,
    types_from_crd,
)
from .resources import (
    workload_api as workload_api_types,
)
from .schema import validate_custom
from .selectors import Selector
from .store import Store, Stored, Watcher, dumps

log = logging.getLogger(__name__)

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_NO_GENERATION = frozenset({("", "namespaces"), ("", "configmaps"), ("", "secrets"),
                            ("", "serviceaccounts"), ("", "events"), ("events.k8s.io", "events"),
                            ("coordination.k8s.io", "leases"), ("", "nodes"), ("", "services"),
                            ("rbac.authorization.k8s.io", "roles"),
                            ("rbac.authorization.k8s.io", "rolebindings"),
                            ("rbac.authorization.k8s.io", "clusterroles"),
                            ("rbac.authorization.k8s.io", "clusterrolebindings"),
                            ("scheduling.k8s.io", "priorityclasses")})
#: pod spec fields an update may change (validation.ValidatePodUpdate)
_UPDATE_RETRIES = 5
_POD_MUTABLE_SPEC = ("activeDeadlineSeconds", "tolerations", "schedulingGates")
#: what it emulates: the newest release the real tier runs (e2e/node/versions.py)
VERSION_INFO = {"major": "1", "minor": "37", "gitVersion": "v1.37.2-muster-emulator",
                "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.26", "compiler": "gc", "platform": "linux/amd64"}
#: PriorityClasses every cluster has (the apiserver creates them at start)
_SYSTEM_PRIORITIES = {"system-cluster-critical": 2000000000, "system-node-critical": 2000001000}


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _warn(response: web.StreamResponse, text: str) -> None:
    # RFC 7234 warn-text is a quoted-string, escaped as the apiserver's NewWarningHeader
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    response.headers.add("Warning", f'299 - "{quoted}"')


def _json(body: Any, status: int = 200, warnings: Iterable[str] = ()) -> web.Response:
    raw = body if isinstance(body, bytes) else dumps(body)
    resp = web.Response(body=raw, status=status, content_type="application/json")
    for w in warnings:
        _warn(resp, w)
    return resp


async def _deprecation_warning(request: web.Request, response: web.StreamResponse) -> None:
    """A deprecated API's warning on every answer about it, as kube-apiserver adds it."""
    m = request.match_info
    text = DEPRECATED.get((m.get("group", ""), m.get("version", ""), m.get("resource", "")))
    if text is not None:
        _warn(response, text)


def _watch_list(q: Mapping[str, str]) -> bool:
    """Is this watch a streaming list (sendInitialEvents=true)? Refuses the combinations
    kube-apiserver's ValidateListOptions refuses for a watch."""
    initial, match = q.get("sendInitialEvents"), q.get("resourceVersionMatch")
    causes = []
    if initial is not None and match != "NotOlderThan":
        causes.append(("resourceVersionMatch", "FieldValueForbidden",
                       "Forbidden: sendInitialEvents requires setting resourceVersionMatch to "
                       "NotOlderThan"))
    if match:
        if initial is None:
            causes.append(("resourceVersionMatch", "FieldValueForbidden",
                           "Forbidden: resourceVersionMatch is forbidden for watch unless "
                           "sendInitialEvents is provided"))
        if match != "NotOlderThan":
            causes.append(("resourceVersionMatch", "FieldValueNotSupported",
                           f'Unsupported value: "{match}": supported values: "NotOlderThan"'))
    if initial is not None and not _truthy(q.get("allowWatchBookmarks")):
        causes.append(("allowWatchBookmarks", "FieldValueForbidden",
                       "Forbidden: sendInitialEvents requires setting allowWatchBookmarks to "
                       "true"))
    if causes:
        raise errors.invalid("meta.k8s.io", "ListOptions", "", causes)
    return _truthy(initial)


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _as_status(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error as the apiserver answers it: a Status object (a path no route has is the
    apiserver's 404 "the server could not find the requested resource")."""
    try:
        return await handler(request)
    except ApiStatusError as exc:
        return _json(exc.to_status(), exc.code)
    except web.HTTPNotFound:
        err = errors.server_not_found()
        return _json(err.to_status(), err.code)
    except web.HTTPMethodNotAllowed:
        err = errors.method_not_allowed()
        return _json(err.to_status(), err.code)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.exception("emulator request failed", extra={"path": request.path})
        return _json(errors.internal(repr(exc)).to_status(), 500)


def _found(doc: Any) -> web.Response:
    """A discovery document, or the apiserver's 404 when the group or version is unknown."""
    if doc is None:
        raise errors.server_not_found()
    return _json(doc)


@dataclass(frozen=True, slots=True)
class _Target:
    """What a resource path names."""

    rt: ResourceType
    ns: str
    name: str
    sub: str


def _spec_like(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Everything but metadata and status: what a generation bump tracks."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


class ApiServerEmulator:
    """An in-process Kubernetes API server for tests, e2e and the demo.

    `async with ApiServerEmulator() as api:` → `api.url`, `api.write_kubeconfig(path)`,
    `api.get/objects/create/...` (same store and same code path as HTTP requests).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 ssl_context: ssl.SSLContext | None = None, ca_pem: bytes | None = None,
                 crds: Iterable[dict[str, Any]] = (),
                 service_hosts: Mapping[tuple[str, str], str] | None = None,
                 history: int = 10_000, watch_buffer: int = 20_000,
                 bookmark_interval: float = 5.0,
                 user: Mapping[str, Any] | None = None,
                 workload_api: str | None = None) -> None:
        self.host = host
        self.port = port
        self._ssl = ssl_context
        self._ca_pem = ca_pem
        self.registry = Registry()
        if workload_api is not None:  # as with feature gate GenericWorkload on (see resources)
            for rt in workload_api_types(workload_api):
                self.registry.add(rt)
        self.store = Store(history=history, watch_buffer=watch_buffer)
        self.bookmark_interval = bookmark_interval
        self.user = dict(user or DEFAULT_USER)
        self.admission = AdmissionChain(self._webhook_configurations, self._namespace_labels,
                                        service_hosts)
        self._runner: web.AppRunner | None = None
        for ns in DEFAULT_NAMESPACES:
            self._seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for crd in crds:
            self._seed(crd)

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application(client_max_size=16 * 1024 * 1024, middlewares=[_as_status])
        app.on_response_prepare.append(_deprecation_warning)
        for path, handler in self._routes():
            # a trailing slash is the same path (client-go asks for /apis/)
            app.router.add_route("*", path + "{slash:/?}", handler)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                                     shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self._ssl)
        await site.start()
        if self.port == 0:
            self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        self.store.close_watchers()
        await self.admission.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ApiServerEmulator:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"{'https' if self._ssl else 'http'}://{self.host}:{self.port}"

    @property
    def webhook_calls(self) -> list[WebhookCall]:
        return self.admission.calls

    @property
    def service_hosts(self) -> dict[tuple[str, str], str]:
        """(namespace, service name) → "host:port" used for clientConfig.service webhooks."""
        return self.admission.service_hosts

    def kubeconfig(self, namespace: str = "default") -> dict[str, Any]:
        cluster: dict[str, Any] = {"server": self.url}
        if self._ca_pem:
            cluster["certificate-authority-data"] = base64.b64encode(self._ca_pem).decode()
        return {"apiVersion": "v1", "kind": "Config",
                "clusters": [{"name": "muster-emulator", "cluster": cluster}],
                "users": [{"name": "admin", "user": {"token": "muster-emulator-admin"}}],
                "contexts": [{"name": "muster-emulator", "context": {
                    "cluster": "muster-emulator", "user": "admin", "namespace": namespace}}],
                "current-context": "muster-emulator"}

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        path = Path(path)
        path.write_text(yaml.safe_dump(self.kubeconfig(namespace), sort_keys=False))
        return path

    # --- in-process helpers -------------------------------------------------------------------

    def resource(self, ref: str | ResourceType) -> ResourceType:
        """"pods", "podgroups.scheduling.volcano.sh", "PodGroup" or a ResourceType."""
        if isinstance(ref, ResourceType):
            return ref
        plural, _, group = ref.partition(".")
        found = [rt for rt in self.registry.all()
                 if (rt.plural == plural and rt.group == group)
                 or (rt.kind == ref) or (rt.plural == plural and not group)]
        if not found:
            raise KeyError(f"unknown resource {ref!r}")
        found.sort(key=lambda rt: (rt.group != group, rt.group != "", rt.group))
        return found[0]

    def get(self, ref: str | ResourceType, name: str,
            namespace: str | None = None) -> dict[str, Any] | None:
        """A copy of the stored object, or None."""
        rt = self.resource(ref)
        st = self.store.get(rt.key, namespace or "" if rt.namespaced else "", name)
        return None if st is None else json.loads(st.raw)

    def objects(self, ref: str | ResourceType, namespace: str | None = None,
                label_selector: str | None = None,
                field_selector: str | None = None) -> list[dict[str, Any]]:
        rt = self.resource(ref)
        sel = Selector(rt.group, rt.plural, label_selector, field_selector)
        return [json.loads(st.raw) for st in self.store.items(rt.key, namespace, sel)]

    async def create(self, ref: str | ResourceType, obj: dict[str, Any],
                     namespace: str | None = None, dry_run: bool = False) -> dict[str, Any]:
        """Create through the same path as POST (admission webhooks included)."""
        rt = self.resource(ref)
        ns = namespace or (obj.get("metadata") or {}).get("namespace") or "default"
        created, _ = await self._create(rt, ns if rt.namespaced else "", copy.deepcopy(obj),
                                        dry_run=dry_run, query={}, user=self.user)
        return copy.deepcopy(created)

    async def delete(self, ref: str | ResourceType, name: str,
                     namespace: str | None = None) -> None:
        rt = self.resource(ref)
        await self._delete(rt, namespace or "" if rt.namespaced else "", name, query={},
                           opts={}, user=self.user)

    def seed(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object directly (no admission, no defaulting, no validation): for fixtures
        and `--seed` files. CRDs become served at once. Returns a copy of what was stored."""
        return copy.deepcopy(self._seed(obj))

    def _seed(self, obj: dict[str, Any]) -> dict[str, Any]:
        rt = self.registry.by_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
        if rt is None:
            raise KeyError(f"unknown kind {obj.get('apiVersion')}/{obj.get('kind')}")
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if rt.namespaced:
            meta.setdefault("namespace", "default")
        else:
            meta.pop("namespace", None)
        if rt.key == NAMESPACES.key:
            defaults.default_namespace(obj)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = defaults.generated_name(meta["generateName"])
        self._finish_create(rt, obj)
        existing = self.store.get(rt.key, meta.get("namespace", ""), meta["name"])
        if existing is not None:
            meta["uid"] = existing.obj["metadata"]["uid"]
        return self._persist(rt, obj)

    def load_yaml(self, path: str | Path) -> list[dict[str, Any]]:
        """Seed every document of a YAML file (CRDs, nodes, namespaces...)."""
        docs = [d for d in yaml.load_all(Path(path).read_text(), Loader=SafeLoader) if d]
        return [copy.deepcopy(self._seed(d)) for d in docs]

    # --- store access used by admission ---------------------------------------------------------

    def _webhook_configurations(self, kind: str) -> list[dict[str, Any]]:
        rt = MUTATING if kind == "mutating" else VALIDATING
        return [st.obj for st in self.store.items(rt.key)]

    def _namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        st = self.store.get(NAMESPACES.key, "", namespace)
        return None if st is None else st.obj["metadata"].get("labels") or {}

    # --- HTTP ---------------------------------------------------------------------------------

    def _routes(self) -> list[tuple[str, Handler]]:
        """The API server's paths: discovery, then each resource path under /api/{version} and
        /apis/{group}/{version}, with and without /watch. A namespaced path is tried first; its
        resource is never `status` or `finalize`, which are a Namespace's subresources."""
        routes: list[tuple[str, Handler]] = [
            ("/version", self._version), ("/healthz", self._ok), ("/readyz", self._ok),
            ("/livez", self._ok), ("/api", self._api_versions), ("/apis", self._group_list),
            ("/openapi/v3", self._openapi_root),
            ("/openapi/v3/api/{version}", self._openapi),
            ("/openapi/v3/apis/{group}/{version}", self._openapi),
            ("/api/{version}", self._resource_list), ("/apis/{group}", self._api_group),
            ("/apis/{group}/{version}", self._resource_list)]
        namespaced = "/namespaces/{namespace}/{resource:(?!status$|finalize$)[^/]+}"
        for prefix in ("/api/{version}", "/apis/{group}/{version}"):
            for watch, handler in (("", self._resource), ("/watch", self._watch_path)):
                for base in (namespaced, "/{resource}"):
                    for tail in ("", "/{name}", "/{name}/{subresource}"):
                        routes.append((prefix + watch + base + tail, handler))
        return routes

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        if request.content_type == "application/vnd.kubernetes.protobuf":
            try:
                return decode_body(raw)
            except ProtobufError as exc:
                raise errors.ApiStatusError(
                    415, "UnsupportedMediaType", f"the body of the request was in an unknown "
                    f"format - accepted media types include: application/json, "
                    f"application/yaml (protobuf: {exc})") from exc
        if "protobuf" in request.content_type or "cbor" in request.content_type:
            raise errors.ApiStatusError(
                415, "UnsupportedMediaType", f'the body of the request was in an unknown format '
                f'- accepted media types include: application/json, application/yaml (the '
                f'emulator does not decode "{request.content_type}")')
        try:
            if request.content_type in ("application/yaml", "application/apply-patch+yaml"):
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise errors.bad_request(f"error decoding request body: {exc}") from exc

    # --- discovery ----------------------------------------------------------------------------

    async def _version(self, _request: web.Request) -> web.Response:
        return _json(VERSION_INFO)

    async def _ok(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _api_versions(self, _request: web.Request) -> web.Response:
        return _json(self.registry.api_versions())

    async def _group_list(self, _request: web.Request) -> web.Response:
        return _json(self.registry.api_group_list())

    async def _openapi_root(self, _request: web.Request) -> web.Response:
        return _json(self.registry.openapi_v3_root())

    async def _openapi(self, request: web.Request) -> web.Response:
        m = request.match_info
        return _found(self.registry.openapi_v3(m.get("group", ""), m["version"]))

    async def _resource_list(self, request: web.Request) -> web.Response:
        m = request.match_info
        return _found(self.registry.resource_list(m.get("group", ""), m["version"]))

    async def _api_group(self, request: web.Request) -> web.Response:
        return _found(self.registry.api_group(request.match_info["group"]))

    # --- resources ----------------------------------------------------------------------------

    async def _watch_path(self, request: web.Request) -> web.StreamResponse:
        """/watch/...: only GET, and always a watch."""
        return await self._resource(request, watch=True)

    async def _resource(self, request: web.Request, watch: bool = False
                        ) -> web.StreamResponse:
        t = self._target(request)
        method, q = request.method, request.query
        dry_run = q.get("dryRun") == "All"
        if "dryRun" in q and not dry_run:
            verb = {"POST": "Create", "PUT": "Update", "PATCH": "Patch",
                    "DELETE": "Delete"}.get(method, "Get")
            raise errors.invalid("meta.k8s.io", f"{verb}Options", "", [(
                "dryRun", "FieldValueNotSupported",
                f'Unsupported value: []string{{"{q["dryRun"]}"}}: supported values: "All"')])
        if t.sub == "binding" and method != "POST":
            raise errors.method_not_allowed()
        if method == "GET":
            if watch or _truthy(q.get("watch")):
                return await self._watch(request, t.rt, t.ns, t.name)
            if t.name:
                return _json(self._get(t.rt, t.ns, t.name).raw)
            return self._list(request, t.rt, t.ns)
        body = await self._body(request) if method in ("POST", "PUT", "PATCH", "DELETE") else None
        if method == "POST":
            return await self._post(t, body, dry_run, dict(q))
        if method in ("PUT", "PATCH") and t.name:
            return await self._write(request, t, body, dry_run)
        if method == "DELETE":
            return await self._delete_request(t, body, dict(q))
        raise errors.method_not_allowed()

    def _target(self, request: web.Request) -> _Target:
        """The resource type, namespace, name and subresource a path names (404 if none)."""
        m = request.match_info
        ns, name, sub = m.get("namespace", ""), m.get("name", ""), m.get("subresource", "")
        rt = self.registry.lookup(m.get("group", ""), m["version"], m["resource"])
        if rt is None or (ns and not rt.namespaced) or (sub and sub not in rt.subresources) \
                or (rt.namespaced and name and not ns):
            raise errors.server_not_found()
        return _Target(rt, ns, name, sub)

    async def _post(self, t: _Target, body: Any, dry_run: bool, query: dict[str, str]
                    ) -> web.Response:
        if not t.name:
            if not isinstance(body, dict):
                raise errors.bad_request("the request body must be a JSON object")
            created, warnings = await self._create(t.rt, t.ns, body, dry_run=dry_run,
                                                   query=query, user=self.user)
            return _json(created, 201, warnings)
        if t.sub == "binding":
            status, warnings = await self._bind(t.ns, t.name, body, dry_run, self.user)
            return _json(status, 201, warnings)
        if t.sub == "eviction":
            return _json(await self._evict(t.ns, t.name, body, dry_run), 201)
        raise errors.method_not_allowed()

    async def _evict(self, ns: str, name: str, body: Any, dry_run: bool) -> dict[str, Any]:
        """POST pods/NAME/eviction (`eviction`)."""
        pod = self._get(PODS, ns, name).obj
        pdbs = self.registry.lookup("policy", "v1", "poddisruptionbudgets")
        assert pdbs is not None
        budgets = eviction.covering(pod, (st.obj for st in self.store.items(pdbs.key, ns)))
        if not eviction.ignores_budgets(pod):
            blocking = eviction.forbidding(budgets)
            if blocking is not None:
                raise eviction.refused(blocking)
        opts = (body.get("deleteOptions") if isinstance(body, dict) else None) or {}
        if not dry_run:
            for budget in budgets:
                changed = copy.deepcopy(budget)
                status = changed.setdefault("status", {})
                status["disruptionsAllowed"] = max(0, int(status.get("disruptionsAllowed")
                                                           or 0) - 1)
                self._persist(pdbs, changed)
            await self._delete(PODS, ns, name, query={}, opts=opts, user=self.user)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "code": 201}

    async def _write(self, request: web.Request, t: _Target, body: Any, dry_run: bool
                     ) -> web.Response:
        """PUT or PATCH, as GuaranteedUpdate: a write that raced with ours during admission is
        retried (re-applying a patch to the new state), unless a resourceVersion was given."""
        rt, ns, name = t.rt, t.ns, t.name
        for _ in range(_UPDATE_RETRIES):
            if request.method == "PUT":
                if not isinstance(body, dict):
                    raise errors.bad_request("the request body must be a JSON object")
                new = copy.deepcopy(body)
                pinned = bool((body.get("metadata") or {}).get("resourceVersion"))
            else:
                current = self._get(rt, ns, name).obj
                # on a copy: stored objects are never changed in place
                new = apply_patch_body(request.headers.get("Content-Type", ""),
                                       copy.deepcopy(current), body,
                                       custom=rt.schema is not None)
                if not isinstance(new, dict):
                    raise errors.bad_request("the patch result is not an object")
                pinned = (new.get("metadata") or {}).get("resourceVersion") != \
                    current["metadata"]["resourceVersion"]
            try:
                obj, warnings = await self._update(
                    rt, ns, name, sub=t.sub, body=new, dry_run=dry_run,
                    query=dict(request.query), user=self.user,
                    patch=request.method == "PATCH")
                return _json(obj, 200, warnings)
            except _Changed:
                if pinned:
                    raise errors.conflict(rt.group, rt.plural, name) from None
        raise errors.conflict(rt.group, rt.plural, name)

    async def _delete_request(self, t: _Target, body: Any, query: dict[str, str]) -> web.Response:
        """DELETE of one object, or of the collection (with its selectors)."""
        rt = t.rt
        if t.name and not t.sub:
            opts = body if isinstance(body, dict) else {}
            result, warnings = await self._delete(rt, t.ns, t.name, query=query, opts=opts,
                                                  user=self.user)
            return _json(result, 200, warnings)
        if t.name:
            raise errors.method_not_allowed()
        sel = Selector(rt.group, rt.plural, query.get("labelSelector"),
                       query.get("fieldSelector"))
        items = []
        for st in list(self.store.items(rt.key, t.ns or None, sel)):
            meta = st.obj["metadata"]
            await self._delete(rt, meta.get("namespace", ""), meta["name"], query=query,
                               opts={}, user=self.user)
            items.append(st.obj)
        return _json({"kind": rt.list_kind, "apiVersion": rt.api_version,
                      "metadata": {"resourceVersion": str(self.store.rv)}, "items": items})

    # --- reads --------------------------------------------------------------------------------

    def _get(self, rt: ResourceType, ns: str, name: str) -> Stored:
        st = self.store.get(rt.key, ns, name)
        if st is None:
            raise errors.not_found(rt.group, rt.plural, name)
        return st

    def _list(self, request: web.Request, rt: ResourceType, ns: str) -> web.Response:
        q = request.query
        sel = Selector(rt.group, rt.plural, q.get("labelSelector"), q.get("fieldSelector"))
        items = list(self.store.items(rt.key, ns or None, sel))
        meta: dict[str, Any] = {"resourceVersion": str(self.store.rv)}
        start = 0
        if q.get("continue"):
            try:
                token = json.loads(base64.urlsafe_b64decode(q["continue"]))
                after = (token["ns"], token["name"])
                meta["resourceVersion"] = token["rv"]
            except (ValueError, KeyError, TypeError) as exc:
                raise errors.bad_request("continue key is not valid") from exc
            keys = [(st.obj["metadata"].get("namespace", ""), st.obj["metadata"]["name"])
                    for st in items]
            start = next((i for i, k in enumerate(keys) if k > after), len(items))
        limit = int(q.get("limit") or 0)
        page = items[start:start + limit] if limit > 0 else items[start:]
        if limit > 0 and start + limit < len(items):
            last = page[-1].obj["metadata"]
            meta["continue"] = base64.urlsafe_b64encode(dumps(
                {"rv": meta["resourceVersion"], "ns": last.get("namespace", ""),
                 "name": last["name"]})).decode()
            meta["remainingItemCount"] = len(items) - start - limit
        if "as=Table" in request.headers.get("Accept", ""):
            return _json(self._table(rt, [st.obj for st in page], meta))
        head = dumps({"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": meta})
        body = head[:-1] + b',"items":[' + b",".join(st.raw for st in page) + b"]}"
        return _json(body)

    def _table(self, rt: ResourceType, objs: list[dict[str, Any]],
               meta: dict[str, Any]) -> dict[str, Any]:
        """meta.k8s.io/v1 Table, as `kubectl get` asks for: name, printer columns, age."""
        cols: list[dict[str, Any]] = [{"name": "Name", "type": "string", "format": "name",
                                       "description": "Name", "priority": 0}]
        paths: list[list[str]] = []
        for pc in rt.printer_columns:
            if pc.get("jsonPath") == ".metadata.creationTimestamp":
                continue
            cols.append({"name": pc["name"], "type": pc.get("type", "string"), "format": "",
                         "description": pc.get("description", ""),
                         "priority": pc.get("priority", 0)})
            paths.append(pc["jsonPath"].lstrip(".").split("."))
        if rt.key == PODS.key:
            cols += [{"name": "Status", "type": "string", "format": "", "description": "",
                      "priority": 0},
                     {"name": "Node", "type": "string", "format": "", "description": "",
                      "priority": 0}]
            paths += [["status", "phase"], ["spec", "nodeName"]]
        cols.append({"name": "Age", "type": "string", "format": "",
                     "description": "time since creation", "priority": 0})
        rows = []
        for obj in objs:
            cells: list[Any] = [obj["metadata"]["name"]]
            for path in paths:
                cur: Any = obj
                for k in path:
                    cur = cur.get(k) if isinstance(cur, dict) else None
                cells.append(cur if cur is not None else "<none>")
            cells.append(_age(obj["metadata"].get("creationTimestamp")))
            rows.append({"cells": cells, "object": {
                "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"]}})
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
                "columnDefinitions": cols, "rows": rows}

    async def _watch(self, request: web.Request, rt: ResourceType, ns: str,
                     name: str) -> web.StreamResponse:
        q = request.query
        field_sel = q.get("fieldSelector")
        if name:
            field_sel = f"metadata.name={name}" + (f",{field_sel}" if field_sel else "")
        sel = Selector(rt.group, rt.plural, q.get("labelSelector"), field_sel)
        rv_param = q.get("resourceVersion") or ""
        try:
            since = None if rv_param in ("", "0") else int(rv_param)
        except ValueError as exc:
            raise errors.bad_request(f"invalid resource version: {rv_param}") from exc
        timeout = float(q.get("timeoutSeconds") or 1800)
        bookmarks = _truthy(q.get("allowWatchBookmarks"))
        streaming = _watch_list(q)
        if streaming:
            since = None  # NotOlderThan: the current state is never older than asked
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        try:
            watcher, first = self.store.watch(rt, ns or None, sel, since)
        except ApiStatusError as exc:
            # kube-apiserver answers 200 and sends the 410 as an ERROR event
            await resp.prepare(request)
            await resp.write(dumps({"type": "ERROR", "object": exc.to_status()}) + b"\n")
            await resp.write_eof()
            return resp
        try:
            await resp.prepare(request)
            if first:
                await resp.write(b"".join(first))
            if streaming:
                await resp.write(dumps({"type": "BOOKMARK", "object": {
                    "kind": rt.kind, "apiVersion": rt.api_version, "metadata": {
                        "resourceVersion": str(self.store.rv),
                        "annotations": {"k8s.io/initial-events-end": "true"}}}}) + b"\n")
            await self._pump(resp, rt, watcher, timeout, bookmarks)
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            self.store.unwatch(rt, watcher)
        return resp

    async def _pump(self, resp: web.StreamResponse, rt: ResourceType, watcher: Watcher,
                    duration: float, bookmarks: bool) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + duration
        next_bookmark = loop.time() + self.bookmark_interval
        while not watcher.closed:
            now = loop.time()
            if now >= deadline:
                break
            wait = min(deadline, next_bookmark if bookmarks else deadline) - now
            with contextlib.suppress(TimeoutError):  # asyncio.timeout keeps a cancel (3.11)
                async with asyncio.timeout(max(wait, 0.0)):
                    await watcher.wake.wait()
            watcher.wake.clear()
            if watcher.buf:
                chunk = b"".join(watcher.buf)
                watcher.buf.clear()
                await resp.write(chunk)
            if watcher.failed is not None:
                await resp.write(watcher.failed)
                break
            if bookmarks and loop.time() >= next_bookmark:
                next_bookmark = loop.time() + self.bookmark_interval
                await resp.write(dumps({"type": "BOOKMARK", "object": {
                    "kind": rt.kind, "apiVersion": rt.api_version,
                    "metadata": {"resourceVersion": str(self.store.rv)}}}) + b"\n")
        if watcher.buf and watcher.failed is None:  # closed: what was queued still goes out
            await resp.write(b"".join(watcher.buf))
        await resp.write_eof()

    # --- writes -------------------------------------------------------------------------------

    def _options(self, kind: str, query: Mapping[str, str], dry_run: bool) -> dict[str, Any]:
        opts: dict[str, Any] = {"kind": kind, "apiVersion": "meta.k8s.io/v1"}
        if dry_run:
            opts["dryRun"] = ["All"]
        for key in ("fieldManager", "fieldValidation"):
            if query.get(key):
                opts[key] = query[key]
        return opts

    def _check_namespace(self, rt: ResourceType, ns: str) -> None:
        if rt.namespaced and self.store.get(NAMESPACES.key, "", ns) is None:
            raise errors.not_found("", "namespaces", ns)

    def _check_kind(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        shapes.check_decodable(rt, obj)
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if kind and kind != rt.kind:
            raise errors.bad_request(f"the kind in the data ({kind}) does not match the "
                                     f"expected kind ({rt.kind})")
        if api_version and api_version != rt.api_version:
            raise errors.bad_request(f"the API version in the data ({api_version}) does not "
                                     f"match the expected API version ({rt.api_version})")
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind

    async def _create(self, rt: ResourceType, ns: str, obj: dict[str, Any], *, dry_run: bool,
                      query: Mapping[str, str], user: Mapping[str, Any]
                      ) -> tuple[dict[str, Any], list[str]]:
        self._check_kind(rt, obj)
        meta = obj["metadata"]
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise errors.bad_request("the namespace of the provided object does not match "
                                         "the namespace sent on the request")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        self._check_namespace(rt, ns)
        for key in ("uid", "resourceVersion", "generation", "deletionTimestamp",
                    "deletionGracePeriodSeconds"):
            meta.pop(key, None)
        meta["creationTimestamp"] = None
        if rt.key == PODS.key:
            shapes.check_pod_decodable(obj)
            defaults.default_pod(obj)
            self._resolve_priority(obj)
        elif rt.key == NAMESPACES.key:
            defaults.default_namespace(obj)
        warnings: list[str] = []
        attrs = Attributes("CREATE", rt, ns, meta.get("name") or "", old_object=None,
                           dry_run=dry_run,
                           options=self._options("CreateOptions", query, dry_run), user=user)
        mutated = await self.admission.mutate(attrs, obj, warnings)
        obj = mutated if mutated is not None else obj
        meta = obj.setdefault("metadata", {})
        if rt.key == PODS.key:
            merge_label_keys(obj)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise errors.invalid(rt.group, rt.kind, "", [(
                    "metadata.name", "FieldValueRequired",
                    "Required value: name or generateName is required")])
            meta["name"] = defaults.generated_name(meta["generateName"])
        self._validate(rt, obj, query, warnings)
        self._finish_create(rt, obj)
        if self.store.get(rt.key, ns, meta["name"]) is not None:
            raise errors.already_exists(rt.group, rt.plural, meta["name"])
        await self.admission.validate(attrs, obj, warnings)
        if self.store.get(rt.key, ns, meta["name"]) is not None:
            raise errors.already_exists(rt.group, rt.plural, meta["name"])
        if dry_run:
            return obj, warnings
        return self._persist(rt, obj), warnings

    def _finish_create(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """rest.BeforeCreate: identity, timestamps, generation, initial status."""
        meta = obj["metadata"]
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        if rt.key not in _NO_GENERATION:
            meta["generation"] = 1
        if rt.key == PODS.key:
            defaults.pod_status_on_create(obj)
        elif rt.key == NAMESPACES.key:
            defaults.default_namespace(obj)
        elif rt.key == CRDS.key:
            names = obj["spec"]["names"]
            obj["status"] = {"acceptedNames": dict(names), "storedVersions": [
                v["name"] for v in obj["spec"].get("versions", []) if v.get("storage")],
                "conditions": [
                    {"type": t, "status": "True", "lastTransitionTime": meta["creationTimestamp"],
                     "reason": r, "message": m} for t, r, m in (
                        ("NamesAccepted", "NoConflicts", "no conflicts found"),
                        ("Established", "InitialNamesAccepted",
                         "the initial names have been accepted"))]}

    def _validate(self, rt: ResourceType, obj: dict[str, Any], query: Mapping[str, str],
                  warnings: list[str]) -> None:
        """Name, CRD schema (pruning unknown fields: an error under fieldValidation=Strict, a
        warning under Warn, the default), and that a CRD is well formed."""
        shapes.check_decodable(rt, obj)  # again: a webhook's patch may have broken it
        name = obj["metadata"].get("name", "")  # a string: check_decodable
        causes = shapes.meta_errors(obj, name_is_label=rt.key in LABEL_NAMED)
        if rt.key == PODS.key:  # ValidatePodCreate: the metadata's causes, then the spec's
            causes += shapes.pod_errors(obj)
        if causes:
            raise errors.invalid(rt.group, rt.kind, name, causes)
        if rt.schema is not None:
            unknown = validate_custom(rt, obj)
            mode = query.get("fieldValidation", "Warn")
            if unknown and mode == "Strict":
                raise errors.bad_request(
                    f"{rt.kind} in version \"{rt.version}\" cannot be handled as a {rt.kind}: "
                    "strict decoding error: "
                    + ", ".join(f'unknown field "{u}"' for u in unknown))
            if mode == "Warn":
                warnings.extend(f'unknown field "{u}"' for u in unknown)
        if rt.key in (MUTATING.key, VALIDATING.key):
            causes += configuration_errors(obj, rt.key == MUTATING.key)
            if causes:
                raise errors.invalid(rt.group, rt.kind, name, causes)
        if rt.key == CRDS.key:
            try:
                types_from_crd(obj)
            except (KeyError, TypeError, AttributeError) as exc:
                raise errors.invalid(rt.group, rt.kind, name, [(
                    "spec", "FieldValueRequired", f"Required value: {exc}")]) from exc

    def _persist(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        rv = self.store.next_rv()
        obj["metadata"]["resourceVersion"] = str(rv)
        self.store.put(rt.key, obj, rv)
        if rt.key == CRDS.key:
            self.registry.set_crd(obj["metadata"]["name"], types_from_crd(obj))
        return obj

    async def _update(self, rt: ResourceType, ns: str, name: str, *, sub: str,
                      body: dict[str, Any], dry_run: bool, query: Mapping[str, str],
                      user: Mapping[str, Any], patch: bool = False
                      ) -> tuple[dict[str, Any], list[str]]:
        current = self._get(rt, ns, name).obj
        self._check_kind(rt, body)
        meta = body.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise errors.bad_request(f"the name of the object ({meta.get('name')}) does not "
                                     f"match the name on the URL ({name})")
        if rt.namespaced and meta.get("namespace", ns) != ns:
            raise errors.bad_request("the namespace of the provided object does not match the "
                                     "namespace sent on the request")
        cur_meta = current["metadata"]
        rv = meta.get("resourceVersion")
        if rv and rv != cur_meta["resourceVersion"]:
            raise errors.conflict(rt.group, rt.plural, name)
        if not rv and rt.schema is not None and not patch:
            raise errors.invalid(rt.group, rt.kind, name, [(
                "metadata.resourceVersion", "FieldValueInvalid",
                "Invalid value: 0x0: must be specified for an update")])
        if meta.get("uid") and meta["uid"] != cur_meta["uid"]:
            # a write meant for an earlier object of the same name, status included
            raise errors.invalid(rt.group, rt.kind, name, [(
                "metadata.uid", "FieldValueInvalid",
                f'Invalid value: "{meta["uid"]}": field is immutable')])
        new = body
        if sub == "status":
            new = copy.deepcopy(current)
            if "status" in body:
                new["status"] = body["status"]
            else:
                new.pop("status", None)
        elif "status" in rt.subresources:
            new = dict(body)
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)
        new_meta = new.setdefault("metadata", {})
        for key in ("uid", "creationTimestamp", "namespace", "deletionTimestamp",
                    "deletionGracePeriodSeconds", "generateName", "generation",
                    "resourceVersion"):
            if key in cur_meta:
                new_meta[key] = cur_meta[key]
            else:
                new_meta.pop(key, None)
        new_meta["name"] = name
        if rt.key == PODS.key and sub != "status":
            _check_pod_update(current, new)
        if rt.key == NAMESPACES.key:
            defaults.default_namespace(new)
        if new == current:
            return current, []  # a no-op update changes nothing, not even resourceVersion
        warnings: list[str] = []
        attrs = Attributes("UPDATE", rt, ns, name, sub, old_object=current, dry_run=dry_run,
                           options=self._options("UpdateOptions", query, dry_run), user=user)
        mutated = await self.admission.mutate(attrs, new, warnings)
        new = mutated if mutated is not None else new
        for key in ("uid", "creationTimestamp", "resourceVersion"):
            new["metadata"][key] = cur_meta[key]
        self._validate(rt, new, query, warnings)
        if "generation" in cur_meta and _spec_like(new) != _spec_like(current):
            new["metadata"]["generation"] = cur_meta["generation"] + 1
        await self.admission.validate(attrs, new, warnings)
        if self.store.get(rt.key, ns, name) is None:
            raise errors.not_found(rt.group, rt.plural, name)
        if self.store.get(rt.key, ns, name).obj is not current:  # type: ignore[union-attr]
            raise _Changed  # someone wrote while the webhooks ran

        if dry_run:
            return new, warnings
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            return self._remove(rt, new), warnings
        return self._persist(rt, new), warnings

    def _resolve_priority(self, pod: dict[str, Any]) -> None:
        """The Priority admission plugin (before webhooks): priorityClassName → spec.priority,
        and a 403 for a class that does not exist."""
        spec = pod["spec"]
        name = spec.get("priorityClassName")
        if not name:
            return
        found = self.store.get(PRIORITY_CLASSES.key, "", name)
        if found is None and name not in _SYSTEM_PRIORITIES:
            raise errors.forbidden("", "pods", str(pod["metadata"].get("name") or ""),
                                   f"no PriorityClass with name {name} was found")
        spec["priority"] = (int(found.obj.get("value") or 0) if found is not None
                            else _SYSTEM_PRIORITIES[name])
        if found is not None and found.obj.get("preemptionPolicy"):
            spec["preemptionPolicy"] = found.obj["preemptionPolicy"]

    async def _bind(self, ns: str, name: str, body: Any, dry_run: bool,
                    user: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        if not isinstance(body, dict) or not (body.get("target") or {}).get("name"):
            raise errors.invalid("", "Binding", name, [(
                "target.name", "FieldValueRequired", "Required value")])
        if (body.get("metadata") or {}).get("name") not in (None, "", name):
            raise errors.bad_request("name in URL does not match name in Binding object")
        kind = body["target"].get("kind") or ""
        if kind not in ("", "Node"):
            # the real server answers this one with a 500
            raise errors.ApiStatusError(500, "", f'target.kind: Unsupported value: "{kind}": '
                                        'supported values: "Node", "<empty>"')
        current = self._get(PODS, ns, name).obj
        warnings: list[str] = []
        body.setdefault("metadata", {}).setdefault("name", name)
        body["metadata"].setdefault("namespace", ns)
        attrs = Attributes("CREATE", PODS, ns, name, "binding", kind=("", "v1", "Binding"),
                           dry_run=dry_run, options=self._options("CreateOptions", {}, dry_run),
                           user=user)
        body = await self.admission.mutate(attrs, body, warnings) or body
        await self.admission.validate(attrs, body, warnings)
        current = self._get(PODS, ns, name).obj
        node = body["target"]["name"]
        why = None
        if current["metadata"].get("deletionTimestamp"):
            why = f"pod {name} is being deleted, cannot be assigned to a host"
        elif (current.get("spec") or {}).get("nodeName"):
            why = f'pod {name} is already assigned to node "{current["spec"]["nodeName"]}"'
        elif (current.get("spec") or {}).get("schedulingGates"):
            why = f"pod {name} has non-empty .spec.schedulingGates"
        if why:
            raise errors.conflict("", "pods/binding", name, why)
        uid = (body.get("metadata") or {}).get("uid")
        if uid and uid != current["metadata"]["uid"]:
            raise errors.conflict("", "pods/binding", name, "Precondition failed: UID in "
                                  f"precondition: {uid}, UID in object meta: "
                                  f"{current['metadata']['uid']}")
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise errors.conflict("", "pods", name, (
                f"StorageError: invalid object, Code: 4, Key: /registry/pods/{ns}/{name}, "
                "ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: ResourceVersion "
                f"in precondition: {rv}, ResourceVersion in object meta: "
                f"{current['metadata']['resourceVersion']}"))
        if not dry_run:
            pod = copy.deepcopy(current)
            pod["spec"]["nodeName"] = node
            anns = (body.get("metadata") or {}).get("annotations") or {}
            if anns:
                pod["metadata"].setdefault("annotations", {}).update(anns)
            conds = [c for c in pod.setdefault("status", {}).get("conditions") or []
                     if c.get("type") != "PodScheduled"]
            conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                          "lastTransitionTime": now_rfc3339()})
            pod["status"]["conditions"] = conds
            self._persist(PODS, pod)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "code": 201}, warnings

    async def _delete(self, rt: ResourceType, ns: str, name: str, *, query: Mapping[str, str],
                      opts: Mapping[str, Any], user: Mapping[str, Any]
                      ) -> tuple[dict[str, Any], list[str]]:
        current = self._get(rt, ns, name).obj
        dry_run = query.get("dryRun") == "All" or "All" in (opts.get("dryRun") or [])
        pre = opts.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != current["metadata"]["uid"]:
            raise errors.conflict(rt.group, rt.plural, name,
                                  f"Precondition failed: UID in precondition: {pre['uid']}, "
                                  f"UID in object meta: {current['metadata']['uid']}")
        if pre.get("resourceVersion") and \
                pre["resourceVersion"] != current["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.group, rt.plural, name)
        warnings: list[str] = []
        options = self._options("DeleteOptions", query, dry_run)
        if opts.get("propagationPolicy"):
            options["propagationPolicy"] = opts["propagationPolicy"]
        attrs = Attributes("DELETE", rt, ns, name, old_object=current, dry_run=dry_run,
                           options=options, user=user)
        await self.admission.mutate(attrs, None, warnings)
        await self.admission.validate(attrs, None, warnings)
        policy = opts.get("propagationPolicy") or query.get("propagationPolicy") or "Background"
        if dry_run:
            return current, warnings
        if current["metadata"].get("finalizers"):
            if not current["metadata"].get("deletionTimestamp"):
                obj = copy.deepcopy(current)
                obj["metadata"]["deletionTimestamp"] = now_rfc3339()
                obj["metadata"]["deletionGracePeriodSeconds"] = 0
                current = self._persist(rt, obj)
            return current, warnings
        final = self._remove(rt, current, orphan=policy == "Orphan")
        if rt.key in RETURNS_DELETED_OBJECT:
            return final, warnings
        details: dict[str, Any] = {"name": name, "kind": rt.plural,
                                   "uid": current["metadata"]["uid"]}
        if rt.group:
            details = {"name": name, "group": rt.group, "kind": rt.plural,
                       "uid": current["metadata"]["uid"]}
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": details}, warnings

    def _remove(self, rt: ResourceType, obj: dict[str, Any],
                orphan: bool = False) -> dict[str, Any]:
        """Delete from the store now, then the namespace's content or the dependents."""
        meta = obj["metadata"]
        ns, name = meta.get("namespace", ""), meta["name"]
        rv = self.store.next_rv()
        final = copy.deepcopy(obj)
        final["metadata"]["resourceVersion"] = str(rv)
        self.store.remove(rt.key, ns, name, final, rv)
        if rt.key == NAMESPACES.key:
            for other in self.registry.all():
                if other.namespaced:
                    for st in list(self.store.items(other.key, name)):
                        self._remove(other, st.obj)
        elif rt.key == CRDS.key:
            # its custom resources are deleted first (DELETED events), then it stops serving
            gone = {t.key: t for t in self.registry.remove_crd(name)}
            for kind in gone.values():
                for st in list(self.store.items(kind.key)):
                    self._remove(kind, st.obj)
                self.store.drop_type(kind.key)
        self._collect_garbage(meta["uid"], orphan)
        return final

    def _collect_garbage(self, owner_uid: str, orphan: bool) -> None:
        """The garbage collector, synchronously: dependents with no owner left are deleted
        (background propagation) or lose the owner reference (orphan)."""
        for tk, (ns, name) in sorted(self.store.dependents.get(owner_uid, set())):
            st = self.store.get(tk, ns, name)
            if st is None:
                continue
            rt = next((r for r in self.registry.all() if r.key == tk), None)
            if rt is None:
                continue
            refs = st.obj["metadata"].get("ownerReferences") or []
            alive = [r for r in refs if r.get("uid") != owner_uid and
                     r.get("uid") in self.store.by_uid]
            if orphan or alive:
                obj = copy.deepcopy(st.obj)
                obj["metadata"]["ownerReferences"] = [r for r in refs
                                                      if r.get("uid") != owner_uid]
                if not obj["metadata"]["ownerReferences"]:
                    del obj["metadata"]["ownerReferences"]
                self._persist(rt, obj)
            elif st.obj["metadata"].get("finalizers"):
                obj = copy.deepcopy(st.obj)
                obj["metadata"].setdefault("deletionTimestamp", now_rfc3339())
                self._persist(rt, obj)
            else:
                self._remove(rt, st.obj)


class _Changed(Exception):
    """The object changed while an update was in admission."""


def _age(timestamp: str | None) -> str:
    """Server-side printing of a date column, as kubectl shows AGE: 42s, 7m, 3h, 2d."""
    if not timestamp:
        return "<unknown>"
    then = dt.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    secs = max(0, int((dt.datetime.now(dt.UTC) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{secs}s"


def _without_seconds(tolerations: Any) -> list[Any]:
    return [{k: v for k, v in t.items() if k != "tolerationSeconds"} if isinstance(t, dict)
            else t for t in tolerations or ()]


def _gate_names(pod: dict[str, Any]) -> list[Any]:
    return [g.get("name") if isinstance(g, dict) else g
            for g in (pod.get("spec") or {}).get("schedulingGates") or ()]


def _check_pod_update(old: dict[str, Any], new: dict[str, Any]) -> None:
    """ValidatePodUpdate: only images and a few fields of a pod's spec may change; tolerations
    may only be added to, scheduling gates only removed."""
    kept = _without_seconds((new.get("spec") or {}).get("tolerations"))
    if any(t not in kept for t in _without_seconds((old.get("spec") or {}).get("tolerations"))):
        raise errors.invalid("", "Pod", old["metadata"]["name"], [(
            "spec.tolerations", "FieldValueForbidden",
            "Forbidden: existing toleration can not be modified except its tolerationSeconds")])
    before = _gate_names(old)
    added = [(i, g) for i, g in enumerate(_gate_names(new)) if g not in before]
    if added:
        raise errors.invalid("", "Pod", old["metadata"]["name"], [(
            f"spec.schedulingGates[{i}].name", "FieldValueForbidden",
            f"Forbidden: only deletion is allowed, but found new scheduling gate '{g}'")
            for i, g in added])
    old_spec, new_spec = dict(old.get("spec") or {}), dict(new.get("spec") or {})
    for spec in (old_spec, new_spec):
        for key in _POD_MUTABLE_SPEC:
            spec.pop(key, None)
        for field in ("containers", "initContainers"):
            spec[field] = [{k: v for k, v in c.items() if k != "image"}
                           for c in spec.get(field) or []]
    if old_spec != new_spec:
        name = old["metadata"]["name"]
        changed = sorted(k for k in set(old_spec) | set(new_spec)
                         if old_spec.get(k) != new_spec.get(k))
        raise errors.invalid("", "Pod", name, [(
            "spec", "FieldValueForbidden",
            "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
            "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
            "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
            f"(allow it to be set to 1 if it was previously negative); changed: "
            f"{', '.join('spec.' + k for k in changed)}")])
