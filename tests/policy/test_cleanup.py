"""When a finished job's PodGroup goes: upstream operators' rules, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.policy.cleanup import cleanup_reason


def job(*, conditions: tuple[str, ...] = (), clean: str | None = None, suspend: bool = False,
        completed: bool = True, batch: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"runPolicy": {}}
    if clean:
        spec["runPolicy"]["cleanPodPolicy"] = clean
    if suspend:
        (spec if batch else spec["runPolicy"])["suspend"] = True
    status: dict[str, Any] = {"conditions": [{"type": c, "status": "True"} for c in conditions]
                              + [{"type": "Running", "status": "False"}]}
    if completed:
        status["completionTime"] = "2026-11-23T10:00:00Z"
    return {"spec": spec, "status": status}


MPI, PYTORCH, BATCH = "kubeflow.org/MPIJob", "kubeflow.org/PyTorchJob", "batch/Job"


@pytest.mark.parametrize(("kind", "obj", "expected"), [
    # mpi-operator: finished and cleanPodPolicy Running or All; the default None keeps it
    (MPI, job(conditions=("Succeeded",), clean="Running"),
     "the MPIJob succeeded (cleanPodPolicy Running)"),
    (MPI, job(conditions=("Failed",), clean="All"), "the MPIJob failed (cleanPodPolicy All)"),
    (MPI, job(conditions=("Succeeded",)), None),
    (MPI, job(conditions=("Succeeded",), clean="None"), None),
    (MPI, job(conditions=("Succeeded",), clean="Running", completed=False), None),
    (MPI, job(conditions=("Running",), clean="All"), None),
    (MPI, job(suspend=True), "the MPIJob is suspended"),
    # training-operator: finished, whatever the cleanPodPolicy; suspended
    (PYTORCH, job(conditions=("Succeeded",)), "the PyTorchJob succeeded"),
    (PYTORCH, job(conditions=("Failed",), clean="None"), "the PyTorchJob failed"),
    (PYTORCH, job(conditions=("Running",)), None),
    (PYTORCH, job(suspend=True), "the PyTorchJob is suspended"),
    # batch Job (Muster's rule): Complete, Failed, suspended
    (BATCH, job(conditions=("Complete",)), "the Job completed"),
    (BATCH, job(conditions=("Failed",)), "the Job failed"),
    (BATCH, job(suspend=True, batch=True), "the Job is suspended"),
    (BATCH, job(), None),
    ("apps/Deployment", job(conditions=("Complete",)), None),
])
def test_cleanup_follows_each_operator(kind: str, obj: dict[str, Any],
                                       expected: str | None) -> None:
    assert cleanup_reason(kind, obj) == expected
