"""Custom resources against their CRD's structural openAPIV3Schema, as kube-apiserver treats
them: unknown fields pruned (unless x-kubernetes-preserve-unknown-fields), nulls dropped for
non-nullable fields, defaults applied, then types, required fields and enums validated (422
with causes)."""

from __future__ import annotations

import copy
import json
from typing import Any

from . import errors
from .resources import ResourceType

Cause = tuple[str, str, str]
_TOP_LEVEL = frozenset({"apiVersion", "kind", "metadata"})


def _type_ok(kind: str | None, value: Any) -> bool:
    if kind is None:
        return True
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return True


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value).lower() \
        if isinstance(value, bool) else json.dumps(value)


def _walk(schema: dict[str, Any], value: Any, path: str, causes: list[Cause],
          pruned: list[str]) -> Any:
    """Returns the pruned value; appends validation failures to causes."""
    if schema.get("x-kubernetes-int-or-string"):
        if not (isinstance(value, str) or (isinstance(value, int)
                                           and not isinstance(value, bool))):
            causes.append((path, "FieldValueTypeInvalid",
                           f"Invalid value: {_show(value)}: {path} in body must be of type "
                           f"integer,string: {_show(value)}"))
        return value
    kind = schema.get("type")
    if not _type_ok(kind, value):
        causes.append((path, "FieldValueTypeInvalid",
                       f"Invalid value: {_show(value)}: {path} in body must be of type "
                       f"{kind}: {_show(value)}"))
        return value
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_show(v) for v in schema["enum"])
        causes.append((path, "FieldValueNotSupported",
                       f"Unsupported value: {_show(value)}: supported values: {supported}"))
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            causes.append((path, "FieldValueInvalid",
                           f"Invalid value: {value}: {path} in body should be greater than or "
                           f"equal to {schema['minimum']}"))
        if "maximum" in schema and value > schema["maximum"]:
            causes.append((path, "FieldValueInvalid",
                           f"Invalid value: {value}: {path} in body should be less than or "
                           f"equal to {schema['maximum']}"))
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            return [_walk(items, v, f"{path}[{i}]", causes, pruned)
                    for i, v in enumerate(value)]
        return value
    if isinstance(value, dict) and (kind == "object" or "properties" in schema):
        return _walk_object(schema, value, path, causes, pruned)
    return value


def _walk_object(schema: dict[str, Any], value: dict[str, Any], path: str,
                 causes: list[Cause], pruned: list[str]) -> dict[str, Any]:
    props: dict[str, Any] = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    keep_unknown = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    out: dict[str, Any] = {}
    for key, item in value.items():
        sub = props.get(key)
        child = f"{path}.{key}" if path else key
        if sub is None and isinstance(extra, dict):
            sub = extra
        if sub is None:
            if keep_unknown or extra is True:
                out[key] = item
            else:
                pruned.append(child)  # dropped, as the apiserver prunes unknown fields
            continue
        if item is None and not sub.get("nullable"):
            continue
        out[key] = _walk(sub, item, child, causes, pruned)
    for key, sub in props.items():
        if key not in out and isinstance(sub, dict) and "default" in sub:
            out[key] = copy.deepcopy(sub["default"])  # structural defaulting
    for req in schema.get("required") or []:
        if req not in out:
            child = f"{path}.{req}" if path else req
            causes.append((child, "FieldValueRequired", "Required value"))
    return out


def validate_custom(rt: ResourceType, obj: dict[str, Any]) -> list[str]:
    """Prune obj in place and raise 422 Invalid listing every failure; returns the paths of
    the unknown fields dropped (for fieldValidation Warn / Strict)."""
    schema = rt.schema or {}
    causes: list[Cause] = []
    pruned: list[str] = []
    body = {k: v for k, v in obj.items() if k not in _TOP_LEVEL}
    top = {**schema, "properties": {k: v for k, v in (schema.get("properties") or {}).items()
                                     if k not in _TOP_LEVEL}}
    top["required"] = [r for r in schema.get("required") or [] if r not in _TOP_LEVEL]
    kept = _walk_object(top, body, "", causes, pruned)
    for key in list(obj):
        if key not in _TOP_LEVEL:
            del obj[key]
    obj.update(kept)
    if causes:
        raise errors.invalid(rt.group, rt.kind, obj["metadata"].get("name", ""), causes)
    return pruned
