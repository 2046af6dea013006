"""PATCH bodies: JSON merge patch (RFC 7386), strategic merge patch (an approximation of
apimachinery's, see docs/emulator.md) and JSON Patch (RFC 6902, via webhook.jsonpatch)."""

from __future__ import annotations

import copy
from typing import Any

from webhook.jsonpatch import JsonPatchError, apply_patch

from .errors import ApiStatusError

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"

#: list fields merged element-wise by key in strategic merge patch (patchMergeKey in k8s types);
#: any other list is replaced, as apimachinery does for lists without a patch strategy. A field
#: name used by two types with different keys lists both (container ports by containerPort,
#: Service ports by port): the first key every element has is used.
MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",), "initContainers": ("name",), "ephemeralContainers": ("name",),
    "volumes": ("name",), "env": ("name",), "volumeMounts": ("mountPath",),
    "ports": ("containerPort", "port"), "imagePullSecrets": ("name",), "conditions": ("type",),
    "ownerReferences": ("uid",), "addresses": ("type",), "hostAliases": ("ip",),
    "readinessGates": ("conditionType",), "topologySpreadConstraints": ("topologyKey",),
    "webhooks": ("name",),  # Mutating/ValidatingWebhookConfiguration
}
#: primitive lists merged as sets (patchStrategy: merge without key)
MERGE_SETS = frozenset({"finalizers"})


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _merge_key(field: str, items: list[Any]) -> str | None:
    if not all(isinstance(v, dict) for v in items):
        return None
    elements = [v for v in items if "$patch" not in v]
    return next((k for k in MERGE_KEYS.get(field, ()) if all(k in v for v in elements)), None)


def _strategic_list(field: str, target: list[Any], patch: list[Any]) -> list[Any]:
    if field in MERGE_SETS:
        return list(target) + [v for v in patch if v not in target]
    key = _merge_key(field, [*target, *patch])
    if key is None:
        return [v for v in copy.deepcopy(patch) if not (isinstance(v, dict) and "$patch" in v)]
    if any(isinstance(v, dict) and v.get("$patch") == "replace" for v in patch):
        return [v for v in copy.deepcopy(patch) if v.get("$patch") != "replace"]
    result = [dict(v) for v in target]
    for item in patch:
        found = next((i for i, v in enumerate(result) if v.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if found is not None:
                del result[found]
        elif found is None:
            result.append(strategic_merge({}, item))
        else:
            result[found] = strategic_merge(result[found], item)
    return result


def strategic_merge(target: Any, patch: Any) -> Any:
    """Merge semantics plus merge-by-key for the well-known lists and `$patch` directives."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue  # $setElementOrder/, $retainKeys...: hints, ignored here
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _strategic_list(key, result[key], value)
        elif isinstance(value, list):
            result[key] = _strategic_list(key, [], value)
        else:
            merged = strategic_merge(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    return result


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 through the project's implementation; failures are 422 like the apiserver's."""
    if not isinstance(ops, list):
        raise ApiStatusError(400, "BadRequest",
                             "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    try:
        return apply_patch(target, ops)
    except JsonPatchError as exc:
        raise ApiStatusError(422, "Invalid", f"the server rejected our request due to an error "
                             f"in our request: {exc}") from exc


def apply_patch_body(content_type: str, target: dict[str, Any], body: Any,
                     custom: bool) -> Any:
    """Dispatch on Content-Type; strategic merge patch is not accepted for custom resources."""
    ctype = content_type.split(";", maxsplit=1)[0].strip()
    if ctype == MERGE:
        return merge_patch(target, body)
    if ctype == JSON_PATCH:
        return json_patch(target, body)
    if ctype == STRATEGIC and not custom:
        return strategic_merge(target, body)
    accepted = [JSON_PATCH, MERGE] + ([] if custom else [STRATEGIC])
    raise ApiStatusError(415, "UnsupportedMediaType",
                         f"the body of the request was in an unknown format - accepted media "
                         f"types include: {', '.join(accepted)}")
