"""The pods/eviction subresource (policy/v1 Eviction), as the API server decides it: an
eviction a PodDisruptionBudget covering the pod does not allow now is refused with 429; a pod
that is not running (Pending, Succeeded, Failed) or is being deleted is evicted whatever its
budgets say; each budget covering an evicted pod allows one disruption less until the
disruption controller (here: whoever writes its status) counts again."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .errors import ApiStatusError
from .selectors import label_selector_object, labels_match


def covering(pod: Mapping[str, Any], budgets: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The budgets whose selector selects the pod (a budget without one selects nothing)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return [b for b in budgets if (b.get("spec") or {}).get("selector") is not None
            and labels_match(label_selector_object(b["spec"]["selector"]), labels)]


def ignores_budgets(pod: Mapping[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase", "Pending")
    return phase in ("Pending", "Succeeded", "Failed") or \
        bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def forbidding(budgets: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The first budget that allows no disruption now (or whose spec is not observed yet)."""
    for b in budgets:
        status = b.get("status") or {}
        observed = status.get("observedGeneration", -1) >= (b.get("metadata") or {}).get(
            "generation", 0)
        if not observed or int(status.get("disruptionsAllowed") or 0) < 1:
            return b
    return None


def refused(budget: Mapping[str, Any]) -> ApiStatusError:
    name = (budget.get("metadata") or {}).get("name", "")
    return ApiStatusError(429, "TooManyRequests", "Cannot evict pod as it would violate the "
                          "pod's disruption budget.", {"causes": [{
                              "reason": "DisruptionBudget",
                              "message": f"The disruption budget {name} needs more healthy "
                                         "pods to allow this eviction"}]})
