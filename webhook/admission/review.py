"""AdmissionReview (admission.k8s.io/v1) as the API server sends and expects it.

Only the fields Muster reads are typed; everything else is kept (extra="allow") so that a newer
API server adding fields never turns into a 400.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, GetPydanticSchema, ValidationError
from typing_extensions import TypedDict

from webhook import jsonpatch

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")


class GroupVersionKind(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    group: str = ""
    version: str = ""
    kind: str = ""


class GroupVersionResource(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    group: str = ""
    version: str = ""
    resource: str = ""


class AdmissionRequest(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    uid: str = Field(min_length=1)
    kind: GroupVersionKind
    resource: GroupVersionResource
    sub_resource: str | None = Field(default=None, alias="subResource")
    name: str | None = None
    namespace: str | None = None
    operation: str
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = Field(default=None, alias="oldObject")
    dry_run: bool | None = Field(default=None, alias="dryRun")


class AdmissionReview(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    api_version: Literal["admission.k8s.io/v1", "admission.k8s.io/v1beta1"] = Field(
        alias="apiVersion"
    )
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class BadReview(ValueError):
    """The body is not an AdmissionReview; `errors` are short human-readable reasons."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = list(errors)


# --- the pod as /mutate/pods reads it -------------------------------------------------------
# Only the pod fields that admission and the policy engine read are built as Python objects
# (metadata.managedFields and most of the spec are skipped by the parser): about a third less
# work than a full parse. Each field keeps its JSON value as is; a field of an unexpected type
# falls back to that raw value (left_to_right), so the projection accepts exactly what the full
# model accepts. tests/admission/test_review.py checks both (same answers on the fixtures and on
# fuzzed pods, same acceptance).


class _Container(TypedDict, total=False):
    resources: Any


def _raw_fallback(typed: Any) -> Any:
    return Annotated[typed | Any, Field(union_mode="left_to_right")]


class _PodSpec(TypedDict, total=False):
    containers: _raw_fallback(list[_Container])  # type: ignore[valid-type]
    initContainers: _raw_fallback(list[_Container])  # type: ignore[valid-type]
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
    metadata: _raw_fallback(_PodMeta)  # type: ignore[valid-type]
    spec: _raw_fallback(_PodSpec)  # type: ignore[valid-type]


#: statically a dict, validated as the projection above (a plain dict of the fields present)
_PodObject = Annotated[dict[str, Any] | None, GetPydanticSchema(
    lambda _type, handler: handler.generate_schema(_Pod | None))]


class _PodAdmissionRequest(AdmissionRequest):
    model_config = ConfigDict(extra="ignore")
    object: _PodObject = None


class PodAdmissionReview(AdmissionReview):
    """An AdmissionReview whose `request.object` holds only the pod fields Muster reads."""

    model_config = ConfigDict(extra="ignore")
    request: _PodAdmissionRequest


def _loc(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(body)"


def parse_review(body: bytes) -> AdmissionReview:
    """Parse and validate a request body; raises BadReview with reasons naming the field."""
    try:
        return AdmissionReview.model_validate_json(body)
    except ValidationError as exc:
        errors = []
        for err in exc.errors(include_url=False, include_input=False)[:10]:
            if err["type"] == "json_invalid":
                errors.append(f"invalid JSON: {err['msg']}")
            else:
                errors.append(f"{_loc(err['loc'])}: {err['msg']}")
        raise BadReview(errors) from None


def parse_pod_review(body: bytes) -> AdmissionReview:
    """`parse_review` for /mutate/pods: the pod projected to the fields Muster reads. A body the
    projection refuses goes through `parse_review`, so errors are reported the same way."""
    try:
        return PodAdmissionReview.model_validate_json(body)
    except ValidationError:
        return parse_review(body)




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
