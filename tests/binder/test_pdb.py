"""PodDisruptionBudgets as preemption reads them: how many disruptions each allows now."""

from __future__ import annotations

from typing import Any

from binder_objects import pod

from webhook.binder.pdb import forbidding, parse_pdb
from webhook.binder.pods import parse_pod


def budget(allowed: int, *, selector: dict[str, Any] | None = None, observed: int = 1
           ) -> dict[str, Any]:
    return {"metadata": {"name": "b", "namespace": "team-a", "generation": 1},
            "spec": {"selector": selector} if selector is not None else {},
            "status": {"observedGeneration": observed, "disruptionsAllowed": allowed}}


def gang(count: int, app: str = "a") -> list[Any]:
    return [parse_pod(pod(f"p{i}", labels={"app": app})) for i in range(count)]


def test_a_budget_must_allow_as_many_disruptions_as_the_gang_has_covered_pods() -> None:
    two = parse_pdb(budget(2, selector={"matchLabels": {"app": "a"}}))
    assert forbidding(gang(2), [two]) is None
    assert forbidding(gang(3), [two]) is two
    assert forbidding(gang(3, app="b"), [two]) is None  # not covered


def test_an_unobserved_budget_allows_none_and_one_without_a_selector_covers_none() -> None:
    stale = parse_pdb(budget(5, selector={}, observed=0))
    assert stale.allowed == 0 and forbidding(gang(1), [stale]) is stale
    assert forbidding(gang(4), [parse_pdb(budget(0))]) is None
