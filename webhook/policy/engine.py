"""The policy engine: (pod, namespace labels, owners, policies) → Decision. Pure; never raises.

Matching policies are merged field by field, the higher spec.priority winning (equal priorities
cannot disagree: the loader refuses such conflicts). The job's own runPolicy.schedulingPolicy wins
over any policy. Applying the engine to a pod it already mutated yields the same Decision, so
render_patch then returns an empty patch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from webhook import keys
from webhook.policy import native
from webhook.policy.audit import audit_of
from webhook.policy.compiled import CompiledPolicy, MatchInput
from webhook.policy.decision import (
    Backend,
    Decision,
    Override,
    PodGroupSpec,
    PolicyMatch,
    Withdrawal,
)
from webhook.policy.jsonshape import as_str
from webhook.policy.network import network_ask
from webhook.policy.podview import TOPOLOGY_TOLERATION, PodView, view_of
from webhook.policy.policyset import PolicySet
from webhook.policy.workload import NO_PRIORITIES, POD, Priorities, Workload

_DEFAULT_SCHEDULER: dict[str, str | None] = {
    # coscheduling usually runs inside the default scheduler: leave schedulerName alone
    "volcano": "volcano", "coscheduling": None, "muster": keys.DEFAULT_BINDER_SCHEDULER_NAME,
    "kubernetes": None}
#: preferred node affinity weights of `topology.preferredModels`, first model first
MAX_MODEL_WEIGHT, MODEL_WEIGHT_STEP, MIN_MODEL_WEIGHT = 100, 10, 10
_GROUP_KEYS = (  # (where, key, backend) of every key that puts a pod into a gang
    ("annotation", keys.VOLCANO_GROUP_ANNOTATION, "volcano"),
    ("label", keys.COSCHEDULING_GROUP_LABEL, "coscheduling"),
    ("label", keys.LEGACY_COSCHEDULING_GROUP_LABEL, None),
    ("annotation", keys.ANN_GANG_NAME, "muster"),
)


def _merge(matched: Sequence[CompiledPolicy]) -> dict[str, tuple[Any, str]]:
    """field → (value, policy name); the first writer wins (policies come highest priority
    first)."""
    merged: dict[str, tuple[Any, str]] = {}
    for compiled in matched:
        name = compiled.policy.name
        for key, value in compiled.writes:
            if key not in merged:
                merged[key] = (value, name)
    return merged


def _overrides(matched: Sequence[CompiledPolicy]) -> tuple[Override, ...]:
    """Each field a policy writes that an earlier one (higher priority) wrote differently.
    Equal values are no override: both policies ask the same."""
    first: dict[str, tuple[Any, str]] = {}
    out: list[Override] = []
    for compiled in matched:
        name = compiled.policy.name
        for key, value in (*compiled.writes,
                           *((f"labels.{k}", v) for k, v in compiled.labels.items()),
                           *((f"annotations.{k}", v) for k, v in compiled.annotations.items())):
            won, by = first.setdefault(key, (value, name))
            if by != name and won != value:
                out.append(Override(name, key, by))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class _Writes:
    """What a set of matched policies writes, independent of the pod (computed once per set)."""

    merged: Mapping[str, tuple[Any, str]]
    value: Mapping[str, Any]
    names: tuple[str, ...]
    #: the policies' static labels/annotations, the highest priority winning
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    policy_annotation: str
    overrides: tuple[Override, ...]


def _writes(policies: PolicySet, matched: list[CompiledPolicy]) -> _Writes:
    # Keyed by the identities of the matched policies: they live (and stay unchanged) as long
    # as the policy set that holds this memo.
    memo = policies.index.merged_writes
    key = tuple(map(id, matched))
    found = memo.get(key)
    if found is None:
        merged = _merge(matched)
        labels: dict[str, str] = {}
        annotations: dict[str, str] = {}
        for compiled in reversed(matched):  # the highest priority last, so that it wins
            labels.update(compiled.labels)
            annotations.update(compiled.annotations)
        names = tuple(c.policy.name for c in matched)
        found = _Writes(merged, {k: v for k, (v, _) in merged.items()}, names, labels,
                        annotations, ",".join(names), _overrides(matched))
        memo.put(key, found)
    return found


def evaluate(pod: Mapping[str, Any], *, namespace_labels: Mapping[str, str],
             owners: Sequence[Mapping[str, Any]], policies: PolicySet,
             priorities: Priorities = NO_PRIORITIES) -> Decision:
    """The Decision for a pod being created. `owners` are the owner objects from the pod's
    controller up to the root (e.g. [Job, MPIJob] for an MPI launcher); when they are missing
    the engine falls back on the pod's ownerReferences and labels and says so in a warning.

    `Decision.matches` lists the policies examined: those whose `namespaces` exclude the pod's
    namespace are skipped by the index (`explain` shows every policy)."""
    return decide(view_of(pod, namespace_labels=namespace_labels, owners=owners,
                          index=policies.index, priorities=priorities), policies)


def decide(view: PodView, policies: PolicySet) -> Decision:
    """`evaluate` on the pod's view: all the engine reads of a pod is in it."""
    matches, matched = _match(view, policies)
    if policies.index.rehearsed:
        return _rehearse(view, policies, matches, matched)
    return _apply(view, policies, matches, matched)


def _rehearse(view: PodView, policies: PolicySet, matches: tuple[PolicyMatch, ...],
              matched: list[CompiledPolicy]) -> Decision:
    """Only the enforced policies apply, as if the others were not loaded (so a policy in audit
    or warn mode never overrides an enforced one); each other one is told what it would change
    if enforced alongside them, and a warn policy's user is warned."""
    enforced = [c for c in matched if c.policy.spec.enforcement == "enforce"]
    decision = _apply(view, policies, matches, enforced)
    if len(enforced) == len(matched):
        return decision
    audits = []
    for compiled in matched:
        mode = compiled.policy.spec.enforcement
        if mode != "enforce":
            would = _apply(view, policies, matches,
                           [c for c in matched
                            if c is compiled or c.policy.spec.enforcement == "enforce"])
            audits.append(audit_of(compiled.policy.name, mode, decision, would, view.shape))
    warned = tuple(f"muster: {a.summary}" for a in audits if a.mode == "warn")
    return replace(decision, audits=tuple(audits), warnings=decision.warnings + warned)


def _apply(view: PodView, policies: PolicySet, matches: tuple[PolicyMatch, ...],
           matched: list[CompiledPolicy]) -> Decision:
    """The Decision of the `matched` policies (by priority)."""
    draft = _Draft()
    for key in keys.PROTECTED_ANNOTATIONS:
        if view.shape.annotation(key) is not None:
            draft.annotations[key] = None
            draft.warnings.append(f"removed {key}: only Muster's binder and node agent write it")
    if not matched:
        return Decision(matches=matches, annotations=draft.annotations,
                        warnings=tuple(draft.warnings))
    writes = _writes(policies, matched)
    backend: Backend | None = writes.value.get("gang.backend")
    if backend is not None and view.work.kind == POD and backend != "muster":
        _lone_pod(draft, view, writes, backend)
    elif backend is not None:
        _job_gang(draft, view, writes, backend)
    current = view.shape.scheduler_name
    if draft.scheduler_name and current not in (None, "default-scheduler",
                                                draft.scheduler_name):
        draft.warnings.append(f"schedulerName {current!r} replaced by "
                              f"{draft.scheduler_name!r} for backend {backend}")
    _topology_request(draft, writes, view)
    _istio_opt_out(draft, writes)
    draft.labels.update(writes.labels)
    draft.annotations.update(writes.annotations)
    draft.annotations[keys.ANN_POLICY] = writes.policy_annotation
    return Decision(
        matches=matches, policies=writes.names, pod_group=draft.pod_group,
        labels=draft.labels, annotations=draft.annotations, scheduler_name=draft.scheduler_name,
        tolerations=tuple(draft.tolerations), node_affinity=tuple(draft.node_affinity),
        node_preferences=tuple(draft.node_preferences), warnings=tuple(draft.warnings),
        gang_blocked=draft.gang_blocked,
        overrides=writes.overrides, network=draft.network, withdrawn=draft.withdrawn)


def _match(view: PodView, policies: PolicySet
           ) -> tuple[tuple[PolicyMatch, ...], list[CompiledPolicy]]:
    """(the record of every policy examined, the policies that match, by priority)."""
    match_input = _match_input(view)
    matches: list[PolicyMatch] = []
    matched: list[CompiledPolicy] = []
    for compiled in policies.index.candidates(view.namespace):
        failed = compiled.first_failure(match_input)
        if failed:
            matches.append(compiled.failed_records[failed])
        else:
            matches.append(compiled.matched_record)
            matched.append(compiled)
    return tuple(matches), matched


@dataclass(slots=True)
class _Draft:
    """The Decision being built, step by step."""

    labels: dict[str, str | None] = field(default_factory=dict)
    annotations: dict[str, str | None] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    scheduler_name: str | None = None
    tolerations: list[Mapping[str, Any]] = field(default_factory=list)
    node_affinity: list[Mapping[str, Any]] = field(default_factory=list)
    node_preferences: list[Mapping[str, Any]] = field(default_factory=list)
    pod_group: PodGroupSpec | None = None
    gang_blocked: str | None = None
    network: str | None = None
    withdrawn: Withdrawal | None = None


def _lone_pod(draft: _Draft, view: PodView, writes: _Writes, backend: Backend) -> None:
    """A pod outside any job needs no gang, and a PodGroup made for it could not be owned by it
    (no uid yet at admission), so it would outlive the pod. Volcano still schedules it: its
    controller creates the pod's own PodGroup, taking the queue from the annotation."""
    if view.work.solo:
        draft.warnings.append(f"gang policy {writes.merged['gang.backend'][1]} not applied: "
                              f"{view.work.solo}")
    if backend == "volcano":
        value = writes.value
        draft.scheduler_name = value.get("gang.schedulerName") or "volcano"
        queue = view.annotation_map().get(keys.VOLCANO_QUEUE_ANNOTATION) or value.get(
            "gang.queue")
        if queue:
            draft.annotations[keys.VOLCANO_QUEUE_ANNOTATION] = queue


def _job_gang(draft: _Draft, view: PodView, writes: _Writes, backend: Backend) -> None:
    """The job's gang: its PodGroup spec and the pod's keys to join it."""
    work = view.work
    draft.warnings.extend(work.warnings)
    pod_group: PodGroupSpec | None = None
    if work.solo:  # a job pod that is no member of its job's gang (a muster gang of one)
        why_not = work.solo
    else:
        try:
            pod_group, why_not = _gang(backend, writes, work,
                                       namespace=view.namespace, pod_labels=view.label_map(),
                                       pod_ann=view.annotation_map(), warnings=draft.warnings,
                                       replica_priorities=view.replica_priorities,
                                       native_ref=view.shape.native_ref)
        except _NeedsJob as exc:
            why_not = str(exc)
            draft.gang_blocked = why_not
    if pod_group is None:
        draft.warnings.append(f"gang policy {writes.merged['gang.backend'][1]} not applied: "
                              f"{why_not}")
        _withdraw(draft, view, backend)
        return
    draft.scheduler_name = writes.value.get("gang.schedulerName") or _DEFAULT_SCHEDULER[backend]
    _join(pod_group, draft.labels, draft.annotations)
    draft.pod_group = pod_group
    if backend == "muster":
        draft.tolerations.append(TOPOLOGY_TOLERATION)
    elif pod_group.owner is None:
        # The job's uid is unknown (its object could not be read): a PodGroup made now could
        # not be owned by the job and would outlive it. The pod joins the group; the job's
        # other pods, admitted with their owner, create it.
        draft.gang_blocked = (f"PodGroup {pod_group.name} not created from this pod: the "
                              f"{work.kind} object is not available to own it")
        draft.warnings.append(draft.gang_blocked)
        draft.pod_group = None


def _withdraw(draft: _Draft, view: PodView, backend: Backend) -> None:
    """Stand aside from the gang an earlier pass joined the pod to, when a later webhook (the
    job's own controller: LeaderWorkerSet's Volcano provider) has since put the pod in another
    gang through that backend's key. The pod is in the other gang whatever Muster does, so
    Muster's record goes, the other key stays, and admission deletes Muster's PodGroup if no pod
    joins it (one that no pod joins would hold its minResources against the queue)."""
    name = view.work.name
    ann = view.annotation_map()
    if not name or not _ours(backend, name, ann):
        return
    for where, key, key_backend in _GROUP_KEYS:
        present = (view.label_map() if where == "label" else ann).get(key)
        if key_backend == backend and present is not None and present != name:
            draft.annotations[keys.ANN_JOINED_GANG] = None
            draft.withdrawn = Withdrawal(backend, name, view.namespace, view.work.owner,
                                         f"gang {present!r} ({where} {key})")
            return


def _topology_request(draft: _Draft, writes: _Writes, view: PodView) -> None:
    """The topology request for the binder, which only a muster gang gets. On a muster gang
    the binder reads no request but this one: the pod's own is removed when no policy writes
    one, so that nobody steers placement beyond what the policies allow."""
    value = writes.value
    mode = value.get("topology.mode", "off")
    muster_gang = draft.pod_group is not None and draft.pod_group.backend == "muster"
    if mode == "off":
        if muster_gang and view.shape.annotation(keys.ANN_GPU_TOPOLOGY) is not None:
            draft.annotations[keys.ANN_GPU_TOPOLOGY] = None
            draft.warnings.append(f"removed {keys.ANN_GPU_TOPOLOGY}: no policy asks for "
                                  "topology placement")
        return
    if not muster_gang:
        draft.warnings.append(f"topology policy {writes.merged['topology.mode'][1]} not "
                              "applied: it needs a gang with backend muster")
        return
    request: dict[str, Any] = {
        "v": 1, "mode": mode, "singleNode": bool(value.get("topology.singleNode")),
        "minRingGBps": value.get("topology.minRingGBps")}
    by = writes.merged.get("topology.network", writes.merged["topology.mode"])[1]
    ask = network_ask(value.get("topology.network"), by, view.annotation_map(),
                      view.work.facts.network if view.work.facts else None)
    draft.warnings.extend(ask.warnings)
    if ask.request is not None:
        request["network"] = ask.request
        draft.network = ask.why
    draft.annotations[keys.ANN_GPU_TOPOLOGY] = json.dumps(request, separators=(",", ":"))
    models = value.get("topology.allowedModels") or []
    allowed = sorted({keys.gpu_model_label_value(m) for m in models})
    if models:
        draft.node_affinity.append({
            "key": keys.LABEL_GPU_MODEL, "operator": "In", "values": allowed})
    _preferred_models(draft, value.get("topology.preferredModels") or [], allowed,
                      by=writes.merged.get("topology.preferredModels", ("", ""))[1])


def _preferred_models(draft: _Draft, models: list[str], allowed: list[str], *, by: str) -> None:
    """Preferred node affinity, one term per model: the first weighs most (100, then 10 less
    each, at least 10). A model the allowed ones exclude is dropped, and said (two policies
    may write the two lists)."""
    values = list(dict.fromkeys(keys.gpu_model_label_value(m) for m in models))
    kept = [v for v in values if not allowed or v in allowed]
    if len(kept) < len(values):
        draft.warnings.append(f"preferredModels of policy {by}: "
                              f"{', '.join(v for v in values if v not in kept)} not in "
                              "allowedModels, not preferred")
    draft.node_preferences.extend(
        {"weight": max(MIN_MODEL_WEIGHT, MAX_MODEL_WEIGHT - MODEL_WEIGHT_STEP * i),
         "preference": {"matchExpressions": [
             {"key": keys.LABEL_GPU_MODEL, "operator": "In", "values": [v]}]}}
        for i, v in enumerate(kept))


def _istio_opt_out(draft: _Draft, writes: _Writes) -> None:
    opt_out = writes.value.get("istio.optOut", "none")
    if opt_out in ("sidecar", "both"):
        draft.labels[keys.ISTIO_INJECT] = "false"
        draft.annotations[keys.ISTIO_INJECT] = "false"
    if opt_out in ("ambient", "both"):
        draft.labels[keys.ISTIO_DATAPLANE_MODE] = keys.ISTIO_DATAPLANE_MODE_NONE


class _NeedsJob(Exception):
    """The gang's size needs the job's object, which was not read (Decision.gang_blocked)."""


def _gang(backend: Backend, writes: _Writes, work: Workload, *, namespace: str,
          pod_labels: Mapping[str, str], pod_ann: Mapping[str, str], warnings: list[str],
          replica_priorities: tuple[int, ...], native_ref: Any
          ) -> tuple[PodGroupSpec | None, str]:
    value = writes.value
    name = work.name
    if not name:
        return None, "the pod has no name yet (generateName) and no owner to name a gang after"
    joined = _joined_elsewhere(backend, name, pod_labels, pod_ann) or (
        _native_joined_elsewhere(backend, name, pod_ann, native_ref))
    if joined:
        return None, joined
    min_member = _min_member(value, work, warnings)
    job_min = work.scheduling_policy.get("minAvailable")
    # a native gang's minCount must be positive
    if min_member < 1 and not (job_min == 0 and backend not in ("muster", "kubernetes")):
        return None, f"the {work.kind} has no pods to gang"
    queue, priority_class, fallback = _volcano_fields(backend, value, work)
    return PodGroupSpec(backend=backend, name=name, namespace=namespace, min_member=min_member,
                        min_resources=_min_resources(backend, value, work, min_member,
                                                     replica_priorities),
                        queue=queue, priority_class=priority_class,
                        timeout_seconds=_timeout(backend, value, work), owner=work.owner,
                        fallback_queue=fallback,
                        unavailable_api=value.get("gang.unavailableApi", "Refuse")
                        if backend == "kubernetes" else None,
                        preemption=value.get("gang.preemption") if backend == "muster"
                        else None), ""


def _joined_elsewhere(backend: Backend, name: str, pod_labels: Mapping[str, str],
                      pod_ann: Mapping[str, str]) -> str | None:
    """Why the pod already belongs to another gang, or None. A group key from another
    controller (e.g. the MPI operator's --gang-scheduling, Trainer's coscheduling plugin) stays,
    even when it names the job as ours would; our own keys, from an earlier pass over the same
    pod (reinvocation), are recognised by the record of the gang we joined it to."""
    ours = _ours(backend, name, pod_ann)
    for where, key, key_backend in _GROUP_KEYS:
        present = (pod_labels if where == "label" else pod_ann).get(key)
        if present is not None and not (ours and key_backend == backend and present == name):
            return f"the pod already joins gang {present!r} through {where} {key}"
    return None


def _native_joined_elsewhere(backend: Backend, name: str, pod_ann: Mapping[str, str],
                             native_ref: Any) -> str | None:
    """Why the pod already belongs to a native gang it was not given by us (e.g. by the Job
    controller's WorkloadWithJob), or None; `native_ref` is `PodShape.native_ref`."""
    if native_ref is None:
        return None
    ours = backend == "kubernetes" and _ours(backend, name, pod_ann)
    if ours and native_ref in (native.frozen_reference(name, api) for api in native.APIS):
        return None
    return f"the pod already joins a native gang through spec.{native_ref[0]}"


def _ours(backend: Backend, name: str, pod_ann: Mapping[str, str]) -> bool:
    """Whether an earlier pass joined the pod to this gang itself (`_join`'s record; the audit
    annotation is no proof: it is written on pods left in another controller's gang too)."""
    return pod_ann.get(keys.ANN_JOINED_GANG) == keys.joined_gang(backend, name)


def _min_member(value: Mapping[str, Any], work: Workload, warnings: list[str]) -> int:
    """The job's own minAvailable (0 too: the operator then makes a PodGroup that waits for
    none), else the policy's: auto, a count capped at the job's size, or a percentage."""
    job_min = work.scheduling_policy.get("minAvailable")
    if isinstance(job_min, int) and not isinstance(job_min, bool) and job_min >= 0:
        return job_min
    wanted = value.get("gang.minAvailable", "auto")
    total = work.members
    if wanted == "auto":
        if work.auto_min_member is None:
            raise _NeedsJob(f"minAvailable auto needs the {work.kind} object to count its pods")
        return work.auto_min_member
    if isinstance(wanted, int):
        if total is not None and wanted > total:
            warnings.append(f"minAvailable {wanted} is more than the job's {total} pods: "
                            f"using {total}")
            return total
        return wanted
    if total is None:
        raise _NeedsJob(f"minAvailable {wanted} needs the {work.kind} object to count its pods")
    return max(1, math.ceil(int(wanted[:-1]) * total / 100))


def _volcano_fields(backend: Backend, value: Mapping[str, Any], work: Workload
                    ) -> tuple[str | None, str | None, str | None]:
    """(queue, priority class, fallback queue): the job's own first, then the policy's."""
    if backend != "volcano":
        return None, None, None
    sp = work.scheduling_policy
    queue = as_str(sp.get("queue")) or work.queue or value.get("gang.queue")
    priority_class = (as_str(sp.get("priorityClass")) or work.priority_class
                      or value.get("gang.priorityClass"))
    fallback = value.get("gang.fallbackQueue", "default") if value.get(
        "gang.unavailableQueue", "Fallback") == "Fallback" else None
    return queue, priority_class, fallback


def _timeout(backend: Backend, value: Mapping[str, Any], work: Workload) -> int | None:
    """The schedule timeout (Volcano has none); an explicit 0 on the job is kept, as the
    operator writes it."""
    if backend in ("volcano", "kubernetes"):
        return None
    job_timeout = work.scheduling_policy.get("scheduleTimeoutSeconds")
    if isinstance(job_timeout, int) and job_timeout >= 0 and not isinstance(job_timeout, bool):
        return job_timeout
    timeout: int | None = value.get("gang.scheduleTimeoutSeconds")
    return timeout


def _min_resources(backend: Backend, value: Mapping[str, Any], work: Workload,
                   min_member: int, replica_priorities: tuple[int, ...]
                   ) -> dict[str, str] | None:
    """The job's own minResources ({} stays empty), else the policy's map or its sum."""
    if backend in ("muster", "kubernetes") or min_member <= 0:
        return None
    job_res = work.scheduling_policy.get("minResources")
    if type(job_res) is dict or isinstance(job_res, Mapping):
        return {str(k): str(v) for k, v in job_res.items()}
    wanted = value.get("gang.minResources", "auto")
    if isinstance(wanted, dict):
        return dict(wanted)
    return work.min_resources(min_member, replica_priorities) if wanted == "auto" else None


def _join(group: PodGroupSpec, labels: dict[str, str | None],
          annotations: dict[str, str | None]) -> None:
    """The keys that make the pod a member of its gang, per backend, and the record that we
    joined it (`_ours`)."""
    annotations[keys.ANN_JOINED_GANG] = keys.joined_gang(group.backend, group.name)
    if group.backend == "volcano":
        annotations[keys.VOLCANO_GROUP_ANNOTATION] = group.name
        if group.queue:
            annotations[keys.VOLCANO_QUEUE_ANNOTATION] = group.queue
    elif group.backend == "coscheduling":
        labels[keys.COSCHEDULING_GROUP_LABEL] = group.name
    elif group.backend == "kubernetes":
        return  # the pod's spec reference, rendered from the group (native.pod_reference)
    else:
        annotations[keys.ANN_GANG_NAME] = group.name
        annotations[keys.ANN_GANG_MIN_MEMBER] = str(group.min_member)
        if group.timeout_seconds:
            annotations[keys.ANN_GANG_TIMEOUT] = str(group.timeout_seconds)
        # the policy's, or none (a value the pod was created with is removed): the binder
        # honours only what the policy set, and its --preemption default
        annotations[keys.ANN_GANG_PREEMPTION] = group.preemption


def explain(pod: Mapping[str, Any], *, namespace_labels: Mapping[str, str],
            owners: Sequence[Mapping[str, Any]], policies: PolicySet) -> tuple[PolicyMatch, ...]:
    """Every condition of every policy, met or not (evaluate stops at the first failure and
    skips the policies of other namespaces), decided by the same matcher as `evaluate`."""
    view = view_of(pod, namespace_labels=namespace_labels, owners=owners, index=policies.index)
    match_input = _match_input(view)
    return tuple(c.narrate(match_input) for c in policies.index.every)


def _match_input(view: PodView) -> MatchInput:
    work = view.work
    return MatchInput(view.namespace, view.ns_label_map(), view.label_map(), work.owner_kinds,
                      work.gpus, "job" if work.members is not None and work.kind != POD else "pod")
