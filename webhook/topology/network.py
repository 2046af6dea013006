"""The cluster's network levels: which node labels say which nodes share a switch, a rack, a
block or an NVLink domain, ordered widest first (docs/topology.md, "Network levels").

An admin declares the levels once, in one of the shapes users already have:
- a list of node labels, widest first (an entry may be `{nodeLabel, alias}`, or `ALIAS=LABEL`
  on the command line);
- Kueue's `Topology` object (`kueue.x-k8s.io/v1beta2`, `spec.levels[].nodeLabel`), or KAI's
  (`kai.scheduler/v1`, or `v1alpha1`, whose levels may have an `alias`);
- `topograph`: the labels NVIDIA Topograph wrote on the nodes (`topograph_levels`);
- `kueue:NAME` or `kai:NAME`: that Topology object in the cluster, read by the binder as it
  changes (`TopologyRef`, `webhook.binder.topologies`).
`nvidia.com/gpu.clique` (GPU Feature Discovery: `<ClusterUUID>.<CliqueID>`) is a level like any
other: the nodes with one value are one multi-node NVLink domain. `kubernetes.io/hostname` is
always the narrowest level, the node itself, whether it is declared or not. An alias names its
level wherever a label does (a KAI manifest may name `rack` for `example.com/rack`).

A domain of level i is the path of the node's values down to it (rack `r1` of block `b1` is
not rack `r1` of block `b2`), as Kueue keys its domains. A node that lacks a declared label is
in no domain of that level or any narrower one (a DGX node without a clique label is still in
its rack and block).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path as FsPath
from typing import Any

from webhook.keys import (
    HOSTNAME_LABEL,
    TOPOLOGY_APIS,
    decimal,
    is_dns_subdomain,
    is_label_key,
    network_tier,
    topology_object,
)
from webhook.topology.model import NetworkRequest
from webhook.yamlpos import YamlProblem, load_all, read

HOSTNAME = HOSTNAME_LABEL
CLIQUE = "nvidia.com/gpu.clique"
#: NVIDIA Topograph's labels up to v0.5: three switch tiers, widest first, and an NVLink domain
TOPOGRAPH_V0_FABRIC = tuple(f"network.topology.nvidia.com/{tier}"
                            for tier in ("core", "spine", "leaf"))
TOPOGRAPH_V0_ACCELERATOR = ("network.topology.nvidia.com/accelerator",)
#: since v1.0: switch tiers of any depth (tier 0 the leaf switch, numbered outwards), and an
#: NVLink domain with an optional sub-domain
TOPOGRAPH_TIER_PREFIX = "fabric.topograph.run/tier-"
TOPOGRAPH_ACCELERATOR = ("accelerator.topograph.run/domain",
                         "accelerator.topograph.run/sub-domain")
#: the levels whose domains are multi-node NVLink domains: their nodes reach each other over
#: NVLink, as fast as a node's own GPUs do on a GB200 tray
NVLINK_LEVELS = frozenset((CLIQUE, *TOPOGRAPH_V0_ACCELERATOR, *TOPOGRAPH_ACCELERATOR))
KUEUE_API_VERSIONS = ("kueue.x-k8s.io/v1beta2", "kueue.x-k8s.io/v1beta1",
                      "kueue.x-k8s.io/v1alpha1")
KAI_API_VERSIONS = ("kai.scheduler/v1", "kai.scheduler/v1alpha1")


class LevelsError(ValueError):
    """A declaration of network levels that cannot be used, with what is wrong."""


@dataclass(frozen=True, slots=True)
class TopologyRef:
    """A Topology object in the cluster whose spec.levels are the levels: Kueue's (`api`
    "kueue") or KAI's ("kai"), cluster-scoped, by name."""

    api: str
    name: str

    def __str__(self) -> str:
        return topology_object(self.api, self.name)

    @property
    def group(self) -> str:
        return TOPOLOGY_APIS[self.api]

    @property
    def says(self) -> str:
        """How a message names it: "KAI Topology cluster-topology"."""
        return f"{'Kueue' if self.api == 'kueue' else 'KAI'} Topology {self.name}"


@dataclass(frozen=True, slots=True)
class Levels:
    """The declared levels: node labels widest first (without the node level), and the aliases
    that name some of them, as (alias, label) pairs. `hypernodes`: the levels are Volcano's
    HyperNode tiers (`webhook.binder.hypernodes`), `tiers` each label's tier."""

    labels: tuple[str, ...] = ()
    aliases: tuple[tuple[str, str], ...] = ()
    hypernodes: bool = False
    tiers: tuple[int, ...] = ()
    #: the levels are the labels Topograph wrote on the nodes (`on`)
    topograph: bool = False
    #: the levels are this Topology object's, read from the cluster as it changes (none until
    #: it is read: a gang that names a level is placed by that label alone)
    topology: TopologyRef | None = None

    def on(self, labels_of: Iterable[Mapping[str, str]]) -> Levels:
        """These levels on nodes with these labels: Topograph's, the labels found there."""
        return Levels(topograph_levels(labels_of)) if self.topograph else self

    def label(self, name: str) -> str:
        """The label `name` stands for: the one it is an alias of, else itself."""
        return next((label for alias, label in self.aliases if alias == name), name)

    def is_tier(self, label: str) -> bool:
        """Whether level `label` is a HyperNode tier (a `tier_label`), which no node carries."""
        return self.hypernodes and label in self.labels

    def kind(self, label: str) -> str:
        """How a message names a domain of level `label`: "tier-1 HyperNode (leaf)" where the
        levels are HyperNode tiers (with the tier's tierName), else "<label> domain"."""
        if not self.is_tier(label):
            return f"{label} domain"
        tier = self.tiers[self.labels.index(label)]
        names = [alias for alias, of in self.aliases if of == label]
        return f"tier-{tier} HyperNode" + (f" ({names[0]})" if names else "")

    def which(self, label: str, value: str) -> str:
        """How a message names one domain: "HyperNode <name>", else "<label>=<value>"."""
        if self.is_tier(label):
            return f"HyperNode {value}"
        return f"{label}={value}"

    def resolve(self, name: str) -> str | None:
        """The label a request's level `name` stands for: an alias's label; tier N's, None for a
        tier above the widest level (the whole cluster); else the name itself. Tier N (N >= 1)
        is HyperNode tier N where the levels are HyperNode tiers (the widest at most N; one
        node below the narrowest, or while there is no HyperNode), else the N-th level counted
        from the narrowest up, as Volcano's label-based HyperNode discovery counts them."""
        tier = network_tier(name)
        if tier is None:  # (not a tier: a label, or "tier:0", which no node may have)
            return self.label(name)
        if self.hypernodes:
            if self.tiers and tier > self.tiers[0]:
                return None
            return next((label for label, t in zip(self.labels, self.tiers, strict=True)
                         if t <= tier), HOSTNAME)
        return self.labels[-tier] if tier <= len(self.labels) else None


def nvlink_domain(labels: Mapping[str, str]) -> str | None:
    """The multi-node NVLink domain a node's labels put it in (GPU feature discovery's
    clique, Topograph's accelerator domain and sub-domain: every one it carries, so that two
    nodes share a domain only where all their NVLink labels agree), None when it has none."""
    found = [f"{k}={labels[k]}" for k in _NVLINK_ORDER if k in labels]
    return ", ".join(found) if found else None


#: (`nvlink_domain`: NVLINK_LEVELS in a fixed order)
_NVLINK_ORDER = (CLIQUE, *TOPOGRAPH_V0_ACCELERATOR, *TOPOGRAPH_ACCELERATOR)
#: the label to require for a gang in one NVLink domain, by the labels a domain was read from:
#: the narrowest, a clique or Topograph's sub-domain, before the domain around it
_NVLINK_NARROWEST = (CLIQUE, *reversed(TOPOGRAPH_ACCELERATOR), *TOPOGRAPH_V0_ACCELERATOR)


def nvlink_level(domain: str) -> str:
    """The label a gang requires to stay in one domain like `domain` (`nvlink_domain`'s)."""
    keys = {part.split("=", 1)[0] for part in domain.split(", ")}
    return next(k for k in _NVLINK_NARROWEST if k in keys)


def resolve_request(req: NetworkRequest, levels: Levels) -> NetworkRequest:
    """`req` with its level names as labels (`Levels.resolve`). A tier above the widest level
    is the whole cluster: as the gang's level, no level (nor bound); as its bound, no bound; as
    its slices' level, no slices."""
    level = None if req.level is None else levels.resolve(req.level)
    bound = None if req.max_level is None else levels.resolve(req.max_level)
    sliced = None if req.slice_level is None else levels.resolve(req.slice_level)
    if level is None:
        bound = None
    return replace(req, level=level, max_level=bound, slice_level=sliced,
                   slice_size=req.slice_size if sliced is not None else 0)


def resolved(req: NetworkRequest, network: Network | None) -> NetworkRequest:
    """`resolve_request` on `network`'s levels (none without a network): what the placement
    and the binder's check of a placement both read."""
    return resolve_request(req, network.declared if network is not None else Levels())


def topograph_fabric(labels_of: Iterable[Mapping[str, str]]) -> tuple[str, ...]:
    """The switch tiers NVIDIA Topograph wrote on these nodes, widest first: v1's
    `fabric.topograph.run/tier-N` where a node has one (the highest N first), else v0's core,
    spine and leaf. The widest is the widest that as many nodes have as any tier (a node
    without the widest level is in no domain, and a fabric of two tiers has no core); the
    narrower ones follow where some node has them."""
    nodes = list(labels_of)
    return _fabric(nodes, set().union(*nodes))


def _fabric(nodes: Sequence[Mapping[str, str]], present: set[str]) -> tuple[str, ...]:
    tiers = sorted(((n, k) for k in present if (n := _tier_number(k)) is not None),
                   reverse=True)
    family = [k for _, k in tiers] or [k for k in TOPOGRAPH_V0_FABRIC if k in present]
    # (counted, not checked node by node: the binder reads this on every node change)
    counts = [sum(k in labels for labels in nodes) for k in family]
    widest = counts.index(max(counts)) if counts else 0
    return tuple(family[widest:])


def topograph_levels(labels_of: Iterable[Mapping[str, str]]) -> tuple[str, ...]:
    """The levels of the labels NVIDIA Topograph wrote on these nodes, widest first: the switch
    tiers (`topograph_fabric`), then the NVLink domain (and v1's sub-domain) where some node has
    it; else GPU feature discovery's `nvidia.com/gpu.clique`, which Topograph leaves as the
    domain's label where the GPU Operator writes it. A node without a narrower level is still in
    the wider ones."""
    nodes = list(labels_of)
    present: set[str] = set().union(*nodes)
    fabric = _fabric(nodes, present)
    v1 = any(k.startswith(TOPOGRAPH_TIER_PREFIX) for k in fabric)
    accelerator = [k for k in (TOPOGRAPH_ACCELERATOR if v1 else TOPOGRAPH_V0_ACCELERATOR)
                   if k in present]
    if not accelerator and CLIQUE in present:
        accelerator = [CLIQUE]
    return (*fabric, *accelerator)


def _tier_number(label: str) -> int | None:
    """N of Topograph's `fabric.topograph.run/tier-N`, None for another label."""
    digits = label.removeprefix(TOPOGRAPH_TIER_PREFIX)
    return decimal(digits) if digits != label else None


def parse_levels(doc: Any) -> Levels:
    """The declared levels from a list (of label keys, or `{nodeLabel, alias}` entries), a Kueue
    or KAI Topology object, or "topograph"."""
    if doc == "topograph":
        return Levels(topograph=True)
    if isinstance(doc, Mapping):
        entries = _topology_levels(doc)
    elif isinstance(doc, Sequence) and not isinstance(doc, str):
        entries = list(doc)
    else:
        raise LevelsError("network levels must be a list of node labels (widest first), a "
                          "Kueue or KAI Topology object, or \"topograph\"")
    labels: list[Any] = []
    aliases: list[tuple[int, Any, Any]] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            labels.append(entry)
            continue
        if "nodeLabel" not in entry:
            raise LevelsError(f"level {i + 1}: an entry needs a nodeLabel")
        if entry.get("alias") is not None:
            aliases.append((i, entry["alias"], entry["nodeLabel"]))
        labels.append(entry["nodeLabel"])
    checked = check_levels(labels)
    return Levels(checked, _check_aliases(aliases, labels))


def parse_levels_flag(text: str) -> Levels:
    """`--network-levels` written out: "topograph", "volcano" (Volcano's HyperNode tiers, read
    by the binder as they change), "kueue:NAME" or "kai:NAME" (that Topology object, read by
    the binder as it changes), or entries LABEL or ALIAS=LABEL, comma separated, widest
    first."""
    if text.strip() == "topograph":
        return Levels(topograph=True)
    if text.strip() == "volcano":
        return Levels(hypernodes=True)
    ref = topology_ref(text.strip())
    if ref is not None:
        return Levels(topology=ref)

    def entry(part: str) -> str | dict[str, str]:
        alias, eq, label = (t.strip() for t in part.partition("="))
        return {"nodeLabel": label, "alias": alias} if eq else alias
    return parse_levels([entry(p) for p in text.split(",")])


def read_levels(value: str) -> Levels:
    """`--network-levels` as given: written out (`parse_levels_flag`), or `@FILE`, a list or a
    Kueue or KAI Topology read from that file. LevelsError, naming the file and the place in it,
    when they cannot be used."""
    if not value.startswith("@"):
        return parse_levels_flag(value)
    try:
        docs = load_all(read(FsPath(value[1:])))
    except YamlProblem as exc:
        raise LevelsError(exc.at(value[1:])) from exc
    except OSError as exc:
        raise LevelsError(f"{value}: {exc.strerror or exc}") from exc
    try:
        return parse_levels(docs[0] if len(docs) == 1 else None)
    except LevelsError as exc:
        raise LevelsError(f"{value}: {exc}") from exc


def topology_ref(text: str) -> TopologyRef | None:
    """`kai:NAME` or `kueue:NAME` as a reference to that Topology object; None for text that
    names no Topology API; LevelsError where NAME is no object's name."""
    api, colon, name = text.partition(":")
    if not colon or api not in TOPOLOGY_APIS:
        return None
    if not is_dns_subdomain(name):
        raise LevelsError(f"{name!r} is no Topology's name: a Topology's name is a DNS "
                          "subdomain (lower-case letters, digits, '-' and '.')")
    return TopologyRef(api, name)


def _check_aliases(aliases: list[tuple[int, Any, Any]], labels: list[Any]
                   ) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for i, alias, label in aliases:
        if not isinstance(alias, str) or not is_label_key(alias):
            raise LevelsError(f"level {i + 1}: alias {alias!r} is not a label key")
        if alias in labels or alias == HOSTNAME:
            raise LevelsError(f"level {i + 1}: alias {alias} is a level's node label")
        if any(alias == a for a, _ in out):
            raise LevelsError(f"level {i + 1}: alias {alias} names two levels")
        out.append((alias, label))
    return tuple(out)


def check_levels(labels: Sequence[Any]) -> tuple[str, ...]:
    out: list[str] = []
    for i, label in enumerate(labels):
        if not isinstance(label, str) or not is_label_key(label):
            raise LevelsError(f"level {i + 1}: {label!r} is not a node label key")
        if label in out:
            raise LevelsError(f"level {i + 1}: {label} is declared twice")
        if label == HOSTNAME and i != len(labels) - 1:
            raise LevelsError(f"level {i + 1}: {HOSTNAME} is the node itself, the narrowest "
                              "level: it can only come last")
        out.append(label)
    return tuple(label for label in out if label != HOSTNAME)


def _topology_levels(doc: Mapping[str, Any]) -> list[Any]:
    """A Kueue or KAI Topology's spec.levels."""
    if doc.get("kind") != "Topology" or doc.get("apiVersion") not in (*KUEUE_API_VERSIONS,
                                                                      *KAI_API_VERSIONS):
        raise LevelsError(f"expected a Kueue ({KUEUE_API_VERSIONS[0]}) or KAI "
                          f"({KAI_API_VERSIONS[0]}) Topology, got "
                          f"{doc.get('apiVersion')}/{doc.get('kind')}")
    levels = (doc.get("spec") or {}).get("levels")
    if not isinstance(levels, list) or not levels:
        raise LevelsError("Topology spec.levels must be a non-empty list")
    for i, level in enumerate(levels):
        if not isinstance(level, Mapping):  # (its nodeLabel is checked with a list's entries)
            raise LevelsError(f"Topology spec.levels[{i}] needs a nodeLabel")
    return levels


class Network:
    """Every node's place in the declared levels, made once per node set (the binder remakes it
    when a node changes): per request the placement groups nodes by domain from these tuples,
    without reading labels again."""

    def __init__(self, levels: Levels | Sequence[str],
                 labels: Mapping[str, Mapping[str, str]]) -> None:
        #: what was asked for (Topograph's family), and the levels it is on these nodes
        self.asked = levels if isinstance(levels, Levels) else Levels(tuple(levels))
        self.declared = self.asked.on(labels.values())
        self.levels = self.declared.labels
        self._labels = labels
        self._paths: dict[tuple[str, ...], dict[str, tuple[str, ...]]] = {}
        self._domains: dict[tuple[tuple[str, ...], int], Domains] = {}

    def label(self, name: str) -> str:
        """The label a request's level name stands for (`Levels.label`)."""
        return self.declared.label(name)

    def chain(self, *wanted: str | None) -> tuple[str, ...]:
        """The levels a request naming `wanted` is placed over: the declared ones, or the named
        ones alone (in the order given) when one is not declared (a manifest may name a label
        the admin did not declare: it still means "one domain of this label")."""
        named = [w for w in wanted if w is not None and w != HOSTNAME]
        if all(w in self.levels for w in named):
            return self.levels
        return tuple(dict.fromkeys(named))

    def paths(self, chain: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
        """node -> its values of `chain`, down to the first label it lacks (a node without the
        widest label is left out)."""
        found = self._paths.get(chain)
        if found is None:
            found = self._paths[chain] = {}
            for node, labels in self._labels.items():
                values: list[str] = []
                for label in chain:
                    value = labels.get(label)
                    if value is None:
                        break
                    values.append(value)
                if values:
                    found[node] = tuple(values)
        return found

    def domains(self, chain: tuple[str, ...], depth: int) -> Domains:
        """The domains of `chain`'s first `depth` levels, in the order of their values: the
        nodes whose path reaches that deep, grouped by its first `depth` values."""
        found = self._domains.get((chain, depth))
        if found is None:
            grouped: dict[tuple[str, ...], set[str]] = {}
            for node, path in self.paths(chain).items():
                if len(path) >= depth:
                    grouped.setdefault(path[:depth], set()).add(node)
            found = self._domains[chain, depth] = Domains.of(
                [(", ".join(f"{lv}={v}" for lv, v in zip(chain, path, strict=False)),
                  frozenset(members)) for path, members in sorted(grouped.items())])
        return found

    def missing(self, label: str) -> list[str]:
        """The nodes without `label` (`muster analyze`)."""
        if label == HOSTNAME:
            return []
        return sorted(n for n, labels in self._labels.items() if label not in labels)


@dataclass(frozen=True, slots=True)
class Domains:
    """Disjoint domains of nodes: their names ("<label>=<value>" of each level down), their
    nodes, and the domain of each node (by index)."""

    names: tuple[str, ...]
    members: tuple[frozenset[str], ...]
    index: Mapping[str, int]

    @classmethod
    def of(cls, found: Sequence[tuple[str, frozenset[str]]]) -> Domains:
        return cls(tuple(n for n, _ in found), tuple(m for _, m in found),
                   {node: i for i, (_, m) in enumerate(found) for node in m})
