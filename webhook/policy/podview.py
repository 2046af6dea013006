"""What the engine and the patch renderer read of a pod being admitted: one typed extraction.

`view_of` projects the pod onto the keys the policy set can read (the label and annotation keys
some policy tests or writes, and the engine's own; the namespace label keys some policy tests) and
reads the few spec fields they use. `engine.decide` and `patch.render` take only a `PodView`, so
they cannot read anything else; and the outcome memo keys on the view itself: its fields are
compared and hashed, except the ones derived from them (`work` is a function of `workload_key`,
which holds everything the owner-chain walk reads; `strings` of the projected maps; the raw
affinity of `affinity_key`) and the policy index it was made for. A new read therefore needs a
new field, which is in the key unless marked `compare=False` for that reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any

from webhook import keys
from webhook.policy.compiled import PolicyIndex
from webhook.policy.jsonshape import as_map, as_str
from webhook.policy.workload import (
    NO_PRIORITIES,
    POD,
    Priorities,
    Workload,
    chain_key,
)
from webhook.records import record

#: the toleration the engine adds for backend muster (render checks whether it is present)
TOPOLOGY_TOLERATION: Mapping[str, str] = {
    "key": keys.TAINT_GPU_TOPOLOGY, "operator": "Exists", "effect": "NoSchedule"}
#: the affinity_key of an affinity that cannot be frozen
UNKEYABLE = ("unkeyable",)


class _Unhashable(Exception):
    """A value no API server sends (a float, a non-string key): the view is not a memo key."""


def freeze(value: Any) -> Any:
    """A hashable value equal exactly when the JSON values are equal (types included)."""
    t = type(value)
    if t is dict:
        if not all(type(k) is str for k in value):
            raise _Unhashable
        return (dict, tuple(sorted((k, freeze(v)) for k, v in value.items())))
    if t is list:
        return (list, tuple(freeze(v) for v in value))
    if t is str or t is int or t is bool or value is None:
        return (t, value)
    raise _Unhashable


def _project(mapping: Any, wanted: tuple[str, ...]) -> tuple[Any, ...] | None:
    """The values of `wanted` keys (None: absent), or None when the pod has no such map."""
    if type(mapping) is not dict:
        return None if mapping is None or not isinstance(mapping, Mapping) else tuple(
            mapping.get(k) for k in wanted)
    return tuple(map(mapping.get, wanted))


def _tolerations(value: Any) -> bool | None:
    """All that render reads of spec.tolerations: whether it is a list (else the patch adds the
    whole list) and whether it holds the one toleration the engine adds."""
    if not isinstance(value, list):
        return None
    return TOPOLOGY_TOLERATION in value


@record  # built on every request (hash is over the compared fields)
class PodShape:
    """What the patch renderer reads of a pod: its labels and annotations (projected onto the
    keys the policy set reads or writes), schedulerName, tolerations and affinity."""

    #: values of `label_keys` (None: absent), or None when the pod has no labels map
    labels: tuple[Any, ...] | None
    annotations: tuple[Any, ...] | None
    scheduler_name: Any
    tolerations: bool | None
    #: spec.affinity frozen (see `freeze`); UNKEYABLE for a value no API server sends
    affinity_key: Any
    #: spec.affinity as it is (None: absent): `affinity_key` holds it for the comparison
    affinity: Any = field(compare=False)
    #: the pod's native gang reference: (spec field, its value frozen), or None (see `native_ref`)
    native_ref: Any = None
    label_keys: tuple[str, ...] = field(compare=False, default=())
    annotation_keys: tuple[str, ...] = field(compare=False, default=())

    def label(self, key: str) -> Any:
        """The raw value of a projected label (render compares raw values), None if absent."""
        return _raw(self.label_keys, self.labels, key)

    def annotation(self, key: str) -> Any:
        return _raw(self.annotation_keys, self.annotations, key)


def shape_of(pod: Any, label_keys: tuple[str, ...], annotation_keys: tuple[str, ...]
             ) -> PodShape:
    meta, spec = as_map(as_map(pod).get("metadata")), as_map(as_map(pod).get("spec"))
    affinity = spec.get("affinity")
    try:
        frozen = freeze(affinity)
    except _Unhashable:
        frozen = UNKEYABLE
    return PodShape(_project(meta.get("labels"), label_keys),
                    _project(meta.get("annotations"), annotation_keys),
                    spec.get("schedulerName"), _tolerations(spec.get("tolerations")), frozen,
                    affinity, native_ref(spec), label_keys, annotation_keys)


def native_ref(spec: Mapping[str, Any]) -> Any:
    """The pod's reference to a native gang (1.36+ spec.schedulingGroup, 1.35
    spec.workloadRef) as (field, frozen value), or None."""
    for name in ("schedulingGroup", "workloadRef"):
        value = spec.get(name)
        if value is not None:
            try:
                return name, freeze(value)
            except _Unhashable:
                return name, UNKEYABLE
    return None


@record
class PodView:
    """A pod as the engine and the renderer see it; compared and hashed as the memo key."""

    namespace: str
    shape: PodShape
    #: values of the index's namespace label keys
    ns_labels: tuple[Any, ...]
    #: `workload.chain_key` of the pod and its owners (None: not a job pod with known owners)
    workload_key: tuple[Any, ...] | None
    #: the PriorityClass values of the job's replicas (minResources counts higher ones first)
    replica_priorities: tuple[int, ...]
    work: Workload = field(compare=False)
    index: PolicyIndex = field(compare=False, repr=False)
    #: the projected labels, annotations and namespace labels that are strings, as maps (a
    #: function of the fields above, built once: the engine reads them several times)
    strings: tuple[dict[str, str], dict[str, str], dict[str, str]] = field(
        compare=False, repr=False, default=({}, {}, {}))

    @property
    def memoisable(self) -> bool:
        """Whether equal views give equal outcomes: a pod of a known job, whose analysis reads
        only what `workload_key` holds (a bare pod's also reads its spec)."""
        return (self.workload_key is not None and self.work.facts is not None
                and self.work.kind != POD)

    def label_map(self) -> dict[str, str]:
        """The projected labels with string values, for selectors and key checks."""
        return self.strings[0]

    def annotation_map(self) -> dict[str, str]:
        return self.strings[1]

    def ns_label_map(self) -> dict[str, str]:
        return self.strings[2]


def _strings(names: tuple[str, ...], values: tuple[Any, ...] | None) -> dict[str, str]:
    if values is None:
        return {}
    return {k: v for k, v in zip(names, values, strict=False) if type(v) is str}


def _raw(names: tuple[str, ...], values: tuple[Any, ...] | None, key: str) -> Any:
    if values is None:
        return None
    try:
        return values[names.index(key)]
    except ValueError:
        raise KeyError(f"{key} is not among the keys the policy set reads") from None


def view_of(pod: Any, *, namespace_labels: Any, owners: Any, index: PolicyIndex,
            priorities: Priorities = NO_PRIORITIES) -> PodView:
    """The view of any JSON value as a pod (never raises)."""
    pod = as_map(pod)
    owners = owners if type(owners) is list or isinstance(owners, Sequence) else ()
    key = chain_key(pod, owners)
    work = index.workloads.workload(pod, owners, key)
    shape = shape_of(pod, index.label_keys, index.annotation_keys)
    ns_labels = _project(as_map(namespace_labels), index.ns_label_keys) or ()
    return PodView(
        namespace=as_str(as_map(pod.get("metadata")).get("namespace")) or "",
        shape=shape, ns_labels=ns_labels, workload_key=key,
        replica_priorities=work.facts.replica_priorities(priorities) if work.facts else (),
        work=work, index=index,
        strings=(_strings(index.label_keys, shape.labels),
                 _strings(index.annotation_keys, shape.annotations),
                 _strings(index.ns_label_keys, ns_labels)))


def memo_key(view: PodView) -> PodView | None:
    """The view itself when it can key the outcome memo (hashable and memoisable)."""
    if not view.memoisable or view.shape.affinity_key is UNKEYABLE:
        return None
    try:
        hash(view)
    except TypeError:  # a label value that is a list or a map: never from an API server
        return None
    return view
