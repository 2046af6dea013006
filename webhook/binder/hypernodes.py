"""Volcano's HyperNodes (`topology.volcano.sh/v1alpha1`) as the binder's network levels
(`--network-levels volcano`): each tier a level, each HyperNode a domain of its tier.

Read as Volcano's scheduler reads them:
- a member of type Node is selected by `exactMatch.name`, `regexMatch.pattern` (a search in the
  node's name, as Go's `MatchString`, in Go's syntax, RE2's: a pattern Go refuses selects
  nothing, and `[[:digit:]]` or `\\z` mean what they mean to Go) or `labelMatch` (a label
  selector; an empty one selects nothing); a member of type HyperNode by `exactMatch.name` only;
- a HyperNode has one parent, of a higher tier.

A node's domains are its HyperNode and that one's ancestors. Tiers a chain skips are filled from
below (a tier-3 HyperNode whose member is a tier-1 one: that tier-1 HyperNode is also its nodes'
tier-2 domain, holding just them), so domains stay nested. A node in no HyperNode is in no
domain, as a node without the widest label is. What cannot be read is said in `problems` and
left out, never guessed: a missing member, a member of a higher tier, a second parent.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import re2  # type: ignore[import-untyped]

from webhook import keys
from webhook.binder.interpod import LabelIndex
from webhook.binder.nodes import NodeInfo
from webhook.binder.pods import label_selector
from webhook.policy.compiled import Requirement as LabelRequirement
from webhook.policy.compiled import selector_matches
from webhook.topology.network import Levels

#: the network level of HyperNode tier N: a name no node carries as a label, for the levels
TIER_LABEL_PREFIX = f"{keys.DOMAIN}/hypernode-tier-"
#: at most this many problems are listed, then how many more there were
_MOST_PROBLEMS = 20
#: more changed nodes than this are read by matching every HyperNode again (`Candidates`: a
#: pattern's or a label's nodes found at once), not each node against every HyperNode
_FEW_NODES = 32


def tier_label(tier: int) -> str:
    return f"{TIER_LABEL_PREFIX}{tier}"


class HyperNodeError(ValueError):
    """A HyperNode object that cannot be read at all (no name, no whole-number tier)."""


_RE2 = re2.Options()
_RE2.log_errors = False  # (a bad pattern is a problem the caller reports, not a C++ log line)


class Pattern:
    """A `regexMatch` pattern as Go's regexp reads it (RE2), for a search in node names."""

    __slots__ = ("_set", "pattern")

    def __init__(self, pattern: str) -> None:
        """ValueError says why RE2 (so Go) refuses `pattern`."""
        self.pattern = pattern
        # a one-pattern Set: 4x the cost of Python's re per name, where re2's search is 20x
        self._set = re2.Set.SearchSet(_RE2)
        try:
            self._set.Add(pattern)
        except re2.error:  # (a Set says only that it failed; compiling says why)
            raise ValueError(_refusal(pattern)) from None
        self._set.Compile()

    def search(self, name: str) -> bool:
        return self._set.Match(name) is not None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pattern) and other.pattern == self.pattern

    def __hash__(self) -> int:
        return hash(self.pattern)


def _refusal(pattern: str) -> str:
    try:
        re2.compile(pattern, _RE2)
    except re2.error as exc:
        why = exc.args[0] if exc.args else exc
        return why.decode(errors="replace") if isinstance(why, bytes) else str(why)
    return "RE2 refuses it"


@dataclass(frozen=True, slots=True)
class Member:
    """A member of type Node: one of an exact name, a pattern, a label selector."""

    exact: str | None = None
    pattern: Pattern | None = None
    labels: tuple[LabelRequirement, ...] | None = None

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if self.exact is not None:
            return name == self.exact
        if self.pattern is not None:
            return self.pattern.search(name)
        return bool(self.labels) and selector_matches(self.labels or (), labels)


@dataclass(frozen=True, slots=True)
class HyperNode:
    name: str
    tier: int
    tier_name: str
    nodes: tuple[Member, ...]
    children: tuple[str, ...]


def parse_hypernode(obj: Mapping[str, Any]) -> tuple[HyperNode, list[str]]:
    """The HyperNode and what of it was left out (members that select nothing readable)."""
    name = (obj.get("metadata") or {}).get("name")
    spec = obj.get("spec") or {}
    tier = spec.get("tier")
    if not isinstance(name, str) or not name:
        raise HyperNodeError("a HyperNode without a name")
    if not isinstance(tier, int) or isinstance(tier, bool) or tier < 0:
        raise HyperNodeError(f"HyperNode {name}: spec.tier {tier!r} is not a whole number")
    nodes: list[Member] = []
    children: list[str] = []
    problems: list[str] = []
    for i, m in enumerate(spec.get("members") or ()):
        sel = (m.get("selector") if isinstance(m, Mapping) else None) or {}
        kind = m.get("type") if isinstance(m, Mapping) else None
        exact = (sel.get("exactMatch") or {}).get("name")
        if kind == "HyperNode":
            if isinstance(exact, str) and exact:
                children.append(exact)
            else:
                problems.append(f"HyperNode {name}: member {i + 1}: a HyperNode member is "
                                "selected by exactMatch only")
            continue
        member = _node_member(sel, exact)
        if kind != "Node" or isinstance(member, str):
            why = member if isinstance(member, str) else f"unknown member type {kind!r}"
            problems.append(f"HyperNode {name}: member {i + 1}: {why}")
            continue
        nodes.append(member)
    return HyperNode(name, tier, str(spec.get("tierName") or ""), tuple(nodes),
                     tuple(children)), problems


def _node_member(sel: Mapping[str, Any], exact: Any) -> Member | str:
    """A Node member's selector, or why it selects nothing."""
    if isinstance(exact, str) and exact:
        return Member(exact=exact)
    pattern = (sel.get("regexMatch") or {}).get("pattern")
    if isinstance(pattern, str) and pattern:
        try:
            return Member(pattern=Pattern(pattern))
        except ValueError as exc:
            return f"regexMatch {pattern!r} is not a regular expression ({exc})"
    labels = label_selector(sel.get("labelMatch"))
    if labels:
        return Member(labels=labels)
    return "no exactMatch, regexMatch or non-empty labelMatch"


class Candidates:
    """The nodes a member may select, found without reading every node where its selector
    allows: a pattern's literal prefix by bisection of the sorted names, a label selector's
    required values from the nodes by label value."""

    def __init__(self, nodes: Mapping[str, NodeInfo]) -> None:
        self.nodes = nodes
        self._sorted: list[str] | None = None
        self._index: LabelIndex | None = None

    def of(self, m: Member) -> Iterable[str]:
        if m.pattern is not None:
            return self._prefixed(_literal_prefix(m.pattern.pattern))
        if self._index is None:
            self._index = LabelIndex(self.nodes)
        for op, key, values in m.labels or ():
            if op in ("=", "In"):
                by_value = self._index.values(key)
                return {n for v in values for n in by_value.get(v, ())}
            if op == "Exists":
                return self._index.carrying((key,))
        return self.nodes

    def _prefixed(self, prefix: str) -> Iterable[str]:
        if not prefix:
            return self.nodes
        if self._sorted is None:
            self._sorted = sorted(self.nodes)
        at = bisect.bisect_left(self._sorted, prefix)
        return itertools.takewhile(lambda n: n.startswith(prefix), self._sorted[at:])


#: a pattern's characters that match only themselves (and an escaped `.` or `-`)
_LITERAL = re.compile(r"\^((?:[A-Za-z0-9_-]|\\[.-])*)")


def _literal_prefix(pattern: str) -> str:
    """The text every name the pattern selects starts with ("" when it has no such prefix): an
    anchored literal head, without its last character where a quantifier may drop it, and none
    where the pattern has an alternation."""
    head = _LITERAL.match(pattern)
    if head is None or "|" in pattern:
        return ""
    literal = head.group(1)
    if pattern[head.end():head.end() + 1] in ("?", "*", "{"):
        literal = literal[:-2] if literal.endswith(("\\.", "\\-")) else literal[:-1]
    return literal.replace("\\", "")


def selected(h: HyperNode, nodes: Candidates) -> set[str]:
    """The nodes `h`'s Node members select."""
    out: set[str] = set()
    for m in h.nodes:
        if m.exact is not None:
            if m.exact in nodes.nodes:
                out.add(m.exact)
        elif m.pattern is not None:  # (filter calls the pattern's search without a frame)
            out.update(filter(m.pattern.search, nodes.of(m)))
        else:
            out.update(name for name in nodes.of(m)
                       if m.matches(name, nodes.nodes[name].labels))
    return out


def selects(h: HyperNode, name: str, labels: Mapping[str, str]) -> bool:
    return any(m.matches(name, labels) for m in h.nodes)


@dataclass(frozen=True, slots=True)
class Tiers:
    """The levels (`tier_label`s widest first, with their tiers and tierName aliases), each
    node's domain per level (node -> {tier label: HyperNode name}), and what was left out."""

    levels: Levels
    domains: Mapping[str, Mapping[str, str]]
    problems: tuple[str, ...]


def tiers(hypernodes: Iterable[HyperNode], members: Mapping[str, Iterable[str]],
          problems: Iterable[str] = ()) -> Tiers:
    """The network levels and every node's domains that `hypernodes` make, given the nodes
    each one's Node members select (`members`: HyperNode name -> node names, `selected`).
    `problems`: those found while parsing, listed first."""
    said = list(problems)
    by_name = {h.name: h for h in sorted(hypernodes, key=lambda h: h.name)}
    parent = _parents(by_name, said)
    leaf = _leaves(by_name, members, said)
    chains: dict[str, tuple[HyperNode, ...]] = {}  # per leaf: it and its ancestors
    for name in set(leaf.values()):
        chain, at = [by_name[name]], parent.get(name)
        while at is not None:
            chain.append(by_name[at])
            at = parent.get(at)
        chains[name] = tuple(chain)
    order = sorted({h.tier for chain in chains.values() for h in chain}, reverse=True)
    paths = {name: _path(chain, order) for name, chain in chains.items()}
    domains = {node: paths[name] for node, name in leaf.items()}
    levels = Levels(tuple(tier_label(t) for t in order), _aliases(by_name, order, said),
                    True, tuple(order))
    if len(said) > _MOST_PROBLEMS:
        said[_MOST_PROBLEMS:] = [f"and {len(said) - _MOST_PROBLEMS} more"]
    return Tiers(levels, domains, tuple(said))


def _parents(by_name: Mapping[str, HyperNode], said: list[str]) -> dict[str, str]:
    """Each HyperNode's parent: the first by name that lists it, of a higher tier (so no
    chain loops)."""
    parent: dict[str, str] = {}
    for h in by_name.values():
        for name in h.children:
            child = by_name.get(name)
            if child is None:
                said.append(f"HyperNode {h.name}: member HyperNode {name} does not exist")
            elif child.tier >= h.tier:
                said.append(f"HyperNode {h.name} (tier {h.tier}): member {name} has tier "
                            f"{child.tier}, not a lower one: left out")
            elif name in parent:
                said.append(f"HyperNode {name} is a member of {parent[name]} and {h.name}: "
                            f"read as in {parent[name]}")
            else:
                parent[name] = h.name
    return parent


def _leaves(by_name: Mapping[str, HyperNode], members: Mapping[str, Iterable[str]],
            said: list[str]) -> dict[str, str]:
    """node -> the HyperNode it is a member of: the lowest tier, then the first by name."""
    found: dict[str, list[HyperNode]] = {}
    for name, nodes in members.items():
        h = by_name.get(name)
        if h is not None:
            for node in nodes:
                found.setdefault(node, []).append(h)
    out: dict[str, str] = {}
    for node in sorted(found):
        ranked = sorted(found[node], key=lambda h: (h.tier, h.name))
        out[node] = ranked[0].name
        if len(ranked) > 1:
            said.append(f"node {node} is a member of HyperNodes "
                        f"{', '.join(h.name for h in ranked)}: read as in {ranked[0].name}")
    return out


def _path(chain: tuple[HyperNode, ...], order: list[int]) -> dict[str, str]:
    """A leaf's domains per tier of `order` (widest first): the widest of its chain at most
    that tier; none below the leaf's own tier."""
    out: dict[str, str] = {}
    for tier in order:
        within = [h for h in chain if h.tier <= tier]
        if not within:
            break
        out[tier_label(tier)] = within[-1].name
    return out


def _aliases(by_name: Mapping[str, HyperNode], order: list[int], said: list[str]
             ) -> tuple[tuple[str, str], ...]:
    """tierName -> its tier's level, where the tier's HyperNodes agree on one name that is a
    label key (a level's alias is one) and no other tier has it."""
    names: dict[int, set[str]] = {}
    for h in by_name.values():
        if h.tier_name:
            names.setdefault(h.tier, set()).add(h.tier_name)
    out: list[tuple[str, str]] = []
    for tier in order:
        found = sorted(names.get(tier, ()))
        if len(found) > 1:
            said.append(f"tier {tier}: HyperNodes name it {', '.join(found)}: no tierName read")
        elif found and not keys.is_label_key(found[0]):
            said.append(f"tier {tier}: tierName {found[0]!r} cannot name a level")
        elif found and any(alias == found[0] for alias, _ in out):
            said.append(f"tierName {found[0]} names two tiers: read for the wider")
        elif found:
            out.append((found[0], tier_label(tier)))
    return tuple(out)


class HyperNodeView:
    """The binder's HyperNodes as its informer sees them, the nodes each selects, and the
    tiers they make. A changed HyperNode is matched against every node, a changed node (new,
    gone, or its labels) against every HyperNode, and only then (`selected`, `selects`): a
    node that joins a 4,096-node cluster costs its own matches, not the cluster's."""

    def __init__(self) -> None:
        self._objects: dict[str, tuple[HyperNode, list[str]]] = {}
        self._unread: dict[str, str] = {}
        self._members: dict[str, set[str]] = {}
        self._new_hypernodes: set[str] = set()
        self._new_nodes: set[str] = set()
        self._tiers: Tiers | None = None

    def on_event(self, event: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        self._objects.pop(name, None)
        self._unread.pop(name, None)
        self._members.pop(name, None)
        self._new_hypernodes.discard(name)
        if event != "DELETED":
            try:
                self._objects[name] = parse_hypernode(obj)
                self._new_hypernodes.add(name)
            except HyperNodeError as exc:
                self._unread[name] = str(exc)
        self._tiers = None

    def nodes_changed(self, name: str) -> None:
        """The node came, went or changed its labels."""
        self._new_nodes.add(name)
        self._tiers = None

    def tiers(self, nodes: Mapping[str, NodeInfo]) -> tuple[Tiers, bool]:
        """The tiers, and whether they were remade now (their problems are new then)."""
        if self._tiers is not None:
            return self._tiers, False
        if len(self._new_nodes) > _FEW_NODES:  # (a sync, a mass relabel): every HyperNode
            self._new_hypernodes = set(self._objects)
        candidates = Candidates(nodes)
        for name in self._new_hypernodes:
            self._members[name] = selected(self._objects[name][0], candidates)
        kept = [(name, h) for name, (h, _) in self._objects.items()
                if name not in self._new_hypernodes]
        for node in self._new_nodes if kept else ():
            info = nodes.get(node)
            for name, h in kept:
                if info is not None and selects(h, node, info.labels):
                    self._members[name].add(node)
                else:
                    self._members[name].discard(node)
        self._new_hypernodes.clear()
        self._new_nodes.clear()
        problems = [*self._unread.values(), *(p for _, said in self._objects.values()
                                              for p in said)]
        self._tiers = tiers((h for h, _ in self._objects.values()), self._members, problems)
        return self._tiers, True
