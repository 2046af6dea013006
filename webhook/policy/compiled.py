"""Policies compiled for fast matching: plain tuples and frozensets instead of pydantic models,
an index by namespace, and the failure reasons prepared once.

The admission webhook evaluates every pod create against every policy, so matching must cost
less than parsing the request. One matcher decides: `CompiledPolicy.first_failure` (with
`selector_matches` for label selectors). `narrate` (for `muster policy explain`) asks it about each
condition alone and only adds the words, so explain cannot disagree with admission.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from webhook import keys
from webhook.lru import Lru
from webhook.policy.decision import PolicyMatch
from webhook.policy.schema import LabelSelector, SchedulingPolicy
from webhook.policy.workload import WorkloadMemo
from webhook.records import record

#: one selector requirement: (operator, key, values); matchLabels become ("=", key, {value})
Requirement = tuple[str, str, frozenset[str]]

#: label keys the engine checks (gang keys of other controllers) or writes, whatever the policies
ENGINE_LABEL_KEYS = (keys.COSCHEDULING_GROUP_LABEL, keys.LEGACY_COSCHEDULING_GROUP_LABEL,
                     keys.ISTIO_INJECT, keys.ISTIO_DATAPLANE_MODE)
#: annotation keys the engine checks or writes, whatever the policies
ENGINE_ANNOTATION_KEYS = (
    *keys.PROTECTED_ANNOTATIONS, keys.ANN_POLICY, keys.ANN_GPU_TOPOLOGY, keys.ANN_GANG_NAME,
    keys.ANN_GANG_MIN_MEMBER, keys.ANN_GANG_TIMEOUT, keys.ANN_GANG_PREEMPTION,
    keys.ANN_JOINED_GANG,
    keys.VOLCANO_GROUP_ANNOTATION, keys.VOLCANO_QUEUE_ANNOTATION, keys.ISTIO_INJECT,
    *keys.NETWORK_ANNOTATIONS)

#: outcomes remembered per policy set (webhook.policy.outcome)
OUTCOME_MEMO_SIZE = 4096
#: distinct sets of matched policies whose merged writes are remembered (engine._writes)
WRITES_MEMO_SIZE = 1024

NO_MATCH_NAMESPACE, NO_MATCH_NS_SELECTOR, NO_MATCH_POD_SELECTOR, NO_MATCH_OWNER, NO_MATCH_GPUS = (
    range(1, 6))


@record  # built per request
class MatchInput:
    """What a policy's `match` reads of a pod: the one input of the one matcher."""

    namespace: str
    ns_labels: Mapping[str, str]
    pod_labels: Mapping[str, str]
    owner_kinds: frozenset[str]
    gpus: int
    #: whose GPUs `gpus` counts: "job" (the job's spec is known) or "pod"
    gpus_of: str = "pod"


def _requirements(sel: LabelSelector | None) -> tuple[Requirement, ...] | None:
    if sel is None:
        return None
    reqs: list[Requirement] = [("=", k, frozenset((v,))) for k, v in sel.matchLabels.items()]
    reqs += [(e.operator, e.key, frozenset(e.values)) for e in sel.matchExpressions]
    return tuple(reqs)


def selector_matches(reqs: tuple[Requirement, ...], labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics (NotIn holds for an absent key); inline, as it runs
    for every selector of every policy on every pod."""
    for op, key, values in reqs:
        value = labels.get(key)
        if op in {"=", "In"}:
            if value not in values:
                return False
        elif op == "NotIn":
            if value is not None and value in values:
                return False
        elif op == "Exists":
            if value is None:
                return False
        elif value is not None:  # DoesNotExist
            return False
    return True


def _unmet(reqs: tuple[Requirement, ...], labels: Mapping[str, str]) -> str:
    """The first requirement `selector_matches` finds unmet, in words ("matches" if none)."""
    for req in reqs:
        if not selector_matches((req,), labels):
            op, key, values = req
            found = f"{key}={labels[key]}" if key in labels else "none"
            wanted = {"=": f"{key}={next(iter(values), '')}",
                      "In": f"{key} in {sorted(values)}",
                      "NotIn": f"{key} not in {sorted(values)}",
                      "Exists": f"label {key}"}.get(op, f"no label {key}")
            return f"{wanted} required, found {found}"
    return "matches"


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    policy: SchedulingPolicy
    namespaces: frozenset[str] | None
    ns_selector: tuple[Requirement, ...] | None
    pod_selector: tuple[Requirement, ...] | None
    owner_kinds: frozenset[str] | None
    gpu_min: int | None
    gpu_max: int | None
    #: (merge key, value) of the gang/istio/topology fields the policy writes, e.g.
    #: ("gang.queue", "training")
    writes: tuple[tuple[str, Any], ...]
    #: the static labels and annotations the policy writes
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    #: the Decision's record of this policy: when it matches, and per first failed condition
    #: (immutable and independent of the pod, so built once here)
    matched_record: PolicyMatch
    failed_records: Mapping[int, PolicyMatch]
    #: the conditions the policy has, in the order they are checked
    conditions: tuple[int, ...] = ()
    #: per condition, this policy with only that condition (see `met`)
    alone: dict[int, CompiledPolicy] = field(default_factory=dict, compare=False,
                                                repr=False)

    def first_failure(self, m: MatchInput) -> int:
        """0 if the policy matches, else the code of the first condition that fails: the one
        place a match is decided (inline: it runs for every policy on every pod)."""
        if self.namespaces is not None and m.namespace not in self.namespaces:
            return NO_MATCH_NAMESPACE
        if self.ns_selector is not None and not selector_matches(self.ns_selector,
                                                                 m.ns_labels):
            return NO_MATCH_NS_SELECTOR
        if self.pod_selector is not None and not selector_matches(self.pod_selector,
                                                                  m.pod_labels):
            return NO_MATCH_POD_SELECTOR
        if self.owner_kinds is not None and self.owner_kinds.isdisjoint(m.owner_kinds):
            return NO_MATCH_OWNER
        if (self.gpu_min is not None and m.gpus < self.gpu_min) or (
                self.gpu_max is not None and m.gpus > self.gpu_max):
            return NO_MATCH_GPUS
        return 0

    def met(self, condition: int, m: MatchInput) -> bool:
        """Whether one condition holds, decided by `first_failure` of the policy reduced to it."""
        return self.alone[condition].first_failure(m) == 0

    def narrate(self, m: MatchInput) -> PolicyMatch:
        """Every condition, met or not, in words: `met` decides each, as for admission."""
        if not self.conditions:
            return PolicyMatch(self.policy.name, True, ("✓ no conditions: matches every pod",))
        reasons = tuple(("✓ " if self.met(c, m) else "✗ ") + self._describe(c, m)
                        for c in self.conditions)
        return PolicyMatch(self.policy.name, self.first_failure(m) == 0, reasons)

    def _describe(self, condition: int, m: MatchInput) -> str:
        if condition == NO_MATCH_NAMESPACE:
            inside = "is" if m.namespace in (self.namespaces or ()) else "not"
            return (f"namespace {m.namespace or '(none)'} {inside} in "
                    f"{self.policy.spec.match.namespaces}")
        if condition == NO_MATCH_NS_SELECTOR:
            return f"namespaceSelector: {_unmet(self.ns_selector or (), m.ns_labels)}"
        if condition == NO_MATCH_POD_SELECTOR:
            return f"podSelector: {_unmet(self.pod_selector or (), m.pod_labels)}"
        if condition == NO_MATCH_OWNER:
            hit = sorted(m.owner_kinds & (self.owner_kinds or frozenset()))
            chain = ", ".join(sorted(m.owner_kinds)) or "no owner"
            return f"owned by {hit[0]}" if hit else \
                f"owner kinds {self.policy.spec.match.ownerKinds} not in ({chain})"
        return f"{m.gpus_of} requests {m.gpus} GPUs, range [{self.gpu_min}, {self.gpu_max}]"


def compile_policy(policy: SchedulingPolicy, writes: Sequence[tuple[str, Any]]) -> CompiledPolicy:
    m = policy.spec.match
    gpus = m.gpus
    met = [f"✓ namespace in {m.namespaces}" if m.namespaces is not None else "",
           "✓ namespaceSelector matches" if m.namespaceSelector is not None else "",
           "✓ podSelector matches" if m.podSelector is not None else "",
           f"✓ owner of kind {m.ownerKinds}" if m.ownerKinds is not None else "",
           f"✓ GPU count in [{gpus.min}, {gpus.max}]" if gpus is not None else ""]
    fail_reasons = {
        NO_MATCH_NAMESPACE: f"✗ namespace not in {m.namespaces}",
        NO_MATCH_NS_SELECTOR: "✗ namespaceSelector does not match",
        NO_MATCH_POD_SELECTOR: "✗ podSelector does not match",
        NO_MATCH_OWNER: f"✗ no owner of kind {m.ownerKinds}",
        NO_MATCH_GPUS: f"✗ GPU count outside [{gpus.min if gpus else None}, "
                       f"{gpus.max if gpus else None}]",
    }
    present = (m.namespaces, m.namespaceSelector, m.podSelector, m.ownerKinds, m.gpus)
    compiled = CompiledPolicy(
        policy=policy,
        namespaces=frozenset(m.namespaces) if m.namespaces is not None else None,
        ns_selector=_requirements(m.namespaceSelector),
        pod_selector=_requirements(m.podSelector),
        owner_kinds=frozenset(m.ownerKinds) if m.ownerKinds is not None else None,
        gpu_min=gpus.min if gpus else None,
        gpu_max=gpus.max if gpus else None,
        writes=tuple((k, v) for k, v in writes if not k.startswith(("labels.", "annotations."))),
        labels=dict(policy.spec.labels),
        annotations=dict(policy.spec.annotations),
        matched_record=PolicyMatch(policy.name, True, tuple(r for r in met if r)
                                   or ("✓ no conditions: matches every pod",)),
        failed_records={code: PolicyMatch(policy.name, False, (why,))
                        for code, why in fail_reasons.items()},
        conditions=tuple(code for code, cond in enumerate(present, 1) if cond is not None))
    unset: dict[int, dict[str, Any]] = {
        NO_MATCH_NAMESPACE: {"namespaces": None}, NO_MATCH_NS_SELECTOR: {"ns_selector": None},
        NO_MATCH_POD_SELECTOR: {"pod_selector": None}, NO_MATCH_OWNER: {"owner_kinds": None},
        NO_MATCH_GPUS: {"gpu_min": None, "gpu_max": None}}
    compiled.alone.update({c: replace(compiled, **{k: v for other in compiled.conditions
                                                   if other != c for k, v in unset[other].items()})
                           for c in compiled.conditions})
    return compiled


@dataclass(frozen=True, slots=True)
class PolicyIndex:
    """Which policies can match a pod in a given namespace, in evaluation order."""

    by_namespace: Mapping[str, tuple[CompiledPolicy, ...]]
    unscoped: tuple[CompiledPolicy, ...]
    #: every policy, in evaluation order (what `muster policy explain` narrates)
    every: tuple[CompiledPolicy, ...] = ()
    #: the engine's memo of what each set of matched policies writes (see engine._writes)
    merged_writes: Lru[tuple[int, ...], Any] = field(
        default_factory=lambda: Lru(WRITES_MEMO_SIZE), compare=False, repr=False)
    #: the pod label / annotation keys some policy tests or writes, and the engine's own; the
    #: namespace label keys some policy tests (each sorted): all the outcome memo's key reads
    label_keys: tuple[str, ...] = ()
    annotation_keys: tuple[str, ...] = ()
    ns_label_keys: tuple[str, ...] = ()
    #: some policy is in audit or warn mode (the engine then decides twice: engine._rehearse)
    rehearsed: bool = False
    #: the memo of whole outcomes (see webhook.policy.outcome)
    outcomes: Lru[Any, Any] = field(default_factory=lambda: Lru(OUTCOME_MEMO_SIZE),
                                    compare=False, repr=False)
    #: the memo of pods' workload analyses (see webhook.policy.workload.WorkloadMemo)
    workloads: WorkloadMemo = field(default_factory=WorkloadMemo, compare=False, repr=False)

    @classmethod
    def build(cls, compiled: Sequence[CompiledPolicy]) -> PolicyIndex:
        unscoped = tuple(c for c in compiled if c.namespaces is None)
        names = {ns for c in compiled for ns in (c.namespaces or ())}
        by_ns = {ns: tuple(c for c in compiled if c.namespaces is None or ns in c.namespaces)
                 for ns in names}
        labels = {k for c in compiled for _, k, _ in c.pod_selector or ()}
        labels.update(k for c in compiled for k in c.labels)
        labels.update(ENGINE_LABEL_KEYS)
        annotations = {k for c in compiled for k in c.annotations}
        annotations.update(ENGINE_ANNOTATION_KEYS)
        return cls(by_ns, unscoped, tuple(compiled),
                   label_keys=tuple(sorted(labels)),
                   annotation_keys=tuple(sorted(annotations)),
                   ns_label_keys=tuple(sorted({k for c in compiled
                                               for _, k, _ in c.ns_selector or ()})),
                   rehearsed=any(c.policy.spec.enforcement != "enforce" for c in compiled))

    def candidates(self, namespace: str) -> tuple[CompiledPolicy, ...]:
        return self.by_namespace.get(namespace, self.unscoped)
