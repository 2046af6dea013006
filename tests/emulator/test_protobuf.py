"""The emulator's decoder of Kubernetes protobuf bodies, against messages encoded by the official
protobuf runtime from descriptors written here with the field numbers of k8s.io/api and
k8s.io/apimachinery's generated.proto (an encoder independent of the decoder's tables)."""

from __future__ import annotations

import base64
import contextlib
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.doubles.emulator.protobuf import MAGIC, ProtobufError, decode_body

F = descriptor_pb2.FieldDescriptorProto
STRING, BYTES, BOOL, INT64, INT32, MSG = (F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_BOOL, F.TYPE_INT64,
                                          F.TYPE_INT32, F.TYPE_MESSAGE)
OPTIONAL, REPEATED = F.LABEL_OPTIONAL, F.LABEL_REPEATED

# message -> [(name, number, type, label, message type)]; maps are repeated entry messages
SCHEMA: dict[str, list[tuple[str, int, int, int, str]]] = {
    "TypeMeta": [("apiVersion", 1, STRING, OPTIONAL, ""), ("kind", 2, STRING, OPTIONAL, "")],
    "Unknown": [("typeMeta", 1, MSG, OPTIONAL, "TypeMeta"), ("raw", 2, BYTES, OPTIONAL, ""),
                ("contentEncoding", 3, STRING, OPTIONAL, ""),
                ("contentType", 4, STRING, OPTIONAL, "")],
    "Time": [("seconds", 1, INT64, OPTIONAL, ""), ("nanos", 2, INT32, OPTIONAL, "")],
    "StringEntry": [("key", 1, STRING, OPTIONAL, ""), ("value", 2, STRING, OPTIONAL, "")],
    "BytesEntry": [("key", 1, STRING, OPTIONAL, ""), ("value", 2, BYTES, OPTIONAL, "")],
    "OwnerReference": [("kind", 1, STRING, OPTIONAL, ""), ("name", 3, STRING, OPTIONAL, ""),
                       ("uid", 4, STRING, OPTIONAL, ""), ("apiVersion", 5, STRING, OPTIONAL, ""),
                       ("controller", 6, BOOL, OPTIONAL, "")],
    "ObjectMeta": [("name", 1, STRING, OPTIONAL, ""), ("namespace", 3, STRING, OPTIONAL, ""),
                   ("resourceVersion", 6, STRING, OPTIONAL, ""),
                   ("creationTimestamp", 8, MSG, OPTIONAL, "Time"),
                   ("labels", 11, MSG, REPEATED, "StringEntry"),
                   ("annotations", 12, MSG, REPEATED, "StringEntry"),
                   ("ownerReferences", 13, MSG, REPEATED, "OwnerReference"),
                   ("finalizers", 14, STRING, REPEATED, ""),
                   ("managedFields", 17, BYTES, REPEATED, "")],
    "Secret": [("metadata", 1, MSG, OPTIONAL, "ObjectMeta"),
               ("data", 2, MSG, REPEATED, "BytesEntry"), ("type", 3, STRING, OPTIONAL, ""),
               ("stringData", 4, MSG, REPEATED, "StringEntry"),
               ("immutable", 5, BOOL, OPTIONAL, "")],
    "ConfigMap": [("metadata", 1, MSG, OPTIONAL, "ObjectMeta"),
                  ("data", 2, MSG, REPEATED, "StringEntry")],
    "DeleteOptions": [("gracePeriodSeconds", 1, INT64, OPTIONAL, ""),
                      ("propagationPolicy", 4, STRING, OPTIONAL, ""),
                      ("dryRun", 5, STRING, REPEATED, "")],
}


def _classes() -> dict[str, type[Message]]:
    proto = descriptor_pb2.FileDescriptorProto(name="k8s_test.proto", package="k8stest",
                                               syntax="proto2")
    for name, fields in SCHEMA.items():
        msg = proto.message_type.add(name=name)
        for field, number, kind, label, type_name in fields:
            f = msg.field.add(name=field, number=number, type=kind, label=label)
            if type_name:
                f.type_name = f".k8stest.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"k8stest.{name}")) for name in SCHEMA}


M = _classes()


def _body(kind: str, obj: Message, api_version: str = "v1") -> bytes:
    unknown = M["Unknown"](typeMeta=M["TypeMeta"](apiVersion=api_version, kind=kind),
                           raw=obj.SerializeToString(), contentType="")
    return MAGIC + unknown.SerializeToString()


def _meta(**kw: Any) -> Message:
    labels = [M["StringEntry"](key=k, value=v) for k, v in kw.pop("labels", {}).items()]
    return M["ObjectMeta"](labels=labels, **kw)


def test_helm_release_secret() -> None:
    secret = M["Secret"](
        metadata=_meta(name="sh.helm.release.v1.muster.v1", namespace="muster-system",
                       labels={"owner": "helm", "name": "muster", "status": "deployed"}),
        data=[M["BytesEntry"](key="release", value=b"\x1f\x8b binary \x00")],
        type="helm.sh/release.v1")
    assert decode_body(_body("Secret", secret)) == {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "sh.helm.release.v1.muster.v1", "namespace": "muster-system",
                     "labels": {"owner": "helm", "name": "muster", "status": "deployed"}},
        "data": {"release": base64.b64encode(b"\x1f\x8b binary \x00").decode()},
        "type": "helm.sh/release.v1"}


def test_metadata_details_and_pointer_zero_values() -> None:
    owner = M["OwnerReference"](kind="Job", name="j", uid="u-1", apiVersion="batch/v1",
                                controller=False)
    cm = M["ConfigMap"](metadata=_meta(
        name="c", resourceVersion="42", creationTimestamp=M["Time"](seconds=1_700_000_000),
        ownerReferences=[owner], finalizers=["a", "b"]),
        data=[M["StringEntry"](key="k", value=""), M["StringEntry"](key="x", value="y")])
    assert decode_body(_body("ConfigMap", cm)) == {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c", "resourceVersion": "42",
                     "creationTimestamp": "2023-11-14T22:13:20Z",
                     "ownerReferences": [{"kind": "Job", "name": "j", "uid": "u-1",
                                          "apiVersion": "batch/v1", "controller": False}],
                     "finalizers": ["a", "b"]},
        "data": {"k": "", "x": "y"}}  # a pointer field keeps false; a map keeps "" values


def test_delete_options_keep_a_zero_grace_period() -> None:
    opts = M["DeleteOptions"](gracePeriodSeconds=0, propagationPolicy="Foreground",
                              dryRun=["All"])
    assert decode_body(_body("DeleteOptions", opts, "meta.k8s.io/v1")) == {
        "apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
        "propagationPolicy": "Foreground", "dryRun": ["All"]}
    negative = M["DeleteOptions"](gracePeriodSeconds=-1)
    assert decode_body(_body("DeleteOptions", negative))["gracePeriodSeconds"] == -1


@pytest.mark.parametrize(("body", "needle"), [
    (b"{}", "magic"),
    (MAGIC + b"\x0a\x05\x0a\x02v1", "corrupt"),  # truncated TypeMeta
    (None, "field 17 of ObjectMeta is not decoded"),  # managedFields: refused, not dropped
    (_body("ConfigMap", M["ConfigMap"](metadata=M["ObjectMeta"](
        creationTimestamp=M["Time"](seconds=2**62)))), "time out of range"),
    (MAGIC + M["Unknown"](typeMeta=M["TypeMeta"](apiVersion="v1", kind="Pod"))
     .SerializeToString(), "not Pod"),
])
def test_refused_with_a_reason(body: bytes | None, needle: str) -> None:
    if body is None:
        body = _body("Secret", M["Secret"](metadata=M["ObjectMeta"](
            name="s", managedFields=[b"x"])))
    with pytest.raises(ProtobufError, match=needle):
        decode_body(body)


@settings(max_examples=500, deadline=None)
@given(cut=st.integers(0, 400), flips=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)),
                                              max_size=4))
def test_damaged_bodies_decode_or_are_refused(cut: int, flips: list[tuple[int, int]]) -> None:
    """A release Secret truncated and with bytes changed: the answer is an object or a
    ProtobufError (a 415), never another exception (a 500)."""
    secret = M["Secret"](
        metadata=_meta(name="s", namespace="n", labels={"a": "b"},
                       creationTimestamp=M["Time"](seconds=1)),
        data=[M["BytesEntry"](key="release", value=b"xyz")], type="t")
    body = bytearray(_body("Secret", secret))
    for at, value in flips:
        body[len(MAGIC) + at % (len(body) - len(MAGIC))] = value
    with contextlib.suppress(ProtobufError):
        assert isinstance(decode_body(bytes(body[:len(MAGIC) + cut])), dict)
