"""What the server answers to one AdmissionReview: policy decision, PodGroup, patch, fail-open.

Safety rules, in order: a request is always answered before its deadline; any failure admits the
pod (with a warning and a metric) rather than blocking it; system namespaces are never touched;
nobody chooses their own GPUs (the binder's assignment annotation is stripped or denied).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeGuard

from webhook import jsonpatch
from webhook.admission.metrics import Metrics
from webhook.admission.reload import PolicyStore
from webhook.admission.review import AdmissionReview, response
from webhook.keys import ANN_GPU_ASSIGNMENT
from webhook.policy import PolicyError, PolicySet, load_policy_texts
from webhook.policy.decision import PodGroupSpec
from webhook.policy.outcome import evaluate_and_render

log = logging.getLogger(__name__)

SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
UserAssignment = Literal["strip", "deny"]


class ClusterContext(Protocol):
    """What admission needs from the cluster; every read comes from a cache where one can."""

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None: ...

    def cached_owners(self, pod: Mapping[str, Any], namespace: str) -> list[
        dict[str, Any]] | None: ...

    async def owners(self, pod: Mapping[str, Any], namespace: str) -> tuple[
        list[dict[str, Any]], list[str]]: ...

    def pod_group_current(self, spec: PodGroupSpec) -> bool: ...

    async def ensure_pod_group(self, spec: PodGroupSpec, *, dry_run: bool) -> list[str]: ...

    def ready(self) -> bool: ...


@dataclass(frozen=True)
class AdmissionConfig:
    on_user_assignment: UserAssignment = "strip"
    #: namespaces never mutated, on top of SYSTEM_NAMESPACES (the server's own is added by serve)
    excluded_namespaces: frozenset[str] = field(default_factory=frozenset)
    #: seconds kept back from the API server's timeout for the answer to travel
    deadline_margin: float = 0.5


@dataclass
class _Result:
    allowed: bool = True
    patch: list[dict[str, Any]] = field(default_factory=list)
    #: `patch` already encoded, when it is exactly the (memoised) outcome's ops
    patch_json: bytes | None = None
    warnings: list[str] = field(default_factory=list)
    policies: tuple[str, ...] = ()
    fail_open: str | None = None
    message: str | None = None


def _is_map(value: Any) -> TypeGuard[Mapping[str, Any]]:
    return type(value) is dict or isinstance(value, Mapping)  # dict first: no ABC check


def _pod_namespace(review: AdmissionReview, pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    ns = meta.get("namespace") if _is_map(meta) else None
    return review.request.namespace or (ns if isinstance(ns, str) else "") or "default"


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    ann = meta.get("annotations") if _is_map(meta) else None
    return ann if _is_map(ann) else {}


def _strip_assignment(pod: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The pod without the binder-only annotation, and the op that removes it from the original."""
    if ANN_GPU_ASSIGNMENT not in _annotations(pod):
        return pod, []
    op = {"op": "remove",
          "path": "/metadata/annotations/" + jsonpatch.escape(ANN_GPU_ASSIGNMENT)}
    return jsonpatch.apply_patch(pod, [op]), [op]


class Admitter:
    def __init__(
        self,
        config: AdmissionConfig,
        policies: PolicyStore[PolicySet],
        context: ClusterContext | None,
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.policies = policies
        self.context = context
        self.metrics = metrics
        self._excluded = SYSTEM_NAMESPACES | config.excluded_namespaces
        self._background: set[asyncio.Task[list[str]]] = set()
        #: set at shutdown: /readyz reports not ready while in-flight requests finish
        self.draining = False

    def ready(self) -> bool:
        return not self.draining and self.policies.current is not None and (
            self.context is None or self.context.ready())

    async def mutate(self, review: AdmissionReview, budget: float) -> tuple[dict[str, Any], str]:
        """The response body and its outcome label for /mutate/pods."""
        result = await self._mutate(review, budget)
        if result.fail_open:
            self.metrics.fail_open.labels(result.fail_open).inc()
        for name in result.policies:
            self.metrics.count_decision(name)
        audit = {"policy": ",".join(result.policies)} if result.policies else None
        body = response(review, allowed=result.allowed, patch=result.patch,
                        patch_json=result.patch_json, warnings=result.warnings, audit=audit,
                        message=result.message)
        if not result.allowed:
            outcome = "denied"
        elif result.fail_open:
            outcome = "fail_open"
        else:
            outcome = "patched" if result.patch else "allowed"
        return body, outcome

    async def _mutate(self, review: AdmissionReview, budget: float) -> _Result:
        req = review.request
        pod = req.object
        if (req.operation != "CREATE" or req.kind.kind != "Pod" or req.sub_resource
                or not isinstance(pod, dict)):
            return _Result()
        namespace = _pod_namespace(review, pod)
        if namespace in self._excluded:
            return _Result()
        try:
            clean_pod, strip_ops = _strip_assignment(pod)
        except jsonpatch.JsonPatchError:  # annotations not an object: let the API server reject
            return _Result()
        if strip_ops and self.config.on_user_assignment == "deny":
            return _Result(allowed=False, message=(
                f"{ANN_GPU_ASSIGNMENT} is written only by the Muster binder; "
                "remove it from the pod"))
        result = _Result(patch=list(strip_ops))
        if strip_ops:
            result.warnings.append(f"muster: removed {ANN_GPU_ASSIGNMENT}, which only the "
                                   "binder may set")
        policies = self.policies.current
        if policies is None:
            result.warnings.append("muster: no valid policies loaded; pod admitted unchanged")
            result.fail_open = "not_ready"
            return result
        # Only awaits that may wait on the API server run under the deadline; the common path
        # (everything cached) has none.
        deadline = asyncio.get_running_loop().time() + budget
        try:
            await self._decide(review, clean_pod, namespace, policies, deadline=deadline,
                               result=result)
        except TimeoutError:
            result.warnings.append("muster: policy decision did not finish before the "
                                   "webhook deadline; pod admitted unchanged")
            result.patch, result.patch_json = list(strip_ops), None
            result.policies = ()
            result.fail_open = "deadline"
        except Exception:
            log.exception("admission decision failed; admitting the pod unchanged",
                          extra={"uid": req.uid, "namespace": namespace})
            result.warnings.append("muster: internal error while applying policies; pod "
                                   "admitted unchanged")
            result.patch, result.patch_json = list(strip_ops), None
            result.policies = ()
            result.fail_open = "error"
        return result

    async def _decide(
        self,
        review: AdmissionReview,
        pod: dict[str, Any],
        namespace: str,
        policies: PolicySet,
        *,
        deadline: float,
        result: _Result,
    ) -> None:
        if self.context is None:
            ns_labels: Mapping[str, str] = {"kubernetes.io/metadata.name": namespace}
            owners: list[dict[str, Any]] = []
        else:
            known = self.context.namespace_labels(namespace)
            if known is None:
                result.warnings.append(f"muster: labels of namespace {namespace} unknown; "
                                       "namespaceSelector policies may not apply")
                known = {"kubernetes.io/metadata.name": namespace}
            ns_labels = known
            cached = self.context.cached_owners(pod, namespace)
            if cached is not None:
                owners = cached
            else:
                async with asyncio.timeout_at(deadline):
                    owners, owner_warnings = await self.context.owners(pod, namespace)
                result.warnings.extend(owner_warnings)
        # The pods of one job share one outcome (see webhook.policy.outcome).
        decision, ops, patch_json = evaluate_and_render(
            pod, namespace_labels=ns_labels, owners=owners, policies=policies)
        result.warnings.extend(decision.warnings)
        if not result.patch:
            result.patch_json = patch_json
        result.patch.extend(ops)
        result.policies = decision.policies
        spec = decision.pod_group
        if spec is None:
            return
        if self.context is None:
            result.warnings.append(f"muster: no cluster connection; PodGroup "
                                   f"{spec.namespace}/{spec.name} was not created")
            result.fail_open = "podgroup"
            return
        dry_run = bool(review.request.dry_run)
        if not dry_run and self.context.pod_group_current(spec):
            return
        # The write is shielded: if the deadline cuts the wait short it still completes in the
        # background, so the gang's next pod finds the PodGroup in place.
        task = asyncio.ensure_future(self.context.ensure_pod_group(spec, dry_run=dry_run))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        try:
            async with asyncio.timeout_at(deadline):
                warnings = await asyncio.shield(task)
        except TimeoutError:
            result.warnings.append(f"muster: PodGroup {spec.namespace}/{spec.name} not "
                                   "confirmed before the webhook deadline; still being written")
            result.fail_open = "deadline"
            return
        if warnings:
            result.fail_open = "podgroup"
        result.warnings.extend(warnings)

    async def validate_policies(self, review: AdmissionReview) -> tuple[dict[str, Any], str]:
        """/validate/policies: would this ConfigMap's data load? Validation only, no reload."""
        req = review.request
        obj = req.object
        if req.operation not in ("CREATE", "UPDATE") or not isinstance(obj, dict):
            return response(review, allowed=True), "allowed"
        data = obj.get("data") or {}
        if not isinstance(data, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            return response(review, allowed=False, status_code=422,
                            message="ConfigMap data must map file names to text"), "denied"
        try:
            await asyncio.to_thread(load_policy_texts, data)
        except PolicyError as exc:
            return response(review, allowed=False, status_code=422,
                            message=f"invalid Muster policies:\n{exc}"), "denied"
        return response(review, allowed=True), "allowed"

    async def drain(self, grace: float) -> None:
        """Let shielded PodGroup writes finish (graceful shutdown)."""
        if self._background:
            await asyncio.wait(list(self._background), timeout=grace)


def policy_count(policies: PolicySet) -> int:
    return len(policies)
