"""A pod's requests and its containers' GPUs, counted as Kubernetes 1.34–1.37 counts them
(resourcehelper.PodRequests; the kubelet's device manager)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.podresources import (
    DeviceShortage,
    GpuAsk,
    Kind,
    allocate,
    gpu_asks,
    pod_gpus,
    pod_requests,
)
from webhook.quantity import format_quantity

GPU = "nvidia.com/gpu"


def c(name: str, requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None,
      sidecar: bool = False) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if requests is not None:
        res["requests"] = requests
    if limits is not None:
        res["limits"] = limits
    out: dict[str, Any] = {"name": name, "resources": res}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def readable(spec: dict[str, Any]) -> dict[str, str]:
    return {k: format_quantity(*v) for k, v in pod_requests(spec).items()}


@pytest.mark.parametrize(("spec", "want"), [
    pytest.param({"containers": [c("a", {"cpu": "1", "memory": "1Gi"}),
                                 c("b", {"cpu": "500m", "memory": "1Gi"})]},
                 {"cpu": "1500m", "memory": "2Gi"}, id="app containers add up"),
    pytest.param({"containers": [c("a", limits={"cpu": "2", "memory": "1Gi"}),
                                 c("b", {"cpu": "1"}, {"cpu": "4"})]},
                 {"cpu": "3", "memory": "1Gi"}, id="a limit stands in for a missing request"),
    pytest.param({"containers": [c("a", {"cpu": "1"})],
                  "initContainers": [c("i1", {"cpu": "3"}), c("i2", {"cpu": "2"})]},
                 {"cpu": "3"}, id="the largest init container when more"),
    pytest.param({"containers": [c("a", {"cpu": "1"})],
                  "initContainers": [c("s", {"cpu": "1"}, sidecar=True), c("i", {"cpu": "2"})]},
                 {"cpu": "3"}, id="an init container after a sidecar runs beside it"),
    pytest.param({"containers": [c("a", {"cpu": "1"})],
                  "initContainers": [c("i", {"cpu": "2"}), c("s", {"cpu": "1"}, sidecar=True)]},
                 {"cpu": "2"}, id="an init container before a sidecar runs alone"),
    pytest.param({"containers": [c("a", {"cpu": "4"})],
                  "initContainers": [c("i", {"cpu": "2"}), c("s", {"cpu": "1"}, sidecar=True)]},
                 {"cpu": "5"}, id="a sidecar adds to the app containers"),
    pytest.param({"containers": [c("a", limits={GPU: "2"})],
                  "initContainers": [c("s", limits={GPU: "1"}, sidecar=True),
                                     c("i", limits={GPU: "2"})]},
                 {GPU: "3"}, id="sidecar GPUs"),
    pytest.param({"containers": [c("a", {GPU: "4"}, {GPU: "1"})]},
                 {GPU: "1"}, id="the GPU limit wins"),
    pytest.param({"containers": [c("a", {"cpu": "1", "memory": "1Gi"})],
                  "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}},
                 {"cpu": "4", "memory": "8Gi"}, id="pod-level requests replace the containers'"),
    pytest.param({"containers": [c("a", {"cpu": "1", "memory": "1Gi", GPU: "1"})],
                  "resources": {"requests": {"cpu": "2"}, "limits": {GPU: "8"}}},
                 {"cpu": "2", "memory": "1Gi", GPU: "1"},
                 id="only the resources the pod level sets, never a GPU"),
    pytest.param({"containers": [c("a", {"cpu": "1"})],
                  "resources": {"limits": {"cpu": "4", "memory": "2Gi"}}},
                 {"cpu": "1", "memory": "2Gi"},
                 id="a pod-level limit defaults a request the containers do not make"),
    pytest.param({"containers": [c("a", {"hugepages-2Mi": "2Mi"})],
                  "resources": {"limits": {"hugepages-2Mi": "8Mi"}}},
                 {"hugepages-2Mi": "8Mi"}, id="pod-level hugepages come from the limit"),
    pytest.param({"containers": [c("a", {"cpu": "1", "memory": "1Gi"})],
                  "resources": {"requests": {"cpu": "2"}},
                  "overhead": {"cpu": "250m", "memory": "120Mi"}},
                 {"cpu": "2250m", "memory": "1144Mi"}, id="overhead on top of pod-level"),
    pytest.param({"containers": [c("a", {"cpu": "1"})],
                  "initContainers": [c("i", {"cpu": "2"})], "overhead": {"cpu": "100m"}},
                 {"cpu": "2100m"}, id="overhead on top of the init containers"),
    pytest.param({"containers": "junk", "initContainers": [7, None], "resources": [],
                  "overhead": None}, {}, id="any JSON"),
])
def test_pod_requests(spec: dict[str, Any], want: dict[str, str]) -> None:
    assert readable(spec) == want


def test_bad_quantities_count_as_none_and_are_reported() -> None:
    problems: list[str] = []
    spec = {"containers": [c("a", {"cpu": "lots", "memory": "1Gi"}, {GPU: "1.5"})],
            "initContainers": [c("i", limits={GPU: True})],
            "resources": {"requests": {"memory": "x"}}, "overhead": {"cpu": "-"}}
    assert pod_requests(spec, problems) == {"memory": (2**30 * 10**9, True), GPU: (0, False)}
    assert len(problems) == 5 and all(p.startswith("bad resource quantity: ") for p in problems)
    assert problems[0] == ("bad resource quantity: container a cpu: 'lots' is not a resource "
                           "quantity (e.g. 500m, 4, 16Gi)")
    assert problems[1] == "bad resource quantity: container a nvidia.com/gpu: '1.5' is not a " \
        "whole number"
    assert pod_gpus(spec) == 0


@pytest.mark.parametrize(("spec", "gpus"), [
    ({"containers": [c("a", limits={GPU: 2}), c("b", limits={GPU: "1"})]}, 3),
    ({"containers": [c("a", limits={GPU: "2000m"})]}, 2),  # a whole number, in any form
    ({"containers": [c("a", limits={GPU: "2"})],
      "initContainers": [c("s", limits={GPU: "1"}, sidecar=True), c("i", limits={GPU: "3"})]},
     4),
    ({"containers": [c("a", limits={GPU: "2"})],
      "initContainers": [c("i", limits={GPU: "3"}), c("s", limits={GPU: "1"}, sidecar=True)]},
     3),
    ({"containers": [c("a", limits={GPU: "1"})], "overhead": {GPU: "1"}}, 2),
])
def test_pod_gpus(spec: dict[str, Any], gpus: int) -> None:
    assert pod_gpus(spec) == gpus == pod_requests(spec)[GPU][0] // 10**9


def test_gpu_asks_are_in_the_kubelets_order() -> None:
    spec = {"containers": [c("a", limits={GPU: "2"}), c("b")],
            "initContainers": [c("i", limits={GPU: "1"}), c("s", sidecar=True)]}
    assert gpu_asks(spec) == (GpuAsk("i", 1, "init"), GpuAsk("s", 0, "sidecar"),
                              GpuAsk("a", 2, "app"), GpuAsk("b", 0, "app"))


@pytest.mark.parametrize(("asks", "want"), [
    pytest.param([("i", 2, "init"), ("b", 3, "app"), ("c", 2, "app")],
                 {"i": "AB", "b": "ABC", "c": "DE"}, id="an app container reuses an init's"),
    pytest.param([("i", 2, "init"), ("s", 1, "sidecar"), ("a", 2, "app")],
                 {"i": "AB", "s": "A", "a": "BC"}, id="never a sidecar's"),
    pytest.param([("s", 1, "sidecar"), ("i", 2, "init"), ("a", 1, "app")],
                 {"s": "A", "i": "BC", "a": "B"}, id="an init after a sidecar runs beside it"),
    pytest.param([("i1", 1, "init"), ("i2", 3, "init"), ("a", 0, "app"), ("b", 1, "app")],
                 {"i1": "A", "i2": "ABC", "b": "A"}, id="init containers reuse each other's"),
])
def test_allocate(asks: list[tuple[str, int, Kind]], want: dict[str, str]) -> None:
    devices = "ABCDE"[:pod_gpus(_spec(asks))]
    got = allocate([GpuAsk(*a) for a in asks], devices)
    assert {k: "".join(v) for k, v in got.items()} == want
    with pytest.raises(DeviceShortage):
        allocate([GpuAsk(*a) for a in asks], devices[:-1])


def _spec(asks: list[tuple[str, int, Kind]]) -> dict[str, Any]:
    """The pod those asks are read from."""
    return {"containers": [c(n, limits={GPU: str(g)}) for n, g, k in asks if k == "app"],
            "initContainers": [c(n, limits={GPU: str(g)}, sidecar=k == "sidecar")
                               for n, g, k in asks if k != "app"]}


_ASK = st.tuples(st.integers(0, 4), st.sampled_from(["init", "sidecar", "app"]))


@given(st.lists(_ASK, max_size=8))
def test_allocation_uses_exactly_what_the_scheduler_counts(drawn: list[tuple[int, Kind]]
                                                          ) -> None:
    """The device manager's simulation needs exactly `pod_gpus` devices; containers that run
    at the same time never share one."""
    asks = [GpuAsk(f"c{i}", g, k) for i, (g, k) in
            enumerate(sorted(drawn, key=lambda a: a[1] == "app"))]
    spec = _spec([(a.name, a.gpus, a.kind) for a in asks])
    assert gpu_asks(spec) == tuple(asks)
    need = pod_gpus(spec)
    got = allocate(asks, range(need))
    assert {d for v in got.values() for d in v} == set(range(need))
    assert all(len(got.get(a.name, ())) == a.gpus for a in asks)
    running: set[int] = set()  # what the sidecars started so far hold
    for a in asks:
        mine = set(got.get(a.name, ()))
        assert len(mine) == a.gpus and not mine & running
        if a.kind != "init":
            running |= mine
    if need:
        with pytest.raises(DeviceShortage):
            allocate(asks, range(need - 1))
