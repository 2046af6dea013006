"""What the server answers to one AdmissionReview: policy decision, PodGroup, patch, fail-open.

Safety rules, in order: a request is always answered before its deadline; any failure admits the
pod (with a warning and a metric) rather than blocking it; system namespaces are never touched;
nobody chooses their own GPUs (the muster.io/ annotations only the binder and the node agent
write are stripped or denied: keys.user_may_create_with).

Gangs never wait forever in silence. Three cases refuse or change what the policy asked for, each
with an Event on the job (and on the pod when it has a name) and a metric:

- the job's object cannot be read (API error or timeout) and a gang policy needs it: the pod is
  refused for `owner_retry_seconds`, so that no member joins half a gang; the job's controller
  retries the create. After that the pod is admitted without the gang;
- the PodGroup's name is taken by a PodGroup another live object controls: refused until it
  goes; by one whose controller cannot be read: no gang (webhook.admission.podgroups);
- the Volcano queue is missing or not Open: the policy's fallback queue, or no gang
  (webhook.policy.queues);
- a native gang (backend kubernetes) on a cluster that serves no Workload API: refused, or no
  gang, as the policy says (webhook.policy.native).

One case undoes what an earlier pass did: a webhook called after Muster's (the job's own gang
scheduling, e.g. LeaderWorkerSet's Volcano provider) replaced the group key Muster gave the pod.
On the pass that follows (reinvocation) Muster stands aside: its record leaves the pod, and the
PodGroup it made for that gang is deleted unless a pod still joins it (Decision.withdrawn).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeGuard

from webhook import jsonpatch
from webhook.admission.metrics import Metrics
from webhook.admission.outcomes import OutcomeLog
from webhook.admission.podgroups import Ensured
from webhook.admission.reload import PolicyStore
from webhook.admission.review import AdmissionReview, response
from webhook.keys import user_may_create_with
from webhook.kube import ApiError
from webhook.kube.owners import controller_ref
from webhook.lru import Lru
from webhook.policy import PolicyError, PolicySet, load_policy_texts, render_patch
from webhook.policy.audit import EVENT_REASON, event_message
from webhook.policy.decision import Decision, Override, PodGroupSpec, Withdrawal
from webhook.policy.native import VERSIONS, NativeVerdict, api_of, with_api
from webhook.policy.outcome import evaluate_and_render
from webhook.policy.queues import QueueVerdict, with_queue, without_gang
from webhook.policy.workload import NO_PRIORITIES, Priorities

log = logging.getLogger(__name__)

SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
#: seconds of the deadline kept for deciding after a slow owner or Queue read
_OWNER_MARGIN = 0.2
UserAssignment = Literal["strip", "deny"]


class ClusterContext(Protocol):
    """What admission needs from the cluster; every read comes from a cache where one can."""

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None: ...

    def cached_owners(self, pod: Mapping[str, Any], namespace: str) -> list[
        dict[str, Any]] | None: ...

    async def owners(self, pod: Mapping[str, Any], namespace: str, deadline: float
                     ) -> tuple[list[dict[str, Any]], list[str], Mapping[str, Any] | None]: ...

    def pod_group_current(self, spec: PodGroupSpec) -> bool: ...

    def priorities(self) -> Priorities: ...

    async def ensure_pod_group(self, spec: PodGroupSpec, *, dry_run: bool) -> Ensured: ...

    async def withdraw_pod_group(self, gone: Withdrawal) -> str | None: ...

    async def queue_verdict(self, spec: PodGroupSpec, deadline: float
                            ) -> QueueVerdict | None: ...

    async def native_verdict(self, spec: PodGroupSpec, deadline: float
                             ) -> NativeVerdict | None: ...

    def report(self, objects: list[Mapping[str, Any]], reason: str, message: str, *,
               type_: str = "Warning", once_as: str | None = None) -> None: ...

    def ready(self) -> bool: ...


@dataclass(frozen=True)
class AdmissionConfig:
    on_user_assignment: UserAssignment = "strip"
    #: namespaces never mutated, on top of SYSTEM_NAMESPACES (the server's own is added by serve)
    excluded_namespaces: frozenset[str] = field(default_factory=frozenset)
    #: seconds kept back from the API server's timeout for the answer to travel
    deadline_margin: float = 0.5
    #: how long a gang job's pods are refused while its object cannot be read
    owner_retry_seconds: float = 60.0


#: what a fail_open reason says went wrong, in a fail-closed namespace's refusal
_FAILED = {
    "not_ready": "no valid policies are loaded",
    "namespace": "the namespace's labels are not known to the webhook yet",
    "deadline": "the decision or the gang's PodGroup was not done before the webhook's deadline",
    "error": "an internal error (the webhook's log has it)",
    "owner": "the pod's job could not be read to size its gang",
    "podgroup": "the gang's PodGroup could not be written",
}


@dataclass
class _Result:
    allowed: bool = True
    patch: list[dict[str, Any]] = field(default_factory=list)
    #: `patch` already encoded, when it is exactly the (memoised) outcome's ops
    patch_json: bytes | None = None
    warnings: list[str] = field(default_factory=list)
    policies: tuple[str, ...] = ()
    overrides: tuple[Override, ...] = ()
    fail_open: str | None = None
    message: str | None = None
    status_code: int | None = None


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


def _job_of(pod: Mapping[str, Any], spec: PodGroupSpec) -> Mapping[str, Any] | None:
    """The job a gang belongs to, as a reference: the PodGroup's owner, else the pod's."""
    return spec.owner.as_owner_reference() if spec.owner else controller_ref(pod)


def _involved(pod: Mapping[str, Any], namespace: str,
              ref: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """What an Event about a gang goes on: the job `ref` names, and the pod when it already
    has a name."""
    out: list[Mapping[str, Any]] = []
    if ref is not None:
        out.append({"apiVersion": ref.get("apiVersion"), "kind": ref.get("kind"),
                    "metadata": {"name": ref.get("name"), "namespace": namespace,
                                 "uid": ref.get("uid")}})
    name = (pod.get("metadata") or {}).get("name")
    if isinstance(name, str) and name:
        out.append({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": namespace}})
    return out


class OwnerRetry:
    """Since when each job's object could not be read (bounded: the oldest entries go)."""

    def __init__(self, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._since: dict[str, float] = {}

    def still_refusing(self, job: str) -> bool:
        now = self._clock()
        since = self._since.setdefault(job, now)
        if len(self._since) > 4096:
            del self._since[next(iter(self._since))]
        return now - since < self.window

    def recovered(self, job: str) -> None:
        self._since.pop(job, None)


class Once:
    """Which keys were seen (bounded: the least recent go first)."""

    def __init__(self, size: int = 4096) -> None:
        self._seen: Lru[tuple[str, ...], bool] = Lru(size)

    def first(self, key: tuple[str, ...]) -> bool:
        """True the first time `key` is given."""
        if self._seen.get(key):
            return False
        self._seen.put(key, True)
        return True


def _root_owner(pod: Mapping[str, Any], owners: list[dict[str, Any]]
                ) -> Mapping[str, Any] | None:
    """A reference to the outermost owner read (the job), else the pod's controller."""
    if not owners:
        return controller_ref(pod)
    root = owners[-1]
    meta = root.get("metadata") or {}
    return {"apiVersion": root.get("apiVersion"), "kind": root.get("kind"),
            "name": meta.get("name"), "uid": meta.get("uid")}


def _strip_protected_annotations(pod: dict[str, Any]
                                 ) -> tuple[dict[str, Any], list[str], list[dict[str, Any]]]:
    """The pod without the muster.io/ annotations its creator may not set (every one the
    webhook does not write itself: keys.user_may_create_with), which of them it had, and the
    ops that remove them from the original."""
    found = sorted(key for key in _annotations(pod)
                   if isinstance(key, str) and not user_may_create_with(key))
    if not found:
        return pod, [], []
    ops = [{"op": "remove", "path": "/metadata/annotations/" + jsonpatch.escape(key)}
           for key in found]
    return jsonpatch.apply_patch(pod, ops), found, ops


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
        self._background: set[asyncio.Task[Any]] = set()
        self.owner_retry = OwnerRetry(config.owner_retry_seconds)
        #: (policy set, job, policy) whose audit Event was recorded: one per job, not per pod
        self.audit_events = Once()
        #: set at shutdown: /readyz reports not ready while in-flight requests finish
        self.draining = False
        self.outcomes = OutcomeLog()

    def ready(self) -> bool:
        return not self.draining and self.policies.current is not None and (
            self.context is None or self.context.ready())

    async def mutate(self, review: AdmissionReview, budget: float, *, fail_closed: bool = False
                     ) -> tuple[dict[str, Any], str]:
        """The response body and its outcome label for /mutate/pods, or for
        /mutate/pods/fail-closed (`fail_closed`: the namespaces whose pods must not run without
        their policies, which the chart sends there with failurePolicy Fail)."""
        result = await self._mutate(review, budget)
        if fail_closed and result.fail_open:
            self._refuse_failing_closed(review, result)
        if result.fail_open:
            self.metrics.fail_open.labels(result.fail_open).inc()
        if result.allowed and (result.fail_open or result.warnings):
            pod = review.request.object if isinstance(review.request.object, dict) else {}
            self.outcomes.admitted(review.request.uid, _pod_namespace(review, pod), pod,
                                   fail_open=result.fail_open, warnings=result.warnings)
        for name in result.policies:
            self.metrics.count_decision(name)
        audit = {"policy": ",".join(result.policies)} if result.policies else None
        if audit and result.overrides:  # which policy lost which field, for the audit log
            audit["overridden"] = "; ".join(o.describe() for o in result.overrides)
        body = response(review, allowed=result.allowed, patch=result.patch,
                        patch_json=result.patch_json, warnings=result.warnings, audit=audit,
                        message=result.message, status_code=result.status_code)
        if not result.allowed:
            outcome = "denied"
        elif result.fail_open:
            outcome = "fail_open"
        else:
            outcome = "patched" if result.patch else "allowed"
        return body, outcome

    def _refuse_failing_closed(self, review: AdmissionReview, result: _Result) -> None:
        """What would be admitted failing open is refused, as the API server refuses the pod
        when the webhook is unreachable: its controller creates it again (503: retry)."""
        reason = result.fail_open or "error"
        self.metrics.fail_closed.labels(reason).inc()
        pod = review.request.object if isinstance(review.request.object, dict) else {}
        namespace = _pod_namespace(review, pod)
        self.outcomes.refused_closed(review.request.uid, namespace, pod, reason=reason,
                                     warnings=result.warnings)
        why = _FAILED.get(reason, reason)
        result.allowed, result.status_code, result.fail_open = False, 503, None
        result.patch, result.patch_json, result.policies, result.overrides = [], None, (), ()
        result.message = (f"muster: namespace {namespace} admits no pod without its policies "
                          f"(fail-closed), and they could not be applied: {why}; retry")

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
            clean_pod, found, strip_ops = _strip_protected_annotations(pod)
        except jsonpatch.JsonPatchError:  # annotations not an object: let the API server reject
            return _Result()
        if strip_ops and self.config.on_user_assignment == "deny":
            return _Result(allowed=False, message=(
                f"only Muster's binder and node agent write {' and '.join(found)}; "
                f"remove {'them' if len(found) > 1 else 'it'} from the pod"))
        result = _Result(patch=list(strip_ops))
        for key in found:
            result.warnings.append(f"muster: removed {key}, which only Muster's binder and "
                                   "node agent may set")
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
            result.policies, result.overrides = (), ()
            result.fail_open = "deadline"
        except Exception:
            log.exception("admission decision failed; admitting the pod unchanged",
                          extra={"uid": req.uid, "namespace": namespace})
            result.warnings.append("muster: internal error while applying policies; pod "
                                   "admitted unchanged")
            result.patch, result.patch_json = list(strip_ops), None
            result.policies, result.overrides = (), ()
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
        ns_labels, owners, unread = await self._inputs(pod, namespace, deadline, result)
        # The pods of one job share one outcome (see webhook.policy.outcome).
        decided, ops, patch_json = evaluate_and_render(
            pod, namespace_labels=ns_labels, owners=owners, policies=policies,
            priorities=self.context.priorities() if self.context else NO_PRIORITIES)
        if self.context is not None and self._hold_for_owner(pod, namespace, decided,
                                                             unread, result):
            return
        decision = await self._gang_available(pod, namespace, decided, deadline, result)
        if decision is None:
            return
        dry_run = bool(review.request.dry_run)
        if decision.withdrawn is not None and self.context is not None:
            await self._stand_aside(pod, decision.withdrawn, deadline=deadline,
                                    dry_run=dry_run, result=result)
        decision = await self._pod_group(pod, namespace, decision, deadline=deadline,
                                         dry_run=dry_run, result=result)
        if decision is not decided:
            ops = tuple(render_patch(pod, decision)) if decision.changes_pod else ()
            patch_json = b""  # encoded by the response from `ops`
        if decision.audits:
            self._record_audits(review, pod, namespace=namespace, owners=owners,
                                policies=policies, decision=decision)
        result.warnings.extend(decision.warnings)
        if not result.patch and patch_json:
            result.patch_json = patch_json
        result.patch.extend(ops)
        result.policies, result.overrides = decision.policies, decision.overrides

    async def _inputs(self, pod: dict[str, Any], namespace: str, deadline: float,
                      result: _Result) -> tuple[Mapping[str, str], list[dict[str, Any]],
                                                Mapping[str, Any] | None]:
        """The namespace's labels, the pod's owners, and the owner whose read failed."""
        if self.context is None:
            return {"kubernetes.io/metadata.name": namespace}, [], None
        ns_labels = self.context.namespace_labels(namespace)
        if ns_labels is None:
            result.warnings.append(f"muster: labels of namespace {namespace} unknown; "
                                   "namespaceSelector policies may not apply")
            result.fail_open = "namespace"
            ns_labels = {"kubernetes.io/metadata.name": namespace}
        cached = self.context.cached_owners(pod, namespace)
        if cached is not None:
            return ns_labels, cached, None
        # a little is kept back: a slow owner read still gets a decision in time
        owners, owner_warnings, unread = await self.context.owners(
            pod, namespace, deadline - _OWNER_MARGIN)
        result.warnings.extend(owner_warnings)
        if unread is not None:
            result.fail_open = "owner"
        return ns_labels, owners, unread

    async def _gang_available(self, pod: dict[str, Any], namespace: str, decision: Decision,
                              deadline: float, result: _Result) -> Decision | None:
        """The decision as the cluster can serve its gang (its queue, its API); None when the
        pod is refused."""
        spec = decision.pod_group
        if self.context is None or spec is None:
            return decision
        if spec.backend == "volcano":
            return await self._queue_available(pod, namespace, decision, spec, deadline)
        if spec.backend == "kubernetes":
            return await self._api_available(pod, namespace, decision, spec, deadline=deadline,
                                             result=result)
        return decision

    async def _queue_available(self, pod: dict[str, Any], namespace: str, decision: Decision,
                               spec: PodGroupSpec, deadline: float) -> Decision:
        """A Volcano gang whose queue is missing or not Open: the fallback queue, or none."""
        assert self.context is not None
        verdict = await self.context.queue_verdict(spec, deadline - _OWNER_MARGIN)
        if verdict is None or not verdict.changed:
            return decision
        what = "queue_fallback" if verdict.queue is not None else "queue_without_gang"
        self.metrics.gang_interventions.labels(what).inc()
        self.context.report(_involved(pod, namespace, _job_of(pod, spec)),
                            "GangQueueUnavailable", verdict.reason)
        return (with_queue(decision, verdict.queue) if verdict.queue is not None
                else without_gang(decision, f"muster: {verdict.reason}"))

    async def _api_available(self, pod: dict[str, Any], namespace: str, decision: Decision,
                             spec: PodGroupSpec, *, deadline: float,
                             result: _Result) -> Decision | None:
        """A native gang: the shape the cluster serves, or (none served) refused or no gang,
        as the policy says."""
        assert self.context is not None
        native = await self.context.native_verdict(spec, deadline - _OWNER_MARGIN)
        if native is None:
            return decision
        if native.api is not None:
            # an older shape (1.35)
            return with_api(decision, native.api) if native.api != api_of(spec) else decision
        self.context.report(_involved(pod, namespace, _job_of(pod, spec)),
                            "GangApiUnavailable", native.reason)
        if native.refuse:
            self.metrics.gang_interventions.labels("native_api_denied").inc()
            result.allowed, result.status_code = False, 503
            result.message = f"muster: {native.reason}"
            return None
        self.metrics.gang_interventions.labels("native_api_without_gang").inc()
        return without_gang(decision, f"muster: {native.reason}")

    async def _pod_group(self, pod: dict[str, Any], namespace: str, decision: Decision, *,
                         deadline: float, dry_run: bool, result: _Result) -> Decision:
        """Make the gang's PodGroup exist before its pod; the decision without its gang when
        the name is taken by a PodGroup whose owner cannot be read."""
        spec = decision.pod_group
        if spec is None:
            return decision
        if self.context is None:
            result.warnings.append(f"muster: no cluster connection; PodGroup "
                                   f"{spec.namespace}/{spec.name} was not created")
            result.fail_open = "podgroup"
            return decision
        if not dry_run and self.context.pod_group_current(spec):
            return decision
        # The write is shielded: if the deadline cuts the wait short it still completes in the
        # background, so the gang's next pod finds the PodGroup in place.
        task = asyncio.ensure_future(self.context.ensure_pod_group(spec, dry_run=dry_run))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        try:
            async with asyncio.timeout_at(deadline):
                ensured = await asyncio.shield(task)
        except TimeoutError:
            result.warnings.append(f"muster: PodGroup {spec.namespace}/{spec.name} not "
                                   "confirmed before the webhook deadline; still being written")
            result.fail_open = "deadline"
            return decision
        self._report_podgroup(pod, namespace, spec, ensured, result)
        return without_gang(decision, f"muster: {ensured.unreadable}") if ensured.unreadable \
            else decision

    async def _stand_aside(self, pod: dict[str, Any], gone: Withdrawal, *, deadline: float,
                           dry_run: bool, result: _Result) -> None:
        """A later webhook put the pod in another gang: count it and, except on a dry run (no
        side effects), delete Muster's PodGroup for the gang if no pod joins it. Shielded like
        a PodGroup write: past the deadline it still finishes, and the pod keeps its patch."""
        self.metrics.gang_interventions.labels("stood_aside").inc()
        if dry_run:
            return
        task = asyncio.ensure_future(self._withdraw(pod, gone))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        try:
            async with asyncio.timeout_at(deadline):
                await asyncio.shield(task)
        except TimeoutError:
            result.warnings.append(f"muster: PodGroup {gone.namespace}/{gone.name}, which no "
                                   "longer gangs this pod, not checked before the webhook "
                                   "deadline; still being checked")

    async def _withdraw(self, pod: dict[str, Any], gone: Withdrawal) -> None:
        assert self.context is not None
        try:
            deleted = await self.context.withdraw_pod_group(gone)
        except ApiError as exc:  # it stays; the gang's next pod tries again
            log.warning("PodGroup of a gang Muster stood aside from not deleted", extra={
                "podgroup": f"{gone.namespace}/{gone.name}", "error": str(exc)})
            return
        if deleted is not None:
            ref = gone.owner.as_owner_reference() if gone.owner else controller_ref(pod)
            self.context.report(_involved({}, gone.namespace, ref), "GangStoodAside",
                                f"muster: {deleted}")

    def _hold_for_owner(self, pod: dict[str, Any], namespace: str, decision: Decision,
                        unread: Mapping[str, Any] | None, result: _Result) -> bool:
        """A gang policy needs the job's object and reading it failed: refuse the pod (the
        job's controller retries) for `owner_retry_seconds`, then admit it without the gang.
        True when the pod is refused."""
        assert self.context is not None
        ref = controller_ref(pod)
        job = f"{namespace}/{ref.get('uid')}" if ref is not None else ""
        if ref is None or unread is None or not decision.gang_blocked:
            if ref is not None and unread is None:
                self.owner_retry.recovered(job)
            return False
        if not self.context.ready():
            return False  # caches not synced: this server is the problem, not the job
        what = f"{unread.get('kind')} {namespace}/{unread.get('name')}"
        involved = _involved(pod, namespace, unread)
        if self.owner_retry.still_refusing(job):
            self.metrics.gang_interventions.labels("owner_unavailable_denied").inc()
            result.allowed, result.status_code, result.fail_open = False, 503, None
            result.message = (f"muster: {what} could not be read to size this pod's gang "
                              f"({decision.gang_blocked}); the pod is refused so that it does "
                              "not join half a gang: retry")
            self.context.report(involved, "GangOwnerUnavailable", result.message)
            return True
        self.metrics.gang_interventions.labels("owner_unavailable_admitted").inc()
        self.context.report(involved, "GangOwnerUnavailable", (
            f"muster: {what} could not be read for {self.owner_retry.window:g} s; pod admitted "
            "without its gang"))
        return False

    def _record_audits(self, review: AdmissionReview, pod: dict[str, Any], *, namespace: str,
                       owners: list[dict[str, Any]], policies: PolicySet,
                       decision: Decision) -> None:
        """What the policies in audit or warn mode would have done: counted per pod, and an
        Event on the pod's job once per policy (a 1,000-pod job makes one Event each)."""
        for audit in decision.audits:
            for action in audit.actions or ("none",):
                self.metrics.count_audit(audit.policy, action)
        if self.context is None or review.request.dry_run:
            return  # sideEffects NoneOnDryRun: a dry run records nothing
        meta = pod.get("metadata")
        meta = meta if _is_map(meta) else {}
        name = meta.get("name") or f"{meta.get('generateName') or ''}*"
        ref = _root_owner(pod, owners)
        if ref is not None and ref.get("uid"):
            target, involved = str(ref.get("uid")), _involved({}, namespace, ref)
        elif meta.get("name"):
            target, involved = f"{namespace}/{name}", _involved(pod, namespace, None)
        else:
            return  # nothing stored to put an Event on: the metric says it
        for audit in decision.audits:
            key = (policies.digest, target, audit.policy)
            if self.audit_events.first(key):
                # named by what it is about, so the other replicas' copy is a conflict
                once = hashlib.sha256("\0".join(key).encode()).hexdigest()[:16]
                self.context.report(involved, EVENT_REASON, event_message(audit, str(name)),
                                    type_="Normal", once_as=f"muster-audit.{once}")

    def _report_podgroup(self, pod: dict[str, Any], namespace: str, spec: PodGroupSpec,
                         ensured: Ensured, result: _Result) -> None:
        assert self.context is not None
        if ensured.refused:
            self.metrics.gang_interventions.labels("podgroup_foreign_denied").inc()
            result.allowed, result.status_code = False, 409
            result.message = f"muster: {ensured.refused}"
            self.context.report(_involved(pod, namespace, _job_of(pod, spec)),
                                "GangPodGroupConflict", ensured.refused)
            return
        if ensured.unreadable:
            self.metrics.gang_interventions.labels("podgroup_owner_unreadable").inc()
            self.context.report(_involved(pod, namespace, _job_of(pod, spec)),
                                "GangPodGroupOwnerUnreadable", ensured.unreadable)
        if ensured.replaced:
            self.metrics.gang_interventions.labels("podgroup_replaced").inc()
            self.context.report(_involved({}, namespace, _job_of(pod, spec)),
                                "GangPodGroupReplaced", ensured.replaced)
        if ensured.warnings:
            result.fail_open = "podgroup"
        result.warnings.extend(ensured.warnings)

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
            loaded = await asyncio.to_thread(load_policy_texts, data)
        except PolicyError as exc:
            return response(review, allowed=False, status_code=422,
                            message=f"invalid Muster policies:\n{exc}"), "denied"
        unserved = await self._unserved_native_gangs(loaded)
        if unserved:
            return response(review, allowed=False, status_code=422,
                            message=f"invalid Muster policies for this cluster:\n{unserved}"
                            ), "denied"
        return response(review, allowed=True), "allowed"

    async def _unserved_native_gangs(self, policies: PolicySet) -> str:
        """Why policies whose native gangs would refuse every pod cannot be used here: the
        cluster serves no Workload API ("" when it does, when none would, or when discovery
        does not answer)."""
        names = [p.name for p in policies.policies if p.spec.gang is not None
                 and p.spec.gang.backend == "kubernetes" and p.spec.gang.unavailableApi == "Refuse"]
        if not names or self.context is None:
            return ""
        probe = PodGroupSpec("kubernetes", "probe", "", 1, unavailable_api="Refuse")
        deadline = asyncio.get_running_loop().time() + 2.0
        verdict = await self.context.native_verdict(probe, deadline)
        if verdict is None or verdict.api is not None:
            return ""
        return (f"policies {', '.join(names)}: gang backend kubernetes, but this cluster serves "
                f"no Workload API ({', '.join(VERSIONS)} of scheduling.k8s.io; feature gate "
                "GenericWorkload and --runtime-config on the API server): every pod of their "
                "jobs would be refused. Turn the API on, or set gang.unavailableApi: WithoutGang")

    async def drain(self, grace: float) -> None:
        """Let shielded PodGroup writes finish (graceful shutdown)."""
        if self._background:
            await asyncio.wait(list(self._background), timeout=grace)

