"""`muster policy check`: the network levels policies name that none of the binder's levels is
(docs/topology.md, "Network levels"), the levels being --network-levels, or those a values file
or `helm template`'s output gives the binder. The binder places a gang that names such a level
by a node label of that name alone, so `rack` beside the binder's `example.com/rack` (without
the alias `rack`) is very likely a mistake.

The binder's levels are read by the binder's own parser (`webhook.topology.network`); this is
the one place the policy commands read them (.importlinter says so).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from webhook.failures import UsageError
from webhook.keys import HOSTNAME_LABEL
from webhook.policy.chart import BinderLevels
from webhook.policy.policyset import PolicySet
from webhook.policy.schema import Network
from webhook.topology.network import Levels, LevelsError, read_levels


def binder_levels(value: str) -> Levels:
    """`--network-levels` as `muster bind` reads it; UsageError when it cannot be used."""
    try:
        return read_levels(value)
    except LevelsError as exc:
        raise UsageError(f"--network-levels {exc}") from exc


def level_warnings(policies: PolicySet, flag: Levels | None, given: BinderLevels | None
                   ) -> list[str]:
    """The warnings of `unnamed_levels` for --network-levels (`flag`), else for the levels a
    chart file gives the binder."""
    if flag is not None:
        return unnamed_levels(policies, flag)
    if given is None:
        return []
    levels, said = _levels_of(given)
    return [*said, *(unnamed_levels(policies, levels, given.source) if levels else ())]


def _levels_of(given: BinderLevels) -> tuple[Levels | None, list[str]]:
    """The levels a chart file gives the binder (none when it runs without, or reads them from
    a file in its pod: `@FILE`), or a warning when the binder would refuse them."""
    if given.value is None or given.value.startswith("@"):
        return None, []
    try:
        return read_levels(given.value), []
    except LevelsError as exc:
        return None, [f"{given.source}: warning: {exc}: the binder refuses these levels (it "
                      "would not start)"]


def unnamed_levels(policies: PolicySet, levels: Levels, source: str = "") -> list[str]:
    """A warning line for each level a policy's topology.network names that is neither a level
    nor an alias of `levels` (read from `source`, when not --network-levels), nor the node
    itself; none where the levels are only known in the cluster (Topograph's labels, Volcano's
    HyperNodes, a Topology object)."""
    if not levels.labels:
        return []
    whose = f"; from {source}" if source else ""
    known = [*levels.labels, *(alias for alias, _ in levels.aliases)]
    out = []
    for policy, origin in zip(policies.policies, policies.origins, strict=True):
        network = policy.spec.topology.network if policy.spec.topology else None
        for field, name in _named(network):
            if name not in known and name != HOSTNAME_LABEL:
                out.append(f"{origin}: warning: spec.topology.network.{field}: {name!r} is no "
                           f"level of the binder's ({', '.join(known)}{whose}): a gang is "
                           f"placed by a node label {name!r} alone{_meant(name, known)} (policy "
                           f"{policy.name})")
    return out


def _named(network: Network | None) -> Iterator[tuple[str, str]]:
    if network is None:
        return
    for field, name in (("required", network.required), ("preferred", network.preferred),
                        ("slice.level", network.slice.level if network.slice else None)):
        if name is not None:
            yield field, name


def _meant(name: str, known: list[str]) -> str:
    """"; did you mean X?" for the level most likely meant: the label whose name part is this
    name (`rack` for `example.com/rack`), else the closest spelling."""
    same = [k for k in known if k.rpartition("/")[2] == name.rpartition("/")[2]]
    close = same or difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""
