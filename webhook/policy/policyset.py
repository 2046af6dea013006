"""PolicySet: the loaded policies, immutable, in evaluation order, with a content digest.

Also the load-time analysis of conflicts: two policies of equal priority that write the same
field with different values for pods that both could match.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from webhook.policy.compiled import PolicyIndex, compile_policy
from webhook.policy.errors import PolicyIssue
from webhook.policy.schema import Match, Path, SchedulingPolicy
from webhook.policy.selectors import constraints, provably_disjoint


@dataclass(frozen=True, slots=True)
class PolicySet:
    #: policies in evaluation order: higher spec.priority first, then load order
    policies: tuple[SchedulingPolicy, ...] = ()
    #: where each policy came from ("file:line"), parallel to `policies`
    origins: tuple[str, ...] = ()
    #: sha256 of the policies' canonical JSON: equal digests mean identical behaviour
    digest: str = field(default="")
    #: the policies compiled for matching, indexed by namespace (derived from `policies`)
    index: PolicyIndex = field(default_factory=lambda: PolicyIndex.build(()), repr=False,
                               compare=False)
    #: what `muster policy check` warns about (valid, but very likely not what was meant)
    warnings: tuple[PolicyIssue, ...] = field(default=(), compare=False)

    @classmethod
    def of(cls, policies: list[tuple[SchedulingPolicy, str]],
           warnings: tuple[PolicyIssue, ...] = ()) -> PolicySet:
        ranked = sorted(enumerate(policies), key=lambda item: (-item[1][0].spec.priority, item[0]))
        ordered = tuple(p for _, (p, _) in ranked)
        canonical = json.dumps([p.model_dump(mode="json", exclude_unset=True) for p in ordered],
                               sort_keys=True, separators=(",", ":"))
        index = PolicyIndex.build([
            compile_policy(p, [(k, v) for k, (_, v) in written_fields(p).items()])
            for p in ordered])
        return cls(ordered, tuple(o for _, (_, o) in ranked),
                   hashlib.sha256(canonical.encode()).hexdigest(), index, warnings)

    def __len__(self) -> int:
        return len(self.policies)

    def __iter__(self) -> Iterator[SchedulingPolicy]:
        return iter(self.policies)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.policies)


def written_fields(policy: SchedulingPolicy) -> dict[str, tuple[Path, Any]]:
    """Fields the policy explicitly sets, as merge keys ("gang.queue", "labels.team") with the
    document path of each and its value. Defaults are not written: they apply after merging."""
    spec = policy.spec
    out: dict[str, tuple[Path, Any]] = {}
    for section in ("gang", "istio", "topology"):
        model = getattr(spec, section)
        if model is None:
            continue
        for name in sorted(model.model_fields_set):
            value = getattr(model, name)
            out[f"{section}.{name}"] = (("spec", section, name), value)
    for section in ("labels", "annotations"):
        for key, value in getattr(spec, section).items():
            out[f"{section}.{key}"] = (("spec", section, key), value)
    return out


def disjoint_reason(a: Match, b: Match) -> str | None:
    """Why no pod can match both (conservative: None unless it is provable)."""
    if a.namespaces is not None and b.namespaces is not None and \
            not set(a.namespaces) & set(b.namespaces):
        return "their namespaces differ"
    ns_key = provably_disjoint(constraints(a.namespaceSelector, names=a.namespaces),
                               constraints(b.namespaceSelector, names=b.namespaces))
    if ns_key:
        return f"their namespace selectors exclude each other on {ns_key}"
    pod_key = provably_disjoint(constraints(a.podSelector), constraints(b.podSelector))
    if pod_key:
        return f"their pod selectors exclude each other on {pod_key}"
    if a.gpus and b.gpus:
        lo_a, hi_a = a.gpus.min or 0, a.gpus.max
        lo_b, hi_b = b.gpus.min or 0, b.gpus.max
        if (hi_a is not None and hi_a < lo_b) or (hi_b is not None and hi_b < lo_a):
            return "their GPU ranges do not overlap"
    return None


@dataclass(frozen=True, slots=True)
class Conflict:
    first: int  # indices into the list given to find_conflicts
    second: int
    field: str
    path: Path


def find_conflicts(policies: list[SchedulingPolicy]) -> Iterator[Conflict]:
    """Each conflict, lazily: pairs grow with the square of the policies, so the caller takes
    as many as it reports and only counts the rest."""
    written = [written_fields(p) for p in policies]
    for j, b in enumerate(policies):
        for i in range(j):
            a = policies[i]
            if a.spec.priority != b.spec.priority:
                continue
            clashing = [name for name in written[i].keys() & written[j].keys()
                        if written[i][name][1] != written[j][name][1]]
            if clashing and disjoint_reason(a.spec.match, b.spec.match) is None:
                yield from (Conflict(i, j, name, written[j][name][0]) for name in sorted(clashing))
