"""Gangs that never wait forever in silence: an unreadable job, a PodGroup another object owns
or a deleted job left behind, and a Volcano queue that is missing or closed. `muster serve`
against the API server emulator, with faults injected over HTTP where the job is read."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from admission_helpers import (
    JOB,
    POLICIES,
    FaultProxy,
    Tls,
    client,
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

from e2e.probes import eventually
from webhook import jsonpatch
from webhook.admission.server import WebhookServer
from webhook.demo import scenario
from webhook.doubles.emulator import ApiServerEmulator
from webhook.keys import (
    ANN_JOINED_GANG,
    ANN_POLICY,
    VOLCANO_GROUP_ANNOTATION,
    VOLCANO_QUEUE_ANNOTATION,
    joined_gang,
)

MPIJOB_GET = r"/mpijobs/" + JOB + "$"
PODGROUPS = "podgroups.scheduling.volcano.sh"


def events(api: ApiServerEmulator, reason: str) -> list[dict[str, Any]]:
    return [e for e in api.objects("events", "team-a") if e.get("reason") == reason]


def patched(body: dict[str, Any], resp: dict[str, Any]) -> dict[str, Any]:
    return jsonpatch.apply_patch(body["request"]["object"], decode_patch(resp))


@dataclass
class Env:
    tls: Tls
    api: ApiServerEmulator
    shared: Path
    tmp: Path
    policy_dir: Path
    kubeconfig: Path

    def worker(self, job: dict[str, Any]) -> dict[str, Any]:
        return owned_by(load_fixture(self.shared, "pod-create-worker.json"), job)


@pytest.fixture
def env(tls: Tls, apiserver: ApiServerEmulator, shared_dir: Path, tmp_path: Path,
        policy_dir: Path) -> Env:
    return Env(tls, apiserver, shared_dir, tmp_path, policy_dir,
               apiserver.write_kubeconfig(tmp_path / "kubeconfig-env"))


@pytest.fixture
async def proxy(apiserver: ApiServerEmulator) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(apiserver.url) as p:
        yield p


def launcher_review(shared_dir: Path, launcher_job: dict[str, Any]) -> dict[str, Any]:
    return owned_by(load_fixture(shared_dir, "pod-create-launcher-generatename.json"),
                    launcher_job)


async def make_launcher_job(api: ApiServerEmulator, job: dict[str, Any]) -> dict[str, Any]:
    return await api.create("jobs.batch", {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"{JOB}-launcher", "namespace": "team-a",
                     "ownerReferences": [controller_ref(job)]},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "c", "image": "i"}]}}}}, namespace="team-a")


# --- the job's object cannot be read ----------------------------------------------------------

@pytest.mark.parametrize("fault", [500, 0], ids=["error", "timeout"])
async def test_an_unreadable_job_refuses_its_pods_then_admits_them_without_the_gang(
        env: Env, proxy: FaultProxy, fault: int) -> None:
    apiserver = env.api
    job = await mpijob_in(apiserver, env.shared)
    launcher = launcher_review(env.shared, await make_launcher_job(apiserver, job))
    worker = env.worker(job)
    proxy.fail("GET", MPIJOB_GET, fault)
    async with running(env.tls, [env.policy_dir],
                       kubeconfig=str(proxy.kubeconfig(env.tmp / "kc")),
                       owner_retry_seconds=1.5) as srv, client(env.tls) as s:
        await eventually(srv.admitter.ready)
        url = f"{srv.url}/mutate/pods"
        # worker (pod → MPIJob) and launcher (pod → Job → MPIJob): both refused, in time
        for body in (worker, launcher):
            resp = await review(s, url, body, api_timeout="2s")
            assert resp["allowed"] is False, resp
            assert resp["status"]["code"] == 503
            assert f"MPIJob team-a/{JOB} could not be read" in resp["status"]["message"]
        assert volcano_podgroups(apiserver) == []  # no half gang: nothing joined, nothing made
        assert metric(srv, "muster_gang_interventions_total",
                      reason="owner_unavailable_denied") == 2
        await eventually(lambda: {e["involvedObject"]["kind"] for e in events(
            apiserver, "GangOwnerUnavailable")} >= {"MPIJob", "Pod"})

        # still unreadable after the bound: admitted, without the gang, and said so
        await asyncio.sleep(1.6)
        resp = await review(s, url, worker, api_timeout="2s")
        assert resp["allowed"] is True
        assert VOLCANO_GROUP_ANNOTATION not in patched(worker, resp)["metadata"]["annotations"]
        assert metric(srv, "muster_gang_interventions_total",
                      reason="owner_unavailable_admitted") == 1

        # the API recovers: the gang is back, PodGroup first
        proxy.heal()
        resp = await review(s, url, worker_review(worker, 1))
        assert resp["allowed"] is True
        assert patched(worker, resp)["metadata"]["annotations"][VOLCANO_GROUP_ANNOTATION] == JOB
        assert [g["spec"]["minMember"] for g in volcano_podgroups(apiserver)] == [5]
    assert proxy.hits  # the faults were really served


async def test_a_deleted_job_admits_its_pods_without_a_gang_and_without_refusing(
        env: Env, proxy: FaultProxy) -> None:
    """404: the job is gone and its pods will be garbage-collected; refusing helps nobody."""
    apiserver = env.api
    job = await mpijob_in(apiserver, env.shared)
    launcher = launcher_review(env.shared, await make_launcher_job(apiserver, job))
    proxy.fail("GET", MPIJOB_GET, 404)
    async with running(env.tls, [env.policy_dir],
                       kubeconfig=str(proxy.kubeconfig(env.tmp / "kc"))) as srv, \
            client(env.tls) as s:
        await eventually(srv.admitter.ready)
        for body in (env.worker(job), launcher):
            resp = await review(s, f"{srv.url}/mutate/pods", body)
            assert resp["allowed"] is True
            assert any("not found" in w for w in resp["warnings"]), resp["warnings"]
    assert volcano_podgroups(apiserver) == []


# --- a PodGroup with the gang's name that is not ours -----------------------------------------

async def test_a_podgroup_left_by_a_deleted_job_is_replaced(
        tls: Tls, policy_dir: Path, apiserver: ApiServerEmulator, kubeconfig: Path,
        shared_dir: Path) -> None:
    job = await mpijob_in(apiserver, shared_dir)
    gone = {**controller_ref(job), "uid": "uid-of-the-deleted-job"}  # same name, older job
    apiserver.seed({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                    "metadata": {"name": JOB, "namespace": "team-a", "ownerReferences": [gone]},
                    "spec": {"minMember": 9, "queue": "default"}})
    worker = owned_by(load_fixture(shared_dir, "pod-create-worker.json"), job)
    async with running(tls, [policy_dir], kubeconfig=str(kubeconfig)) as srv, client(tls) as s:
        await eventually(srv.admitter.ready)
        resp = await review(s, f"{srv.url}/mutate/pods", worker)
        assert resp["allowed"] is True and "warnings" not in resp, resp.get("warnings")
        [group] = volcano_podgroups(apiserver)
        assert group["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        assert group["spec"]["minMember"] == 5
        assert metric(srv, "muster_podgroup_writes_total", result="replaced") == 1
        await eventually(lambda: events(apiserver, "GangPodGroupReplaced"))


@pytest.mark.parametrize("owner", ["live", "none"])
async def test_a_podgroup_another_object_controls_is_never_taken_over(
        env: Env, owner: str) -> None:
    apiserver = env.api
    job = await mpijob_in(apiserver, env.shared)
    refs = []
    if owner == "live":
        other = await apiserver.create("jobs.batch", {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "someone-else", "namespace": "team-a"},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                {"name": "c", "image": "i"}]}}}}, namespace="team-a")
        refs = [controller_ref(other)]
    apiserver.seed({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                    "metadata": {"name": JOB, "namespace": "team-a", "ownerReferences": refs},
                    "spec": {"minMember": 2, "queue": "default"}})
    worker = env.worker(job)
    async with running(env.tls, [env.policy_dir], kubeconfig=str(env.kubeconfig)) as srv, \
            client(env.tls) as s:
        await eventually(srv.admitter.ready)
        resp = await review(s, f"{srv.url}/mutate/pods", worker)
        assert resp["allowed"] is False
        assert resp["status"]["code"] == 409
        who = "Job someone-else" if owner == "live" else "no controller"
        assert f"is controlled by {who}" in resp["status"]["message"]
        [group] = volcano_podgroups(apiserver)
        assert group["spec"]["minMember"] == 2  # untouched
        assert metric(srv, "muster_gang_interventions_total",
                      reason="podgroup_foreign_denied") == 1
        await eventually(lambda: events(apiserver, "GangPodGroupConflict"))


@pytest.mark.parametrize("fault", [403, 500])
async def test_a_podgroup_whose_owner_cannot_be_read_is_never_joined(
        env: Env, proxy: FaultProxy, fault: int) -> None:
    """Security review #54: the chart's RBAC reads job kinds only, so the owner of a PodGroup
    another controller made (here a ConfigMap) answers 403. Such an owner is not the job (its
    uid differs): the pod never joins that group (whose minMember may never be reached); it is
    admitted without a gang, as for a missing queue, and an Event and a warning say why."""
    apiserver = env.api
    job = await mpijob_in(apiserver, env.shared)
    other = await apiserver.create("configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "someone-else", "namespace": "team-a"}}, namespace="team-a")
    apiserver.seed({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                    "metadata": {"name": JOB, "namespace": "team-a",
                                 "ownerReferences": [controller_ref(other)]},
                    "spec": {"minMember": 99, "queue": "default"}})
    proxy.fail("GET", r"/configmaps/someone-else$", fault)
    worker = env.worker(job)
    async with running(env.tls, [env.policy_dir],
                       kubeconfig=str(proxy.kubeconfig(env.tmp / "kc"))) as srv, \
            client(env.tls) as s:
        await eventually(srv.admitter.ready)
        resp = await review(s, f"{srv.url}/mutate/pods", worker)
        assert resp["allowed"] is True
        pod = patched(worker, resp)
        assert VOLCANO_GROUP_ANNOTATION not in pod["metadata"]["annotations"]
        assert pod["spec"].get("schedulerName") in (None, "default-scheduler")
        why = (f"muster: pod admitted without a gang: PodGroup team-a/{JOB} is controlled by "
               f"ConfigMap someone-else, which this webhook cannot read (HTTP {fault}), not by "
               "this MPIJob; the pod does not join it")
        assert why in resp["warnings"]
        [group] = volcano_podgroups(apiserver)
        assert group["spec"]["minMember"] == 99  # untouched
        assert metric(srv, "muster_gang_interventions_total",
                      reason="podgroup_owner_unreadable") == 1
        await eventually(lambda: {e["involvedObject"]["kind"] for e in events(
            apiserver, "GangPodGroupOwnerUnreadable")} >= {"MPIJob", "Pod"})
        assert events(apiserver, "GangPodGroupOwnerUnreadable")[0]["message"] == \
            why.removeprefix("muster: ")


@pytest.mark.parametrize("pod_says", ["nothing", "operator's key", "forged marker"])
async def test_a_podgroup_the_job_controls_but_muster_did_not_make_is_never_written(
        env: Env, pod_says: str) -> None:
    """The operator's own PodGroup (Kubeflow Trainer's; mpi-operator's before a migration):
    controlled by the job, as Muster's would be, with other fields than the policy's. Its pods
    carry its group key, or none (a pod made again after the migration); whatever a pod says (a
    marker that Muster joined it, forged at create, included), Muster never writes that
    PodGroup: the pod is admitted into it as it is."""
    apiserver = env.api
    job = await mpijob_in(apiserver, env.shared)
    theirs = {"minMember": 2, "queue": "default"}
    apiserver.seed({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                    "metadata": {"name": JOB, "namespace": "team-a",
                                 "ownerReferences": [controller_ref(job)]},
                    "spec": dict(theirs)})
    worker = env.worker(job)
    ann = worker["request"]["object"]["metadata"].setdefault("annotations", {})
    if pod_says != "nothing":
        ann[VOLCANO_GROUP_ANNOTATION] = JOB
    if pod_says == "forged marker":
        ann[ANN_JOINED_GANG] = joined_gang("volcano", JOB)
    async with running(env.tls, [env.policy_dir], kubeconfig=str(env.kubeconfig)) as srv, \
            client(env.tls) as s:
        await eventually(srv.admitter.ready)
        resp = await review(s, f"{srv.url}/mutate/pods", worker)
        assert resp["allowed"] is True
        assert [w for w in resp.get("warnings", []) if "already joins gang" not in w] == []
        pod = patched(worker, resp)
        assert pod["metadata"]["annotations"][VOLCANO_GROUP_ANNOTATION] == JOB
        # Muster's own gang (no operator's key, or a forged marker) takes the PodGroup as it is
        kept = metric(srv, "muster_podgroup_writes_total", result="kept")
        assert kept == (0 if pod_says == "operator's key" else 1)
        assert (ANN_JOINED_GANG in pod["metadata"]["annotations"]) == bool(kept)
        # called again on the pod as patched (reinvocation): muster.io/policy, now on it, is no
        # proof that an operator's key is Muster's
        again = copy.deepcopy(worker)
        again["request"]["object"] = pod
        assert ANN_POLICY in pod["metadata"]["annotations"]
        resp = await review(s, f"{srv.url}/mutate/pods", again)
        assert resp["allowed"] is True and decode_patch(resp) == []
        if kept:  # once the informer has seen the operator's PodGroup, it is not even read
            podgroups = srv.context.podgroups  # type: ignore[union-attr]
            await eventually(lambda: [k[2] for k in podgroups.known.values()] == [False])
            before = metric(srv, "muster_podgroup_writes_total", result="kept")
            resp = await review(s, f"{srv.url}/mutate/pods", worker_review(worker, 3))
            assert resp["allowed"] is True
            assert metric(srv, "muster_podgroup_writes_total", result="kept") == before
        [group] = volcano_podgroups(apiserver)
        assert group["spec"] == theirs  # untouched
        for result in ("updated", "foreign", "replaced"):
            assert metric(srv, "muster_podgroup_writes_total", result=result) == 0


# --- the Volcano queue ------------------------------------------------------------------------

async def serve_with(env: Env, policy: str) -> tuple[Any, WebhookServer]:
    (env.tmp / "p").mkdir(exist_ok=True)
    (env.tmp / "p" / "policy.yaml").write_text(policy)
    manager = running(env.tls, [env.tmp / "p"], kubeconfig=str(env.kubeconfig))
    srv = await manager.__aenter__()
    await eventually(srv.admitter.ready)
    return manager, srv


@pytest.mark.parametrize(("state", "policy_extra", "queue"), [
    ("missing", "", "default"),
    ("Closed", "    fallbackQueue: training\n", "training"),
    ("Closed", "    unavailableQueue: WithoutGang\n", None),
], ids=["missing-fallback-default", "closed-fallback-named", "closed-without-gang"])
async def test_an_unavailable_queue_falls_back_or_drops_the_gang_and_says_so(
        env: Env, state: str, policy_extra: str, queue: str | None) -> None:
    apiserver = env.api
    if state != "missing":
        apiserver.seed(scenario.volcano_queue("gpu-queue", state))
    policy = POLICIES.replace("backend: volcano\n", f"backend: volcano\n{policy_extra}")
    job = yaml.safe_load((env.shared / "fixtures" / "jobs" / "mpijob-vgg16-4workers.yaml")
                         .read_text())
    job["metadata"]["annotations"][VOLCANO_QUEUE_ANNOTATION] = "gpu-queue"  # the job's queue
    job = await apiserver.create("mpijobs.kubeflow.org", job, namespace="team-a")
    worker = env.worker(job)
    manager, srv = await serve_with(env, policy)
    try:
        async with client(env.tls) as s:
            resp = await review(s, f"{srv.url}/mutate/pods", worker)
        assert resp["allowed"] is True
        pod = patched(worker, resp)
        groups = volcano_podgroups(apiserver)
        if queue is None:
            assert VOLCANO_GROUP_ANNOTATION not in pod["metadata"]["annotations"]
            assert pod["spec"].get("schedulerName") in (None, "default-scheduler")
            assert groups == []
            reason = "queue_without_gang"
        else:
            assert pod["metadata"]["annotations"][VOLCANO_QUEUE_ANNOTATION] == queue
            assert [g["spec"]["queue"] for g in groups] == [queue]
            reason = "queue_fallback"
        assert any("gpu-queue" in w for w in resp.get("warnings", [])) or queue is not None
        assert metric(srv, "muster_gang_interventions_total", reason=reason) == 1
        await eventually(lambda: {e["involvedObject"]["kind"] for e in events(
            apiserver, "GangQueueUnavailable")} >= {"MPIJob", "Pod"})
        message = events(apiserver, "GangQueueUnavailable")[0]["message"]
        assert "Volcano queue 'gpu-queue'" in message
    finally:
        await manager.__aexit__(None, None, None)


# --- cleanup: a finished job's PodGroup goes ---------------------------------------------------

def podgroup(name: str, owner: dict[str, Any] | None, managed: bool = True) -> dict[str, Any]:
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "team-a",
                         "labels": {"app.kubernetes.io/managed-by": "muster"} if managed else {},
                         "ownerReferences": [controller_ref(owner)] if owner else []},
            "spec": {"minMember": 5, "queue": "default"}}


async def test_the_janitor_deletes_finished_jobs_podgroups_as_their_operators_would(
        env: Env) -> None:
    api = env.api
    jobs = {}
    for name, clean, state in (("done-running", "Running", "Succeeded"),
                               ("done-none", "None", "Succeeded"),
                               ("still-running", "All", "Running")):
        body = yaml.safe_load((env.shared / "fixtures" / "jobs" / "mpijob-vgg16-4workers.yaml")
                              .read_text())
        body["metadata"]["name"] = name
        body["spec"]["runPolicy"]["cleanPodPolicy"] = clean
        body["status"] = {"conditions": [{"type": state, "status": "True"}],
                          "completionTime": "2026-11-23T10:00:00Z"}
        jobs[name] = api.seed(body)
        api.seed(podgroup(name, jobs[name]))
    batch = api.seed({"apiVersion": "batch/v1", "kind": "Job",
                      "metadata": {"name": "batch-done", "namespace": "team-a"},
                      "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}},
                      "status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    api.seed(podgroup("batch-done", batch))
    api.seed(podgroup("not-ours", jobs["done-running"], managed=False))  # someone else's
    async with running(env.tls, [env.policy_dir], kubeconfig=str(env.kubeconfig),
                       namespace="team-a", podgroup_cleanup_interval=0.2) as srv:
        await eventually(lambda: metric(srv, "muster_podgroup_cleanups_total") == 2, within=10)
        await asyncio.sleep(0.5)  # later rounds delete nothing more
        assert metric(srv, "muster_podgroup_cleanups_total") == 2
    left = sorted(g["metadata"]["name"] for g in volcano_podgroups(api))
    assert left == ["done-none", "not-ours", "still-running"]
    deleted = events(api, "PodGroupDeleted")
    assert sorted(e["involvedObject"]["name"] for e in deleted) == ["batch-done", "done-running"]
    assert any("cleanPodPolicy Running" in e["message"] for e in deleted)
    lease = api.get("leases", "muster-webhook-podgroup-cleanup", namespace="team-a")
    assert lease is not None  # one replica at a time
