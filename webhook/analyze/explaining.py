"""`muster explain job|pod`: why a job's pods are where they are, from what the cluster records.

Pure: the policies are re-evaluated with the webhook's engine (`webhook.policy.engine`) on the
pods as stored, with their namespace's labels and owners; the gangs' state and what they wait
for come from `webhook.analyze.gangstate`, as `muster gangs` and `muster analyze` show them.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook import keys
from webhook.analyze.clusterread import Scope
from webhook.analyze.gangstate import (
    GangObjects,
    GangState,
    Obj,
    advice,
    age,
    assemble,
    decide,
)
from webhook.kube.owners import controller_ref
from webhook.policy.decision import PodGroupSpec
from webhook.policy.engine import evaluate, explain

#: the Events shown: Muster's components name themselves muster-webhook, -binder, -agent
_OURS = "muster"
#: and a job controller's FailedCreate that names Muster's webhook: the API server's words for
#: a pod Muster refused, or could not be asked about in a fail-closed namespace
_OUR_WEBHOOK = re.compile(r'webhook "[a-z0-9.-]+\.muster\.io"')
EVENTS_SHOWN = 10


@dataclass(frozen=True, slots=True)
class PolicyVerdict:
    policy: str
    mode: str  # enforce, audit or warn
    matched: int  # of the pods explained, how many it matches
    reasons: tuple[str, ...]  # every condition, for a pod it matches (else the first pod)


@dataclass(frozen=True, slots=True)
class GangReport:
    gang: GangState
    object: str  # the gang object as kubectl names it ("" for backend muster: pod annotations)
    advice: str  # what to do, while it is pending


@dataclass(frozen=True, slots=True)
class EventLine:
    time: str
    type: str
    reason: str
    object: str
    message: str
    count: int


@dataclass(frozen=True, slots=True)
class Explanation:
    target: str  # "job NAMESPACE/NAME" or "pod NAMESPACE/NAME"
    job: str  # group/Kind and name of the job ("" for a pod without an owner)
    pods: int
    policy_source: str
    policies: tuple[PolicyVerdict, ...]
    applied: tuple[str, ...]  # the policies the pods record (muster.io/policy)
    notes: tuple[str, ...]  # where the record and the policies now disagree
    gangs: tuple[GangReport, ...]
    events: tuple[EventLine, ...]


def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _uid(obj: Obj) -> str:
    return str(_meta(obj).get("uid") or "")


def named_after(pod: Obj, name: str) -> bool:
    """Whether the pod's controller is named after `name` (operators name what they make after
    the job: an MPIJob's launcher Job NAME-launcher, a JobSet's Jobs NAME-...): only these pods'
    owners are read."""
    ref = controller_ref(pod)
    return ref is not None and str(ref.get("name", "")).startswith(name)


def job_pods(pods: Iterable[Obj], chains: Mapping[str, Sequence[Obj]], name: str) -> list[Obj]:
    """The pods with an owner named `name` up their controller chain."""
    return [p for p in pods if any(_meta(o).get("name") == name for o in chains.get(_uid(p), ()))]


def _kind_name(obj: Obj) -> str:
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    kind = f"{group}/{obj.get('kind')}" if group else str(obj.get("kind"))
    return f"{kind} {_meta(obj).get('name')}"


def refused_creators(events: Iterable[Obj], name: str) -> list[Obj]:
    """The object references of Events that name Muster's webhook on an object named after the
    job `name` (NAME-...): a JobSet's Jobs, whose pods were refused, have these Events where
    the JobSet has none. Whether each is the job's is for its controller chain to say."""
    refs: dict[tuple[str, str], Obj] = {}
    for e in events:
        ref = e.get("involvedObject") or {}
        if str(ref.get("name") or "").startswith(f"{name}-") and _OUR_WEBHOOK.search(
                str(e.get("message") or "")):
            refs[_ref(ref, nested=False)] = ref
    return list(refs.values())


def job_owner(chains: Mapping[str, Sequence[Obj]], pods: Sequence[Obj], name: str | None
              ) -> Obj | None:
    """The job: the owner named `name`, or (None) the root of the first pod's chain."""
    for pod in pods:
        chain = chains.get(_uid(pod), ())
        found = [o for o in chain if name is None or _meta(o).get("name") == name]
        if found:
            return found[-1]
    return None


def explain_pods(scope: Scope, pods: Sequence[Obj], chains: Mapping[str, Sequence[Obj]], *,
                 target: str, job: Obj | None, job_name: str, release_namespace: str,
                 now: dt.datetime, children: Iterable[tuple[str, str]] = ()) -> Explanation:
    """The explanation of `pods` (a job's, or one pod) and the gangs they join or their job
    (`job`; when it cannot be read, the gang objects whose controller is named `job_name`)
    owns; the Events of the job's `children` ((kind, name)) are shown too."""
    verdicts, notes = _policies(scope, pods, chains)
    uids = {_uid(p) for p in pods}
    gangs = [g for g in assemble(scope.pods, scope.groups)
             if uids & {_uid(p) for p in g.pods} or _owned_by(g, job, job_name)]
    reports = tuple(_report(g, release_namespace) for g in gangs)
    related = {_ref(o) for o in [*pods, *(g.group for g in gangs if g.group is not None),
                                 *(o for p in pods for o in chains.get(_uid(p), ()))]}
    related |= set(children)
    keys_ = {f"{g.ref.namespace}/{g.ref.name}" for g in gangs}
    return Explanation(
        target=target, job=_kind_name(job) if job is not None else "", pods=len(pods),
        policy_source=scope.policy_source, policies=verdicts,
        applied=tuple(sorted({n for p in pods for n in _applied(p)})), notes=tuple(notes),
        gangs=reports, events=events_of(scope.events, related, keys_, now, job_name=job_name))


def _owned_by(g: GangObjects, job: Obj | None, name: str) -> bool:
    ref = controller_ref(g.group) if g.group is not None else None
    if ref is None:
        return False
    return str(ref.get("uid")) == _uid(job) if job is not None else ref.get("name") == name


def _applied(pod: Obj) -> list[str]:
    said = str((_meta(pod).get("annotations") or {}).get(keys.ANN_POLICY, ""))
    return [n.strip() for n in said.split(",") if n.strip()]


def _policies(scope: Scope, pods: Sequence[Obj], chains: Mapping[str, Sequence[Obj]]
              ) -> tuple[tuple[PolicyVerdict, ...], list[str]]:
    """Each policy's match over the pods (the engine's own words), and where the gang the
    policies make now differs from the one the pods joined at admission."""
    if scope.policies is None or not pods:
        return (), []
    modes = {p.name: p.spec.enforcement for p in scope.policies}
    matched: dict[str, int] = dict.fromkeys(modes, 0)
    reasons: dict[str, tuple[str, ...]] = {}
    shown_matched: set[str] = set()  # the policies whose reasons are those of a pod matched
    notes: list[str] = []
    for pod in pods:
        owners = chains.get(_uid(pod), ())
        for m in explain(pod, namespace_labels=scope.namespace_labels, owners=owners,
                         policies=scope.policies):
            matched[m.policy] += m.matched
            if m.policy not in reasons or (m.matched and m.policy not in shown_matched):
                reasons[m.policy] = m.reasons
                if m.matched:
                    shown_matched.add(m.policy)
        note = _gang_note(pod, evaluate(pod, namespace_labels=scope.namespace_labels,
                                        owners=owners, policies=scope.policies).pod_group)
        if note and note not in notes:
            notes.append(note)
    verdicts = tuple(PolicyVerdict(n, modes[n], matched[n], reasons[n]) for n in modes)
    return verdicts, notes


def _gang_note(pod: Obj, spec: PodGroupSpec | None) -> str:
    """What differs between the gang the pod joined (its muster.io/joined-gang) and the one the
    policies make of it now (a policy changed since the pod was admitted, or the webhook did
    not see the pod)."""
    carried = str((_meta(pod).get("annotations") or {}).get(keys.ANN_JOINED_GANG, ""))
    wanted = keys.joined_gang(spec.backend, spec.name) if spec is not None else ""
    if carried == wanted:
        return ""
    name = _meta(pod).get("name")
    if not carried:
        return (f"the policies now make gang {wanted} of pod {name}, which joined none: it was "
                "admitted before the policy, or without the webhook (its failurePolicy Ignore)")
    if not wanted:
        return f"pod {name} joined gang {carried}, which no policy makes of it now"
    return f"pod {name} joined gang {carried}; the policies now make gang {wanted}"


def _report(g: GangObjects, release_namespace: str) -> GangReport:
    state = decide(g)
    where = ""
    if g.group is not None:
        meta = _meta(g.group)
        where = f"{g.group.get('kind')} {g.group.get('apiVersion')} " \
                f"{meta.get('namespace')}/{meta.get('name')}"
    return GangReport(state, where, advice(state.waiting_kind, release_namespace)
                      if state.state == "Pending" else "")


def events_of(events: Iterable[Obj], objects: set[tuple[str, str]], gangs: Iterable[str],
              now: dt.datetime, *, job_name: str = "") -> tuple[EventLine, ...]:
    """Muster's latest Events, oldest first, of one namespace: about `objects` ((kind, name):
    the binder names a PodGroup without its uid, and a pod made again keeps its name), about
    the object named `job_name` (a job whose pods Muster refused has none to lead to it), or
    about one of `gangs` ("namespace/name") in the binder's words, on pods that may be gone
    (a preempted gang's)."""
    about = _about(gangs)
    ours = [e for e in events if _by_muster(e) and (
        _ref(e.get("involvedObject") or {}, nested=False) in objects
        or (job_name and (e.get("involvedObject") or {}).get("name") == job_name)
        or (about is not None and about.search(str(e.get("message") or ""))))]
    ours.sort(key=_when)
    return tuple(EventLine(age(_when(e), now) if _when(e) else "?", str(e.get("type") or ""),
                           str(e.get("reason") or ""), _involved(e), str(e.get("message") or ""),
                           int(e.get("count") or 1)) for e in ours[-EVENTS_SHOWN:])


def _ref(obj: Obj, nested: bool = True) -> tuple[str, str]:
    """(kind, name) of an object (`nested`), or of an object reference."""
    return str(obj.get("kind") or ""), str((_meta(obj) if nested else obj).get("name") or "")


def _about(gangs: Iterable[str]) -> re.Pattern[str] | None:
    """How the binder names a gang in what it says of the gang itself ("gang NS/NAME cannot be
    placed", "as part of gang NS/NAME", "gang NS/NAME (priority" when preempted), and not the
    gang that preempted it ("preempted by gang NS/NAME")."""
    names = "|".join(re.escape(g) for g in sorted(gangs))
    return re.compile(rf"(?<!preempted by )gang (?:{names})(?![\w.-])") if names else None


def _by_muster(event: Obj) -> bool:
    return _component(event).startswith(_OURS) or bool(
        _OUR_WEBHOOK.search(str(event.get("message") or "")))


def _component(event: Obj) -> str:
    return str(event.get("reportingComponent") or (event.get("source") or {}).get("component")
               or "")


def _when(event: Obj) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or
               event.get("firstTimestamp") or "")


def _involved(event: Obj) -> str:
    ref = event.get("involvedObject") or {}
    return f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}"


def render(e: Explanation) -> list[str]:
    """The explanation in plain words, as `muster explain` prints it."""
    lines = [f"{e.target}: {e.job or 'no owner'}, {e.pods} pod(s)"]
    lines += _policy_lines(e)
    if not e.gangs:
        lines.append("Gang: none: no pod of it joined a gang Muster made or places")
    for r in e.gangs:
        lines += _gang_lines(r)
    lines.append("Muster's recent Events:" if e.events else
                 "Muster's recent Events: none (Events last the API server's --event-ttl, 1 h "
                 "by default)")
    lines += [f"  {ev.time:>4} {ev.type:<7} {ev.reason:<20} {ev.object}: {ev.message}"
              + (f" (x{ev.count})" if ev.count > 1 else "") for ev in e.events]
    return lines


def _policy_lines(e: Explanation) -> list[str]:
    lines = [f"Policies ({e.policy_source}), re-evaluated on the pods as stored:"]
    for v in e.policies:
        mode = "" if v.mode == "enforce" else f" [{v.mode}]"
        if v.matched:
            lines.append(f"  MATCH {v.policy}{mode}: {v.matched} of {e.pods} pod(s)")
            lines += [f"        {reason}" for reason in v.reasons]
        else:
            failed = next((r for r in v.reasons if r.startswith("✗")), "")
            lines.append(f"  no    {v.policy}{mode}: {failed}")
    lines.append("  the pods record policies: " + (", ".join(e.applied) or "none (muster.io/"
                                                    "policy absent: no policy changed them)"))
    lines += [f"  note: {n}" for n in e.notes]
    return lines


def _gang_lines(r: GangReport) -> list[str]:
    g = r.gang
    least = "?" if g.minimum is None else str(g.minimum)
    lines = [f"Gang {g.namespace}/{g.name}: backend {g.backend}, placed by {g.placed_by or '-'}",
             f"  object: {r.object}" + (f", phase {g.phase}" if g.phase else "") if r.object
             else "  object: none (backend muster: the gang lives on its pods' annotations)",
             f"  members: {g.present} present, {g.bound} bound, minimum {least}",
             f"  state: {g.state}" + (f": {g.waiting}" if g.waiting else "")]
    if r.advice:
        lines.append(f"  what to do: {r.advice}")
    return lines
