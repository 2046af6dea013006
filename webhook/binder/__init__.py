"""The gang binder (`muster bind`): places whole gangs on nodes and concrete GPU sets, writes
muster.io/gpu-assignment, then binds. The cycle's rules are a pure function (planner.plan)."""

from webhook.binder.assignment import build_assignment, decode_assignment, encode_assignment
from webhook.binder.controller import Binder, BinderConfig
from webhook.binder.planner import Plan, PlanConfig, plan
from webhook.binder.service import BinderService, ServiceConfig

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
