"""A memo of `evaluate` + `render_patch` for the pods of one job, which differ only in names.

The key holds every input the engine and the patch renderer read on the job path (a pod whose
job object is known, so the workload analysis reads only its ownerReferences and the owners;
see `workload.workload_of`). Pods off that path (bare pods, owner object unavailable) are evaluated
fresh every time: there the pod's name, containers and priorityClassName are read too. What is
read of the pod, and why it is in the key:

- metadata.namespace: policy `namespaces`, the PodGroup's namespace;
- metadata.labels, for the keys any loaded policy's podSelector tests, the keys any policy
  writes, and Muster's own group and Istio keys (the engine checks or writes only those);
- metadata.annotations, for the keys any policy writes and every key Muster reads or writes;
- whether labels/annotations are maps (the patch adds the whole map when not);
- spec.schedulerName (warning, patch), spec.affinity (patch), and of spec.tolerations only
  whether it is a list holding the one toleration the engine adds (patch);
- the namespace labels a namespaceSelector tests; the owner-chain key of `workload.chain_key`;
- the PriorityClass values of the job's replicas (minResources counts higher ones first).

The memo lives in the policy set's index, so a reload starts a new one; it is bounded (LRU).
tests/policy/test_outcome_memo.py checks with hypothesis that it equals a fresh evaluation,
also for pods differing in exactly one of the fields above.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from webhook import jsonpatch
from webhook.policy.decision import Decision
from webhook.policy.engine import TOPOLOGY_TOLERATION, evaluate
from webhook.policy.patch import render_patch
from webhook.policy.policyset import PolicySet
from webhook.policy.workload import NO_PRIORITIES, POD, Priorities, chain_key, workload_for_key

#: outcomes remembered per policy set
MEMO_SIZE = 4096
_MISSING = object()  # a map that is absent, distinct from every value


class Outcome(NamedTuple):
    decision: Decision
    #: the RFC 6902 operations (shared between callers: read-only)
    ops: tuple[dict[str, Any], ...]
    #: `ops` as compact JSON, encoded once per job rather than once per pod (b"" for none)
    patch_json: bytes


class _Unkeyable(Exception):
    """An input the key cannot hold exactly (never sent by an API server): evaluate fresh."""


def _project(mapping: Any, wanted: tuple[str, ...]) -> tuple[Any, ...] | None:
    """The values of `wanted` keys (None: absent), or None for an absent map. Raises
    _Unkeyable for a map that is not a dict or a wanted value that is not a string."""
    if mapping is None:
        return None
    if type(mapping) is not dict:
        raise _Unkeyable
    out = tuple(map(mapping.get, wanted))
    for v in out:
        if v is not None and type(v) is not str:
            raise _Unkeyable
    return out


def _freeze(value: Any) -> Any:
    """A hashable value equal exactly when the JSON values are equal (types included)."""
    t = type(value)
    if t is dict:
        if not all(type(k) is str for k in value):
            raise _Unkeyable
        return (dict, tuple(sorted((k, _freeze(v)) for k, v in value.items())))
    if t is list:
        return (list, tuple(_freeze(v) for v in value))
    if t is str or t is int or t is bool or value is None:
        return (t, value)
    raise _Unkeyable  # floats (nan, -0.0) and anything else: not worth exactness here


def _tolerations(value: Any) -> bool | None:
    """All that render_patch reads of spec.tolerations: whether it is a list (else the patch
    adds the whole list) and whether it holds the one toleration the engine adds."""
    if not isinstance(value, list):
        return None
    return TOPOLOGY_TOLERATION in value


def outcome_key(pod: Mapping[str, Any], namespace_labels: Mapping[str, str],
                owners: Sequence[Mapping[str, Any]], policies: PolicySet,
                priorities: Priorities = NO_PRIORITIES) -> tuple[Any, ...] | None:
    """Everything evaluate + render_patch read for this pod, or None when the pod is not on the
    job path (its outcome then depends on more of it, e.g. its name)."""
    if type(pod) is not dict or type(owners) is not list:
        return None
    chain = chain_key(pod, owners)
    if chain is None:
        return None
    work = workload_for_key(pod, owners, chain)
    if work.facts is None or work.kind == POD:
        return None
    index = policies.index
    meta, spec = pod.get("metadata", _MISSING), pod.get("spec", _MISSING)
    if type(meta) is not dict or (spec is not _MISSING and type(spec) is not dict):
        return None
    spec = spec if type(spec) is dict else {}
    namespace = meta.get("namespace")
    scheduler = spec.get("schedulerName")
    if (namespace is not None and type(namespace) is not str) or (
            scheduler is not None and type(scheduler) is not str) or (
            type(namespace_labels) is not dict):
        return None
    try:
        return (chain, work.facts.replica_priorities(priorities), namespace,
                _project(namespace_labels, index.ns_label_keys),
                _project(meta.get("labels"), index.label_keys),
                _project(meta.get("annotations"), index.annotation_keys), scheduler,
                _tolerations(spec.get("tolerations")), _freeze(spec.get("affinity")))
    except _Unkeyable:
        return None


def evaluate_and_render(pod: Mapping[str, Any], *, namespace_labels: Mapping[str, str],
                        owners: Sequence[Mapping[str, Any]], policies: PolicySet,
                        priorities: Priorities = NO_PRIORITIES) -> Outcome:
    """`evaluate` and, when it changes the pod, `render_patch` (else no ops); remembered for the
    job path."""
    key = outcome_key(pod, namespace_labels, owners, policies, priorities)
    memo: OrderedDict[Any, Outcome] = policies.index.outcomes
    if key is not None:
        found = memo.get(key)
        if found is not None:
            memo.move_to_end(key)
            return found
    decision = evaluate(pod, namespace_labels=namespace_labels, owners=owners, policies=policies,
                        priorities=priorities)
    ops = tuple(render_patch(pod, decision)) if decision.changes_pod else ()
    outcome = Outcome(decision, ops, jsonpatch.encode(ops) if ops else b"")
    if key is not None:
        memo[key] = outcome
        if len(memo) > MEMO_SIZE:
            memo.popitem(last=False)
    return outcome
