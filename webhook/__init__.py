"""Muster: gang scheduling, the Istio sidecar opt-out and NVLink-aware GPU placement for
distributed training on Kubernetes.

The public API is the two pure decision engines and their typed data; everything else (admission
server, binder, node agent, emulator) is run through the `muster` CLI. Names load lazily so that
`muster --help` imports neither engine.

    from webhook import load_policies, evaluate, render_patch      # policy + pod -> Decision
    from webhook import builtin, choose_gpus, place_gang            # topology -> placement
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from webhook.lazy import lazy_getattr

if TYPE_CHECKING:
    from webhook.policy import (
        Decision,
        PodGroupSpec,
        PolicyError,
        PolicySet,
        evaluate,
        load_policies,
        load_policy_texts,
        podgroup_manifest,
        render_patch,
    )
    from webhook.topology import (
        GangPlacement,
        GangRequest,
        GpuAssignment,
        MemberRequest,
        NodeState,
        Topology,
        TopologyRequest,
        Unplaceable,
        builtin,
        choose_gpus,
        decode,
        encode,
        place_gang,
        set_score,
    )

__all__ = [
    "Decision", "GangPlacement", "GangRequest", "GpuAssignment", "MemberRequest", "NodeState",
    "PodGroupSpec", "PolicyError", "PolicySet", "Topology", "TopologyRequest", "Unplaceable",
    "builtin", "choose_gpus", "decode", "encode", "evaluate", "load_policies",
    "load_policy_texts", "place_gang", "podgroup_manifest", "render_patch", "set_score",
]
_POLICY = {"Decision", "PodGroupSpec", "PolicyError", "PolicySet", "evaluate", "load_policies",
           "load_policy_texts", "podgroup_manifest", "render_patch"}

_EXPORTS = {name: "webhook.policy" if name in _POLICY else "webhook.topology" for name in __all__}

__getattr__ = lazy_getattr(__name__, _EXPORTS)
