"""What `muster demo` learned: per job, per pod, and of the preemption scene (what
webhook.demo.report prints)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PodOutcome:
    name: str
    role: str
    patch: list[dict[str, Any]]
    warnings: list[str]
    #: the fields a matched policy lost to another (the webhook's audit annotation)
    overridden: list[str] = field(default_factory=list)
    node: str | None = None
    gpus: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()
    visible_devices: tuple[str, ...] | None = None  # what the device plugin gave the container

    @property
    def handed_exactly(self) -> bool:
        """The device plugin gave the container exactly the GPUs the binder wrote on the pod."""
        return self.visible_devices is not None and \
            sorted(self.visible_devices) == sorted(self.uuids)


@dataclass
class JobOutcome:
    name: str
    namespace: str
    kind: str
    policies: list[str]
    pods: list[PodOutcome]
    scheduler_name: str = ""
    pod_group: dict[str, Any] | None = None  # the PodGroup object, for Volcano/coscheduling
    gang: dict[str, str] = field(default_factory=dict)  # muster gang annotations
    bus_gbps: float | None = None
    images_per_s: dict[str, float] = field(default_factory=dict)


@dataclass
class PreemptionOutcome:
    """The preemption scene: where the filler ran, what the binder evicted for the urgent job,
    where that went, and the Events that said so."""

    filler_node: str
    urgent_node: str
    urgent_gpus: tuple[int, ...]
    evicted: list[str]
    #: the binder's Events: GangPreempted on a victim's pod, GangPreempting on the urgent's
    preempted: str
    preempting: str
    #: each urgent worker's container was handed exactly its assigned GPUs, some of them the
    #: evicted gang's a moment before
    exact: bool = False


@dataclass
class DemoResult:
    jobs: list[JobOutcome]
    regular_images_per_s: dict[str, float]
    regular_placement: str
    seconds: float
    #: the steps skipped, each with why
    skipped: list[str] = field(default_factory=list)
    preemption: PreemptionOutcome | None = None
