"""The gang binder (`muster bind`): places whole gangs on nodes and concrete GPU sets, writes
muster.io/gpu-assignment, then binds. The cycle's rules are a pure function (planner.plan).

Public API: `Binder`/`BinderConfig` (the controller), `BinderService`/`ServiceConfig` (leader
election, metrics), `plan`/`Plan`/`PlanConfig`, and the assignment codec. Loaded lazily:
`webhook.binder.cli` is imported by every `muster` command, so the Kubernetes client loads only
when a command uses the binder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from webhook.lazy import lazy_getattr

if TYPE_CHECKING:
    from webhook.binder.assignment import (
        build_assignment,
        decode_assignment,
        encode_assignment,
    )
    from webhook.binder.controller import Binder, BinderConfig
    from webhook.binder.planner import Plan, PlanConfig, plan
    from webhook.binder.service import BinderService, ServiceConfig

_EXPORTS = {
    "build_assignment": "webhook.binder.assignment",
    "decode_assignment": "webhook.binder.assignment",
    "encode_assignment": "webhook.binder.assignment",
    "Binder": "webhook.binder.controller",
    "BinderConfig": "webhook.binder.controller",
    "Plan": "webhook.binder.planner",
    "PlanConfig": "webhook.binder.planner",
    "plan": "webhook.binder.planner",
    "BinderService": "webhook.binder.service",
    "ServiceConfig": "webhook.binder.service",
}

__all__ = [
    "Binder",
    "BinderConfig",
    "BinderService",
    "Plan",
    "PlanConfig",
    "ServiceConfig",
    "build_assignment",
    "decode_assignment",
    "encode_assignment",
    "plan",
]

__getattr__ = lazy_getattr(__name__, _EXPORTS)
