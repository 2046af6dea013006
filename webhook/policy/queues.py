"""A Volcano gang's queue against the cluster's Queues: use it, fall back, or drop the gang.

Volcano's PodGroup validating webhook refuses a PodGroup whose queue does not exist or is not
`Open` (volcano-sh/volcano pkg/webhooks/admission/podgroups/validate), and its scheduler ignores
pods whose PodGroup is missing. Without this check such a gang's pods wait forever, with no
Event. Which queue a PodGroup lands in (precedence, as Volcano applies it):

1. the job's own `runPolicy.schedulingPolicy.queue`, then the job object's
   `scheduling.volcano.sh/queue-name` annotation, then the policy's `gang.queue`;
2. when that leaves the queue empty or `default`: the namespace's
   `scheduling.volcano.sh/queue-name` annotation (Volcano's PodGroup mutating webhook applies
   it to `default` PodGroups only; pkg/webhooks/admission/podgroups/mutate);
3. otherwise Volcano's `default` queue.

Pure: the admission server passes the Queue states its informer holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook import keys
from webhook.policy.decision import Decision, PodGroupSpec

DEFAULT_QUEUE = "default"
OPEN = "Open"


@dataclass(frozen=True, slots=True)
class QueueVerdict:
    #: the queue the PodGroup gets, or None when the pod is admitted without its gang
    queue: str | None
    #: why the wanted queue was not used, in plain words (empty when it was)
    reason: str = ""

    @property
    def changed(self) -> bool:
        return bool(self.reason)


def effective_queue(spec: PodGroupSpec, namespace_queue: str | None) -> str:
    """The queue Volcano will file the PodGroup under."""
    queue = spec.queue or DEFAULT_QUEUE
    if queue == DEFAULT_QUEUE and namespace_queue:
        return namespace_queue
    return queue


def state_of(queue: Mapping[str, Any]) -> str:
    """A Queue object's status.state ("" until Volcano's controller has set it)."""
    return str((queue.get("status") or {}).get("state") or "")


def queue_problem(name: str, queues: Mapping[str, str]) -> str:
    """Why queue `name` cannot take a PodGroup ("" when it can); `queues`: name -> state."""
    state = queues.get(name)
    if state is None:
        return f"Volcano queue {name!r} does not exist"
    if state != OPEN:
        return f"Volcano queue {name!r} is {state or 'not Open yet'}, not Open"
    return ""


def check_queue(spec: PodGroupSpec, queues: Mapping[str, str],
                namespace_queue: str | None = None) -> QueueVerdict:
    """The verdict for a Volcano gang; `queues` maps each Queue's name to its status.state."""
    wanted = effective_queue(spec, namespace_queue)
    problem = queue_problem(wanted, queues)
    if not problem:
        return QueueVerdict(wanted)
    fallback = spec.fallback_queue
    if fallback is not None and fallback != wanted:
        also = queue_problem(fallback, queues)
        if not also:
            return QueueVerdict(fallback, f"{problem}: PodGroup {spec.name} uses fallback "
                                          f"queue {fallback!r} instead")
        problem = f"{problem}, and the fallback: {also}"
    return QueueVerdict(None, f"{problem}: pod admitted without gang {spec.name} (it would "
                              "never be scheduled)")


def describe(spec: PodGroupSpec) -> str:
    """What admission will do about the queue, for `muster policy explain`."""
    queue = spec.queue or DEFAULT_QUEUE
    instead = (f"queue {spec.fallback_queue!r} instead" if spec.fallback_queue is not None
               else "the pod admitted without the gang")
    return (f"Volcano queue {queue!r} (the namespace's {keys.VOLCANO_QUEUE_ANNOTATION} applies "
            f"when it is 'default'): checked at admission against the cluster's Queues; if it "
            f"is missing or not Open, {instead} (gang.unavailableQueue), with an Event")


def with_queue(decision: Decision, queue: str) -> Decision:
    """The decision with its Volcano gang in `queue` (PodGroup and the pod's annotation)."""
    assert decision.pod_group is not None
    annotations = {**decision.annotations, keys.VOLCANO_QUEUE_ANNOTATION: queue}
    return dataclasses.replace(decision, annotations=annotations,
                               pod_group=dataclasses.replace(decision.pod_group, queue=queue))


def without_gang(decision: Decision, reason: str) -> Decision:
    """The decision with its gang dropped: no PodGroup, no group keys, the default scheduler."""
    annotations = {k: v for k, v in decision.annotations.items()
                   if k not in (keys.VOLCANO_GROUP_ANNOTATION, keys.VOLCANO_QUEUE_ANNOTATION)}
    return dataclasses.replace(decision, pod_group=None, annotations=annotations,
                               scheduler_name=None, warnings=(*decision.warnings, reason))
