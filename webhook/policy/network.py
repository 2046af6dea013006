"""The network request a gang's pods carry to the binder: from the policy, or from the job's own
Kueue / KAI topology annotations where the policy honours them (docs/policies.md, "Network").

A level is a node label, as Kueue and KAI name it. The job's annotations replace the policy's
request part by part (the gang's level, the slices) when the policy's `jobAnnotations` is
`honour` (its default): a manifest written for Kueue or KAI then means the same to Muster. With
`ignore` the policy alone decides, and the annotations are only explained.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook import keys
from webhook.policy.schema import Network, check_label_key

#: (annotation, mode) in the order they are read: Kueue's, then KAI's; required first
_LEVELS = ((keys.KUEUE_REQUIRED_TOPOLOGY, "required"), (keys.KUEUE_PREFERRED_TOPOLOGY, "preferred"),
           (keys.KAI_REQUIRED_PLACEMENT, "required"), (keys.KAI_PREFERRED_PLACEMENT, "preferred"))


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


def _from_annotations(ann: Mapping[str, str], warnings: list[str]
                      ) -> tuple[dict[str, Any], list[str]]:
    """The parts the job's annotations ask for, and the annotations that asked."""
    out: dict[str, Any] = {}
    used: list[str] = []
    for key, mode in _LEVELS:
        level = _label(ann, key, warnings)
        if level is not None:
            if "level" in out:
                warnings.append(f"{key} ignored: {used[0]} is read first")
                continue
            out.update(level=level, mode=mode)
            used.append(key)
    slice_level = _label(ann, keys.KUEUE_SLICE_REQUIRED_TOPOLOGY, warnings)
    size_text = ann.get(keys.KUEUE_SLICE_SIZE)
    if slice_level is not None or size_text is not None:
        size = int(size_text) if size_text is not None and size_text.isdigit() else 0
        if slice_level is None or size < 1:
            warnings.append(f"{keys.KUEUE_SLICE_REQUIRED_TOPOLOGY} and a positive "
                            f"{keys.KUEUE_SLICE_SIZE} go together; the slice is ignored")
        else:
            out.update(sliceLevel=slice_level, sliceSize=size)
            used.append(keys.KUEUE_SLICE_REQUIRED_TOPOLOGY)
    return out, used


def network_ask(policy: Network | None, policy_name: str, ann: Mapping[str, str]) -> NetworkAsk:
    """What the gang asks of the network: `policy` (the merged `topology.network`, written by
    `policy_name`; None: not set, and then the topology policy `policy_name` decides whether
    the job's annotations are honoured, which they are by default)."""
    warnings: list[str] = []
    ask: dict[str, Any] = {}
    if policy is not None:
        level = policy.required or policy.preferred
        if level is not None:
            ask.update(level=level, mode="required" if policy.required else "preferred")
        if policy.slice is not None:
            ask.update(sliceLevel=policy.slice.level, sliceSize=policy.slice.size)
    source = f"policy {policy_name}"
    present = [k for k in keys.NETWORK_ANNOTATIONS if k in ann]
    if present and policy is not None and policy.jobAnnotations == "ignore":
        source += f" (which ignores the pod's {', '.join(present)})"
    elif present:
        found, used = _from_annotations(ann, warnings)
        if used:
            if "sliceLevel" in found:  # the job's slices replace the policy's
                ask.pop("sliceLevel", None)
            ask.update(found)
            source = f"the pod's {', '.join(used)}, honoured by policy {policy_name}"
    if not ask:
        return NetworkAsk(None, None, tuple(warnings))
    parts = [f"{ask['mode']} {ask['level']}"] if "level" in ask else []
    if "sliceLevel" in ask:
        parts.append(f"slices of {ask['sliceSize']} pods, each within one {ask['sliceLevel']}")
    return NetworkAsk(ask, f"network: {'; '.join(parts)} (from {source})", tuple(warnings))
