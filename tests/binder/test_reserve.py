"""How long the binder holds a preemptor's reservation (webhook.binder.preempting.prune)."""

from __future__ import annotations

from typing import Any

from binder_objects import pod

from webhook.binder.evict import Evictor
from webhook.binder.metrics import Metrics
from webhook.binder.pods import parse_pod
from webhook.binder.preempting import Preemptions
from webhook.binder.reserve import MARGIN_SECONDS, reservation
from webhook.binder.snapshot import Snapshot

NOW = 1795237200.0


def victim(name: str, grace: int) -> dict[str, Any]:
    return pod(name, gpus=8, node_name="n1", phase="Running",
               extra_spec={"terminationGracePeriodSeconds": grace})


def held(grace: int = 30) -> tuple[Preemptions, Snapshot]:
    snapshot = Snapshot("muster-binder")
    victims = [parse_pod(victim("v-0", grace)), parse_pod(victim("v-1", 5))]
    for p in victims:
        snapshot.put(p)
    # (no API: pruning writes nothing)
    pre = Preemptions(Evictor(None, None, Metrics(), lambda _: None, lambda: None), snapshot)
    pre.reserved["team-a/high"] = reservation("team-a/high", (), [("team-a/v", victims)], NOW)
    return pre, snapshot


def test_held_while_a_victim_holds_and_the_gang_waits_for_its_longest_grace() -> None:
    pre, _ = held(grace=90)
    assert pre.reserved["team-a/high"].until == NOW + 90 + MARGIN_SECONDS
    pre.prune({"team-a/high"}, NOW + 90)
    assert "team-a/high" in pre.reserved
    pre.prune({"team-a/high"}, NOW + 90 + MARGIN_SECONDS)  # a victim that never goes
    assert not pre.reserved


def test_let_go_once_every_victim_is_gone_or_the_gang_is_placed() -> None:
    pre, snapshot = held()
    snapshot.remove("team-a/v-0")
    pre.prune({"team-a/high"}, NOW)
    assert "team-a/high" in pre.reserved  # v-1 still holds
    snapshot.remove("team-a/v-1")
    pre.prune({"team-a/high"}, NOW)
    assert not pre.reserved
    pre, _ = held()
    pre.prune(set(), NOW)  # bound: no member pending
    assert not pre.reserved
