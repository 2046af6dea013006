"""What `muster policy explain | test` make of a manifest file: every document is read; a Pod is
taken as it is, a job as the pods its operator creates (`operators.expand`), and a Namespace
gives its labels to the pods in it. Any other kind (a RayJob, a Deployment) is named as not
supported, never taken for a bare pod, which would "request 0 GPUs" and match nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.policy import operators
from webhook.policy.jsonshape import as_map
from webhook.policy.workload import POD, group_kind

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True, slots=True)
class Target:
    """A pod to explain, and the owners a job's operator made for it (its controller first,
    the job last; none for a Pod given as it is)."""

    pod: dict[str, Any]
    made: tuple[dict[str, Any], ...] = ()


@dataclass
class Manifest:
    targets: list[Target] = field(default_factory=list)
    #: a line for each document that is not explained, saying what it is and why
    skipped: list[str] = field(default_factory=list)
    #: each Namespace's labels, with the one the API server sets to its name
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)

    def namespace_labels(self, pod: Mapping[str, Any]) -> dict[str, str]:
        """The labels of the pod's namespace where the manifest holds that Namespace."""
        return self.namespaces.get(str(as_map(pod.get("metadata")).get("namespace")), {})


def object_of(data: Any) -> Any:
    """The object a document stands for: an AdmissionReview's request.object (with the
    request's namespace filled in, as the API server does), else the document itself."""
    if not (isinstance(data, dict) and data.get("kind") == "AdmissionReview"):
        return data
    request = data.get("request") or {}
    obj = request.get("object")
    if not isinstance(obj, dict):
        raise ValueError("AdmissionReview without request.object")
    meta = obj.setdefault("metadata", {})
    if request.get("namespace") and not meta.get("namespace"):
        meta["namespace"] = request["namespace"]
    return obj


def read_manifest(docs: Sequence[Any]) -> Manifest:
    """The pods of every document. ValueError for a job without a name or without pods."""
    out = Manifest()
    for index, doc in enumerate(docs, 1):
        obj = object_of(doc)
        kind = group_kind(obj.get("apiVersion"), obj.get("kind")) if isinstance(obj, dict) \
            else ""
        if kind == POD:
            out.targets.append(Target(obj))
        elif kind == "Namespace":
            name = str(as_map(obj.get("metadata")).get("name"))
            labels = as_map(as_map(obj.get("metadata")).get("labels"))
            out.namespaces[name] = {**{str(k): str(v) for k, v in labels.items()},
                                    NAMESPACE_NAME_LABEL: name}
        elif kind and operators.is_job(obj):
            out.targets.extend(job_targets(obj))
        else:
            out.skipped.append(f"document {index}: {unsupported(obj)}")
    return out


def job_targets(job: Mapping[str, Any]) -> list[Target]:
    """The pods a job's operator creates. ValueError for a job without a name or pods."""
    made = operators.expand(job)
    if not made:
        raise ValueError(f"the {job.get('kind')} {name_of(job)} creates no pods")
    return [Target(p.pod, p.owners) for p in made]


def unsupported(obj: Any) -> str:
    """Why an object is not explained, naming it."""
    kinds = ", ".join(k.rpartition("/")[2] for k in operators.JOB_KINDS)
    if not (isinstance(obj, dict) and isinstance(obj.get("kind"), str)):
        return "not a Kubernetes object (no kind)"
    return (f"{group_kind(obj.get('apiVersion'), obj['kind'])} {name_of(obj)} is not "
            f"supported: give a Pod, or a job of a kind Muster knows ({kinds})")


def name_of(obj: Mapping[str, Any]) -> str:
    """metadata.name, or generateName followed by * ("<job>-launcher-*")."""
    meta = as_map(obj.get("metadata"))
    return str(meta.get("name") or str(meta.get("generateName", "")) + "*")
