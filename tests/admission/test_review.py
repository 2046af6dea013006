"""AdmissionReview parsing and response shape, against the real captured requests."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from webhook.admission.deadline import budget, budget_for_query, parse_go_duration
from webhook.admission.review import BadReview, parse_pod_review, parse_review, response


def _fixture(shared_dir: Path, name: str) -> bytes:
    return (shared_dir / "fixtures" / "admission" / name).read_bytes()


@pytest.mark.parametrize("name", [
    "pod-create-worker.json", "pod-create-worker-dryrun.json",
    "pod-create-launcher-generatename.json", "configmap-create-policies.json",
    "configmap-update-policies.json"])
def test_real_requests_parse(shared_dir: Path, name: str) -> None:
    raw = json.loads(_fixture(shared_dir, name))
    review = parse_review(_fixture(shared_dir, name))
    assert review.request.uid == raw["request"]["uid"]
    assert review.request.operation == raw["request"]["operation"]
    assert review.request.name == raw["request"].get("name")
    assert review.request.dry_run == raw["request"]["dryRun"]
    assert review.request.object == raw["request"]["object"]


def test_generate_name_request_has_no_name(shared_dir: Path) -> None:
    review = parse_review(_fixture(shared_dir, "pod-create-launcher-generatename.json"))
    assert review.request.name is None
    assert review.request.namespace == "team-a"


def test_response_echoes_and_encodes_patch(shared_dir: Path) -> None:
    review = parse_review(_fixture(shared_dir, "pod-create-worker.json"))
    patch = [{"op": "add", "path": "/metadata/annotations/muster.io~1policy", "value": "p"}]
    body = response(review, allowed=True, patch=patch, warnings=["w\nx"],
                    audit={"policy": "p"})
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    resp = body["response"]
    assert resp["uid"] == "7655efe0-fc1e-4832-ba1d-d4a6fe5a5027"
    assert resp["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(resp["patch"])) == patch
    assert resp["warnings"] == ["w x"]
    assert resp["auditAnnotations"] == {"policy": "p"}
    assert "status" not in resp


def test_empty_patch_has_no_patch_type(shared_dir: Path) -> None:
    review = parse_review(_fixture(shared_dir, "pod-create-worker.json"))
    resp = response(review, allowed=True, patch=[])["response"]
    assert resp == {"uid": review.request.uid, "allowed": True}


def test_denial_carries_status(shared_dir: Path) -> None:
    review = parse_review(_fixture(shared_dir, "pod-create-worker.json"))
    resp = response(review, allowed=False, status_code=422, message="bad")["response"]
    assert resp["status"] == {"message": "bad", "code": 422, "status": "Failure"}


@pytest.mark.parametrize("parse", [parse_review, parse_pod_review])
def test_v1beta1_is_refused(shared_dir: Path, parse: Callable[[bytes], object]) -> None:
    """The webhook configurations declare admissionReviewVersions [v1] only."""
    raw = json.loads(_fixture(shared_dir, "pod-create-worker.json"))
    raw["apiVersion"] = "admission.k8s.io/v1beta1"
    with pytest.raises(BadReview) as info:
        parse(json.dumps(raw).encode())
    assert info.value.reason == "unsupported_version"
    assert info.value.errors == [
        "apiVersion: only admission.k8s.io/v1 is served (the webhook configuration's "
        "admissionReviewVersions: [v1]), got 'admission.k8s.io/v1beta1'"]


def _nested(depth: int) -> bytes:
    return (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u",'
            b'"kind":{},"resource":{},"operation":"CREATE","object":{"metadata":{"labels":'
            + b'{"a":' * depth + b"1" + b"}" * depth + b"}}}}")


@pytest.mark.parametrize("parse", [parse_review, parse_pod_review])
@pytest.mark.parametrize(("body", "reason", "error"), [
    (_nested(10_000), "too_deep", "JSON nested too deep"),
    (_nested(1).replace(b'"u"', b'"\xff"'), "not_utf8", "a string is not UTF-8 (byte 0xff)"),
    (b"{", "invalid_json", "invalid JSON: Input data was truncated"),
])
def test_hostile_bodies_are_bad_reviews_not_crashes(
        parse: Callable[[bytes], object], body: bytes, reason: str, error: str) -> None:
    with pytest.raises(BadReview) as info:
        parse(body)
    assert (info.value.reason, info.value.errors) == (reason, [error])


@pytest.mark.parametrize(("body", "needle"), [
    (b"{", "invalid JSON"),
    (b"[]", "(body)"),
    (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}', "request"),
    (b'{"apiVersion":"v1","kind":"AdmissionReview","request":{}}', "apiVersion"),
    (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":""}}',
     "request.uid"),
])
def test_bad_bodies_name_the_problem(body: bytes, needle: str) -> None:
    with pytest.raises(BadReview) as info:
        parse_review(body)
    assert any(needle in e for e in info.value.errors), info.value.errors


@pytest.mark.parametrize(("text", "seconds"), [
    ("5s", 5.0), ("1m0s", 60.0), ("500ms", 0.5), ("1.5s", 1.5), ("1h2m3s", 3723.0),
    ("", None), ("5", None), ("abc", None), ("5s junk", None)])
def test_go_durations(text: str, seconds: float | None) -> None:
    assert parse_go_duration(text) == seconds


def test_budget_keeps_a_margin_and_a_floor() -> None:
    assert budget("5s", 0.5) == 4.5
    assert budget(None, 0.5) == 9.5  # the API server's default 10 s
    assert budget("1s", 0.5) == 0.5
    assert budget("100ms", 0.5) == pytest.approx(0.02)  # a fifth of the timeout, never negative
    assert budget("garbage", 0.5) == 9.5
    assert budget("10m", 0.5) == 29.5  # capped at the API's maximum of 30 s


def test_budget_from_query_strings() -> None:
    assert budget_for_query("timeout=5s", 0.5) == 4.5
    assert budget_for_query("dryRun=All&timeout=1s", 0.5) == 0.5
    assert budget_for_query("", 0.5) == 9.5
    assert budget_for_query("timeout=", 0.5) == 9.5
