"""The network request a gang's pods carry to the binder: from the policy, or from the job's own
Kueue / KAI / Volcano topology annotations where the policy honours them (docs/policies.md,
"Network").

A level is a node label, as Kueue and KAI name it, or an alias the binder's levels declare (KAI's
Topology `alias`), or a tier (`tier:N`, Volcano's HyperNode tier: 1 the narrowest level), which
the binder resolves against its levels. The job's annotations replace the policy's request part
by part (the gang's level, the slices) when the policy's `jobAnnotations` is `honour` (its
default): a manifest written for Kueue, KAI or Volcano then means the same to Muster. They are
read from the pod (its template) and from the job object (where KAI's pod grouper reads them),
the pod's winning key by key. With `ignore` the policy alone decides, and the annotations are
only explained.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook import keys
from webhook.policy.schema import Network, check_label_key

#: Kueue's gang levels, required first: a pod set carries one of them
_KUEUE_LEVELS = ((keys.KUEUE_REQUIRED_TOPOLOGY, "required"),
                 (keys.KUEUE_PREFERRED_TOPOLOGY, "preferred"))
_KAI_LEVELS = (keys.KAI_REQUIRED_PLACEMENT, keys.KAI_PREFERRED_PLACEMENT)
_KAI_PREFIX = "kai.scheduler/"
_VOLCANO = (keys.VOLCANO_NETWORK_TOPOLOGY_MODE, keys.VOLCANO_NETWORK_TOPOLOGY_HIGHEST_TIER)
_KAI_SEGMENTS = (keys.KAI_SEGMENT_SIZE, keys.KAI_SEGMENT_REQUIRED_PLACEMENT,
                 keys.KAI_SEGMENT_PREFERRED_PLACEMENT)
#: the request's keys of each part, which the job's annotations replace together
_LEVEL_PART = ("level", "mode", "maxLevel", "unconstrained")
_SLICE_PART = ("sliceLevel", "sliceSize", "sliceMode")

Ask = dict[str, Any]


@dataclass(frozen=True, slots=True)
class NetworkAsk:
    """The request (the annotation's JSON "network" object; None: none) and why, in words."""

    request: Mapping[str, Any] | None
    why: str | None
    warnings: tuple[str, ...] = ()


def _label(ann: Mapping[str, str], key: str, warnings: list[str]) -> str | None:
    value = ann.get(key)
    if value is None:
        return None
    try:
        return check_label_key(value)
    except ValueError:
        warnings.append(f"{key}: {value!r} is not a node label key; ignored")
        return None


def _ignored(keys_: list[str], first: str, warnings: list[str]) -> None:
    warnings.extend(f"{k} ignored: {first} is read first" for k in keys_)


def _levels_ask(required: str | None, preferred: str | None) -> Ask:
    """A gang's level from a required and a preferred one (either may be None): both, the
    preferred level within one domain of the required one (KAI's meaning)."""
    if preferred is None or preferred == required:
        return {"level": required, "mode": "required"} if required else {}
    ask: Ask = {"level": preferred, "mode": "preferred"}
    if required is not None:
        ask["maxLevel"] = required
    return ask


def _unconstrained(ann: Mapping[str, str], warnings: list[str]) -> bool:
    """Kueue's unconstrained pod set: "true" (any other value is false, as Kueue reads it)."""
    value = ann.get(keys.KUEUE_UNCONSTRAINED_TOPOLOGY)
    if value is not None and value.lower() not in ("true", "false"):
        warnings.append(f"{keys.KUEUE_UNCONSTRAINED_TOPOLOGY}: {value!r} is not \"true\" or "
                        "\"false\"; read as false")
    return value is not None and value.lower() == "true"


def _volcano_level(ann: Mapping[str, str], warnings: list[str]) -> Ask:
    """Volcano's network topology (its PodGroup's spec.networkTopology as pod annotations):
    hard, within one domain of at most the highest tier, the narrowest that fits first (tier 1:
    the narrowest level; tier 0: one node; Volcano's default mode); soft, the narrowest domain
    that fits, then wider, the whole cluster last (the highest tier is not read, as Volcano
    does not)."""
    mode = ann.get(keys.VOLCANO_NETWORK_TOPOLOGY_MODE, "hard")
    if mode not in ("hard", "soft"):
        warnings.append(f"{keys.VOLCANO_NETWORK_TOPOLOGY_MODE}: {mode!r} is not hard or soft; "
                        "the network topology is ignored")
        return {}
    if mode == "soft":
        return {"level": keys.network_tier_level(1), "mode": "preferred"}
    text = ann.get(keys.VOLCANO_NETWORK_TOPOLOGY_HIGHEST_TIER)
    tier = keys.decimal(text) if text is not None else None
    if tier is None:
        warnings.append(f"{keys.VOLCANO_NETWORK_TOPOLOGY_MODE} hard needs a "
                        f"{keys.VOLCANO_NETWORK_TOPOLOGY_HIGHEST_TIER} (a whole number); the "
                        "network topology is ignored")
        return {}
    if tier == 0:  # (tier 0: the node itself, as Volcano's label discovery counts it)
        return {"level": keys.HOSTNAME_LABEL, "mode": "required"}
    return _levels_ask(keys.network_tier_level(tier), keys.network_tier_level(1))


def _gang_level(ann: Mapping[str, str], warnings: list[str]) -> tuple[Ask, list[str]]:
    """The gang's level the annotations ask for, and the annotations that asked: Kueue's first
    (required, preferred, then unconstrained: no level, each member where it fits best),
    else KAI's required and preferred, alone or together, else Volcano's."""
    kueue = [(k, mode, level) for k, mode in _KUEUE_LEVELS
             if (level := _label(ann, k, warnings)) is not None]
    kai = {k: level for k in _KAI_LEVELS if (level := _label(ann, k, warnings)) is not None}
    volcano = [k for k in _VOLCANO if k in ann]
    unconstrained = _unconstrained(ann, warnings)
    if kueue:
        key, mode, level = kueue[0]
        _ignored([k for k, _, _ in kueue[1:]] + list(kai)
                 + [keys.KUEUE_UNCONSTRAINED_TOPOLOGY] * unconstrained + volcano, key, warnings)
        return {"level": level, "mode": mode}, [key]
    if unconstrained:
        _ignored(list(kai) + volcano, keys.KUEUE_UNCONSTRAINED_TOPOLOGY, warnings)
        return {"unconstrained": True}, [keys.KUEUE_UNCONSTRAINED_TOPOLOGY]
    ask = _levels_ask(kai.get(keys.KAI_REQUIRED_PLACEMENT), kai.get(keys.KAI_PREFERRED_PLACEMENT))
    if ask:
        _ignored(volcano, next(iter(kai)), warnings)
        return ask, list(kai)
    if volcano:
        ask = _volcano_level(ann, warnings)
    return ask, volcano if ask else []


def _size(text: str | None) -> int:
    return (keys.decimal(text) if text is not None else None) or 0


def _slices(ann: Mapping[str, str], warnings: list[str]) -> tuple[Ask, list[str]]:
    """The slices the annotations ask for: Kueue's slice, else KAI's segments."""
    kai_present = [k for k in _KAI_SEGMENTS if k in ann]
    level = _label(ann, keys.KUEUE_SLICE_REQUIRED_TOPOLOGY, warnings)
    size_text = ann.get(keys.KUEUE_SLICE_SIZE)
    if level is not None or size_text is not None:
        _ignored(kai_present, keys.KUEUE_SLICE_REQUIRED_TOPOLOGY, warnings)
        if level is None or _size(size_text) < 1:
            warnings.append(f"{keys.KUEUE_SLICE_REQUIRED_TOPOLOGY} and a positive "
                            f"{keys.KUEUE_SLICE_SIZE} go together; the slice is ignored")
            return {}, []
        return ({"sliceLevel": level, "sliceSize": _size(size_text)},
                [keys.KUEUE_SLICE_REQUIRED_TOPOLOGY])
    if not kai_present:
        return {}, []
    required = _label(ann, keys.KAI_SEGMENT_REQUIRED_PLACEMENT, warnings)
    preferred = _label(ann, keys.KAI_SEGMENT_PREFERRED_PLACEMENT, warnings)
    size = _size(ann.get(keys.KAI_SEGMENT_SIZE))
    if (required is None and preferred is None) or size < 2:
        warnings.append(f"{keys.KAI_SEGMENT_SIZE} (more than 1) and a segment topology "
                        "placement go together; the segments are ignored")
        return {}, []
    if required is not None and preferred is not None:
        _ignored([keys.KAI_SEGMENT_PREFERRED_PLACEMENT], keys.KAI_SEGMENT_REQUIRED_PLACEMENT,
                 warnings)
    if required is not None:
        return ({"sliceLevel": required, "sliceSize": size},
                [keys.KAI_SEGMENT_SIZE, keys.KAI_SEGMENT_REQUIRED_PLACEMENT])
    return ({"sliceLevel": preferred, "sliceSize": size, "sliceMode": "preferred"},
            [keys.KAI_SEGMENT_SIZE, keys.KAI_SEGMENT_PREFERRED_PLACEMENT])


def _kai_topology(ann: Mapping[str, str], honoured: list[str], warnings: list[str]
                  ) -> str | None:
    """The KAI Topology whose levels the honoured KAI annotations name ("kai:NAME", from
    `kai.scheduler/topology`); None where no KAI annotation is honoured or none is named."""
    name = ann.get(keys.KAI_TOPOLOGY)
    if name is None or not any(k.startswith(_KAI_PREFIX) for k in honoured):
        return None
    if not keys.is_dns_subdomain(name):
        warnings.append(f"{keys.KAI_TOPOLOGY}: {name!r} is not a Topology's name; ignored (the "
                        "binder's levels name the levels)")
        return None
    return keys.topology_object("kai", name)


def _whose(names: list[str], pod_ann: Mapping[str, str]) -> str:
    """The annotations named, each as the pod's or the job's."""
    pod = [k for k in names if k in pod_ann]
    job = [k for k in names if k not in pod_ann]
    return " and ".join(f"the {owner} {', '.join(found)}"
                        for owner, found in (("pod's", pod), ("job's", job)) if found)


def _policy_ask(policy: Network) -> Ask:
    ask = _levels_ask(policy.required, policy.preferred)
    if policy.slice is not None:
        ask.update(sliceLevel=policy.slice.level, sliceSize=policy.slice.size)
        if policy.slice.mode == "preferred":
            ask["sliceMode"] = "preferred"
    return ask


def _level_name(level: str) -> str:
    """A level as explain prints it (a tier: "tier N")."""
    tier = keys.network_tier(level)
    return level if tier is None else f"tier {tier}"


def _describe(ask: Ask) -> str:
    parts = []
    if ask.get("unconstrained"):
        parts.append("unconstrained (no level: each member where it fits best, filling gaps)")
    if "level" in ask:
        within = f" within one {_level_name(ask['maxLevel'])}" if "maxLevel" in ask else ""
        parts.append(f"{ask['mode']} {_level_name(ask['level'])}{within}")
    if "sliceLevel" in ask:
        how = "preferably" if ask.get("sliceMode") == "preferred" else "each"
        parts.append(f"slices of {ask['sliceSize']} pods, {how} within one {ask['sliceLevel']}")
    if any(keys.network_tier(ask.get(k) or "") for k in ("level", "maxLevel")):
        parts[-1] += (" (the binder's HyperNode tiers, or its levels counted up from the "
                      "narrowest, tier 1)")
    if "topology" in ask:
        parts[-1] += (f" (the levels of KAI Topology {ask['topology'].removeprefix('kai:')}, "
                      "where the binder reads KAI's Topologies)")
    return "; ".join(parts)


def network_ask(policy: Network | None, policy_name: str, pod_ann: Mapping[str, str],
                job_ann: Mapping[str, str] | None = None) -> NetworkAsk:
    """What the gang asks of the network: `policy` (the merged `topology.network`, written by
    `policy_name`; None: not set, and then the topology policy `policy_name` decides whether
    the job's annotations are honoured, which they are by default). `pod_ann`: the pod's
    annotations; `job_ann`: the job object's network annotations (the pod's win)."""
    warnings: list[str] = []
    ask = _policy_ask(policy) if policy is not None else {}
    ann = {**(job_ann or {}), **pod_ann}
    source = f"policy {policy_name}"
    present = [k for k in keys.NETWORK_ANNOTATIONS if k in ann]
    if present and policy is not None and policy.jobAnnotations == "ignore":
        source += f" (which ignores {_whose(present, pod_ann)})"
    elif present:
        level, used = _gang_level(ann, warnings)
        slices, sliced_by = _slices(ann, warnings)
        if level.get("unconstrained") and (slices or "sliceLevel" in ask):
            # a slice keeps its members together, not each member where it fits alone
            warnings.append(f"{keys.KUEUE_UNCONSTRAINED_TOPOLOGY} ignored: the gang has slices")
            level, used = {}, []
        for part, found in ((_LEVEL_PART, level), (_SLICE_PART, slices)):
            if found:
                for k in part:
                    ask.pop(k, None)
                ask.update(found)
        named = _kai_topology(ann, used + sliced_by, warnings)
        if named is not None:
            ask["topology"] = named
            used = [keys.KAI_TOPOLOGY, *used]
        if used or sliced_by:
            source = f"{_whose(used + sliced_by, pod_ann)}, honoured by policy {policy_name}"
    if not ask:
        return NetworkAsk(None, None, tuple(warnings))
    return NetworkAsk(ask, f"network: {_describe(ask)} (from {source})", tuple(warnings))
