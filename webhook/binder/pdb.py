"""PodDisruptionBudgets (policy/v1) as preemption reads them: may a whole gang be evicted now?

The Eviction API refuses (429) an eviction its pod's budgets do not allow, and takes one
disruption from each budget per pod evicted; so a gang may be evicted when each budget covering
some of its pods allows at least that many disruptions now. A budget the disruption controller
has not observed yet (no status for its generation) allows none, as the Eviction API reads it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.binder.pods import PodInfo, label_selector
from webhook.policy.compiled import Requirement as LabelRequirement
from webhook.policy.compiled import selector_matches


@dataclass(frozen=True, slots=True)
class PdbInfo:
    namespace: str
    name: str
    #: None: selects no pod (a budget without a selector); (): every pod of its namespace
    selector: tuple[LabelRequirement, ...] | None
    #: status.disruptionsAllowed, 0 until the budget's generation is observed
    allowed: int


def parse_pdb(obj: Mapping[str, Any]) -> PdbInfo:
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    status = obj.get("status") or {}
    observed = status.get("observedGeneration", -1) >= meta.get("generation", 0)
    allowed = status.get("disruptionsAllowed")
    return PdbInfo(str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                   label_selector(spec.get("selector")),
                   allowed if observed and isinstance(allowed, int) else 0)


def forbidding(pods: Sequence[PodInfo], pdbs: Iterable[PdbInfo]) -> PdbInfo | None:
    """The first budget that forbids evicting all of `pods` now; None when none does."""
    for pdb in pdbs:
        if pdb.selector is None:
            continue
        covered = sum(1 for p in pods if p.namespace == pdb.namespace
                      and selector_matches(pdb.selector, dict(p.labels)))
        if covered > pdb.allowed:
            return pdb
    return None
