"""When a finished job's PodGroup goes, as the job's own operator would delete it.

A PodGroup left behind holds its minResources against the Volcano queue (Volcano re-enqueues it)
until the job object itself is deleted. So Muster deletes the PodGroups it made when upstream
would have:

- MPIJob (mpi-operator v2, pkg/controller/mpi_job_controller.go, cleanUpWorkerPods): when the
  job finished (Succeeded or Failed, completionTime set) and `runPolicy.cleanPodPolicy` is
  `Running` or `All` (the default, `None`, keeps it), or when the job is suspended;
- PyTorchJob, TFJob, XGBoostJob, PaddleJob (training-operator v1,
  pkg/controller.v1/common/job.go, CleanUpResources): when the job finished, whatever the
  cleanPodPolicy, or when it is suspended;
- batch Job (no upstream operator makes its PodGroup; Muster's choice): when it is Complete or
  Failed, or suspended.

Pure: the janitor (webhook.admission.cleanup) reads the job and acts on the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_TRAINING_OPERATOR = frozenset({"kubeflow.org/PyTorchJob", "kubeflow.org/TFJob",
                                "kubeflow.org/XGBoostJob", "kubeflow.org/PaddleJob"})


def _conditions(job: Mapping[str, Any]) -> set[str]:
    return {str(c.get("type")) for c in (job.get("status") or {}).get("conditions") or ()
            if isinstance(c, Mapping) and c.get("status") == "True"}


def _finished(conditions: set[str], *types: str) -> str | None:
    return next((t for t in types if t in conditions), None)


def cleanup_reason(kind: str, job: Mapping[str, Any]) -> str | None:
    """Why the PodGroup of `job` (of group/Kind `kind`) should go now, or None to keep it."""
    spec = job.get("spec") or {}
    run_policy = spec.get("runPolicy") or {}
    conditions = _conditions(job)
    name = kind.rpartition("/")[2]
    if kind == "kubeflow.org/MPIJob":
        if run_policy.get("suspend") is True:
            return f"the {name} is suspended"
        state = _finished(conditions, "Succeeded", "Failed")
        policy = run_policy.get("cleanPodPolicy") or "None"
        if state and (job.get("status") or {}).get("completionTime") and \
                policy in ("Running", "All"):
            return f"the {name} {state.lower()} (cleanPodPolicy {policy})"
        return None
    if kind in _TRAINING_OPERATOR:
        if run_policy.get("suspend") is True:
            return f"the {name} is suspended"
        state = _finished(conditions, "Succeeded", "Failed")
        return f"the {name} {state.lower()}" if state else None
    if kind == "batch/Job":
        if spec.get("suspend") is True:
            return "the Job is suspended"
        state = _finished(conditions, "Complete", "Failed")
        return f"the Job {'completed' if state == 'Complete' else 'failed'}" if state else None
    return None
