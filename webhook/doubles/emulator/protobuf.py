"""Request bodies in the Kubernetes protobuf encoding (`application/vnd.kubernetes.protobuf`),
for the few kinds client-go's typed clients send that way to the emulator: Secret and ConfigMap
(Helm keeps its releases in them) and DeleteOptions. Decoded to their JSON form.

The encoding: the magic bytes "k8s\\0", then a runtime.Unknown whose `raw` field holds the
object's message. The messages are parsed by the protobuf runtime with the modules generated
from `kubeproto.proto` (the field numbers of k8s.io/api and k8s.io/apimachinery), then walked by
their descriptors into JSON: each field's `json_name` is its Kubernetes JSON name. A field the
schema does not know is refused with a clear error, never dropped: what the emulator stores is
what the client sent.

Zero values: the Go types' JSON drops empty strings, maps and false/0 of plain fields
(`omitempty`), while pointer fields (DeleteOptions.gracePeriodSeconds, Secret.immutable, ...)
are sent only when set and keep their value, zero included; `POINTERS` names those.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from . import kubeproto_pb2 as pb

MAGIC = b"k8s\x00"
#: the kinds a body may hold (runtime.Unknown's typeMeta.kind), and their messages
MESSAGES: dict[str, type[Message]] = {
    "Secret": pb.Secret, "ConfigMap": pb.ConfigMap, "DeleteOptions": pb.DeleteOptions}
KINDS = tuple(MESSAGES)
#: per message, the JSON names of the fields that are pointers in the Go types
POINTERS: dict[str, frozenset[str]] = {
    "ObjectMeta": frozenset({"deletionTimestamp", "deletionGracePeriodSeconds"}),
    "OwnerReference": frozenset({"controller", "blockOwnerDeletion"}),
    "Secret": frozenset({"immutable"}), "ConfigMap": frozenset({"immutable"}),
    "DeleteOptions": frozenset({"gracePeriodSeconds", "preconditions", "orphanDependents",
                                "propagationPolicy"}),
    "Preconditions": frozenset({"uid", "resourceVersion"}),
}


class ProtobufError(ValueError):
    """The body is not a protobuf object the emulator decodes; the message says why."""


def _parse(cls: type[Message], buf: bytes, where: str) -> Message:
    try:
        return cls.FromString(buf)
    except DecodeError as exc:
        raise ProtobufError(f"{where}: {exc}") from exc


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    return base64.b64encode(value).decode() if field.type == FieldDescriptor.TYPE_BYTES \
        else value


def _time(t: Message, where: str) -> str:
    try:
        moment = datetime.fromtimestamp(t.seconds, UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise ProtobufError(f"{where}: time out of range") from exc
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _value(field: FieldDescriptor, value: Any, where: str) -> Any:
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        return _scalar(field, value)
    if field.message_type.name == "Time":
        _refuse_unknown(value, where)
        return _time(value, where)
    return to_json(value, where)


def _refuse_unknown(msg: Message, where: str) -> None:
    unknown = [f.field_number for f in UnknownFieldSet(msg)]
    if unknown:
        raise ProtobufError(f"{where}: field {unknown[0]} of {msg.DESCRIPTOR.name} is not "
                            "decoded by the emulator")


def _zero(value: Any) -> bool:
    return value in ("", 0, False) or value in ({}, [])


def to_json(msg: Message, where: str = "") -> dict[str, Any]:
    """One message as its JSON object (zero values of non-pointer fields left out)."""
    name = msg.DESCRIPTOR.name
    where = where or name
    _refuse_unknown(msg, where)
    out: dict[str, Any] = {}
    for field, value in msg.ListFields():
        at = f"{where}.{field.json_name}"
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.json_name] = {k: _scalar(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.json_name] = [_value(field, v, at) for v in value]
        else:
            out[field.json_name] = _value(field, value, at)
    pointers = POINTERS.get(name, frozenset())
    return {k: v for k, v in out.items() if k in pointers or not _zero(v)}


def decode_body(body: bytes) -> dict[str, Any]:
    """A request body in the Kubernetes protobuf encoding as the JSON object it stands for."""
    try:
        return _decode(body)
    except UnicodeDecodeError as exc:  # proto2 strings are checked when read, not when parsed
        raise ProtobufError(f"a string field is not UTF-8: {exc}") from exc


def _decode(body: bytes) -> dict[str, Any]:
    if not body.startswith(MAGIC):
        raise ProtobufError('the body does not start with the Kubernetes protobuf magic "k8s\\0"')
    unknown = _parse(pb.Unknown, body[len(MAGIC):], "Unknown")
    _refuse_unknown(unknown, "Unknown")
    kind = unknown.type_meta.kind
    if unknown.content_encoding:
        raise ProtobufError(f"content encoding {unknown.content_encoding!r} is not "
                            "supported")
    if kind not in MESSAGES:
        raise ProtobufError(f"the emulator decodes protobuf bodies of {', '.join(KINDS)} only, "
                            f"not {kind or 'an object without a kind'}")
    obj = to_json(_parse(MESSAGES[kind], unknown.raw, kind))
    head = {"apiVersion": unknown.type_meta.api_version or "v1", "kind": kind}
    return head | obj
