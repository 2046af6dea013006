"""Request bodies in the Kubernetes protobuf encoding (`application/vnd.kubernetes.protobuf`),
for the few kinds client-go's typed clients send that way to the emulator: Secret and ConfigMap
(Helm keeps its releases in them) and DeleteOptions. Decoded to their JSON form.

The encoding: the magic bytes "k8s\\0", then a runtime.Unknown whose `raw` field holds the
object's message. Field numbers are those of the generated.proto files of k8s.io/api (core/v1)
and k8s.io/apimachinery (meta/v1, runtime). A field the tables below do not know is refused with
a clear error, never dropped: what the emulator stores is what the client sent.

Zero values: the Go types' JSON drops empty strings, maps and false/0 of plain fields
(`omitempty`), while pointer fields (DeleteOptions.gracePeriodSeconds, Secret.immutable, ...)
are sent only when set and keep their value, zero included; the tables mark those.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

MAGIC = b"k8s\x00"

# A field: (JSON name, type, pointer). Types: "string", "bytes" (base64 in JSON), "bool",
# "int64", "int32", "time" (meta/v1 Time as RFC 3339), a message name, "map:K:V" (a map of
# two scalar types), "[]T" (repeated T).
Field = tuple[str, str, bool]
MESSAGES: dict[str, dict[int, Field]] = {
    "Unknown": {1: ("typeMeta", "RuntimeTypeMeta", False), 2: ("raw", "raw", False),
                3: ("contentEncoding", "string", False), 4: ("contentType", "string", False)},
    "RuntimeTypeMeta": {1: ("apiVersion", "string", False), 2: ("kind", "string", False)},
    "ObjectMeta": {
        1: ("name", "string", False), 2: ("generateName", "string", False),
        3: ("namespace", "string", False), 4: ("selfLink", "string", False),
        5: ("uid", "string", False), 6: ("resourceVersion", "string", False),
        7: ("generation", "int64", False), 8: ("creationTimestamp", "time", False),
        9: ("deletionTimestamp", "time", True),
        10: ("deletionGracePeriodSeconds", "int64", True),
        11: ("labels", "map:string:string", False), 12: ("annotations", "map:string:string", False),
        13: ("ownerReferences", "[]OwnerReference", False),
        14: ("finalizers", "[]string", False)},
    "OwnerReference": {
        5: ("apiVersion", "string", False), 1: ("kind", "string", False),
        3: ("name", "string", False), 4: ("uid", "string", False),
        6: ("controller", "bool", True), 7: ("blockOwnerDeletion", "bool", True)},
    "Secret": {1: ("metadata", "ObjectMeta", False), 5: ("immutable", "bool", True),
               2: ("data", "map:string:bytes", False),
               4: ("stringData", "map:string:string", False), 3: ("type", "string", False)},
    "ConfigMap": {1: ("metadata", "ObjectMeta", False), 4: ("immutable", "bool", True),
                  2: ("data", "map:string:string", False),
                  3: ("binaryData", "map:string:bytes", False)},
    "DeleteOptions": {
        1: ("gracePeriodSeconds", "int64", True), 2: ("preconditions", "Preconditions", True),
        3: ("orphanDependents", "bool", True), 4: ("propagationPolicy", "string", True),
        5: ("dryRun", "[]string", False)},
    "Preconditions": {1: ("uid", "string", True), 2: ("resourceVersion", "string", True)},
    "Time": {1: ("seconds", "int64", False), 2: ("nanos", "int32", False)},
}
_POINTERS = {m: frozenset(name for name, _, pointer in fields.values() if pointer)
             for m, fields in MESSAGES.items()}
#: the kinds a body may hold (runtime.Unknown's typeMeta.kind)
KINDS = ("Secret", "ConfigMap", "DeleteOptions")


class ProtobufError(ValueError):
    """The body is not a protobuf object the emulator decodes; the message says why."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ProtobufError("truncated or overlong varint")
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes, message: str) -> list[tuple[int, int | bytes]]:
    """(field number, value) in wire order; only varint and length-delimited wire types occur
    in the messages above."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            out.append((number, value))
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise ProtobufError(f"{message}: field {number} runs past the end")
            out.append((number, buf[pos:pos + size]))
            pos += size
        else:
            raise ProtobufError(f"{message}: field {number} has wire type {wire}, not expected "
                                "in this message")
    return out


def _signed64(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _scalar(kind: str, value: int | bytes, where: str) -> Any:
    if kind in ("string", "bytes", "raw"):
        if not isinstance(value, bytes):
            raise ProtobufError(f"{where}: expected bytes")
        if kind == "string":
            try:
                return value.decode()
            except UnicodeDecodeError as exc:
                raise ProtobufError(f"{where}: not UTF-8") from exc
        return value if kind == "raw" else base64.b64encode(value).decode()
    if not isinstance(value, int):
        raise ProtobufError(f"{where}: expected a varint")
    if kind == "bool":
        return value != 0
    # int32 and int64 alike: a negative number is sent as its 64-bit two's complement
    return _signed64(value)


def _time(buf: bytes, where: str) -> str:
    t = decode_message(buf, "Time", where)
    try:
        moment = datetime.fromtimestamp(t.get("seconds", 0), UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise ProtobufError(f"{where}: time out of range") from exc
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _value(kind: str, value: int | bytes, where: str) -> Any:
    if kind != "time" and kind not in MESSAGES:
        return _scalar(kind, value, where)
    if not isinstance(value, bytes):
        raise ProtobufError(f"{where}: expected a message")
    return _time(value, where) if kind == "time" else decode_message(value, kind, where)


def _zero(value: Any) -> bool:
    return value in ("", 0, False) or value in ({}, [])


def decode_message(buf: bytes, message: str, where: str = "") -> dict[str, Any]:
    """One message as its JSON object (zero values of non-pointer fields left out)."""
    table = MESSAGES[message]
    out: dict[str, Any] = {}
    where = where or message
    for number, raw in _fields(buf, message):
        spec = table.get(number)
        if spec is None:
            raise ProtobufError(f"{where}: field {number} of {message} is not decoded by the "
                                "emulator")
        name, kind, _pointer = spec
        at = f"{where}.{name}"
        if kind.startswith("map:"):
            _, key_kind, value_kind = kind.split(":")
            if not isinstance(raw, bytes):
                raise ProtobufError(f"{at}: expected a map entry")
            entry = {n: v for n, v in _fields(raw, f"{message}.{name} entry")}
            if set(entry) - {1, 2}:
                raise ProtobufError(f"{at}: a map entry has fields other than key and value")
            key = _scalar(key_kind, entry.get(1, b""), at)
            value_default: int | bytes = b"" if value_kind in ("string", "bytes") else 0
            out.setdefault(name, {})[key] = _scalar(value_kind, entry.get(2, value_default), at)
        elif kind.startswith("[]"):
            out.setdefault(name, []).append(_value(kind[2:], raw, at))
        else:
            out[name] = _value(kind, raw, at)
    pointers = _POINTERS[message]
    return {k: v for k, v in out.items() if k in pointers or not _zero(v)}


def decode_body(body: bytes) -> dict[str, Any]:
    """A request body in the Kubernetes protobuf encoding as the JSON object it stands for."""
    if not body.startswith(MAGIC):
        raise ProtobufError('the body does not start with the Kubernetes protobuf magic "k8s\\0"')
    unknown = decode_message(body[len(MAGIC):], "Unknown")
    type_meta = unknown.get("typeMeta", {})
    kind = type_meta.get("kind", "")
    if unknown.get("contentEncoding"):
        raise ProtobufError(f"content encoding {unknown['contentEncoding']!r} is not supported")
    if kind not in KINDS:
        raise ProtobufError(f"the emulator decodes protobuf bodies of {', '.join(KINDS)} only, "
                            f"not {kind or 'an object without a kind'}")
    obj = decode_message(unknown.get("raw", b""), kind)
    head = {"apiVersion": type_meta.get("apiVersion") or "v1", "kind": kind}
    return head | obj
