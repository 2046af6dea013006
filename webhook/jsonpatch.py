"""RFC 6902 JSON Patch over plain JSON values, with RFC 6901 pointers.

Used by the policy engine's tests and CLI (to check that a patch is idempotent) and by the API
server emulator (to apply the patches admission webhooks return), so it follows the RFCs
strictly: a patch is atomic (the input document is never modified), array indices have no leading
zeros, `-` appends only where a new element may be added, and `test` compares JSON values (1 is
not `true`).

Why not python-json-patch (the `jsonpatch` package): its `test` operation compares with Python's
`==`, for which `1 == True` and `1 == 1.0`, so a webhook patch that tests `"x": 1` would pass
against `true`, where the API server's RFC 6902 implementation fails it. The emulator must fail it
too, or it would accept patches a real API server refuses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["JsonPatchError", "apply_patch", "encode", "escape", "parse_pointer", "unescape"]

#: one encoder for every patch (json.dumps with separators builds a new encoder per call)
_compact = json.JSONEncoder(separators=(",", ":")).encode


def encode(ops: Sequence[Mapping[str, Any]]) -> bytes:
    """The operations as compact JSON, the form an AdmissionReview response carries."""
    return _compact(ops).encode()


class JsonPatchError(ValueError):
    """A patch that is malformed or cannot be applied to the document."""


def escape(key: str) -> str:
    """One reference token of a JSON Pointer: `~` → `~0`, `/` → `~1` (RFC 6901 §3)."""
    return key.replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    if "~" in token:
        i = token.find("~")
        while i != -1:
            if token[i + 1 : i + 2] not in ("0", "1"):
                raise JsonPatchError(f"invalid escape in pointer token {token!r}")
            i = token.find("~", i + 2)
    return token.replace("~1", "/").replace("~0", "~")


def parse_pointer(pointer: object) -> list[str]:
    if not isinstance(pointer, str):
        raise JsonPatchError(f"pointer must be a string, got {type(pointer).__name__}")
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise JsonPatchError(f"pointer {pointer!r} must be empty or start with '/'")
    return [unescape(t) for t in pointer[1:].split("/")]


def _copy(value: Any) -> Any:
    # JSON-only deep copy: several times faster than copy.deepcopy on API objects.
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def _index(token: str, size: int, *, for_add: bool, where: str) -> int:
    if for_add and token == "-":
        return size
    if not token.isdigit() or not token.isascii() or (len(token) > 1 and token[0] == "0"):
        raise JsonPatchError(f"{where}: {token!r} is not an array index")
    i = int(token)
    limit = size if for_add else size - 1
    if i > limit:
        raise JsonPatchError(f"{where}: index {i} out of range (array has {size} elements)")
    return i


def _resolve(doc: Any, tokens: Sequence[str], where: str) -> Any:
    node = doc
    for n, token in enumerate(tokens):
        at = "/" + "/".join(escape(t) for t in tokens[: n + 1])
        if isinstance(node, dict):
            if token not in node:
                raise JsonPatchError(f"{where}: path {at!r} does not exist")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(token, len(node), for_add=False, where=f"{where} {at!r}")]
        else:
            raise JsonPatchError(f"{where}: path {at!r} goes through a scalar")
    return node


def _add(doc: Any, tokens: Sequence[str], value: Any, where: str) -> Any:
    if not tokens:
        return value
    parent = _resolve(doc, tokens[:-1], where)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(last, len(parent), for_add=True, where=where), value)
    else:
        raise JsonPatchError(f"{where}: parent of the target is not an object or array")
    return doc


def _remove(doc: Any, tokens: Sequence[str], where: str) -> tuple[Any, Any]:
    if not tokens:
        raise JsonPatchError(f"{where}: cannot remove the whole document")
    parent = _resolve(doc, tokens[:-1], where)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise JsonPatchError(f"{where}: path does not exist")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(last, len(parent), for_add=False, where=where))
    raise JsonPatchError(f"{where}: parent of the target is not an object or array")


def _apply_one(doc: Any, op: Mapping[str, Any], n: int) -> Any:
    if not isinstance(op, Mapping):
        raise JsonPatchError(f"operation {n}: must be an object")
    kind = op.get("op")
    where = f"operation {n} ({kind})"
    if kind not in ("add", "remove", "replace", "move", "copy", "test"):
        raise JsonPatchError(f"operation {n}: unknown op {kind!r}")
    if "path" not in op:
        raise JsonPatchError(f"{where}: missing 'path'")
    path = parse_pointer(op["path"])
    if kind in ("add", "replace", "test") and "value" not in op:
        raise JsonPatchError(f"{where}: missing 'value'")
    if kind in ("move", "copy") and "from" not in op:
        raise JsonPatchError(f"{where}: missing 'from'")

    if kind == "add":
        return _add(doc, path, _copy(op["value"]), where)
    if kind == "remove":
        return _remove(doc, path, where)[0]
    if kind == "replace":
        if not path:
            return _copy(op["value"])
        _resolve(doc, path, where)  # must exist
        doc, _ = _remove(doc, path, where)
        return _add(doc, path, _copy(op["value"]), where)
    if kind == "test":
        if not _json_equal(_resolve(doc, path, where), op["value"]):
            raise JsonPatchError(f"{where}: value at {op['path']!r} differs")
        return doc
    source = parse_pointer(op["from"])
    if kind == "copy":
        return _add(doc, path, _copy(_resolve(doc, source, where)), where)
    # move
    if path[: len(source)] == source and len(path) > len(source):
        raise JsonPatchError(f"{where}: cannot move a value into one of its own children")
    if path == source:
        _resolve(doc, source, where)
        return doc
    doc, value = _remove(doc, source, where)
    return _add(doc, path, value, where)


def apply_patch(doc: Any, ops: Sequence[Mapping[str, Any]]) -> Any:
    """Apply an RFC 6902 patch; returns a new document and leaves `doc` untouched.

    Raises JsonPatchError (naming the operation's index) if any operation fails, in which case
    nothing is applied.
    """
    if isinstance(ops, str | bytes) or not isinstance(ops, Sequence):
        raise JsonPatchError("a JSON Patch must be an array of operations")
    result = _copy(doc)
    for n, op in enumerate(ops):
        result = _apply_one(result, op, n)
    return result
