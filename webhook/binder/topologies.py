"""Kueue's or KAI's Topology objects in the cluster as the binder's network levels
(`--network-levels kueue:NAME` or `kai:NAME`): NAME's spec.levels are the binder's levels, read
as the object changes, so an admin edits the levels where Kueue or KAI read them, once, and the
binder follows; every other Topology of the API is read too, for the gangs that name one (KAI's
`kai.scheduler/topology`).

An edit that cannot be read, and an object's deletion, keep the levels last read from it: a bad
edit never replaces the last good levels (the binder says so in its log). Until NAME is first
read the binder has no levels, and a gang that names a level is placed by that label alone."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.topology.network import Levels, LevelsError, TopologyRef, parse_levels


@dataclass(frozen=True, slots=True)
class Read:
    """What one event of a Topology did: the object, its levels now (`changed`: not the ones
    before), and, where the event left them as they were, why (empty when it was read)."""

    ref: TopologyRef
    levels: Levels
    changed: bool
    problem: str = ""


class TopologyView:
    """The levels of each Topology object of `ref`'s API, as its informer sees them; `ref`'s
    are the binder's own."""

    def __init__(self, ref: TopologyRef) -> None:
        self.ref = ref
        #: the levels last read from each object, by name
        self._read: dict[str, Levels] = {}

    @property
    def levels(self) -> Levels:
        """The binder's levels: `ref`'s, none until it is read."""
        return self._read.get(self.ref.name, Levels())

    @property
    def seen(self) -> bool:
        """Whether `ref` was ever read (its absence at sync is worth a warning)."""
        return self.ref.name in self._read

    def named(self) -> dict[str, Levels]:
        """Every object's levels, by reference ("kai:NAME"), as a request names them."""
        return {str(TopologyRef(self.ref.api, name)): levels
                for name, levels in self._read.items()}

    def on_event(self, event: str, obj: Mapping[str, Any]) -> Read:
        ref = TopologyRef(self.ref.api, str((obj.get("metadata") or {}).get("name")))
        before = self._read.get(ref.name, Levels())
        if event == "DELETED":
            return Read(ref, before, False, f"{ref.says} was deleted")
        try:
            levels = parse_levels(obj)
        except LevelsError as exc:
            return Read(ref, before, False, f"{ref.says} cannot be read: {exc}")
        changed = ref.name not in self._read or levels != before
        self._read[ref.name] = levels
        return Read(ref, levels, changed)


def listed(levels: Levels) -> str:
    """Levels as a message lists them: "block > rack (alias rack)"; "none"."""
    if not levels.labels:
        return "none"
    names = {label: alias for alias, label in levels.aliases}
    return " > ".join(f"{label} (alias {names[label]})" if label in names else label
                      for label in levels.labels)
