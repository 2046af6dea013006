"""`muster serve` against the API server emulator (kubernetes-asyncio over real HTTP): the real
captured requests, PodGroup before the pod, concurrency, dry-run, scaled jobs, failures."""

from __future__ import annotations

import asyncio
import base64
import copy
import logging
import ssl
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from admission_helpers import (
    JOB,
    POLICIES,
    Tls,
    client,
    configmap_version,
    controller_ref,
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
from aiohttp import web

from e2e.probes import eventually
from webhook import jsonpatch
from webhook.admission.podgroups import resource_for
from webhook.doubles.emulator import ApiServerEmulator
from webhook.keys import (
    ANN_POLICY,
    COSCHEDULING_GROUP_LABEL,
    FAIL_CLOSED_PATH,
    ISTIO_INJECT,
    VOLCANO_GROUP_ANNOTATION,
)
from webhook.policy.podgroup import MANAGED_BY


async def test_real_requests_against_the_cluster(
        tls: Tls, policy_dir: Path, apiserver: ApiServerEmulator, kubeconfig: Path,
        shared_dir: Path) -> None:
    job = await mpijob_in(apiserver, shared_dir)
    launcher_job = await apiserver.create("jobs.batch", {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"{JOB}-launcher", "namespace": "team-a", "ownerReferences": [{
            "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "name": JOB,
            "uid": job["metadata"]["uid"], "controller": True}]},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "c", "image": "i"}]}}}}, namespace="team-a")
    dry = owned_by(load_fixture(shared_dir, "pod-create-worker-dryrun.json"), job)
    worker = owned_by(load_fixture(shared_dir, "pod-create-worker.json"), job)
    launcher = owned_by(load_fixture(shared_dir, "pod-create-launcher-generatename.json"),
                         launcher_job)
    async with running(tls, [policy_dir], kubeconfig=str(kubeconfig)) as srv, \
            client(tls) as s:
        await eventually(srv.admitter.ready)
        url = f"{srv.url}/mutate/pods"

        resp = await review(s, url, dry)
        assert resp["allowed"] is True
        assert volcano_podgroups(apiserver) == []  # dry run: no side effects
        dry_pod = jsonpatch.apply_patch(dry["request"]["object"], decode_patch(resp))
        assert dry_pod["metadata"]["annotations"][VOLCANO_GROUP_ANNOTATION] == JOB

        resp = await review(s, url, worker)
        assert resp["allowed"] is True and "warnings" not in resp, resp.get("warnings")
        groups = volcano_podgroups(apiserver)
        assert len(groups) == 1
        group = groups[0]
        assert group["metadata"]["name"] == JOB
        assert group["spec"]["minMember"] == 5  # 4 workers + the launcher
        assert group["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        pod = jsonpatch.apply_patch(worker["request"]["object"], decode_patch(resp))
        assert pod["metadata"]["annotations"][VOLCANO_GROUP_ANNOTATION] == JOB
        assert pod["metadata"]["annotations"][ANN_POLICY] == "mpi-volcano"
        assert pod["spec"]["schedulerName"] == "volcano"
        assert resp["auditAnnotations"] == {"policy": "mpi-volcano"}

        resp = await review(s, url, launcher)
        assert resp["allowed"] is True and "warnings" not in resp, resp.get("warnings")
        pod = jsonpatch.apply_patch(launcher["request"]["object"], decode_patch(resp))
        assert pod["metadata"]["labels"][ISTIO_INJECT] == "false"
        assert pod["metadata"]["annotations"][ISTIO_INJECT] == "false"
        assert pod["metadata"]["annotations"][VOLCANO_GROUP_ANNOTATION] == JOB
        assert len(volcano_podgroups(apiserver)) == 1  # same gang, same PodGroup
        assert metric(srv, "muster_podgroup_writes_total", result="created") == 1
        assert metric(srv, "muster_podgroup_writes_total", result="dry_run") == 1


async def test_twenty_pods_of_one_job_make_one_podgroup(
        tls: Tls, policy_dir: Path, apiserver: ApiServerEmulator, kubeconfig: Path,
        shared_dir: Path) -> None:
    job = await mpijob_in(apiserver, shared_dir)
    worker = owned_by(load_fixture(shared_dir, "pod-create-worker.json"), job)
    async with running(tls, [policy_dir], kubeconfig=str(kubeconfig)) as srv, \
            client(tls) as s:
        await eventually(srv.admitter.ready)
        answers = await asyncio.gather(*(
            review(s, f"{srv.url}/mutate/pods", worker_review(worker, i)) for i in range(20)))
        for resp in answers:
            assert resp["allowed"] is True and "warnings" not in resp, resp.get("warnings")
            assert decode_patch(resp)
        assert len(volcano_podgroups(apiserver)) == 1
        assert metric(srv, "muster_podgroup_writes_total", result="created") == 1
        assert metric(srv, "muster_podgroup_writes_total", result="error") == 0
        assert srv.context is not None
        assert srv.context.owner_cache.fetches == 1  # one GET of the MPIJob for 20 pods


async def test_existing_podgroup_409_and_scaled_job_update(
        tls: Tls, policy_dir: Path, apiserver: ApiServerEmulator, kubeconfig: Path,
        shared_dir: Path) -> None:
    job = await mpijob_in(apiserver, shared_dir)
    # a PodGroup made before this server started (another replica): 409, then read and compare
    await apiserver.create("podgroups.scheduling.volcano.sh", {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": JOB, "namespace": "team-a", "ownerReferences": [controller_ref(job)],
                     "labels": dict(MANAGED_BY)},
        "spec": {"minMember": 5}}, namespace="team-a")
    worker = owned_by(load_fixture(shared_dir, "pod-create-worker.json"), job)
    async with running(tls, [policy_dir], kubeconfig=str(kubeconfig),
                       owner_cache_ttl=0.05) as srv, client(tls) as s:
        await eventually(srv.admitter.ready)
        resp = await review(s, f"{srv.url}/mutate/pods", worker_review(worker, 0))
        assert "warnings" not in resp, resp.get("warnings")
        assert len(volcano_podgroups(apiserver)) == 1
        writes = {r: metric(srv, "muster_podgroup_writes_total", result=r)
                  for r in ("created", "exists", "updated")}
        assert writes["created"] == 0 and writes["exists"] + writes["updated"] == 1

        # the job is scaled to 6 workers: the next pod updates minMember to 7
        scaled = apiserver.get("mpijobs.kubeflow.org", JOB, namespace="team-a")
        assert scaled is not None
        scaled["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 6
        await srv.context.api.replace(  # type: ignore[union-attr]
            _mpijobs(), JOB, scaled, namespace="team-a")
        await asyncio.sleep(0.1)  # past the owner cache TTL
        resp = await review(s, f"{srv.url}/mutate/pods", worker_review(worker, 5))
        assert "warnings" not in resp, resp.get("warnings")
        groups = volcano_podgroups(apiserver)
        assert [g["spec"]["minMember"] for g in groups] == [7]
        assert metric(srv, "muster_podgroup_writes_total", result="updated") >= 1

        # edited behind Muster's back: the informer sees it, the next pod of the job (the same
        # remembered decision, found current before the edit) restores minMember
        podgroups = srv.context.podgroups  # type: ignore[union-attr]
        await eventually(lambda: [k[1].get("minMember") for k in podgroups.known.values()] == [7])
        await review(s, f"{srv.url}/mutate/pods", worker_review(worker, 6))
        await srv.context.api.patch(  # type: ignore[union-attr]
            resource_for("volcano"), JOB, {"spec": {"minMember": 2}}, namespace="team-a",
            patch_type="merge")
        await eventually(lambda: [k[1].get("minMember") for k in podgroups.known.values()] == [2])
        await review(s, f"{srv.url}/mutate/pods", worker_review(worker, 7))
        assert [g["spec"]["minMember"] for g in volcano_podgroups(apiserver)] == [7]

        # a deleted PodGroup is forgotten (informer) and made again by the next pod
        await apiserver.delete("podgroups.scheduling.volcano.sh", JOB, namespace="team-a")
        await eventually(lambda: not srv.context.podgroups.known)  # type: ignore[union-attr]
        await review(s, f"{srv.url}/mutate/pods", worker_review(worker, 8))
        assert len(volcano_podgroups(apiserver)) == 1


def _mpijobs() -> Any:
    from webhook.kube import MPIJOBS  # noqa: PLC0415

    return MPIJOBS


def _coscheduling(tmp_path: Path) -> list[Path]:
    """The test policies with the coscheduling backend, as the server's policy directories."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "co.yaml").write_text(POLICIES.replace("backend: volcano",
                                                             "backend: coscheduling"))
    return [tmp_path / "p"]


async def test_podgroup_api_error_fails_open(
        tls: Tls, tmp_path: Path, apiserver: ApiServerEmulator, kubeconfig: Path,
        shared_dir: Path, *, caplog: pytest.LogCaptureFixture) -> None:
    """Coscheduling is not installed: the PodGroup create fails, the pod is still admitted,
    and the webhook's log says which pod of which job, and why."""
    caplog.set_level(logging.INFO, logger="webhook.admission")
    await apiserver.delete("customresourcedefinitions", "podgroups.scheduling.x-k8s.io")
    job = await mpijob_in(apiserver, shared_dir)
    worker = owned_by(load_fixture(shared_dir, "pod-create-worker.json"), job)
    async with running(tls, _coscheduling(tmp_path), kubeconfig=str(kubeconfig)) as srv, \
            client(tls) as s:
        await eventually(srv.admitter.ready)
        resp = await review(s, f"{srv.url}/mutate/pods", worker)
    assert resp["allowed"] is True
    pod = jsonpatch.apply_patch(worker["request"]["object"], decode_patch(resp))
    assert pod["metadata"]["labels"][COSCHEDULING_GROUP_LABEL] == JOB  # still joins its gang
    assert any("PodGroup" in w and "could not be written" in w for w in resp["warnings"]), \
        resp["warnings"]
    assert metric(srv, "muster_podgroup_writes_total", result="error") == 1
    assert metric(srv, "muster_admission_fail_open_total", reason="podgroup") == 1
    [said] = [r for r in caplog.records if r.getMessage() == "pod admitted failing open"]
    assert (said.levelno, said.reason, said.namespace, said.owner) == (  # type: ignore[attr-defined]
        logging.WARNING, "podgroup", worker["request"]["namespace"], f"MPIJob/{JOB}")
    assert any("could not be written" in w for w in said.warnings)  # type: ignore[attr-defined]


async def test_a_fail_closed_namespace_refuses_what_others_admit_failing_open(
        tls: Tls, tmp_path: Path, apiserver: ApiServerEmulator, kubeconfig: Path,
        shared_dir: Path, *, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart sends the namespaces labelled fail-closed to /mutate/pods/fail-closed: a pod
    whose PodGroup cannot be written, or whose decision fails, is refused there (503, its
    controller creates it again), where /mutate/pods admits it without its gang. A pod whose
    policies apply is admitted the same on both."""
    caplog.set_level(logging.INFO, logger="webhook.admission")
    job = await mpijob_in(apiserver, shared_dir)
    worker = owned_by(load_fixture(shared_dir, "pod-create-worker.json"), job)
    async with running(tls, _coscheduling(tmp_path), kubeconfig=str(kubeconfig)) as srv, \
            client(tls) as s:
        await eventually(srv.admitter.ready)
        fine = [await review(s, f"{srv.url}{path}", worker)
                for path in ("/mutate/pods", FAIL_CLOSED_PATH)]
        assert fine[0] == fine[1] and fine[0]["allowed"] and "warnings" not in fine[0]
        await apiserver.delete("customresourcedefinitions", "podgroups.scheduling.x-k8s.io")
        other = copy.deepcopy(job)
        other["metadata"] = {"name": "another-job", "namespace": "team-a"}
        worker = owned_by(worker, await apiserver.create("mpijobs.kubeflow.org", other,
                                                         namespace="team-a"))
        opened = await review(s, f"{srv.url}/mutate/pods", worker)
        closed = await review(s, f"{srv.url}{FAIL_CLOSED_PATH}", worker)
        assert opened["allowed"] is True and "patch" in opened
        assert closed["allowed"] is False and "patch" not in closed
        assert closed["status"]["code"] == 503
        assert closed["status"]["message"] == (
            f"muster: namespace {worker['request']['namespace']} admits no pod without its "
            "policies (fail-closed), and they could not be applied: the gang's PodGroup could "
            "not be written; retry")
        assert metric(srv, "muster_admission_fail_open_total", reason="podgroup") == 1
        assert metric(srv, "muster_admission_fail_closed_total", reason="podgroup") == 1

        async def broken(*_: Any, **__: Any) -> None:
            raise RuntimeError("a bug")
        monkeypatch.setattr(srv.admitter, "_decide", broken)
        assert (await review(s, f"{srv.url}/mutate/pods", worker))["allowed"] is True
        closed = await review(s, f"{srv.url}{FAIL_CLOSED_PATH}", worker)
        assert (closed["allowed"], closed["status"]["code"]) == (False, 503)
        assert "an internal error" in closed["status"]["message"]
        assert metric(srv, "muster_admission_fail_closed_total", reason="error") == 1
        monkeypatch.undo()

        # a namespace the webhook's cache does not hold (yet): decided without its labels
        elsewhere = copy.deepcopy(worker)
        elsewhere["request"]["namespace"] = "not-cached"
        elsewhere["request"]["object"]["metadata"].update(namespace="not-cached",
                                                          ownerReferences=[])
        opened = await review(s, f"{srv.url}/mutate/pods", elsewhere)
        closed = await review(s, f"{srv.url}{FAIL_CLOSED_PATH}", elsewhere)
        assert opened["allowed"] is True
        assert any("labels of namespace not-cached unknown" in w for w in opened["warnings"])
        assert (closed["allowed"], closed["status"]["code"]) == (False, 503)
        assert "the namespace's labels are not known" in closed["status"]["message"]
        assert metric(srv, "muster_admission_fail_closed_total", reason="namespace") == 1
    said = [(r.getMessage(), r.reason) for r in caplog.records  # type: ignore[attr-defined]
            if r.getMessage().startswith("pod ")]
    assert said == [("pod admitted failing open", "podgroup"),
                    ("pod refused failing closed", "podgroup"),
                    ("pod admitted failing open", "error"),
                    ("pod refused failing closed", "error"),
                    ("pod admitted failing open", "namespace"),
                    ("pod refused failing closed", "namespace")]


async def test_deadline_fails_open_in_time(tls: Tls, policy_dir: Path, tmp_path: Path,
                                           shared_dir: Path) -> None:
    """An API server that never answers: the webhook still answers before ?timeout=, with
    what it can decide from the pod alone (not ready: it never refuses the pod)."""
    async def hang(_: web.Request) -> web.Response:
        await asyncio.sleep(60)
        return web.Response()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hang)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    try:
        async with running(tls, [policy_dir], kubeconfig=str(kubeconfig)) as srv, \
                client(tls) as s:
            start = time.monotonic()
            resp = await review(s, f"{srv.url}/mutate/pods",
                                load_fixture(shared_dir, "pod-create-worker.json"),
                                api_timeout="1s")
            elapsed = time.monotonic() - start
            assert elapsed < 1.0, elapsed
            assert resp["allowed"] is True
            pod = jsonpatch.apply_patch(load_fixture(shared_dir, "pod-create-worker.json")[
                "request"]["object"], decode_patch(resp))
            assert pod["metadata"]["labels"][ISTIO_INJECT] == "false"
            assert VOLCANO_GROUP_ANNOTATION not in pod["metadata"]["annotations"]  # no gang
            assert any("was not read in time" in w for w in resp["warnings"]), resp["warnings"]
            assert metric(srv, "muster_admission_fail_open_total", reason="owner") == 1
            async with s.get(f"{srv.url}/readyz") as r:
                assert r.status == 503  # caches never synced
    finally:
        await runner.cleanup()


async def test_refused_policy_update_keeps_previous_and_emits_event(
        tls: Tls, tmp_path: Path, apiserver: ApiServerEmulator, kubeconfig: Path,
        shared_dir: Path) -> None:
    """The mounted ConfigMap volume gets a broken version (kubelet-style ..data swap): refused,
    previous policies keep applying, Event on the ConfigMap; the next good version applies."""
    mount = tmp_path / "mount"
    mount.mkdir()
    configmap_version(mount, "v1", {"mpi.yaml": POLICIES})
    await apiserver.create("namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": "muster"}})
    await apiserver.create("configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "muster-policies", "namespace": "muster"},
        "data": {"mpi.yaml": POLICIES}}, namespace="muster")
    body = load_fixture(shared_dir, "pod-create-launcher-generatename.json")
    async with running(tls, [mount], kubeconfig=str(kubeconfig),
                       namespace="muster") as srv, client(tls) as s:
        await eventually(srv.admitter.ready)
        configmap_version(mount, "v2", {"mpi.yaml": POLICIES.replace("optOut: true",
                                                                     "optOut: maybe")})
        await eventually(lambda: metric(srv, "muster_policy_reloads_total", result="error") == 1)
        resp = await review(s, f"{srv.url}/mutate/pods", body)
        pod = jsonpatch.apply_patch(body["request"]["object"], decode_patch(resp))
        assert pod["metadata"]["labels"][ISTIO_INJECT] == "false"  # previous policies apply

        def refused_event() -> list[dict[str, Any]]:
            return [e for e in apiserver.objects("events", namespace="muster")
                    if e.get("reason") == "PolicyUpdateRefused"]
        await eventually(lambda: bool(refused_event()))
        event = refused_event()[0]
        assert event["involvedObject"]["name"] == "muster-policies"
        assert event["type"] == "Warning"
        assert "mpi.yaml" in event["message"] and "optOut" in event["message"]

        configmap_version(mount, "v3", {"mpi.yaml": POLICIES.replace(
            "  istio:\n    optOut: true\n", "")})
        await eventually(lambda: metric(srv, "muster_policy_reloads_total",
                                       result="success") == 2)
        resp = await review(s, f"{srv.url}/mutate/pods", body)
        pod = jsonpatch.apply_patch(body["request"]["object"], decode_patch(resp))
        assert ISTIO_INJECT not in pod["metadata"]["labels"]  # the new set applies
        assert srv.admitter.ready()


async def test_self_cert_mode_serves_the_managed_secret(
        tls: Tls, policy_dir: Path, apiserver: ApiServerEmulator, kubeconfig: Path,
        tmp_path: Path) -> None:
    """--cert-mode self: the manager creates the serving Secret and the caBundle; the files the
    kubelet projects from that Secret are what the server serves."""
    await apiserver.create("namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": "muster"}})
    await apiserver.create("mutatingwebhookconfigurations", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "muster"}, "webhooks": [{
            "name": "pods.muster.io", "admissionReviewVersions": ["v1"],
            "sideEffects": "NoneOnDryRun", "clientConfig": {"service": {
                "namespace": "muster", "name": "muster-webhook", "path": "/mutate/pods"}}}]})
    mount = tmp_path / "mount"

    async def kubelet() -> None:  # projects the Secret into the pod's volume once it exists
        def secret() -> dict[str, Any] | None:
            return apiserver.get("secrets", "muster-webhook-tls", namespace="muster")
        await eventually(lambda: secret() is not None, within=10)
        data = secret()["data"]  # type: ignore[index]
        mount.mkdir()
        for key in ("tls.crt", "tls.key", "ca.crt"):
            (mount / key).write_bytes(base64.b64decode(data[key]))

    projector = asyncio.create_task(kubelet())
    async with running(tls, [policy_dir], kubeconfig=str(kubeconfig), cert_mode="self",
                       namespace="muster", service_name="muster-webhook",
                       webhook_configurations=["muster"], tls_cert_file=mount / "tls.crt",
                       tls_key_file=mount / "tls.key", cert_wait=10.0) as srv:
        await projector
        ctx = ssl.create_default_context(cadata=(mount / "ca.crt").read_text())
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s, \
                s.get(f"{srv.url}/healthz") as r:
            assert r.status == 200
    config = apiserver.get("mutatingwebhookconfigurations", "muster")
    assert config is not None
    bundle = base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"])
    assert bundle.strip() == (mount / "ca.crt").read_bytes().strip()
