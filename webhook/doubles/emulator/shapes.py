"""The shape checks that decoding into Go structs and core validation give the real API server:
a body the apiserver could not even decode is a 400, a pod without containers a 422. Without
them a malformed object would be stored and break every later reader."""

from __future__ import annotations

from typing import Any

from . import errors
from .affinity import affinity_errors
from .names import (
    dns1123_label_errors,
    dns1123_subdomain_errors,
    label_key_errors,
    label_value_errors,
)
from .resources import ResourceType

_META_STRINGS = ("name", "generateName", "namespace", "resourceVersion", "uid")
_BUILTIN_OBJECTS = ("spec", "status")
_STRING_MAPS = {("", "configmaps"): ("data", "binaryData"), ("", "secrets"): ("data",
                                                                               "stringData")}


def _undecodable(field: str, want: str) -> errors.ApiStatusError:
    return errors.bad_request(f"error decoding request body: {field} must be {want}")


def _string_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def check_decodable(rt: ResourceType, obj: dict[str, Any]) -> None:
    """400 when obj does not have the types of ObjectMeta (and, for built-in kinds, objects
    where Go has structs); JSON nulls read as absent, as Go decoding does."""
    meta = obj.get("metadata")
    if meta is None:
        obj["metadata"] = meta = {}
    if not isinstance(meta, dict):
        raise _undecodable("metadata", "an object")
    for key in _META_STRINGS:
        if meta.get(key) is None:
            meta.pop(key, None)
        elif not isinstance(meta[key], str):
            raise _undecodable(f"metadata.{key}", "a string")
    for key in ("labels", "annotations"):
        if meta.get(key) is None:
            meta.pop(key, None)
        elif not _string_map(meta[key]):
            raise _undecodable(f"metadata.{key}", "a map of strings")
    finalizers = meta.get("finalizers")
    if finalizers is not None and not (isinstance(finalizers, list)
                                       and all(isinstance(f, str) for f in finalizers)):
        raise _undecodable("metadata.finalizers", "a list of strings")
    refs = meta.get("ownerReferences")
    if refs is not None:
        if not isinstance(refs, list) or not all(isinstance(r, dict) for r in refs):
            raise _undecodable("metadata.ownerReferences", "a list of objects")
        for i, ref in enumerate(refs):
            for key in ("apiVersion", "kind", "name", "uid"):
                if not isinstance(ref.get(key), str) or not ref[key]:
                    raise errors.invalid(rt.group, rt.kind, str(meta.get("name", "")), [(
                        f"metadata.ownerReferences[{i}].{key}", "FieldValueRequired",
                        "Required value")])
    if rt.schema is not None:
        return  # custom resources: the CRD's schema decides
    for key in _BUILTIN_OBJECTS:
        if key in obj and obj[key] is not None and not isinstance(obj[key], dict):
            raise _undecodable(key, "an object")
    for key in _STRING_MAPS.get(rt.key, ()):
        if obj.get(key) is not None and not _string_map(obj[key]):
            raise _undecodable(key, "a map of strings")


def check_pod_decodable(pod: dict[str, Any]) -> None:
    """400 for containers the real server could not decode into its structs: before the
    webhooks, as decoding is."""
    containers = (pod.get("spec") or {}).get("containers")
    if containers is not None and not isinstance(containers, list):
        raise _undecodable("spec.containers", "a list")
    for i, c in enumerate(containers or ()):
        if not isinstance(c, dict):
            raise _undecodable(f"spec.containers[{i}]", "an object")
        if c.get("image") is not None and not isinstance(c["image"], str):
            raise _undecodable(f"spec.containers[{i}].image", "a string")
        res = c.get("resources")
        if res is not None and not (isinstance(res, dict) and all(
                v is None or (isinstance(v, dict) and all(isinstance(q, str | int | float)
                                                          for q in v.values()))
                for k, v in res.items() if k != "claims")):
            raise _undecodable(f"spec.containers[{i}].resources", "limits/requests of "
                               "quantities")
        claims = (res or {}).get("claims")
        if claims is not None and not (isinstance(claims, list) and all(
                isinstance(r, dict) and isinstance(r.get("name"), str) for r in claims)):
            raise _undecodable(f"spec.containers[{i}].resources.claims", "a list of named "
                               "claim references")


def pod_errors(pod: dict[str, Any]) -> list[tuple[str, str, str]]:
    """ValidatePodSpec's causes for containers without a name, both a node and scheduling
    gates, or tolerations, extended resources or affinity the real server refuses. The real
    server also requires an image; that is left out so that image-less test pods keep working."""
    check_pod_decodable(pod)
    containers = (pod.get("spec") or {}).get("containers")
    if not isinstance(containers, list) or not containers:
        return [("spec.containers", "FieldValueRequired", "Required value")]
    causes = [(f"spec.containers[{i}].name", "FieldValueRequired", "Required value")
              for i, c in enumerate(containers) if not isinstance(c.get("name"), str)
              or not c["name"]]
    if causes:
        return causes
    causes += [*_toleration_errors(pod), *_extended_resource_errors(pod), *affinity_errors(pod)]
    spec = pod.get("spec") or {}
    if spec.get("nodeName") and spec.get("schedulingGates"):
        causes.append(("spec.nodeName", "FieldValueForbidden",
                       "Forbidden: cannot be set until all schedulingGates have been cleared"))
    return causes


def _toleration_errors(pod: dict[str, Any]) -> list[tuple[str, str, str]]:
    """ValidateTolerations: the operator, and no value with Exists."""
    causes = []
    for i, t in enumerate((pod.get("spec") or {}).get("tolerations") or ()):
        if not isinstance(t, dict):
            continue
        op = t.get("operator") or "Equal"
        field = f"spec.tolerations[{i}].operator"
        if op not in ("Equal", "Exists"):
            causes.append((field, "FieldValueNotSupported",
                           f'Unsupported value: "{op}": supported values: "Equal", "Exists"'))
        elif op == "Exists" and t.get("value"):
            causes.append((field, "FieldValueInvalid",
                           "Invalid value: value must be empty when `operator` is 'Exists'"))
    return causes


def _extended(resource: str) -> bool:
    """An extended resource (nvidia.com/gpu): a domain that is not kubernetes.io's."""
    domain, _, _ = resource.rpartition("/")
    return bool(domain) and domain != "kubernetes.io" and not domain.endswith(".kubernetes.io")


def _extended_resource_errors(pod: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Extended resources cannot be overcommitted: a request needs an equal limit."""
    causes = []
    spec = pod.get("spec") or {}
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or ()):
            res = (c.get("resources") if isinstance(c, dict) else None) or {}
            requests, limits = res.get("requests") or {}, res.get("limits") or {}
            field = f"spec.{kind}[{i}].resources"
            for resource, value in requests.items():
                if not _extended(resource):
                    continue
                if resource not in limits:
                    causes.append((f"{field}.limits", "FieldValueRequired",
                                   "Required value: Limit must be set for non overcommitable "
                                   "resources"))
                elif str(limits[resource]) != str(value):
                    causes.append((f"{field}.requests", "FieldValueInvalid",
                                   f'Invalid value: "{value}": must be equal to {resource} '
                                   f"limit of {limits[resource]}"))
    return causes


_ANNOTATIONS_MAX = 256 * 1024


def meta_errors(obj: dict[str, Any], *, name_is_label: bool = False
                ) -> list[tuple[str, str, str]]:
    """ValidateObjectMeta's generateName, name, label and annotation rules, in its order, as
    (field, reason, message) causes. A name is a DNS subdomain, a Namespace's or a Service's
    a DNS label; a generateName is checked the same way, its trailing '-' taken as a
    letter."""
    meta = obj["metadata"]
    name_check = dns1123_label_errors if name_is_label else dns1123_subdomain_errors
    causes = []
    prefix = meta.get("generateName", "")
    if prefix:
        masked = prefix[:-1] + "a" if len(prefix) > 1 and prefix.endswith("-") else prefix
        causes += [("metadata.generateName", "FieldValueInvalid",
                    f'Invalid value: "{prefix}": {why}') for why in name_check(masked)]
    name = meta.get("name", "")
    causes += [("metadata.name", "FieldValueInvalid", f'Invalid value: "{name}": {why}')
               for why in name_check(name)]
    for key, value in (meta.get("labels") or {}).items():
        causes += [("metadata.labels", "FieldValueInvalid", f'Invalid value: "{key}": {why}')
                   for why in label_key_errors(key)]
        causes += [("metadata.labels", "FieldValueInvalid", f'Invalid value: "{value}": {why}')
                   for why in label_value_errors(value)]
    annotations = meta.get("annotations") or {}
    for key in annotations:
        causes += [("metadata.annotations", "FieldValueInvalid", f'Invalid value: "{key}": {why}')
                   for why in label_key_errors(key.lower())]
    size = sum(len(k) + len(v) for k, v in annotations.items())
    if size > _ANNOTATIONS_MAX:
        causes.append(("metadata.annotations", "FieldValueTooLong",
                       f"Too long: must have at most {_ANNOTATIONS_MAX} bytes"))
    return causes
