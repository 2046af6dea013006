"""Owner references: the controller of an object, and where its kind is served."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.kube.api import Resource


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference marked controller, or None. Tolerates any shape (admission sees
    user input before the API server has validated it)."""
    meta = obj.get("metadata")
    refs = meta.get("ownerReferences") if type(meta) is dict or isinstance(meta, Mapping) \
        else None
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if (type(ref) is dict or isinstance(ref, Mapping)) and ref.get("controller") is True:
            return ref
    return None


def owner_resource(ref: Mapping[str, Any]) -> Resource:
    """The REST resource of an owner reference's kind; CRD plurals are the lower-cased kind
    plus "s" (MPIJob → mpijobs), as for every job kind Muster reads."""
    group, _, version = str(ref.get("apiVersion", "")).rpartition("/")
    kind = str(ref.get("kind", ""))
    return Resource(group, version, kind.lower() + "s", True, kind)


def owner_kind(ref: Mapping[str, Any]) -> str:
    """group/Kind of an owner reference ("kubeflow.org/MPIJob", "batch/Job"; "Pod" for core)."""
    group = str(ref.get("apiVersion", "")).rpartition("/")[0]
    return f"{group}/{ref.get('kind')}" if group else str(ref.get("kind"))
