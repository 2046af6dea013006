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
  Failed, or suspended;
- JobSet: when it is Completed or Failed (the JobSet controller decides that from its
  successPolicy and failurePolicy: a JobSet whose successPolicy is met with workers still
  running is done, and its gang no longer holds the queue), or suspended;
- TrainJob (Kubeflow Trainer v2): when it is Complete or Failed, or suspended;
- LeaderWorkerSet (a PodGroup per group `<name>-<group index>`): when the group is gone, scaled
  down below `spec.replicas` (LWS's own Volcano provider has its PodGroups owned by each leader
  pod for the same effect).

Pure: the janitor (webhook.admission.cleanup) reads the job and acts on the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_TRAINING_OPERATOR = frozenset({"kubeflow.org/PyTorchJob", "kubeflow.org/TFJob",
                                "kubeflow.org/XGBoostJob", "kubeflow.org/PaddleJob"})


#: kinds that finish, with their condition types for success and failure
_FINISHING = {"jobset.x-k8s.io/JobSet": ("Completed", "Failed"),
              "trainer.kubeflow.org/TrainJob": ("Complete", "Failed")}


def _lws_group_gone(lws: Mapping[str, Any], podgroup: str) -> str | None:
    prefix = f"{(lws.get('metadata') or {}).get('name')}-"
    index = podgroup[len(prefix):] if podgroup.startswith(prefix) else ""
    replicas = (lws.get("spec") or {}).get("replicas", 1)
    if index.isdigit() and isinstance(replicas, int) and int(index) >= replicas:
        return f"group {index} of the LeaderWorkerSet is gone (replicas {replicas})"
    return None


def _conditions(job: Mapping[str, Any]) -> set[str]:
    return {str(c.get("type")) for c in (job.get("status") or {}).get("conditions") or ()
            if isinstance(c, Mapping) and c.get("status") == "True"}


def _finished(conditions: set[str], *types: str) -> str | None:
    return next((t for t in types if t in conditions), None)


def cleanup_reason(kind: str, job: Mapping[str, Any], podgroup: str = "") -> str | None:
    """Why the PodGroup named `podgroup` of `job` (of group/Kind `kind`) should go now, or None
    to keep it."""
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
    if kind in _FINISHING:
        if spec.get("suspend") is True:
            return f"the {name} is suspended"
        state = _finished(conditions, *_FINISHING[kind])
        return f"the {name} {'failed' if state == 'Failed' else 'completed'}" if state else None
    if kind == "leaderworkerset.x-k8s.io/LeaderWorkerSet":
        return _lws_group_gone(job, podgroup)
    if kind == "batch/Job":
        if spec.get("suspend") is True:
            return "the Job is suspended"
        state = _finished(conditions, "Complete", "Failed")
        return f"the Job {'completed' if state == 'Complete' else 'failed'}" if state else None
    return None
