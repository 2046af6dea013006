"""What a gang's recorded objects mean: its members present, bound and minimum, its state, and
what it waits for, in words. The one place that decides it: `muster gangs`, `muster explain`
and `muster analyze` read gangs through these functions, so that they never disagree.

Pure: the inputs are the objects as the API server returned them (pods, the PodGroup or
Workload Muster made); `webhook.analyze.clusterread` reads them.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from webhook import keys
from webhook.binder.agents import AGENT_WAIT
from webhook.binder.planner import BLOCKED_WAIT, MEMBERS_WAIT, PREEMPTING_WAIT
from webhook.kube.owners import controller_ref
from webhook.policy import native
from webhook.policy.podgroup import made_by_muster

Obj = Mapping[str, Any]
State = Literal["Running", "Pending", "Finished"]
STATES: tuple[State, ...] = ("Running", "Pending", "Finished")
#: what a pending gang waits for: its members, room (the binder names the network level), a
#: reserving gang ahead of it, the gangs it preempted to go, a node's GPU agent restarting, the
#: words of another scheduler, no scheduler at all, or nothing said yet
WaitKind = Literal["members", "capacity", "blocked", "preempting", "agent", "scheduler",
                   "no-scheduler", "unknown", ""]
#: the backend of a gang object, by its API group
_BACKENDS = {keys.VOLCANO_API[0]: "volcano", keys.COSCHEDULING_API[0]: "coscheduling",
             native.GROUP: "kubernetes"}
#: how the binder begins what it says on a pod (reports.py): the gang is named on its own
_BINDER_HEAD = re.compile(r"^gang \S+ cannot be placed: ")


@dataclass(frozen=True, slots=True, order=True)
class GangRef:
    namespace: str
    backend: str  # muster, volcano, coscheduling or kubernetes
    name: str


@dataclass(slots=True)
class GangObjects:
    """A gang as recorded: its pods (any phase) and the gang object Muster made, if any."""

    ref: GangRef
    pods: list[Obj] = field(default_factory=list)
    group: Obj | None = None


@dataclass(frozen=True, slots=True)
class GangState:
    namespace: str
    name: str
    backend: str
    job: str  # Kind/name of the job the gang is of ("" when none is recorded)
    present: int  # live members (not finished, not being deleted)
    bound: int  # live members with a node
    minimum: int | None  # None: nothing records it
    state: State
    waiting_kind: WaitKind
    waiting: str  # what it waits for, in words ("" unless Pending)
    phase: str  # the gang object's status.phase ("" when none)
    created: str  # the oldest creationTimestamp of its objects
    placed_by: str  # the scheduler its pods name


def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def is_live(pod: Obj) -> bool:
    return not _meta(pod).get("deletionTimestamp") and \
        (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def pod_gang(pod: Obj, binder: str = keys.DEFAULT_BINDER_SCHEDULER_NAME) -> GangRef | None:
    """The gang Muster joined the pod to (its record, every backend), or the one the binder
    places it in (as `webhook.binder.gangs.gang_key` groups them); None: Muster has no part."""
    meta = _meta(pod)
    ns, ann = str(meta.get("namespace") or ""), meta.get("annotations") or {}
    backend, sep, name = str(ann.get(keys.ANN_JOINED_GANG) or "").partition("/")
    if sep and name:
        return GangRef(ns, backend, name)
    if (pod.get("spec") or {}).get("schedulerName") != binder:
        return None
    if ann.get(keys.ANN_GANG_NAME):
        return GangRef(ns, "muster", str(ann[keys.ANN_GANG_NAME]))
    group = (meta.get("labels") or {}).get(keys.COSCHEDULING_GROUP_LABEL)
    if group:
        return GangRef(ns, "coscheduling", str(group))
    return GangRef(ns, "muster", f"pod:{meta.get('name')}")


def group_ref(obj: Obj) -> GangRef | None:
    """The gang a PodGroup or Workload is the object of (None: not a gang object)."""
    backend = _BACKENDS.get(str(obj.get("apiVersion", "")).rpartition("/")[0])
    if backend is None:
        return None
    meta = _meta(obj)
    return GangRef(str(meta.get("namespace") or ""), backend, str(meta.get("name") or ""))


def assemble(pods: Iterable[Obj], groups: Iterable[Obj],
             binder: str = keys.DEFAULT_BINDER_SCHEDULER_NAME) -> list[GangObjects]:
    """The gangs Muster made or places: pods by their gang, with the gang object of each (a
    gang object Muster made counts without pods: its job's pods may not exist yet)."""
    gangs: dict[GangRef, GangObjects] = {}
    for pod in pods:
        ref = pod_gang(pod, binder)
        if ref is not None:
            gangs.setdefault(ref, GangObjects(ref)).pods.append(pod)
    for obj in groups:
        ref = group_ref(obj)
        if ref is not None and (ref in gangs or made_by_muster(obj)):
            gangs.setdefault(ref, GangObjects(ref)).group = obj
    return [gangs[k] for k in sorted(gangs)]


def minimum(g: GangObjects) -> int | None:
    """minMember as Muster wrote it on the pods (the binder's reading: the largest), else the
    gang object's."""
    said = [keys.decimal(str(_meta(p).get("annotations", {}).get(keys.ANN_GANG_MIN_MEMBER, "")))
            for p in g.pods]
    found = [n for n in said if n is not None]
    if found:
        return max(found)
    return _group_minimum(g.group) if g.group is not None else None


def _group_minimum(group: Obj) -> int | None:
    spec = group.get("spec") or {}
    gang = (spec.get("schedulingPolicy") or {}).get("gang") or next(
        ((t.get("policy") or t.get("schedulingPolicy") or {}).get("gang") for t in
         spec.get("podGroups") or spec.get("podGroupTemplates") or ()), None) or {}
    value = spec.get("minMember", gang.get("minCount"))
    return value if isinstance(value, int) else None


def job_of(g: GangObjects) -> tuple[str, str]:
    """(group/Kind, name) of the job the gang is of: the gang object's controller (Muster makes
    it owned by the job), else its members' controller named as the gang, else the commonest."""
    ref = controller_ref(g.group) if g.group is not None else None
    if ref is None:
        refs = [r for p in g.pods if (r := controller_ref(p)) is not None]
        named = [r for r in refs if r.get("name") == g.ref.name]
        counted = Counter((str(r.get("apiVersion")), str(r.get("kind")), str(r.get("name")))
                          for r in named or refs)
        if not counted:
            return "", ""
        api, kind, name = counted.most_common(1)[0][0]
        ref = {"apiVersion": api, "kind": kind, "name": name}
    group = str(ref.get("apiVersion", "")).rpartition("/")[0]
    return (f"{group}/{ref.get('kind')}" if group else str(ref.get("kind"))), str(ref.get("name"))


def decide(g: GangObjects, binder: str = keys.DEFAULT_BINDER_SCHEDULER_NAME) -> GangState:
    live = [p for p in g.pods if is_live(p)]
    bound = [p for p in live if (p.get("spec") or {}).get("nodeName")]
    least = minimum(g)
    finished = not live and any((p.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                                for p in g.pods)
    if finished:
        state: State = "Finished"
    elif live and len(bound) >= (least or len(live)):
        state = "Running"
    else:
        state = "Pending"
    kind, why = waiting(g, live, least, binder) if state == "Pending" else ("", "")
    schedulers = sorted({str((p.get("spec") or {}).get("schedulerName") or "default-scheduler")
                         for p in live})
    kind_name = job_of(g)
    return GangState(
        namespace=g.ref.namespace, name=g.ref.name, backend=g.ref.backend,
        job=f"{kind_name[0].rpartition('/')[2]}/{kind_name[1]}" if kind_name[1] else "",
        present=len(live), bound=len(bound), minimum=least, state=state, waiting_kind=kind,
        waiting=why, phase=str(((g.group or {}).get("status") or {}).get("phase") or ""),
        created=min((str(_meta(o).get("creationTimestamp") or "") for o in
                     [*g.pods, *([g.group] if g.group is not None else [])]), default=""),
        placed_by=",".join(schedulers))


def waiting(g: GangObjects, live: Sequence[Obj], least: int | None, binder: str
            ) -> tuple[WaitKind, str]:
    """What a pending gang waits for: the binder's own words where it places the gang, else
    its members, else what its scheduler says (on the gang object or the pods)."""
    unbound = [p for p in live if not (p.get("spec") or {}).get("nodeName")]
    if any((p.get("spec") or {}).get("schedulerName") == binder for p in live):
        said = next((s for s in map(scheduled_message, _latest_first(unbound)) if s), "")
        if said:
            return wait_kind(said), _BINDER_HEAD.sub("", said)
    if least is not None and len(live) < least:
        return "members", f"{MEMBERS_WAIT}: {len(live)} of minMember {least} exist"
    if any((p.get("spec") or {}).get("schedulerName") == binder for p in live):
        return "unknown", "the binder has not said why (is it running? muster analyze)"
    said = _group_message(g.group) or next(
        (s for s in map(scheduled_message, _latest_first(unbound)) if s), "")
    if said:
        return "scheduler", said
    names = sorted({str((p.get("spec") or {}).get("schedulerName") or "default-scheduler")
                    for p in unbound})
    return "no-scheduler", (f"no scheduler has looked at its unbound pods yet (schedulerName "
                            f"{', '.join(names)}: is it running?)")


def _latest_first(pods: Iterable[Obj]) -> list[Obj]:
    return sorted(pods, key=_condition_time, reverse=True)


def _condition_time(pod: Obj) -> str:
    return next((str(c.get("lastTransitionTime") or "") for c in
                 (pod.get("status") or {}).get("conditions") or ()
                 if c.get("type") == "PodScheduled"), "")


def scheduled_message(pod: Obj) -> str:
    """Why the pod's scheduler left it unbound: its PodScheduled=False message ("" if none)."""
    return next((str(c.get("message") or "") for c in
                 (pod.get("status") or {}).get("conditions") or ()
                 if c.get("type") == "PodScheduled" and c.get("status") == "False"), "")


def _group_message(group: Obj | None) -> str:
    """The latest condition message of a gang object that is not met (Volcano: Unschedulable)."""
    conditions = ((group or {}).get("status") or {}).get("conditions") or ()
    told = sorted((c for c in conditions if c.get("message") and (
        c.get("type") == "Unschedulable" or c.get("status") == "False")),
        key=lambda c: str(c.get("lastTransitionTime") or ""))
    return str(told[-1]["message"]) if told else ""


def wait_kind(said: str) -> WaitKind:
    """What the binder's words (a pod's PodScheduled message) say the gang waits for."""
    if not said:
        return "unknown"
    if f"{MEMBERS_WAIT}:" in said:
        return "members"
    if f"; {PREEMPTING_WAIT} " in said:
        return "preempting"
    if f"{BLOCKED_WAIT} " in said:
        return "blocked"
    if AGENT_WAIT in said:
        return "agent"
    return "capacity"


def advice(kind: WaitKind, namespace: str) -> str:
    """What to do about a gang that waits for `kind` (`namespace`: Muster's release's)."""
    return {
        "unknown": f"kubectl -n {namespace} get pods -l app.kubernetes.io/component=binder; and "
                   "is the pod's spec.schedulerName the binder's?",
        "members": "its other pods do not exist: see what its workload's controller says "
                   "(kubectl describe on the job: quota, admission, a failed pod), or lower its "
                   "minMember",
        "preempting": "it preempted gangs of lower priority and waits for their pods to go "
                      "(their termination grace); see its GangPreempting Event",
        "blocked": "an older gang holds the room back until it is placed: that gang's own "
                   "entry (muster gangs, muster analyze) says what it needs; the binder's "
                   "--starvation-seconds sets when a gang does this",
        "agent": "a node it could use has its GPU agent restarting (a DaemonSet rollout, the "
                 "node back from a failure): the binder places GPU pods there once the agent "
                 "pod its muster.io/gpu-agent annotation names is Ready again; if that takes "
                 f"long, kubectl -n {namespace} get pods -l app.kubernetes.io/component=agent "
                 "-o wide",
        "capacity": "free the resources it needs, or lower its minMember",
        "scheduler": "its scheduler's words above say what it lacks: free that, or lower its "
                     "minMember",
        "no-scheduler": "start the scheduler its pods name, or fix the policy's "
                        "gang.schedulerName (muster analyze: SchedulerNotRunning)",
    }.get(kind, "")


def age(created: str, now: dt.datetime) -> str:
    """How long ago `created` (RFC 3339) was, as kubectl shows it: 45s, 12m, 5h, 3d."""
    try:
        then = dt.datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return "?"
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size, below in (("s", 1, 120), ("m", 60, 120 * 60), ("h", 3600, 48 * 3600)):
        if seconds < below:
            return f"{seconds // size}{unit}"
    return f"{seconds // 86400}d"
