"""AdmissionReview (admission.k8s.io/v1) as the API server sends and expects it.

Only the fields Muster reads are typed; everything else is kept (extra="allow") so that a newer
API server adding fields never turns into a 400.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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


def response(
    review: AdmissionReview,
    *,
    allowed: bool,
    patch: list[dict[str, Any]] | None = None,
    warnings: Sequence[str] = (),
    audit: dict[str, str] | None = None,
    status_code: int | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    """The AdmissionReview response body: apiVersion/kind/uid echoed; patch only when non-empty."""
    resp: dict[str, Any] = {"uid": review.request.uid, "allowed": allowed}
    if patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(
            json.dumps(patch, separators=(",", ":")).encode()
        ).decode()
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
