"""Capacity held for a gang that preempted others, from the cycle that chose its victims until
its members are bound (docs/binder.md, "Priority and preemption").

The victims take their termination grace to go; meanwhile what they free, and the free GPUs
the preemptor's planned placement uses beside them, must not go to another gang. Each cycle the
planner takes a reservation's slots from what is free right after the preemptor's turn (so a
gang before it in the queue, of higher priority, may still take them; none after it can), and
the preemptor itself is placed afresh on what is free, once its victims are gone."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from webhook.binder.assignment import assigned_indices
from webhook.binder.pods import PodInfo
from webhook.topology.model import GpuAssignment

#: how long past its victims' termination grace a reservation lasts at most (a victim whose
#: node stopped answering never goes: the preemptor then plans again)
MARGIN_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Slot:
    node: str
    gpus: frozenset[int]
    cpu_milli: int
    memory_bytes: int


@dataclass(frozen=True, slots=True)
class Reservation:
    #: the preemptor's key, and its victims' (gangs) and their pods' keys
    gang: str
    slots: tuple[Slot, ...]
    victims: tuple[str, ...]
    victim_pods: tuple[str, ...]
    #: it lapses then (epoch seconds)
    until: float


def reservation(gang: str, assignments: Iterable[tuple[PodInfo, GpuAssignment]],
                victims: Iterable[tuple[str, Iterable[PodInfo]]], now: float) -> Reservation:
    """What the preemptor's planned placement (`assignments`) uses, held for it until its
    victims (gang key, pods) have had their grace and `MARGIN_SECONDS` more."""
    held = [(key, list(pods)) for key, pods in victims]
    pods = [p for _, ps in held for p in ps]
    grace = max((p.grace_seconds for p in pods), default=0)
    return Reservation(
        gang,
        tuple(Slot(a.node, frozenset(assigned_indices(a)), p.cpu_milli, p.memory_bytes)
              for p, a in assignments),
        tuple(key for key, _ in held), tuple(p.key for p in pods),
        now + grace + MARGIN_SECONDS)
