"""A Kueue or KAI Topology object in the cluster as the binder's network levels
(`--network-levels kueue:NAME` or `kai:NAME`): its spec.levels, read as the object changes, so
an admin edits the levels where Kueue or KAI read them, once, and the binder follows.

An edit that cannot be read, and the object's deletion, keep the levels last read: a bad edit
never replaces the last good levels (the binder says so in its log). Until the object is first
read there are no levels, and a gang that names a level is placed by that label alone."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.topology.network import Levels, LevelsError, TopologyRef, parse_levels


@dataclass(frozen=True, slots=True)
class Read:
    """What one event of the named object did: the levels now (`changed`: not the ones before),
    and, where the event left them as they were, why (empty when it was read)."""

    levels: Levels
    changed: bool
    problem: str = ""


class TopologyView:
    """The levels of the Topology object `ref` names, as its informer sees it."""

    def __init__(self, ref: TopologyRef) -> None:
        self.ref = ref
        self.levels = Levels()
        #: whether the object was ever read (its absence at sync is worth a warning)
        self.seen = False

    def on_event(self, event: str, obj: Mapping[str, Any]) -> Read | None:
        """The object's event read; None for another Topology's."""
        if (obj.get("metadata") or {}).get("name") != self.ref.name:
            return None
        if event == "DELETED":
            return Read(self.levels, False, f"{self.ref.says} was deleted")
        try:
            levels = parse_levels(obj)
        except LevelsError as exc:
            return Read(self.levels, False, f"{self.ref.says} cannot be read: {exc}")
        changed, self.levels, self.seen = levels != self.levels, levels, True
        return Read(levels, changed)


def listed(levels: Levels) -> str:
    """Levels as a message lists them: "block > rack (alias rack)"; "none"."""
    if not levels.labels:
        return "none"
    names = {label: alias for alias, label in levels.aliases}
    return " > ".join(f"{label} (alias {names[label]})" if label in names else label
                      for label in levels.labels)
