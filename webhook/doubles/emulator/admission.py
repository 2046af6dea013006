"""Admission webhooks called the way kube-apiserver calls them (k8s.io/apiserver
pkg/admission/plugin/webhook): matching, AdmissionReview v1 over HTTPS, failurePolicy,
sideEffects on dry run, JSONPatch responses, warnings, reinvocation."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import logging
import ssl
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from . import errors
from .patch import json_patch
from .resources import ResourceType
from .selectors import Requirement, label_selector_object, labels_match

log = logging.getLogger(__name__)

DEFAULT_USER: dict[str, Any] = {"username": "admin", "uid": "admin",
                                "groups": ["system:masters", "system:authenticated"]}
_EXEMPT_GROUPS = frozenset({"admissionregistration.k8s.io"})
_DRY_RUN_SAFE = frozenset({"None", "NoneOnDryRun"})


@dataclass
class Attributes:
    """What is being admitted (admission.Attributes)."""

    operation: str  # CREATE | UPDATE | DELETE | CONNECT
    resource: ResourceType
    namespace: str
    name: str
    subresource: str = ""
    kind: tuple[str, str, str] | None = None  # (group, version, kind) if not the resource's
    old_object: dict[str, Any] | None = None
    dry_run: bool = False
    options: dict[str, Any] | None = None
    user: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_USER))


@dataclass
class WebhookCall:
    """One call made, kept for tests: what was sent and what came back."""

    phase: str  # "mutating" | "validating"
    configuration: str
    webhook: str
    url: str
    request: dict[str, Any]
    response: dict[str, Any] | None = None
    error: str | None = None
    duration_s: float = 0.0
    reinvocation: bool = False


class AdmissionDenied(errors.ApiStatusError):
    pass


def _rule_matches(rule: Mapping[str, Any], attrs: Attributes) -> bool:
    rt = attrs.resource
    ops = rule.get("operations") or []
    if "*" not in ops and attrs.operation not in ops:
        return False
    groups = rule.get("apiGroups") or []
    if "*" not in groups and rt.group not in groups:
        return False
    versions = rule.get("apiVersions") or []
    if "*" not in versions and rt.version not in versions:
        return False
    scope = rule.get("scope") or "*"
    if (scope == "Cluster" and rt.namespaced) or (scope == "Namespaced" and not rt.namespaced):
        return False
    wanted = f"{rt.plural}/{attrs.subresource}" if attrs.subresource else rt.plural
    for res in rule.get("resources") or []:
        if res in ("*/*", wanted):
            return True
        main, _, sub = res.partition("/")
        if not attrs.subresource and res == "*":
            return True
        if attrs.subresource and main in ("*", rt.plural) and sub in ("*", attrs.subresource):
            return True
    return False


def _selects(reqs: list[Requirement], obj: Mapping[str, Any] | None) -> bool:
    """A selector never matches an absent object (oldObject on CREATE, object on DELETE)."""
    if obj is None:
        return False
    return labels_match(reqs, (obj.get("metadata") or {}).get("labels") or {})


class AdmissionChain:
    """Runs the mutating then validating webhook configurations found in the store."""

    def __init__(self, configurations: Callable[[str], list[dict[str, Any]]],
                 namespace_labels: Callable[[str], Mapping[str, str] | None],
                 service_hosts: Mapping[tuple[str, str], str] | None = None) -> None:
        """configurations(kind) → current Mutating/ValidatingWebhookConfiguration objects;
        service_hosts maps a clientConfig.service (namespace, name) to the "host:port" that
        serves it here, where there is no cluster DNS."""
        self._configurations = configurations
        self._namespace_labels = namespace_labels
        self.service_hosts = dict(service_hosts or {})
        self.calls: list[WebhookCall] = []
        self._session: aiohttp.ClientSession | None = None
        self._ssl: dict[str, ssl.SSLContext] = {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- matching -----------------------------------------------------------------------------

    def _matches(self, hook: Mapping[str, Any], attrs: Attributes,
                 obj: Mapping[str, Any] | None) -> bool:
        if attrs.resource.group in _EXEMPT_GROUPS:
            return False  # the apiserver never calls webhooks on webhook configurations
        if not any(_rule_matches(r, attrs) for r in hook.get("rules") or []):
            return False
        ns_reqs = label_selector_object(hook.get("namespaceSelector"))
        if ns_reqs:
            if attrs.resource.group == "" and attrs.resource.plural == "namespaces":
                if not (_selects(ns_reqs, obj) or _selects(ns_reqs, attrs.old_object)):
                    return False
            elif attrs.resource.namespaced and not labels_match(
                    ns_reqs, self._namespace_labels(attrs.namespace) or {}):
                return False
        obj_reqs = label_selector_object(hook.get("objectSelector"))
        return not obj_reqs or _selects(obj_reqs, obj) or _selects(obj_reqs, attrs.old_object)

    def _hooks(self, kind: str) -> list[tuple[str, dict[str, Any]]]:
        configs = sorted(self._configurations(kind), key=lambda c: c["metadata"]["name"])
        return [(c["metadata"]["name"], h) for c in configs for h in c.get("webhooks") or []]

    # --- the AdmissionReview ------------------------------------------------------------------

    def review(self, attrs: Attributes, obj: dict[str, Any] | None) -> dict[str, Any]:
        rt = attrs.resource
        kg, kv, kk = attrs.kind or (rt.group, rt.version, rt.kind)
        request: dict[str, Any] = {
            "uid": str(uuid.uuid4()),
            "kind": {"group": kg, "version": kv, "kind": kk},
            "resource": {"group": rt.group, "version": rt.version, "resource": rt.plural},
        }
        if attrs.subresource:
            request["subResource"] = attrs.subresource
        request["requestKind"] = dict(request["kind"])
        request["requestResource"] = dict(request["resource"])
        if attrs.subresource:
            request["requestSubResource"] = attrs.subresource
        if attrs.name:
            request["name"] = attrs.name
        if attrs.namespace:
            request["namespace"] = attrs.namespace
        request.update({
            "operation": attrs.operation, "userInfo": dict(attrs.user), "object": obj,
            "oldObject": attrs.old_object, "dryRun": attrs.dry_run, "options": attrs.options})
        return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
                "request": request}

    def _target(self, hook: Mapping[str, Any]) -> tuple[str, str]:
        """(url, TLS server name) for the webhook's clientConfig."""
        cc = hook.get("clientConfig") or {}
        if cc.get("url"):
            url = cc["url"]
            return url, urlsplit(url).hostname or ""
        svc = cc.get("service") or {}
        ns, name = svc.get("namespace", ""), svc.get("name", "")
        host = self.service_hosts.get((ns, name))
        server_name = f"{name}.{ns}.svc"
        port = svc.get("port", 443)
        path = svc.get("path") or ""
        if host is None:
            host = f"{server_name}:{port}"
        return f"https://{host}{path}", server_name

    def _ssl_context(self, ca_bundle: str | None) -> ssl.SSLContext:
        key = ca_bundle or ""
        ctx = self._ssl.get(key)
        if ctx is None:
            if ca_bundle:
                ctx = ssl.create_default_context(
                    cadata=base64.b64decode(ca_bundle).decode("ascii"))
            else:
                ctx = ssl.create_default_context()
            self._ssl[key] = ctx
        return ctx

    async def _call(self, phase: str, config: str, hook: Mapping[str, Any],
                    review: dict[str, Any], reinvocation: bool) -> dict[str, Any]:
        """POST the review; returns the response stanza or raises _CallError."""
        url, server_name = self._target(hook)
        timeout = int(hook.get("timeoutSeconds") or 10)
        full = f"{url}{'&' if '?' in url else '?'}timeout={timeout}s"
        payload = json.dumps(review).encode()
        # recorded as sent: the object goes on changing after the call
        call = WebhookCall(phase, config, hook["name"], full, json.loads(payload),
                           reinvocation=reinvocation)
        self.calls.append(call)
        if self._session is None:
            self._session = aiohttp.ClientSession()
        started = time.monotonic()
        ca = (hook.get("clientConfig") or {}).get("caBundle")
        try:
            try:
                ctx = self._ssl_context(ca) if full.startswith("https://") else None
            except (ValueError, ssl.SSLError) as exc:
                raise _CallError(f"failed to call webhook: invalid caBundle: {exc}") from exc
            async with self._session.post(
                    full, data=payload, ssl=ctx if ctx else False,
                    server_hostname=server_name if ctx else None,
                    headers={"Content-Type": "application/json",
                             "Accept": "application/json, */*",
                             "User-Agent": "kube-apiserver-admission"},
                    timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise _CallError(f"failed to call webhook: the server responded with the "
                                     f"status code {resp.status} but did not return more "
                                     f"information")
            try:
                answer = json.loads(body)
            except ValueError as exc:
                raise _CallError(f"received invalid webhook response: {exc}") from exc
            call.response = answer if isinstance(answer, dict) else None
            if not isinstance(answer, dict) or answer.get("kind") != "AdmissionReview" or \
                    answer.get("apiVersion") != "admission.k8s.io/v1":
                got = (f"{answer.get('apiVersion')}, Kind={answer.get('kind')}"
                       if isinstance(answer, dict) else type(answer).__name__)
                raise _CallError("received invalid webhook response: expected webhook "
                                 f"response of admission.k8s.io/v1, Kind=AdmissionReview, "
                                 f"got {got}")
            response = answer.get("response")
            if not isinstance(response, dict):
                raise _CallError("received invalid webhook response: webhook response "
                                 "was absent")
            uid = review["request"]["uid"]
            if response.get("uid") != uid:
                raise _CallError("received invalid webhook response: expected response.uid="
                                 f"{uid!r}, got {response.get('uid')!r}")
            return response
        except _CallError as exc:
            call.error = str(exc)
            raise
        except (aiohttp.ClientError, TimeoutError, OSError, ssl.SSLError) as exc:
            reason = ("context deadline exceeded" if isinstance(exc, TimeoutError)
                      else str(exc) or type(exc).__name__)
            call.error = f'failed to call webhook: Post "{full}": {reason}'
            raise _CallError(call.error) from exc
        finally:
            call.duration_s = time.monotonic() - started

    # --- the chain ----------------------------------------------------------------------------

    async def mutate(self, attrs: Attributes, obj: dict[str, Any] | None,
                     warnings: list[str]) -> dict[str, Any] | None:
        hooks = [(c, h) for c, h in self._hooks("mutating") if self._matches(h, attrs, obj)]
        if not hooks:
            return obj
        after: dict[int, Any] = {}  # snapshot of the object right after each hook's call
        for i, (config, hook) in enumerate(hooks):
            obj = await self._run_one("mutating", config, hook, attrs=attrs, obj=obj,
                                      warnings=warnings, reinvocation=False)
            after[i] = copy.deepcopy(obj)
        # reinvocationPolicy IfNeeded: once more if a later webhook changed the object
        for i, (config, hook) in enumerate(hooks):
            if hook.get("reinvocationPolicy") == "IfNeeded" and after[i] != obj:
                obj = await self._run_one("mutating", config, hook, attrs=attrs, obj=obj,
                                          warnings=warnings, reinvocation=True)
        return obj

    async def validate(self, attrs: Attributes, obj: dict[str, Any] | None,
                       warnings: list[str]) -> None:
        hooks = [(c, h) for c, h in self._hooks("validating") if self._matches(h, attrs, obj)]
        # validating webhooks are called in parallel by kube-apiserver
        await asyncio.gather(*(self._run_one("validating", c, h, attrs=attrs, obj=obj,
                                             warnings=warnings, reinvocation=False)
                               for c, h in hooks))

    async def _run_one(self, phase: str, config: str, hook: Mapping[str, Any], *,
                       attrs: Attributes, obj: dict[str, Any] | None, warnings: list[str],
                       reinvocation: bool) -> dict[str, Any] | None:
        name = hook["name"]
        if attrs.dry_run and hook.get("sideEffects") not in _DRY_RUN_SAFE:
            raise errors.bad_request(f'admission webhook "{name}" does not support dry run')
        review = self.review(attrs, obj)
        try:
            response = await self._call(phase, config, hook, review, reinvocation)
        except _CallError as exc:
            if hook.get("failurePolicy", "Fail") == "Ignore":
                log.warning("webhook call failed, failurePolicy Ignore",
                            extra={"webhook": name, "error": str(exc)})
                return obj
            raise errors.internal(f'failed calling webhook "{name}": {exc}') from exc
        if isinstance(response.get("warnings"), list):
            warnings.extend(str(w) for w in response["warnings"])
        if response.get("allowed") is not True:
            status = response.get("status")
            raise _denied(name, status if isinstance(status, Mapping) else None)
        patch = response.get("patch")
        if phase != "mutating" or not patch:
            return obj
        if response.get("patchType") != "JSONPatch":
            raise errors.internal(f'failed calling webhook "{name}": received invalid webhook '
                                  f"response: webhook returned response.patch but not "
                                  f"response.patchType")
        try:
            ops = json.loads(base64.b64decode(patch))
            patched: dict[str, Any] = json_patch(obj, ops)
        except (ValueError, errors.ApiStatusError) as exc:
            raise errors.internal(str(exc)) from exc
        return patched


class _CallError(Exception):
    pass


def _shape_errors(hook: Mapping[str, Any], at: str) -> list[tuple[str, str, str]]:
    """Types the matcher relies on: rules of string lists, selectors, a clientConfig object."""
    bad: list[tuple[str, str, str]] = []
    rules = hook.get("rules") or []
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        return [(f"{at}.rules", "FieldValueInvalid", "Invalid value: must be a list of objects")]
    for j, rule in enumerate(rules):
        for key in ("operations", "apiGroups", "apiVersions", "resources"):
            value = rule.get(key) or []
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                bad.append((f"{at}.rules[{j}].{key}", "FieldValueInvalid",
                            "Invalid value: must be a list of strings"))
    for key in ("namespaceSelector", "objectSelector"):
        try:
            sel = hook.get(key)
            if sel is not None and not isinstance(sel, dict):
                raise errors.bad_request("must be a label selector")
            label_selector_object(sel)
        except (errors.ApiStatusError, AttributeError, KeyError, TypeError) as exc:
            bad.append((f"{at}.{key}", "FieldValueInvalid", f"Invalid value: {exc}"))
    if not isinstance(hook.get("clientConfig") or {}, dict):
        bad.append((f"{at}.clientConfig", "FieldValueInvalid", "Invalid value: not an object"))
    return bad


def configuration_errors(config: Mapping[str, Any], mutating: bool) -> list[tuple[str, str, str]]:
    """What admissionregistration/v1 validation refuses in a webhook configuration, as
    (field, reason, message) causes: the mistakes a chart can make that a real API server
    would reject at install time."""
    causes: list[tuple[str, str, str]] = []
    names: set[str] = set()
    hooks = config.get("webhooks") or []
    if not isinstance(hooks, list) or not all(isinstance(h, dict) for h in hooks):
        return [("webhooks", "FieldValueInvalid", "Invalid value: must be a list of objects")]
    for i, hook in enumerate(hooks):
        at = f"webhooks[{i}]"
        causes.extend(_shape_errors(hook, at))
        if causes:
            return causes
        name = str(hook.get("name") or "")
        if not name:
            causes.append((f"{at}.name", "FieldValueRequired", "Required value"))
        elif name.count(".") < 2:
            causes.append((f"{at}.name", "FieldValueInvalid", f'Invalid value: "{name}": '
                           "should be a domain with at least three segments separated by dots"))
        elif name in names:
            causes.append((f"{at}.name", "FieldValueDuplicate", f'Duplicate value: "{name}"'))
        names.add(name)
        effects = hook.get("sideEffects")
        if effects is None:
            causes.append((f"{at}.sideEffects", "FieldValueRequired", "Required value: must "
                           "specify one of None, NoneOnDryRun"))
        elif effects not in ("None", "NoneOnDryRun"):
            causes.append((f"{at}.sideEffects", "FieldValueNotSupported",
                           f'Unsupported value: "{effects}": supported values: "None", '
                           '"NoneOnDryRun"'))
        versions = hook.get("admissionReviewVersions") or []
        if not versions:
            causes.append((f"{at}.admissionReviewVersions", "FieldValueRequired",
                           "Required value: must specify one of v1, v1beta1"))
        elif not set(versions) & {"v1", "v1beta1"}:
            causes.append((f"{at}.admissionReviewVersions", "FieldValueInvalid",
                           f"Invalid value: {json.dumps(versions)}: must include at least one "
                           "of v1, v1beta1"))
        timeout = hook.get("timeoutSeconds")
        if timeout is not None and not 1 <= int(timeout) <= 30:
            causes.append((f"{at}.timeoutSeconds", "FieldValueInvalid",
                           f"Invalid value: {timeout}: the timeout value must be between 1 "
                           "and 30 seconds"))
        cc = hook.get("clientConfig") or {}
        if bool(cc.get("url")) == bool(cc.get("service")):
            causes.append((f"{at}.clientConfig", "FieldValueRequired",
                           "Required value: exactly one of url or service is required"))
        elif cc.get("url") and not str(cc["url"]).startswith("https://"):
            causes.append((f"{at}.clientConfig.url", "FieldValueInvalid",
                           f'Invalid value: "{cc["url"]}": \'https\' is the only allowed URL '
                           "scheme"))
        if not mutating and "reinvocationPolicy" in hook:
            causes.append((f"{at}.reinvocationPolicy", "FieldValueForbidden",
                           "Forbidden: only for mutating webhooks"))
    return causes


def _denied(name: str, status: Mapping[str, Any] | None) -> AdmissionDenied:
    """webhookerrors.ToStatusErr."""
    status = dict(status or {})
    code = int(status.get("code") or 0)
    code = max(code, 400)
    denied_by = f'admission webhook "{name}" denied the request'
    if status.get("message"):
        message = f"{denied_by}: {status['message']}"
    elif status.get("reason"):
        message = f"{denied_by}: {status['reason']}"
    else:
        message = f"{denied_by} without explanation"
    return AdmissionDenied(code, str(status.get("reason") or ""), message,
                           status.get("details"))
