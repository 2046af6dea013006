"""What a pod asks of a node, counted as Kubernetes 1.34–1.37 counts it; shared by the policy
engine (a gang's GPUs and minResources) and the binder (fit, and each container's GPUs).

- `pod_requests` is the scheduler's and the kubelet's `PodRequests`
  (k8s.io/component-helpers/resource): the app containers' sum; sidecars (init containers with
  `restartPolicy: Always`) run beside them and are added, and each init container runs with the
  sidecars started before it, so the pod needs the larger of the two; then the pod-level
  `spec.resources` replace cpu, memory and hugepages-* (never an extended resource), and the
  RuntimeClass overhead is added.
- `allocate` is the kubelet's device manager (pkg/kubelet/cm/devicemanager, `Allocate`): which
  of the pod's GPUs each container gets.

A container's request is its request, else its limit (the API server's defaulting; job templates
are not defaulted, pods are); for GPUs the limit, which must equal any request. Nothing here
raises on any JSON (admission reads pods the API server has not validated yet): a bad quantity
counts as none, and is reported where the caller passes a list of problems.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from webhook import keys
from webhook.quantity import QuantityError, add_value, parse_quantity

GPU = keys.GPU_RESOURCE
_NANO = 10**9
_HUGEPAGES = "hugepages-"

#: resource name → (value in nano-units, binary suffix), as `webhook.quantity` sums them
Requests = dict[str, tuple[int, bool]]
#: "init": runs to completion before the next container starts; "sidecar": an init container
#: with restartPolicy Always, which keeps running beside the app containers; "app"
Kind = Literal["init", "sidecar", "app"]
T = TypeVar("T")
_EMPTY: Mapping[str, Any] = MappingProxyType({})
#: the order the kubelet allocates containers in
_ORDER: tuple[tuple[str, Kind], ...] = (("initContainers", "init"), ("containers", "app"))


@dataclass(frozen=True, slots=True)
class GpuAsk:
    """One container's GPUs, in the order the kubelet allocates them."""

    name: str
    gpus: int
    kind: Kind


class DeviceShortage(ValueError):
    """The pod's containers need more devices than it was given."""


def _map(value: Any) -> Mapping[str, Any]:
    if type(value) is dict:  # the common cases first, without the slower ABC check
        return value
    if value is None:
        return _EMPTY
    return value if isinstance(value, Mapping) else _EMPTY


def _list(value: Any) -> Sequence[Any]:
    return value if type(value) is list or isinstance(value, tuple) else ()


def _is_sidecar(container: Any) -> bool:
    return _map(container).get("restartPolicy") == "Always"


def _quantity(text: Any, problems: list[str] | None, *what: Any) -> tuple[int, bool] | None:
    """The parsed quantity, or None; `what` names it in the problem (joined only then)."""
    try:
        return parse_quantity(text)
    except QuantityError as exc:
        if problems is not None:
            problems.append(f"bad resource quantity: {' '.join(map(str, what))}: {exc}")
        return None


def _gpus(res: Mapping[str, Any], name: Any, problems: list[str] | None) -> int:
    """A container's GPUs from its `resources`: the limit, else the request; a whole number."""
    limits = _map(res.get("limits"))
    raw = limits[GPU] if GPU in limits else _map(res.get("requests")).get(GPU)
    if raw is None:
        return 0
    if type(raw) is int and raw >= 0:  # the common cases first: no quantity parsing
        return raw
    if type(raw) is str and (count := keys.decimal(raw)) is not None:
        return count
    parsed = _quantity(raw, problems, "container", name, GPU)
    if parsed is None:
        return 0
    if parsed[0] < 0 or parsed[0] % _NANO:
        if problems is not None:
            problems.append(f"bad resource quantity: container {name} {GPU}: {raw!r} is not "
                            "a whole number")
        return 0
    return parsed[0] // _NANO


def _container(container: Any, problems: list[str] | None) -> Requests:
    c = _map(container)
    res = _map(c.get("resources"))
    merged = {**_map(res.get("limits")), **_map(res.get("requests"))}
    out: Requests = {}
    for name, text in merged.items():
        if name != GPU:
            value = _quantity(text, problems, "container", c.get("name"), name)
            if value is not None:
                out[str(name)] = value
    if GPU in merged:
        out[GPU] = (_gpus(res, c.get("name"), problems) * _NANO, False)
    return out


def _add(total: Requests, more: Requests) -> None:
    for name, value in more.items():
        add_value(total, name, value)


def _max(total: Requests, other: Requests) -> None:
    for name, value in other.items():
        if name not in total or value[0] > total[name][0]:
            total[name] = value


def _pod_level(name: str) -> bool:
    return name in ("cpu", "memory") or name.startswith(_HUGEPAGES)


def pod_requests(spec: Any, problems: list[str] | None = None) -> Requests:
    """Every resource the pod requests (resourcehelper.PodRequests, its steps in its order)."""
    spec = _map(spec)
    total: Requests = {}
    for c in _list(spec.get("containers")):
        own = _container(c, problems)
        if total:
            _add(total, own)
        else:  # the first (most often the only) container's are the sum so far
            total = own
    inits = _list(spec.get("initContainers"))
    if inits:
        sidecars: Requests = {}
        peak: Requests = {}
        for c in inits:
            own = _container(c, problems)
            if _is_sidecar(c):
                _add(total, own)
                _add(sidecars, own)
                _max(peak, sidecars)
            else:
                _add(own, sidecars)
                _max(peak, own)
        _max(total, peak)
    res = _map(spec.get("resources"))
    if res:
        requests, limits = _map(res.get("requests")), _map(res.get("limits"))
        for name in dict.fromkeys((*requests, *limits)):
            if not isinstance(name, str) or not _pod_level(name):
                continue
            if name in requests:
                text = requests[name]
            # the API server defaults a missing pod-level request: from the containers' own
            # where they request it (hugepages excepted), else from the pod-level limit
            elif name in total and not name.startswith(_HUGEPAGES):
                continue
            else:
                text = limits[name]
            value = _quantity(text, problems, "pod-level", name)
            if value is not None:
                total[name] = value
    for name, text in _map(spec.get("overhead")).items():
        value = _quantity(text, problems, "overhead", name)
        if value is not None:
            add_value(total, str(name), value)
    return total


def pod_gpus(spec: Any) -> int:
    """The GPUs `pod_requests` counts, never raising (the admission hot path)."""
    spec = _map(spec)
    if spec.get("initContainers") or spec.get("overhead"):
        return pod_requests(spec).get(GPU, (0, False))[0] // _NANO
    # the common case: the app containers' sum, without reading their other resources
    total = 0
    for c in _list(spec.get("containers")):
        total += _gpus(_map(_map(c).get("resources")), None, None)
    return total


def gpu_asks(spec: Any) -> tuple[GpuAsk, ...]:
    """Every container's GPUs, init containers first, as the kubelet allocates them."""
    spec = _map(spec)
    asks = []
    for key, kind in _ORDER:
        for item in _list(spec.get(key)):
            c = _map(item)
            asks.append(GpuAsk(str(c.get("name", "")), _gpus(_map(c.get("resources")), None, None),
                               "sidecar" if kind == "init" and _is_sidecar(c) else kind))
    return tuple(asks)


def allocate(asks: Sequence[GpuAsk], devices: Sequence[T]) -> dict[str, tuple[T, ...]]:
    """The devices each container with GPUs gets out of the pod's, as the kubelet's device
    manager hands them out: containers in order, each taking first what finished init
    containers left (`devicesToReuse`), then devices not used yet. A regular init container's
    devices are left to the containers after it; a sidecar's and an app container's stay theirs,
    since they run on together. The devices used add up to `pod_requests`' count, so that many
    suffice. Where the kubelet takes reusable devices in map order, this takes them in
    `devices` order."""
    reusable: list[int] = []  # positions in `devices`, ascending
    used = 0
    out: dict[str, tuple[T, ...]] = {}
    for ask in asks:
        if ask.gpus <= 0:
            continue
        reused = reusable[:ask.gpus]
        fresh = ask.gpus - len(reused)
        if used + fresh > len(devices):
            raise DeviceShortage(f"container {ask.name!r} needs {ask.gpus} GPUs, the pod has "
                                 f"{len(devices)}")
        taken = [*reused, *range(used, used + fresh)]
        if ask.kind == "init":
            reusable += range(used, used + fresh)
        else:
            del reusable[:len(reused)]
        used += fresh
        out[ask.name] = tuple(devices[i] for i in taken)
    return out
