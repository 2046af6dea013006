"""Resource quantities (exact, canonical) and the memo of job facts."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from webhook.policy.workload import MPIJOB, WorkloadMemo, pod_gpus
from webhook.quantity import QuantityError, add_value, format_quantity, parse_quantity


@pytest.mark.parametrize(("text", "canonical"), [
    ("500m", "500m"), ("4", "4"), ("16Gi", "16Gi"), ("1e3", "1k"), ("0.5", "500m"),
    ("1.5Gi", "1536Mi"), ("100n", "100n"), (".5", "500m"), ("1Ki", "1Ki"), ("2048Ki", "2Mi"),
    ("1000000k", "1G"), ("1.0000000001", "1000000001n"),
])
def test_parse_and_format(text: str, canonical: str) -> None:
    assert format_quantity(*parse_quantity(text)) == canonical


@pytest.mark.parametrize("bad", ["", ".", "lots", "1x", "1e99", "Gi", True, None, 1.5])
def test_bad_quantities(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(bad)


def test_sums_are_exact_and_keep_binary_only_when_all_binary() -> None:
    total: dict[str, tuple[int, bool]] = {}
    add_value(total, "cpu", parse_quantity("500m"))
    add_value(total, "cpu", parse_quantity("4"), 4)
    add_value(total, "memory", parse_quantity("1Gi"))
    add_value(total, "memory", parse_quantity("16Gi"), 4)
    add_value(total, "mixed", parse_quantity("1Gi"))
    add_value(total, "mixed", parse_quantity("1G"))
    assert {k: format_quantity(*v) for k, v in total.items()} == {
        "cpu": "16500m", "memory": "65Gi", "mixed": "2073741824"}


def test_job_facts_memo_follows_resource_version(mpijob: dict[str, Any]) -> None:
    mpijob["metadata"]["resourceVersion"] = "1"
    memo = WorkloadMemo()
    job_facts = memo.facts
    first = job_facts(MPIJOB, mpijob)
    assert job_facts(MPIJOB, copy.deepcopy(mpijob)) is first
    changed = copy.deepcopy(mpijob)
    changed["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 8
    changed["metadata"]["resourceVersion"] = "2"  # every write changes it
    assert job_facts(MPIJOB, changed).auto_min_member == 9
    del changed["metadata"]["resourceVersion"]  # no version: never memoised
    changed["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 2
    assert job_facts(MPIJOB, changed).auto_min_member == 3
    assert first.min_resources(5) == {"cpu": "16500m", "memory": "65Gi", "nvidia.com/gpu": "4"}


def test_job_gpus_count_a_sidecars(mpijob: dict[str, Any]) -> None:
    worker = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["initContainers"] = [{"name": "proxy", "restartPolicy": "Always", "resources": {
        "limits": {"nvidia.com/gpu": "1"}}}]
    assert WorkloadMemo().facts(MPIJOB, mpijob).gpus == 4 * 2


def _container(limits: Any = None, requests: Any = None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = {"nvidia.com/gpu": limits}
    if requests is not None:
        resources["requests"] = {"nvidia.com/gpu": requests}
    return {"name": "c", "resources": resources}


@pytest.mark.parametrize(("spec", "gpus"), [
    ({}, 0),
    ({"containers": [_container("2"), _container(limits=1)]}, 3),  # containers add up
    ({"containers": [_container(requests="4")]}, 4),  # requests when no limit
    ({"containers": [_container(limits="1", requests="4")]}, 1),  # the limit wins
    # an init container runs alone: the pod needs the larger of the two
    ({"containers": [_container("1")], "initContainers": [_container("3"), _container("2")]},
     3),
    ({"containers": [_container("4")], "initContainers": [_container("3")]}, 4),
    # what the API server would refuse counts as none
    ({"containers": [_container("x"), _container(True), _container(1.5), "junk"]}, 0),
    ({"containers": "junk", "initContainers": None}, 0),
])
def test_pod_gpus(spec: dict[str, Any], gpus: int) -> None:
    assert pod_gpus(spec) == gpus
