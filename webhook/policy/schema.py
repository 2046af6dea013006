"""The SchedulingPolicy schema (muster.io/v1alpha1): pydantic v2 models, unknown fields rejected.

Every field is documented in docs/policies.md. Validators raise ValueError with a message an
admin can act on; the loader adds file, line, column and field path.
"""

from __future__ import annotations

import math
import re
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from webhook import keys
from webhook.quantity import QuantityError, parse_quantity

API_VERSION = "muster.io/v1alpha1"
KIND = "SchedulingPolicy"

_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_OWNER_KIND = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Z][A-Za-z0-9]*$")
_PERCENT = re.compile(r"^([0-9]{1,3})%$")

#: keys that Muster itself writes: a policy may neither set nor select on them
RESERVED_KEYS = frozenset({
    keys.ISTIO_INJECT, keys.ISTIO_DATAPLANE_MODE, keys.VOLCANO_GROUP_ANNOTATION,
    keys.VOLCANO_QUEUE_ANNOTATION, keys.COSCHEDULING_GROUP_LABEL,
    keys.LEGACY_COSCHEDULING_GROUP_LABEL,
})
#: the Istio data planes a pod can leave (spec.istio.optOut)
IstioOptOutName = Literal["none", "sidecar", "ambient", "both"]
ISTIO_OPT_OUTS: tuple[str, ...] = typing.get_args(IstioOptOutName)
#: what a matching policy does (spec.enforcement): the modes of Pod Security Admission
#: (enforce, warn, audit); audit and warn change nothing and record what they would have done
Enforcement = Literal["enforce", "warn", "audit"]


def _dns_subdomain(value: str, what: str) -> str:
    if not keys.is_dns_subdomain(value):
        raise ValueError(f"{value!r} is not a valid {what} (lowercase DNS-1123 subdomain)")
    return value


def check_label_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if prefix:
        _dns_subdomain(prefix, "key prefix")
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        raise ValueError(f"{key!r} is not a valid label/annotation key")
    return key


def check_label_value(value: str) -> str:
    if len(value) > 63 or not _LABEL_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid label value (≤ 63 of [A-Za-z0-9._-])")
    return value


def _namespace(value: str) -> str:
    if len(value) > 63:
        raise ValueError(f"{value!r} is not a valid namespace name (too long)")
    return _dns_subdomain(value, "namespace name")


def is_owner_kind(value: str) -> bool:
    """`group/Kind`, or `Kind` for the core group."""
    return bool(_OWNER_KIND.match(value))


def _owner_kind(value: str) -> str:
    if not is_owner_kind(value):
        raise ValueError(f"{value!r} is not an owner kind: write group/Kind, e.g. "
                         "kubeflow.org/MPIJob, batch/Job, or Kind alone for the core group")
    return value


def _gpu_model(value: str) -> str:
    if not keys.gpu_model_label_value(value):
        raise ValueError(f"{value!r} is not a GPU model name")
    return value


def _not_reserved(key: str) -> str:
    if key in RESERVED_KEYS or key.split("/", 1)[0] == keys.DOMAIN:
        raise ValueError(f"{key!r} is written by Muster itself; set it through gang/istio/topology")
    return key


LabelKey = Annotated[str, AfterValidator(check_label_key)]
LabelValue = Annotated[str, AfterValidator(check_label_value)]
OwnKey = Annotated[str, AfterValidator(check_label_key), AfterValidator(_not_reserved)]
Namespace = Annotated[str, AfterValidator(_namespace)]
OwnerKind = Annotated[str, AfterValidator(_owner_kind)]
GpuModel = Annotated[str, AfterValidator(_gpu_model)]


def _min_available(value: Any) -> int | str:
    """"auto", an integer ≥ 1, or "NN%" (1-100)."""
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, str) and (m := _PERCENT.match(value)) and 1 <= int(m[1]) <= 100:
        return value
    raise ValueError('must be "auto", an integer ≥ 1 or a percentage such as "80%"')


def _min_resources(value: Any) -> str | dict[str, str]:
    if value in ("auto", "none"):
        return str(value)
    if isinstance(value, dict) and value:
        out: dict[str, str] = {}
        for name, qty in value.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"resource name {name!r} must be a non-empty string")
            try:
                parse_quantity(qty)
            except QuantityError as exc:
                raise ValueError(f"{name}: {exc}") from None
            out[name] = str(qty)
        return out
    raise ValueError('must be "auto", "none" or a map of resource name to quantity')


def _istio_opt_out(value: Any) -> str:
    """One of ISTIO_OPT_OUTS; true and false, the spelling from before ambient mode, are the
    sidecar opt-out and none."""
    if isinstance(value, bool):
        return "sidecar" if value else "none"
    if isinstance(value, str) and value in ISTIO_OPT_OUTS:
        return value
    raise ValueError("must be sidecar, ambient, both or none (true means sidecar, false none)")


MinAvailable = Annotated[int | str, PlainValidator(_min_available)]
MinResources = Annotated[str | dict[str, str], PlainValidator(_min_resources)]
IstioOptOut = Annotated[IstioOptOutName, PlainValidator(_istio_opt_out)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class LabelSelectorRequirement(_Model):
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class LabelSelector(_Model):
    matchLabels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    matchExpressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    def keys(self) -> set[str]:
        return set(self.matchLabels) | {e.key for e in self.matchExpressions}


class GpuRange(_Model):
    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=0)


class Match(_Model):
    namespaces: list[Namespace] | None = None
    namespaceSelector: LabelSelector | None = None
    podSelector: LabelSelector | None = None
    ownerKinds: list[OwnerKind] | None = None
    gpus: GpuRange | None = None

    @field_validator("podSelector")
    @classmethod
    def _pod_selector(cls, v: LabelSelector | None) -> LabelSelector | None:
        if v is not None and (bad := v.keys() & RESERVED_KEYS):
            raise ValueError(
                f"cannot select on {sorted(bad)[0]!r}: Muster writes that label itself, so the "
                "result would change when the pod is evaluated again")
        return v


class Gang(_Model):
    backend: Literal["volcano", "coscheduling", "muster", "kubernetes"]
    minAvailable: MinAvailable = "auto"
    queue: str | None = None
    priorityClass: str | None = None
    minResources: MinResources = "auto"
    scheduleTimeoutSeconds: int | None = Field(default=None, ge=1, le=2**31 - 1)
    schedulerName: str | None = None
    #: Volcano: what happens when the gang's queue is missing or not Open (checked at admission
    #: against the cluster's Queues): Fallback to `fallbackQueue`, or admit WithoutGang
    unavailableQueue: Literal["Fallback", "WithoutGang"] = "Fallback"
    fallbackQueue: str = "default"
    #: kubernetes: what happens when the cluster serves no Workload API (checked at admission
    #: by discovery): Refuse the job's pods with the reason, or admit them WithoutGang
    unavailableApi: Literal["Refuse", "WithoutGang"] = "Refuse"
    #: muster: whether the binder may evict whole gangs of lower priority to place this one
    #: (LowerPriority) or not (Never); unset: the binder's --preemption default
    preemption: Literal["Never", "LowerPriority"] | None = None

    @field_validator("queue", "fallbackQueue")
    @classmethod
    def _queue(cls, v: str | None) -> str | None:
        return None if v is None else _dns_subdomain(v, "queue name")

    @field_validator("priorityClass", "schedulerName")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        return None if v is None else _dns_subdomain(v, "name")


class Istio(_Model):
    #: the data planes the pod leaves: sidecar (sidecar.istio.io/inject "false"), ambient
    #: (istio.io/dataplane-mode "none"), both, or none
    optOut: IstioOptOut = "none"


LevelKey = Annotated[str, AfterValidator(check_label_key)]


class NetworkSlice(_Model):
    #: each `size` GPU pods of the gang (in rank order) within one domain of this level
    level: LevelKey
    size: int = Field(ge=1)
    #: preferred: the slices when they fit, else the gang placed without them (KAI's soft
    #: segment placement)
    mode: Literal["required", "preferred"] = "required"


class Network(_Model):
    """Where the gang's nodes go in the cluster's network levels (docs/topology.md); a level is
    named by its node label, as Kueue and KAI name it, or by an alias of the binder's levels.
    Both `required` and `preferred`: the preferred level, falling back no wider than one domain
    of the required level (KAI's meaning of the two together)."""

    required: LevelKey | None = None
    preferred: LevelKey | None = None
    slice: NetworkSlice | None = None
    #: whether the job's own Kueue / KAI topology annotations replace the policy's request
    jobAnnotations: Literal["honour", "ignore"] = "honour"


class Topology(_Model):
    mode: Literal["required", "preferred", "off"]
    singleNode: bool = False
    minRingGBps: float | None = Field(default=None, gt=0)
    allowedModels: list[GpuModel] = Field(default_factory=list)
    #: the models the gang's pods prefer, first the most (preferred node affinity, weighed by
    #: the binder after the topology)
    preferredModels: list[GpuModel] = Field(default_factory=list)
    network: Network | None = None

    @field_validator("minRingGBps", mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            return float(v)
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError("must be a finite number of GB/s")
        return v


class Spec(_Model):
    priority: int = 0
    enforcement: Enforcement = "enforce"
    match: Match = Field(default_factory=Match)
    gang: Gang | None = None
    istio: Istio | None = None
    topology: Topology | None = None
    labels: dict[OwnKey, LabelValue] = Field(default_factory=dict)
    annotations: dict[OwnKey, str] = Field(default_factory=dict)


class Metadata(BaseModel):
    # labels/annotations on the policy document itself are allowed and ignored
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _dns_subdomain(v, "policy name")


class SchedulingPolicy(_Model):
    apiVersion: Literal["muster.io/v1alpha1"]
    kind: Literal["SchedulingPolicy"]
    metadata: Metadata
    spec: Spec

    @property
    def name(self) -> str:
        return self.metadata.name


Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Parts:
    """The parts of a policy document, each validated on its own and without its invalid fields
    (None: absent or invalid), so that the checks across fields run while other fields of the
    document still have errors."""

    namespace_selector: LabelSelector | None = None
    pod_selector: LabelSelector | None = None
    gpus: GpuRange | None = None
    gang: Gang | None = None
    #: spec.gang is given, valid or not (a check that needs its backend waits for it)
    has_gang: bool = False
    topology: Topology | None = None
    labels: dict[str, str] | None = None


#: each part alone, validated as within the whole policy
_SELECTOR = TypeAdapter(LabelSelector)
_GPUS = TypeAdapter(GpuRange)
_GANG = TypeAdapter(Gang)
_TOPOLOGY = TypeAdapter(Topology)
_LABELS: TypeAdapter[dict[str, str]] = TypeAdapter(dict[OwnKey, LabelValue],
                                                   config=ConfigDict(strict=True))


def parts_of(data: Any) -> Parts:
    spec = _field(data, "spec")
    match = _field(spec, "match")
    return Parts(
        namespace_selector=_valid(_SELECTOR, _field(match, "namespaceSelector")),
        pod_selector=_valid(_SELECTOR, _field(match, "podSelector")),
        gpus=_valid(_GPUS, _field(match, "gpus")),
        gang=_valid(_GANG, _field(spec, "gang")),
        has_gang=_field(spec, "gang") is not None,
        topology=_valid(_TOPOLOGY, _field(spec, "topology")),
        labels=_valid(_LABELS, _field(spec, "labels")))


def _field(data: Any, name: str) -> Any:
    return data.get(name) if isinstance(data, dict) else None


_M = TypeVar("_M")


def _valid(adapter: TypeAdapter[_M], raw: Any) -> _M | None:
    """The part, without those of its fields (or keys) that are invalid; None when nothing of
    it is valid or a required field is not."""
    for _ in range(2):
        if raw is None:
            return None
        try:
            return adapter.validate_python(raw)
        except ValidationError as exc:
            bad = {err["loc"][0] for err in exc.errors() if err["loc"]}
            if not isinstance(raw, dict) or not bad:
                return None
            raw = {k: v for k, v in raw.items() if k not in bad}
    return None


def _preferred_models_problems(topo: Topology) -> list[tuple[Path, str]]:
    """A preferred model named twice, or one the policy's allowedModels keep the pod off."""
    at: Path = ("spec", "topology", "preferredModels")
    values = [keys.gpu_model_label_value(m) for m in topo.preferredModels]
    twice = sorted({m for m, v in zip(topo.preferredModels, values, strict=True)
                    if values.count(v) > 1})
    out = [(at, f"{', '.join(twice)} named twice (as the node label: the same model)")] \
        if twice else []
    allowed = {keys.gpu_model_label_value(m) for m in topo.allowedModels}
    never = [m for m, v in zip(topo.preferredModels, values, strict=True)
             if allowed and v not in allowed]
    if never:
        out.append((at, f"{', '.join(never)} not in allowedModels: never preferred, since "
                        "the pod may not run there"))
    return out


def contradictions(parts: Parts) -> list[tuple[Path, str]]:
    """Combinations of individually valid fields that cannot work together, with exact paths."""
    out: list[tuple[Path, str]] = []
    for sel_name, sel in (("namespaceSelector", parts.namespace_selector),
                          ("podSelector", parts.pod_selector)):
        for i, req in enumerate(sel.matchExpressions if sel else ()):
            at: Path = ("spec", "match", sel_name, "matchExpressions", i, "values")
            if req.operator in ("In", "NotIn") and not req.values:
                out.append((at, f"operator {req.operator} needs at least one value"))
            if req.operator in ("Exists", "DoesNotExist") and req.values:
                out.append((at, f"operator {req.operator} takes no values"))
    gpus = parts.gpus
    if gpus and gpus.min is not None and gpus.max is not None and gpus.min > gpus.max:
        out.append((("spec", "match", "gpus", "max"),
                    f"max ({gpus.max}) is smaller than min ({gpus.min})"))
    gang = parts.gang
    if gang is not None:
        if gang.backend != "volcano" and gang.queue is not None:
            out.append((("spec", "gang", "queue"),
                        f"queue is a Volcano setting; backend {gang.backend} has no queues"))
        for name in ("unavailableQueue", "fallbackQueue"):
            if gang.backend != "volcano" and name in gang.model_fields_set:
                out.append((("spec", "gang", name),
                            f"{name} is a Volcano setting; backend {gang.backend} has no queues"))
        if gang.unavailableQueue == "WithoutGang" and "fallbackQueue" in gang.model_fields_set:
            out.append((("spec", "gang", "fallbackQueue"),
                        "fallbackQueue is used only with unavailableQueue: Fallback"))
        if gang.backend != "volcano" and gang.priorityClass is not None:
            out.append((("spec", "gang", "priorityClass"),
                        f"priorityClass is written to Volcano PodGroups only; backend "
                        f"{gang.backend} uses the pods' own priority"))
        if gang.backend != "muster" and gang.preemption is not None:
            out.append((("spec", "gang", "preemption"),
                        f"preemption is decided by Muster's binder (backend muster); backend "
                        f"{gang.backend} preempts by its own rules"))
        if gang.backend == "volcano" and gang.scheduleTimeoutSeconds is not None:
            out.append((("spec", "gang", "scheduleTimeoutSeconds"),
                        "Volcano PodGroups have no schedule timeout; use backend coscheduling "
                        "or muster, or remove it"))
        out.extend(_native_gang_problems(gang))
    topo = parts.topology
    if topo is not None and topo.mode == "off" and (
            topo.singleNode or topo.minRingGBps is not None or topo.allowedModels
            or topo.preferredModels or topo.network is not None):
        out.append((("spec", "topology", "mode"),
                    "mode off turns topology placement off: singleNode, minRingGBps, "
                    "allowedModels, preferredModels and network would have no effect, remove "
                    "them"))
    if topo is not None:
        out.extend(_preferred_models_problems(topo))
    backend_known = gang is not None or not parts.has_gang  # (not that of an invalid gang)
    if topo is not None and topo.mode != "off" and backend_known and (
            gang is None or gang.backend != "muster"):
        got = f"backend {gang.backend}" if gang else "no gang"
        out.append((("spec", "topology", "mode"),
                    f"topology mode {topo.mode} needs gang backend muster (Muster's binder does "
                    f"topology-aware placement), got {got}"))
    return out


def _native_gang_problems(gang: Gang) -> list[tuple[Path, str]]:
    """Fields the native Workload API has no place for (kube-scheduler's GangScheduling plugin
    waits a fixed 5 minutes and reserves no resources), and the one only it reads."""
    if gang.backend != "kubernetes":
        if "unavailableApi" in gang.model_fields_set:
            return [(("spec", "gang", "unavailableApi"), "unavailableApi is a setting of "
                     f"backend kubernetes (the native Workload API); backend {gang.backend} "
                     "does not use it")]
        return []
    out: list[tuple[Path, str]] = []
    if gang.scheduleTimeoutSeconds is not None:
        out.append((("spec", "gang", "scheduleTimeoutSeconds"),
                    "the native Workload API has no schedule timeout (kube-scheduler waits 5 "
                    "minutes); use backend coscheduling or muster, or remove it"))
    if "minResources" in gang.model_fields_set:
        out.append((("spec", "gang", "minResources"),
                    "the native Workload API has no minResources; remove it"))
    return out
