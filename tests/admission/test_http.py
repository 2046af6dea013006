"""`muster serve` over real HTTPS without a cluster: HTTP errors, safety rules, probes, metrics."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from admission_helpers import (
    ALIAS_BOMB,
    POLICIES,
    Tls,
    client,
    decode_patch,
    load_fixture,
    metric,
    review,
    running,
)

from webhook import jsonpatch
from webhook.keys import (
    ANN_GANG_MIN_MEMBER,
    ANN_GANG_NAME,
    ANN_GANG_PLACEMENT,
    ANN_GPU_ALLOCATED,
    ANN_GPU_ASSIGNMENT,
    ANN_JOINED_GANG,
    ANN_POLICY,
    ISTIO_INJECT,
    PROTECTED_ANNOTATIONS,
    VOLCANO_GROUP_ANNOTATION,
)


def _plain_pod_review(uid: str = "0b1c", namespace: str = "team-a") -> dict[str, Any]:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "web", "namespace": namespace, "labels": {"app": "web"}},
           "spec": {"containers": [{"name": "nginx", "image": "nginx"}]}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "name": "web", "namespace": namespace, "operation": "CREATE",
                        "object": pod, "dryRun": False}}


async def _metrics_text(srv: Any) -> str:
    """The metrics page, from the plain-HTTP metrics port."""
    async with aiohttp.ClientSession() as plain, plain.get(srv.metrics_url) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return await r.text()


async def test_http_errors_are_json_and_never_5xx(tls: Tls, policy_dir: Path) -> None:
    async with running(tls, [policy_dir], max_body_bytes=4096, metrics_port=0) as srv, \
            client(tls) as s:
        url = f"{srv.url}/mutate/pods"
        async with s.post(url, data=b"{", headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400
            body = await r.json()
            assert "AdmissionReview" in body["error"]
            assert any("invalid JSON" in d for d in body["details"])
        async with s.post(url, data=b"{}", headers={"Content-Type": "text/plain"}) as r:
            assert r.status == 415
            assert "application/json" in (await r.json())["error"]
        big = json.dumps({"x": "a" * 10_000}).encode()
        async with s.post(url, data=big, headers={"Content-Type": "application/json"}) as r:
            assert r.status == 413
            assert (await r.json())["code"] == 413
        async with s.post(url, json={"apiVersion": "admission.k8s.io/v1",
                                     "kind": "AdmissionReview", "request": {"uid": "u"}}) as r:
            assert r.status == 400
            details = (await r.json())["details"]
            assert any(d.startswith("request.kind") for d in details), details
        async with s.get(f"{srv.url}/nope") as r:
            assert r.status == 404
            assert (await r.json())["code"] == 404
        async with s.get(url) as r:
            assert r.status == 405
        text = await _metrics_text(srv)
        assert 'muster_admission_requests_total{endpoint="mutate",outcome="bad_request"} 2.0' \
            in text
        assert 'outcome="unsupported_media"' in text and 'outcome="too_large"' in text


async def test_hostile_bodies_are_400_with_one_log_line_and_a_counted_reason(
        tls: Tls, policy_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    head = (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u",'
            b'"kind":{},"resource":{},"operation":"CREATE","object":')
    bodies = {"too_deep": head + b'{"a":' * 20_000 + b"1" + b"}" * 20_001 + b"}",
              "not_utf8": head + b'{"metadata":{"name":"\xff"}}}}',
              "unsupported_version": json.dumps(
                  {**_plain_pod_review(), "apiVersion": "admission.k8s.io/v1beta1"}).encode()}
    async with running(tls, [policy_dir]) as srv, client(tls) as s:
        with caplog.at_level(logging.WARNING):
            for reason, body in bodies.items():
                for path in ("/mutate/pods", "/validate/policies"):
                    async with s.post(f"{srv.url}{path}", data=body,
                                      headers={"Content-Type": "application/json"}) as r:
                        assert r.status == 400, reason
                        details = (await r.json())["details"]
                    assert len(details) == 1, details
                assert metric(srv, "muster_admission_bad_requests_total", reason=reason) == 2
    assert "admissionReviewVersions: [v1]" in details[0]
    # (an earlier test's logging set-up may let INFO records through: only warnings count)
    records = [r for r in caplog.records
               if r.levelno >= logging.WARNING and r.name != "webhook.admission.server"]
    assert [r.getMessage() for r in records] == ["malformed admission request refused"] * 6
    assert [r.reason for r in records] == [  # type: ignore[attr-defined]
        reason for reason in bodies for _ in range(2)]
    assert all(r.exc_info is None for r in records)

async def test_non_matching_pod_gets_no_patch(tls: Tls, policy_dir: Path) -> None:
    async with running(tls, [policy_dir]) as srv, client(tls) as s:
        resp = await review(s, f"{srv.url}/mutate/pods", _plain_pod_review())
    assert resp == {"uid": "0b1c", "allowed": True}


async def test_launcher_without_cluster(tls: Tls, policy_dir: Path, shared_dir: Path) -> None:
    body = load_fixture(shared_dir, "pod-create-launcher-generatename.json")
    async with running(tls, [policy_dir]) as srv, client(tls) as s:
        resp = await review(s, f"{srv.url}/mutate/pods", body)
    assert resp["allowed"] is True
    pod = jsonpatch.apply_patch(body["request"]["object"], decode_patch(resp))
    assert pod["metadata"]["labels"][ISTIO_INJECT] == "false"
    assert pod["metadata"]["annotations"][ISTIO_INJECT] == "false"
    assert pod["metadata"]["annotations"][ANN_POLICY] == "mpi-volcano"
    assert resp["auditAnnotations"] == {"policy": "mpi-volcano"}
    # no cluster: owners cannot be read, so no gang, and the answer says why
    assert VOLCANO_GROUP_ANNOTATION not in pod["metadata"]["annotations"]
    assert any("MPIJob" in w for w in resp["warnings"]), resp["warnings"]


async def test_the_audit_log_says_which_policy_overrode_which(tls: Tls, policy_dir: Path,
                                                                shared_dir: Path) -> None:
    (policy_dir / "ambient.yaml").write_text(
        "apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: ambient}\n"
        "spec: {priority: 5, istio: {optOut: ambient}}\n")
    body = load_fixture(shared_dir, "pod-create-launcher-generatename.json")
    async with running(tls, [policy_dir]) as srv, client(tls) as s:
        resp = await review(s, f"{srv.url}/mutate/pods", body)
    assert resp["auditAnnotations"] == {
        "policy": "ambient,mpi-volcano",
        "overridden": "mpi-volcano: istio.optOut overridden by ambient (higher precedence)"}


async def test_every_protected_key_is_stripped_or_denied(tls: Tls, policy_dir: Path) -> None:
    """Every muster.io/ annotation only the binder or the agent writes (and any muster.io/ key
    the webhook does not write itself) goes from a CREATE; the keys the webhook writes, which
    affect only the creator's own pods, stay for the policy engine to judge."""
    body = _plain_pod_review()
    forged = {ANN_GPU_ASSIGNMENT: '{"v":1,"node":"n1","containers":{}}',
              ANN_GANG_PLACEMENT: '{"v":1,"members":{}}', ANN_GPU_ALLOCATED: "n1",
              "muster.io/made-up": "x"}
    kept = {"keep": "me", "example.com/muster.io": "y", ANN_GANG_NAME: "mine",
            ANN_GANG_MIN_MEMBER: "1", ANN_JOINED_GANG: "muster/mine"}
    assert set(forged) >= set(PROTECTED_ANNOTATIONS)
    body["request"]["object"]["metadata"]["annotations"] = {**forged, **kept}
    async with running(tls, [policy_dir]) as srv, client(tls) as s:
        resp = await review(s, f"{srv.url}/mutate/pods", body)
    assert resp["allowed"] is True
    pod = jsonpatch.apply_patch(body["request"]["object"], decode_patch(resp))
    assert pod["metadata"]["annotations"] == kept
    for key in forged:
        assert any(key in w for w in resp["warnings"]), key

    async with running(tls, [policy_dir], on_user_assignment="deny") as srv, client(tls) as s:
        resp = await review(s, f"{srv.url}/mutate/pods", body)
    assert resp["allowed"] is False
    assert resp["status"]["code"] == 403
    for key in forged:
        assert key in resp["status"]["message"], key
    assert "patch" not in resp


async def test_system_and_own_namespaces_are_never_mutated(
        tls: Tls, policy_dir: Path, shared_dir: Path) -> None:
    (policy_dir / "all.yaml").write_text(
        "apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: everyone}\n"
        "spec:\n  istio: {optOut: true}\n")
    async with running(tls, [policy_dir], namespace="muster",
                       exclude_namespaces=["infra"]) as srv, client(tls) as s:
        for ns in ("kube-system", "kube-public", "kube-node-lease", "muster", "infra"):
            body = _plain_pod_review(namespace=ns)
            body["request"]["object"]["metadata"]["annotations"] = {ANN_GPU_ASSIGNMENT: "{}"}
            assert await review(s, f"{srv.url}/mutate/pods", body) == {
                "uid": "0b1c", "allowed": True}, ns
        resp = await review(s, f"{srv.url}/mutate/pods", _plain_pod_review(namespace="team-b"))
        assert "patch" in resp  # the same pod elsewhere is mutated


async def test_non_create_and_non_pod_requests_pass(tls: Tls, policy_dir: Path,
                                                    shared_dir: Path) -> None:
    worker = load_fixture(shared_dir, "pod-create-worker.json")
    update = copy.deepcopy(worker)
    update["request"]["operation"] = "UPDATE"
    update["request"]["oldObject"] = worker["request"]["object"]
    cm = load_fixture(shared_dir, "configmap-create-policies.json")
    async with running(tls, [policy_dir]) as srv, client(tls) as s:
        for body in (update, cm):
            resp = await review(s, f"{srv.url}/mutate/pods", body)
            assert resp == {"uid": body["request"]["uid"], "allowed": True}


async def test_validate_policies_fixtures_are_denied_with_loader_message(
        tls: Tls, policy_dir: Path, shared_dir: Path) -> None:
    async with running(tls, [policy_dir]) as srv, client(tls) as s:
        for name in ("configmap-create-policies.json", "configmap-update-policies.json"):
            resp = await review(s, f"{srv.url}/validate/policies", load_fixture(shared_dir, name))
            assert resp["allowed"] is False
            assert resp["status"]["code"] == 422
            message = resp["status"]["message"]
            assert "policy.yaml:1:" in message, message  # file:line:col from the loader
        good = load_fixture(shared_dir, "configmap-update-policies.json")
        good["request"]["object"]["data"] = {"mpi.yaml": (policy_dir / "mpi.yaml").read_text()}
        resp = await review(s, f"{srv.url}/validate/policies", good)
        assert resp == {"uid": good["request"]["uid"], "allowed": True}


async def test_validate_policies_refuses_an_alias_bomb_at_once(
        tls: Tls, policy_dir: Path, shared_dir: Path) -> None:
    body = load_fixture(shared_dir, "configmap-update-policies.json")
    body["request"]["object"]["data"] = {"bomb.yaml": ALIAS_BOMB}
    async with running(tls, [policy_dir]) as srv, client(tls) as s:
        started = time.perf_counter()
        resp = await review(s, f"{srv.url}/validate/policies", body)
        elapsed = time.perf_counter() - started
    assert resp["allowed"] is False and resp["status"]["code"] == 422
    assert resp["status"]["message"] == (
        "invalid Muster policies:\nbomb.yaml:7:14: alias *a0: aliases are not accepted (write "
        "the value out) (document 1)")
    assert elapsed < 1.0, elapsed

async def test_probes_and_metrics(tls: Tls, tmp_path: Path, shared_dir: Path) -> None:
    broken = tmp_path / "p"
    broken.mkdir()
    (broken / "p.yaml").write_text("kind: SchedulingPolicy\n")
    body = load_fixture(shared_dir, "pod-create-worker.json")
    async with running(tls, [broken], metrics_port=0) as srv, client(tls) as s:
        async with s.get(f"{srv.url}/healthz") as r:
            assert r.status == 200
        async with s.get(f"{srv.url}/readyz") as r:
            assert r.status == 503
            assert "policies not loaded" in await r.text()
        resp = await review(s, f"{srv.url}/mutate/pods", body)
        assert resp["allowed"] is True and "patch" not in resp
        assert any("no valid policies" in w for w in resp["warnings"])
        (broken / "p.yaml").write_text(POLICIES)

        async def ready() -> bool:
            async with s.get(f"{srv.url}/readyz") as r:
                return r.status == 200
        for _ in range(200):
            if await ready():
                break
            await asyncio.sleep(0.02)
        assert await ready()
        resp = await review(s, f"{srv.url}/mutate/pods", body)
        assert "patch" in resp
        text = await _metrics_text(srv)
    for needle in ('muster_admission_fail_open_total{reason="not_ready"} 1.0',
                   'muster_policy_reloads_total{result="error"} 1.0',
                   'muster_policy_reloads_total{result="success"} 1.0',
                   'muster_policy_decisions_total{policy="mpi-volcano"} 1.0',
                   "muster_certificate_expiry_timestamp_seconds ",
                   'muster_admission_request_duration_seconds_bucket{endpoint="mutate"'):
        assert needle in text, needle


async def test_metrics_are_never_on_the_admission_port(tls: Tls, policy_dir: Path) -> None:
    """Whatever reaches the webhook (the API server's callers' network) reads no metrics: they
    have their own plain-HTTP port, which may listen on the pod's loopback only."""
    async with running(tls, [policy_dir], metrics_port=0, metrics_host="127.0.0.1") as srv, \
            client(tls) as s:
        assert srv.metrics_port not in (None, srv.port)
        async with s.get(f"{srv.url}/metrics") as r:
            assert r.status == 404
        text = await _metrics_text(srv)
        assert "muster_policies_loaded 1.0" in text
        async with aiohttp.ClientSession() as plain, \
                plain.get(f"http://127.0.0.1:{srv.metrics_port}/healthz") as r:
            assert r.status == 200
    async with running(tls, [policy_dir]) as srv:  # no --metrics-port: no metrics server
        assert srv.metrics_port is None
        with pytest.raises(RuntimeError, match="no metrics"):
            _ = srv.metrics_url
