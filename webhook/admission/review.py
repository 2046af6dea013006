"""AdmissionReview (admission.k8s.io/v1) as the API server sends and expects it.

Only v1 is served, as the webhook configurations declare (`admissionReviewVersions: [v1]`): a
v1beta1 review is refused (HTTP 400) rather than answered in a version nobody asked for.

Decoded with msgspec into typed structs: only the fields Muster reads are declared, the others
are skipped without being built (a newer API server adding fields never turns into a 400). This
parse is the largest single cost of a request, which is why it is not pydantic here: on the
captured worker request msgspec takes about a third of the time (see README, dependencies).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
from typing_extensions import TypedDict

from webhook import jsonpatch


class GroupVersionKind(msgspec.Struct, frozen=True):
    group: str = ""
    version: str = ""
    kind: str = ""


class GroupVersionResource(msgspec.Struct, frozen=True):
    group: str = ""
    version: str = ""
    resource: str = ""


class AdmissionRequest(msgspec.Struct, rename="camel"):
    uid: Annotated[str, msgspec.Meta(min_length=1)]
    kind: GroupVersionKind
    resource: GroupVersionResource
    operation: str
    sub_resource: str | None = None
    name: str | None = None
    namespace: str | None = None
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = None
    dry_run: bool | None = None


class AdmissionReview(msgspec.Struct, rename="camel"):
    api_version: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


#: why a body is not an AdmissionReview (the `reason` of muster_admission_bad_requests_total)
BadReason = Literal["invalid_json", "not_utf8", "too_deep", "invalid_review",
                    "unsupported_version"]


class BadReview(ValueError):
    """The body is not an AdmissionReview; `errors` are short human-readable reasons."""

    def __init__(self, errors: Sequence[str], reason: BadReason = "invalid_review") -> None:
        super().__init__("; ".join(errors))
        self.errors = list(errors)
        self.reason: BadReason = reason


# --- the pod as /mutate/pods reads it -------------------------------------------------------
# Only the pod fields that admission and the policy engine read are built as Python objects
# (metadata.managedFields and most of the spec are skipped). Each field keeps its JSON value as
# is; where an object is projected, any other JSON value there is kept whole, so the projection
# accepts exactly what the full request type accepts. tests/admission/test_projection.py checks
# both (same answers on the fixtures and on fuzzed pods, same acceptance).

_NotObject = list[Any] | str | int | float | bool | None
_AnyContainers = list["_Container | _NotObject"] | dict[str, Any] | str | int | float | bool | None


class _Container(TypedDict, total=False):
    resources: Any
    restartPolicy: Any  # Always: a sidecar (webhook.podresources)


class _PodSpec(TypedDict, total=False):
    containers: _AnyContainers
    initContainers: _AnyContainers
    resources: Any  # pod-level resources
    overhead: Any
    schedulerName: Any
    priorityClassName: Any
    tolerations: Any
    affinity: Any


class _PodMeta(TypedDict, total=False):
    name: Any
    namespace: Any
    labels: Any
    annotations: Any
    ownerReferences: Any


class _Pod(TypedDict, total=False):
    metadata: _PodMeta | _NotObject
    spec: _PodSpec | _NotObject


if TYPE_CHECKING:  # a plain dict to its readers; decoded as the projection above
    _PodObject = dict[str, Any]
else:
    _PodObject = _Pod


class _PodAdmissionRequest(AdmissionRequest, rename="camel"):
    object: _PodObject | None = None


class PodAdmissionReview(AdmissionReview, rename="camel"):
    """An AdmissionReview whose `request.object` holds only the pod fields Muster reads."""

    request: _PodAdmissionRequest


_decode_review = msgspec.json.Decoder(AdmissionReview).decode
_decode_pod_review = msgspec.json.Decoder(PodAdmissionReview).decode
_MISSING_FIELD = re.compile(r"^Object missing required field `(.*)`$")
_BAD_ENUM = re.compile(r"^Invalid enum value (.*)$")


def _bad(exc: Exception) -> BadReview:
    """The decoder's error as "field.path: what is wrong" (the path as the API names it)."""
    if isinstance(exc, UnicodeDecodeError):  # in a string: the JSON is not UTF-8
        return BadReview([f"a string is not UTF-8 (byte 0x{exc.object[exc.start]:02x})"],
                         "not_utf8")
    if isinstance(exc, RecursionError):
        return BadReview(["JSON nested too deep"], "too_deep")
    if not isinstance(exc, msgspec.ValidationError):  # (a subclass of DecodeError)
        return BadReview([f"invalid JSON: {exc}"], "invalid_json")
    # e.g. "Expected `str`, got `int` - at `$.request.uid`"
    message, _, at = str(exc).partition(" - at `$")
    path = at.removesuffix("`").removeprefix(".")
    if missing := _MISSING_FIELD.match(message):
        path = f"{path}.{missing[1]}" if path else missing[1]
        message = "field required"
    elif path == "apiVersion" and (got := _BAD_ENUM.match(message)):
        return BadReview([f"apiVersion: only admission.k8s.io/v1 is served (the webhook "
                          f"configuration's admissionReviewVersions: [v1]), got {got[1]}"],
                         "unsupported_version")
    return BadReview([f"{path or '(body)'}: {message}"])


def parse_review(body: bytes) -> AdmissionReview:
    """Parse and validate a request body; raises BadReview with a reason naming the field."""
    try:
        return _decode_review(body)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError) as exc:
        raise _bad(exc) from None


def parse_pod_review(body: bytes) -> AdmissionReview:
    """`parse_review` for /mutate/pods: the pod projected to the fields Muster reads."""
    try:
        return _decode_pod_review(body)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError) as exc:
        raise _bad(exc) from None


def response(
    review: AdmissionReview,
    *,
    allowed: bool,
    patch: list[dict[str, Any]] | None = None,
    patch_json: bytes | None = None,
    warnings: Sequence[str] = (),
    audit: dict[str, str] | None = None,
    status_code: int | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    """The AdmissionReview response body: apiVersion/kind/uid echoed; patch only when non-empty.
    `patch_json`, when given, is `patch` already encoded as JSON."""
    resp: dict[str, Any] = {"uid": review.request.uid, "allowed": allowed}
    if patch:
        resp["patchType"] = "JSONPatch"
        encoded = patch_json if patch_json is not None else jsonpatch.encode(patch)
        resp["patch"] = base64.b64encode(encoded).decode()
    if warnings:
        resp["warnings"] = [_short(w) for w in warnings]
    if audit:
        resp["auditAnnotations"] = dict(audit)
    if not allowed or message:
        status: dict[str, Any] = {"message": message or "denied"}
        if not allowed:
            status["code"] = status_code or 403
            status["status"] = "Failure"
        resp["status"] = status
    return {"apiVersion": review.api_version, "kind": "AdmissionReview", "response": resp}


_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def _short(warning: str) -> str:
    # The API server turns warnings into HTTP Warning headers: keep them printable and short.
    text = _CONTROL.sub(" ", warning).strip()
    return text if len(text) <= 256 else text[:253] + "..."
