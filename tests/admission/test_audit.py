"""Policies in audit and warn mode through `muster serve` on the API server emulator: the pods
are admitted unchanged and no PodGroup is made; each pod is counted by policy and action, the
job gets one Event per policy however many pods it has (none for a dry run), a warn policy's
user gets a warning; switching the policy to enforce (a reload) gangs the next pods."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from admission_helpers import (
    JOB,
    POLICIES,
    Tls,
    client,
    decode_patch,
    load_fixture,
    metric,
    mpijob_in,
    owned_by,
    review,
    running,
    volcano_podgroups,
    worker_review,
)

from e2e.probes import eventually
from webhook import keys
from webhook.admission.admit import Once
from webhook.doubles.emulator import ApiServerEmulator
from webhook.policy.audit import EVENT_REASON

AUDITED = POLICIES.replace("spec:\n", "spec:\n  enforcement: audit\n", 1)
WARNED = """\
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata: {name: team-a-labels}
spec:
  enforcement: warn
  match: {namespaces: [team-a]}
  labels: {cost-center: vision}
"""
AUDIT_TOTAL = "muster_policy_audit_total"


def _audit_events(api: ApiServerEmulator) -> list[dict[str, Any]]:
    return [e for e in api.objects("events", "team-a") if e.get("reason") == EVENT_REASON]


async def test_audit_and_warn_change_nothing_count_every_pod_and_tell_each_job_once(
        tls: Tls, tmp_path: Path, apiserver: ApiServerEmulator, kubeconfig: Path,
        shared_dir: Path) -> None:
    policy_dir = tmp_path / "audit"
    policy_dir.mkdir()
    (policy_dir / "mpi.yaml").write_text(AUDITED)
    (policy_dir / "labels.yaml").write_text(WARNED)
    job = await mpijob_in(apiserver, shared_dir)
    worker = owned_by(load_fixture(shared_dir, "pod-create-worker.json"), job)
    dry_run = owned_by(load_fixture(shared_dir, "pod-create-worker-dryrun.json"), job)
    async with running(tls, [policy_dir], kubeconfig=str(kubeconfig)) as srv, \
            client(tls) as s:
        await eventually(srv.admitter.ready)
        url = f"{srv.url}/mutate/pods"
        resp = await review(s, url, dry_run)  # counted, but a dry run records no Event
        assert resp["allowed"] is True and decode_patch(resp) == []
        for i in range(3):
            resp = await review(s, url, worker_review(worker, i))
            assert resp["allowed"] is True
            assert decode_patch(resp) == []  # not even muster.io/policy: nothing applied
            assert resp["warnings"] == [
                "muster: policy team-a-labels (warn) would set label cost-center=vision"]
            assert "auditAnnotations" not in resp
        assert volcano_podgroups(apiserver) == []
        assert {(a, metric(srv, AUDIT_TOTAL, policy="mpi-volcano", action=a))
                for a in ("gang", "istio", "labels")} == {("gang", 4), ("istio", 4),
                                                         ("labels", 0)}
        assert metric(srv, AUDIT_TOTAL, policy="team-a-labels", action="labels") == 4
        assert metric(srv, "muster_policy_decisions_total", policy="mpi-volcano") == 0

        # one Event per policy on the MPIJob for its four pods, none on the pods
        await eventually(lambda: len(_audit_events(apiserver)) == 2)
        await asyncio.sleep(0.3)  # and no more come
        found = {e["message"].split(" ")[1]: e for e in _audit_events(apiserver)}
        assert set(found) == {"mpi-volcano", "team-a-labels"}
        for event in found.values():
            assert event["type"] == "Normal" and event["count"] == 1
            assert (event["involvedObject"]["kind"], event["involvedObject"]["uid"]) == (
                "MPIJob", job["metadata"]["uid"])
        assert found["mpi-volcano"]["message"] == (
            f"policy mpi-volcano (audit) would set PodGroup team-a/{JOB} (volcano, minMember 5, "
            f"queue research); schedulerName volcano; label {keys.ISTIO_INJECT}=false; "
            f"annotation {keys.ISTIO_INJECT}=false (first seen on pod {JOB}-worker-0)")

        # rolled out: the same policy enforced, and the job's next pod joins its gang
        (policy_dir / "mpi.yaml").write_text(POLICIES)
        await eventually(lambda: srv.admitter.policies.current is not None and not any(
            p.spec.enforcement == "audit" for p in srv.admitter.policies.current))
        resp = await review(s, url, worker_review(worker, 4))
        annotations = {op["path"]: op.get("value") for op in decode_patch(resp)}
        assert annotations["/metadata/annotations"][keys.VOLCANO_GROUP_ANNOTATION] == JOB
        assert [g["spec"]["minMember"] for g in volcano_podgroups(apiserver)] == [5]
        assert metric(srv, AUDIT_TOTAL, policy="mpi-volcano", action="gang") == 4


def test_once_is_bounded_and_says_first_once() -> None:
    once = Once(size=2)
    assert once.first(("a",)) and not once.first(("a",))
    assert once.first(("b",)) and once.first(("c",))
    assert once.first(("a",))  # the least recent was forgotten past the bound
