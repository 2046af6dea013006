"""/mutate/pods parses only the pod fields Muster reads: it must accept exactly what the full
AdmissionReview type accepts, and every answer must be the one the whole pod would get."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from admission_helpers import json_paths
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.admission.admit import _strip_protected_annotations
from webhook.admission.review import BadReview, parse_pod_review, parse_review
from webhook.demo import EXAMPLE_POLICIES
from webhook.podresources import pod_gpus, pod_requests
from webhook.policy import PolicySet, evaluate, load_policies, render_patch

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO.parent / "shared" / "fixtures" / "admission"
PODS = [(FIXTURES / name).read_bytes() for name in (
    "pod-create-worker.json", "pod-create-worker-dryrun.json",
    "pod-create-launcher-generatename.json")]
OBJECTS = EXAMPLE_POLICIES / "tests/objects"
OWNERS = [yaml.safe_load((OBJECTS / name).read_text()) for name in (
    "mpijob-team-a.yaml", "mpijob-team-b.yaml", "launcher-job.yaml", "batch-job.yaml")]

json_values = st.recursive(
    # finite floats: json.dumps writes "Infinity", which is not JSON (and refused as such)
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["labels", "annotations", "containers", "resources", "limits",
                         "nvidia.com/gpu", "spec", "metadata", "name", "x"]) | st.text(max_size=4),
        inner, max_size=3),
    max_leaves=10)


def _mutated(data: st.DataObject, raw: bytes) -> Any:
    doc = json.loads(raw)
    paths = json_paths(doc)
    for _ in range(data.draw(st.integers(0, 4))):
        path = data.draw(st.sampled_from(paths))
        value = data.draw(json_values)
        if not path:
            return value
        target = doc
        try:
            for key in path[:-1]:
                target = target[key]
            if data.draw(st.booleans()) and isinstance(target, dict):
                target.pop(path[-1], None)
            else:
                target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change altered the shape under this path
    return doc


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    return load_policies([EXAMPLE_POLICIES])


def _answer(pod: dict[str, Any], policies: PolicySet, owners: list[dict[str, Any]],
            ns_labels: dict[str, str]) -> tuple[Any, ...]:
    clean, _, strip = _strip_protected_annotations(pod)
    decision = evaluate(clean, namespace_labels=ns_labels, owners=owners, policies=policies)
    return decision, strip + render_patch(clean, decision)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, len(PODS) - 1), data=st.data())
def test_projection_accepts_what_the_full_model_accepts(which: int, data: st.DataObject) -> None:
    body = json.dumps(_mutated(data, PODS[which])).encode()
    try:
        full = parse_review(body)
    except BadReview as exc:
        full, full_errors = None, exc.errors
    try:
        fast = parse_pod_review(body)
    except BadReview as exc:
        fast, fast_errors = None, exc.errors
    assert (full is None) == (fast is None)
    if full is None:
        assert fast_errors == full_errors  # the same 400 message
        return
    assert fast is not None
    for name in ("api_version", "kind"):
        assert getattr(fast, name) == getattr(full, name)
    for name in ("uid", "kind", "resource", "sub_resource", "name", "namespace", "operation",
                 "old_object", "dry_run"):
        assert getattr(fast.request, name) == getattr(full.request, name)
    assert (fast.request.object is None) == (full.request.object is None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, len(PODS) - 1), owner=st.integers(-1, len(OWNERS) - 1),
       topology=st.booleans(), data=st.data())
def test_projected_pod_gets_the_same_answer(policies: PolicySet, which: int, owner: int,
                                            topology: bool, data: st.DataObject) -> None:
    review = json.loads(PODS[which])
    review["request"]["object"] = _mutated(data, json.dumps(review["request"]["object"]).encode())
    if not isinstance(review["request"]["object"], dict):
        return
    body = json.dumps(review).encode()
    full = parse_review(body).request.object
    fast = parse_pod_review(body).request.object
    assert full is not None and fast is not None
    owners = [OWNERS[owner]] if owner >= 0 else []
    ns_labels = {"muster.io/gpu-topology": "enabled"} if topology else {}
    assert _answer(fast, policies, owners, ns_labels) == _answer(full, policies, owners, ns_labels)


@pytest.mark.parametrize("index", range(len(PODS)))
def test_fixtures_projected(policies: PolicySet, index: int) -> None:
    full = parse_review(PODS[index]).request.object
    fast = parse_pod_review(PODS[index]).request.object
    assert full is not None and fast is not None
    assert "managedFields" not in fast["metadata"]  # the point: less is built
    for owners in ([], [OWNERS[0]]):
        decision, patch = _answer(fast, policies, owners, {})
        assert (decision, patch) == _answer(full, policies, owners, {})


def test_the_projection_keeps_what_a_pods_requests_are_counted_from() -> None:
    """Sidecars (an init container's restartPolicy), pod-level resources and the overhead."""
    review = json.loads(PODS[0])
    spec = review["request"]["object"]["spec"]
    spec["initContainers"] = [{"name": "proxy", "image": "envoy", "restartPolicy": "Always",
                               "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    spec["resources"] = {"requests": {"cpu": "64", "memory": "1Ti"}}
    spec["overhead"] = {"cpu": "1", "nvidia.com/gpu": "1"}
    body = json.dumps(review).encode()
    full = parse_review(body).request.object
    fast = parse_pod_review(body).request.object
    assert full is not None and fast is not None
    assert pod_requests(fast["spec"]) == pod_requests(full["spec"])
    assert pod_gpus(fast["spec"]) == pod_gpus(full["spec"]) == 3
