"""`muster explain job|pod` and `muster gangs`: the explanation from recorded objects (pure), then
both commands against the emulator, through a client that records every request it makes (all
reads) and has no write method at all."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from gang_objects import MPI_POLICY, mpijob, owned, pod, podgroup
from reader_role import Requests, reader_rules

from webhook.analyze.clusterread import Scope, Served, read_gangs, read_policies
from webhook.analyze.explaining import (
    EVENTS_SHOWN,
    Explanation,
    events_of,
    explain_pods,
    job_pods,
    named_after,
    render,
)
from webhook.analyze.gangcommands import explain_job, explain_pod, gang_table
from webhook.analyze.gangstate import assemble, decide
from webhook.cli import main
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import ApiError, KubeApi, Resource, make_api_client
from webhook.policy import load_policy_texts

NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
SOURCE = "ConfigMap muster-system/muster-policies, 2 policies"


def event(about: dict[str, Any], reason: str, message: str, *, at: str = "2026-11-23T11:58:00Z",
          component: str = "muster-binder", type_: str = "Warning") -> dict[str, Any]:
    meta = about["metadata"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{abs(hash((reason, message, at))):x}",
                         "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": about.get("apiVersion", "v1"), "kind": about["kind"],
                               "name": meta["name"], "namespace": meta["namespace"],
                               "uid": meta["uid"]},
            "reason": reason, "message": message, "type": type_, "count": 1,
            "source": {"component": component}, "firstTimestamp": at, "lastTimestamp": at}


def _scope(pods: list[dict[str, Any]], **kw: Any) -> Scope:
    return Scope("team-a", pods=pods, policies=load_policy_texts({"p.yaml": MPI_POLICY}),
                 policy_source=SOURCE, **kw)


def _explained(scope: Scope, pods: Sequence[dict[str, Any]] | None = None) -> Any:
    job = mpijob()
    chosen = scope.pods if pods is None else pods
    return explain_pods(scope, chosen, {p["metadata"]["uid"]: [job] for p in chosen},
                        target="job team-a/train", job=job, job_name="train",
                        release_namespace="muster-system", now=NOW)


def test_a_job_s_explanation_names_the_policy_its_gang_and_what_it_waits_for() -> None:
    pods = [pod("train-worker-0"), pod("train-worker-1")]
    e = _explained(_scope(pods, events=[event(pods[0], "FailedScheduling", "gang team-a/train "
                                              "cannot be placed: waiting for members")]))
    verdicts = {v.policy: v for v in e.policies}
    assert (verdicts["mpi-topology"].matched, verdicts["mpi-volcano"].matched) == (2, 0)
    assert any(r.startswith("✗ namespace team-a not in") for r in verdicts["mpi-volcano"].reasons)
    assert e.applied == ("mpi-topology",) and e.notes == ()
    [report] = e.gangs
    assert (report.gang.present, report.gang.minimum, report.gang.waiting_kind) == (
        2, 3, "members")
    assert report.object == "" and "its other pods do not exist" in report.advice
    text = "\n".join(render(e))
    for line in ("job team-a/train: kubeflow.org/MPIJob train, 2 pod(s)",
                 f"Policies ({SOURCE}), re-evaluated on the pods as stored:",
                 "  MATCH mpi-topology: 2 of 2 pod(s)",
                 "  no    mpi-volcano: ✗ namespace team-a not in ['team-v']",
                 "Gang team-a/train: backend muster, placed by muster-binder",
                 "  members: 2 present, 0 bound, minimum 3",
                 "  state: Pending: waiting for members: 2 of minMember 3 exist",
                 "    2m Warning FailedScheduling     pod/train-worker-0: gang team-a/train "
                 "cannot be placed: waiting for members"):
        assert line in text.splitlines(), (line, text)


def test_a_gang_the_policies_no_longer_make_is_noted() -> None:
    moved = pod("train-worker-0", gang="volcano/train")
    e = _explained(_scope([moved, pod("train-worker-1", gang=None, scheduler="x")]))
    assert e.notes == (
        "pod train-worker-0 joined gang volcano/train; the policies now make gang muster/train",
        "the policies now make gang muster/train of pod train-worker-1, which joined none: it "
        "was admitted before the policy, or without the webhook (its failurePolicy Ignore)")


def test_the_gang_object_of_a_job_without_pods_is_explained() -> None:
    group = podgroup(phase="Pending")
    e = _explained(_scope([], groups=[group]), pods=[])
    [report] = e.gangs
    assert report.object == "PodGroup scheduling.volcano.sh/v1beta1 team-a/train"
    assert (report.gang.present, report.gang.minimum, report.gang.phase) == (0, 3, "Pending")
    assert e.policies == ()  # no pod to evaluate


def test_only_muster_s_events_on_the_job_s_objects_are_shown_latest_last() -> None:
    mine, other = pod("train-worker-0"), pod("unrelated", uid="u-x")
    events = [event(mine, "Scheduled", f"#{i}", at=f"2026-11-23T11:{i:02d}:00Z")
              for i in range(EVENTS_SHOWN + 2)]
    events += [event(mine, "Scheduled", "kube", component="default-scheduler"),
               event(other, "Scheduled", "elsewhere")]
    shown = events_of(events, {("Pod", "train-worker-0")}, (), NOW)
    assert [e.message for e in shown] == [f"#{i}" for i in range(2, EVENTS_SHOWN + 2)]
    assert shown[-1].time == "49m"  # 11:11 to 12:00


def test_the_binder_s_events_on_a_gang_s_pods_that_are_gone_and_its_podgroup_are_shown() -> None:
    """A preempted gang's pods are evicted (their Events stay, naming the gang); the binder
    names a coscheduling PodGroup without its uid."""
    gone = pod("train-worker-7", uid="u-old")
    preempted = event(gone, "GangPreempted", "preempted by gang team-a/urgent of priority 9: "
                      "gang team-a/train (priority 0) is evicted whole")
    preemptor = event(pod("urgent-0", uid="u-u"), "GangPreempting", "gang team-a/urgent of "
                      "priority 9 preempts 1 gang(s) of lower priority (team-a/train; 8 GPUs)")
    group = event(podgroup(api="scheduling.x-k8s.io/v1alpha1"), "GangPreempted", "on the group")
    del group["involvedObject"]["uid"]
    similar = event(pod("t2", uid="u-t2"), "Scheduled", "as part of gang team-a/train-2")
    shown = events_of([preempted, preemptor, group, similar], {("PodGroup", "train")},
                      ["team-a/train"], NOW)
    assert [(e.reason, e.object) for e in shown] == [
        ("GangPreempted", "pod/train-worker-7"), ("GangPreempted", "podgroup/train")]
    assert [e.object for e in events_of([preempted, preemptor], set(), ["team-a/urgent"],
                                        NOW)] == ["pod/urgent-0"]


def test_a_job_s_pods_are_those_with_its_name_up_their_owners() -> None:
    launcher_job = {"apiVersion": "batch/v1", "kind": "Job",
                    "metadata": {"name": "train-launcher", "uid": "uid-l"}}
    launcher, worker = pod("l", owner=launcher_job), pod("w")
    other = pod("o", owner=mpijob("trainer", uid="u2"))
    assert [named_after(p, "train") for p in (launcher, worker, other)] == [True, True, True]
    chains = {"uid-l": [launcher_job, mpijob()], "uid-w": [mpijob()],
              "uid-o": [mpijob("trainer", uid="u2")]}
    assert job_pods([launcher, worker, other], chains, "train") == [launcher, worker]


def test_the_gangs_table_has_a_row_a_gang() -> None:
    pods = [pod("w-0"), pod("w-1", node="n1")]
    rows = gang_table([decide(g) for g in assemble(pods, [])],
                      dt.datetime(2026, 11, 23, 11, 30, tzinfo=dt.UTC))
    assert rows == [
        "NAMESPACE   JOB            BACKEND   PRESENT/BOUND/MIN   STATE     AGE   WAITING FOR",
        "team-a      MPIJob/train   muster    2/1/3               Pending   30m   waiting for "
        "members: 2 of minMember 3 exist"]


class _Refusing:
    """A reader the API server refuses (RBAC: no get on the policies ConfigMap)."""

    async def get(self, resource: Resource, name: str, namespace: str | None = None,
                  subresource: str | None = None) -> dict[str, Any]:
        raise ApiError(403, "Forbidden", f"{resource.plural} {name!r} is forbidden")


async def test_policies_the_user_may_not_read_are_said_so_and_the_rest_goes_on() -> None:
    policies, said = await read_policies(_Refusing(), "muster-system", "muster")  # type: ignore[arg-type]
    assert policies is None
    assert said == ("ConfigMap muster-system/muster-policies may not be read by this user: the "
                    "rest is shown without it")


# --- against the emulator -------------------------------------------------------------------

class Reads:
    """A reader of the cluster that records its requests and has no other method: a write
    would raise AttributeError (and not type-check against `Reader`)."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api
        self.methods: list[str] = []
        original = api.request

        async def request(method: str, path: str, *args: Any, **kw: Any) -> Any:
            self.methods.append(method)
            return await original(method, path, *args, **kw)
        api.request = request  # type: ignore[method-assign]

    async def get(self, resource: Resource, name: str, namespace: str | None = None,
                  subresource: str | None = None) -> dict[str, Any]:
        return await self._api.get(resource, name, namespace, subresource)

    async def list(self, resource: Resource, namespace: str | None = None, *,
                   label_selector: str | None = None, field_selector: str | None = None,
                   limit: int | None = None) -> dict[str, Any]:
        return await self._api.list(resource, namespace, label_selector=label_selector,
                                    field_selector=field_selector, limit=limit)

    async def served(self, group: str) -> Served:
        return await self._api.served(group)


def _seed(api: ApiServerEmulator) -> None:
    """A job short of members in team-a (binder), a volcano job waiting in team-v."""
    for ns in ("muster-system", "team-a", "team-v"):
        api.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    api.seed({"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "muster-policies", "namespace": "muster-system"},
              "data": {"p.yaml": MPI_POLICY}})
    train = api.seed(mpijob())
    for i in range(2):
        made = api.seed(pod(f"train-worker-{i}", owner=train))
        api.seed(event(made, "FailedScheduling", "gang team-a/train cannot be placed: waiting "
                       "for members: 2 of minMember 3 exist"))
    volcano = api.seed(mpijob(ns="team-v", uid="v"))
    group = podgroup(ns="team-v", phase="Inqueue")
    group["metadata"]["ownerReferences"][0]["uid"] = volcano["metadata"]["uid"]
    api.seed(group)
    for i in range(3):
        api.seed(owned(pod(f"train-worker-{i}", ns="team-v", gang="volcano/train",
                           scheduler="volcano"), volcano))


async def test_both_commands_read_the_cluster_with_get_and_list_only(
        shared_crds: list[dict[str, Any]], tmp_path: Path) -> None:
    api = ApiServerEmulator(crds=shared_crds)
    _seed(api)
    async with api:
        client = await make_api_client(str(api.write_kubeconfig(tmp_path / "kc")))
        try:
            kube = KubeApi(client)
            requests = Requests(kube)
            reads = Reads(kube)
            job = await explain_job(reads, "team-a", "train", release_namespace="muster-system",
                                    release="muster", now=NOW)
            one = await explain_pod(reads, "team-v", "train-worker-0",
                                    release_namespace="muster-system", release="muster",
                                    now=NOW)
            listed = await read_gangs(reads, None)
        finally:
            await client.close()
    assert reads.methods and set(reads.methods) == {"GET"}
    assert requests.refused_by(reader_rules()) == []  # the chart's role for these commands
    assert job.job.startswith("kubeflow.org/MPIJob train") and job.pods == 2
    assert [e.reason for e in job.events] == ["FailedScheduling"] * 2
    assert [(r.gang.backend, r.gang.waiting_kind) for r in job.gangs] == [("muster", "members")]
    [volcano] = one.gangs
    assert (volcano.gang.backend, volcano.gang.present, volcano.gang.phase) == (
        "volcano", 3, "Inqueue")
    assert volcano.gang.waiting_kind == "no-scheduler"
    assert sorted((g.ref.namespace, g.ref.backend) for g in assemble(
        listed.pods, listed.groups)) == [("team-a", "muster"), ("team-v", "volcano")]


def test_a_job_controller_s_failed_creates_that_name_muster_s_webhook_are_shown() -> None:
    """A job in a fail-closed namespace whose pods Muster refused, or could not be asked about,
    has no pod to lead to it: its controller's FailedCreate Events, in the API server's words,
    say why. Its other Events are not Muster's and are not shown."""
    job = {"kind": "Job", "metadata": {"name": "train", "namespace": "team-a", "uid": "u-j"}}
    unreachable = event(job, "FailedCreate", 'Error creating: Internal error occurred: failed '
                        'calling webhook "pods-fail-closed.muster.io": failed to call webhook: '
                        "no endpoints available", component="job-controller")
    refused = event(job, "FailedCreate", 'Error creating: admission webhook "pods-fail-closed.'
                    'muster.io" denied the request: muster: namespace team-a admits no pod '
                    "without its policies (fail-closed), and they could not be applied: the "
                    "gang's PodGroup could not be written; retry", component="job-controller",
                    at="2026-11-23T11:59:00Z")
    quota = event(job, "FailedCreate", "Error creating: exceeded quota", component="job-controller")
    other = event(dict(job, metadata={**job["metadata"], "name": "other"}), "FailedCreate",
                  unreachable["message"], component="job-controller")
    shown = events_of([unreachable, refused, quota, other], set(), (), NOW, job_name="train")
    assert [(e.reason, e.object) for e in shown] == [("FailedCreate", "job/train")] * 2
    assert "admits no pod without its policies" in shown[-1].message
    assert events_of([unreachable, refused], set(), (), NOW) == ()


async def _explain_job(api: ApiServerEmulator, tmp_path: Path, name: str) -> Explanation:
    """`explain job team-a/NAME` against the emulator, through a reader that only reads."""
    async with api:
        client = await make_api_client(str(api.write_kubeconfig(tmp_path / "kc")))
        try:
            return await explain_job(Reads(KubeApi(client)), "team-a", name,
                                     release_namespace="muster-system", release="muster",
                                     now=NOW)
        finally:
            await client.close()


async def test_a_job_without_pods_is_explained_by_the_refusals(
        shared_crds: list[dict[str, Any]], tmp_path: Path) -> None:
    api = ApiServerEmulator(crds=shared_crds)
    _seed(api)
    job = api.seed({"apiVersion": "batch/v1", "kind": "Job",
                    "metadata": {"name": "refused", "namespace": "team-a"},
                    "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}})
    api.seed(event(job, "FailedCreate", 'Error creating: Internal error occurred: failed '
                   'calling webhook "pods-fail-closed.muster.io": no endpoints available',
                   component="job-controller"))
    found = await _explain_job(api, tmp_path, "refused")
    assert (found.pods, found.gangs) == (0, ())
    assert [(e.reason, e.object) for e in found.events] == [("FailedCreate", "job/refused")]
    assert any("pods-fail-closed.muster.io" in line for line in render(found))


async def test_a_jobset_without_pods_is_explained_by_its_jobs_refusals(
        shared_crds: list[dict[str, Any]], tmp_path: Path) -> None:
    """A JobSet's pods come from its Jobs, so the refusals are on those Jobs (NAME-RJOB-I), not
    on the JobSet. A Job named alike that the JobSet does not control is not its."""
    api = ApiServerEmulator(crds=shared_crds)
    _seed(api)
    jobset = api.seed({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                       "metadata": {"name": "sweep", "namespace": "team-a"},
                       "spec": {"replicatedJobs": []}})

    def job(name: str, owner: dict[str, Any] | None) -> dict[str, Any]:
        refs = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"], "controller": True,
                 "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}] \
            if owner else []
        made = api.seed({"apiVersion": "batch/v1", "kind": "Job",
                         "metadata": {"name": name, "namespace": "team-a",
                                      "ownerReferences": refs},
                         "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}})
        api.seed(event(made, "FailedCreate", 'Error creating: Internal error occurred: failed '
                       'calling webhook "pods-fail-closed.muster.io": no endpoints available',
                       component="job-controller"))
        return made

    job("sweep-workers-0", jobset)
    job("sweep-workers-1", jobset)
    job("sweep-other-0", None)  # named alike, not the JobSet's
    found = await _explain_job(api, tmp_path, "sweep")
    assert found.pods == 0
    assert sorted(e.object for e in found.events) == ["job/sweep-workers-0",
                                                      "job/sweep-workers-1"]


async def _cli(api: ApiServerEmulator, tmp_path: Path, *argv: str) -> int:
    kubeconfig = str(api.write_kubeconfig(tmp_path / "kc"))
    # the CLI runs its own event loop: from a thread, beside the emulator's
    return await asyncio.to_thread(main, [*argv, "--kubeconfig", kubeconfig])


async def test_the_commands_print_json_and_filter_by_namespace_and_state(
        shared_crds: list[dict[str, Any]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    api = ApiServerEmulator(crds=shared_crds)
    _seed(api)
    async with api:
        codes = [await _cli(api, tmp_path, *argv) for argv in (
            ("gangs", "-A", "-o", "json"), ("gangs", "-n", "team-v", "-o", "json"),
            ("gangs", "-A", "--state", "running", "-o", "json"),
            ("explain", "job", "team-a/train", "-o", "json"))]
        none = await _cli(api, tmp_path, "gangs", "-n", "team-v", "--state", "finished")
        missing = await _cli(api, tmp_path, "explain", "job", "team-a/nothing")
        bad = await _cli(api, tmp_path, "explain", "pod", "no-namespace")
    out = capsys.readouterr()
    every, team_v, running, explained = (json.loads(d) for d in _documents(out.out))
    assert codes == [0, 0, 0, 0]
    assert [(g["namespace"], g["job"], g["state"]) for g in every] == [
        ("team-a", "MPIJob/train", "Pending"), ("team-v", "MPIJob/train", "Pending")]
    assert [g["backend"] for g in team_v] == ["volcano"] and running == []
    assert explained["gangs"][0]["gang"]["waiting_kind"] == "members"
    assert (none, missing, bad) == (0, 1, 2)
    assert "no gang Finished in namespace team-v" in out.err
    assert "no pod and no gang of a job named nothing in namespace team-a" in out.err
    assert "'no-namespace': give NAMESPACE/NAME" in out.err


def _documents(text: str) -> list[str]:
    """The JSON documents printed one after another."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        _, end = decoder.raw_decode(text, at)
        out.append(text[at:end])
        at = end + 1
    return out
