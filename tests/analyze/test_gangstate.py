"""What a gang's recorded objects mean (`webhook.analyze.gangstate`): the one decision `muster
gangs`, `muster explain` and `muster analyze` share, from objects as the API server returns
them."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from gang_objects import AT, BINDER, mpijob, pod, podgroup

from webhook.analyze.findings import analyze
from webhook.analyze.gangstate import (
    GangRef,
    GangState,
    advice,
    age,
    assemble,
    decide,
    pod_gang,
    wait_kind,
)
from webhook.binder.agents import AGENT_WAIT
from webhook.binder.planner import BLOCKED_WAIT, MEMBERS_WAIT, PREEMPTING_WAIT

NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
CAPACITY = ("gang train needs 16 GPUs within one network.topology.nvidia.com/leaf; the largest "
            "free one (rack r1) has 8 free GPUs")


def _one(*pods: dict[str, Any], groups: tuple[dict[str, Any], ...] = ()) -> GangState:
    [gang] = assemble(pods, groups)
    return decide(gang)


def test_a_pod_joins_the_gang_muster_recorded_on_any_backend() -> None:
    assert pod_gang(pod("a", gang="volcano/train", scheduler="volcano")) == \
        GangRef("team-a", "volcano", "train")
    assert pod_gang(pod("a")) == GangRef("team-a", "muster", "train")


def test_a_binder_pod_without_muster_s_record_is_grouped_as_the_binder_groups_it() -> None:
    coscheduled = pod("a", gang=None)
    coscheduled["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = "g"
    assert pod_gang(coscheduled) == GangRef("team-a", "coscheduling", "g")
    assert pod_gang(pod("lone", gang=None)) == GangRef("team-a", "muster", "pod:lone")
    assert pod_gang(pod("other", gang=None, scheduler="default-scheduler")) is None


def test_gangs_are_their_pods_and_the_gang_objects_muster_made() -> None:
    gangs = assemble([pod("w-0"), pod("w-1"), pod("x", gang=None, scheduler="default")],
                     [podgroup("early"), podgroup("theirs", ours=False)])
    assert [(g.ref.name, len(g.pods), g.group is not None) for g in gangs] == [
        ("train", 2, False), ("early", 0, True)]  # by namespace, backend, name


def test_a_gang_short_of_members_waits_for_them() -> None:
    state = _one(pod("w-0"))
    assert (state.present, state.bound, state.minimum, state.state) == (1, 0, 3, "Pending")
    assert state.waiting_kind == "members"
    assert state.waiting == f"{MEMBERS_WAIT}: 1 of minMember 3 exist"


@pytest.mark.parametrize(("said", "kind"), [
    (CAPACITY, "capacity"),
    (f"{BLOCKED_WAIT} team-a/big, which has waited longer than 300s for resources", "blocked"),
    (f"{CAPACITY}; {PREEMPTING_WAIT} of lower priority (team-b/low) to go: it fits", "preempting"),
    (f"{MEMBERS_WAIT}: 2 of minMember 3 exist", "members"),
    (f"{CAPACITY} (node n1: {AGENT_WAIT}: agent pod muster/muster-agent-x is not Ready)",
     "agent"),
    (f"pod w-0: 0/1 nodes are eligible (1 node(s): {AGENT_WAIT}; node n1: agent pod "
     "muster/muster-agent-x is being deleted)", "agent"),
])
def test_a_binder_gang_waits_for_what_the_binder_says(said: str, kind: str) -> None:
    pods = [pod(f"w-{i}", said=f"gang team-a/train cannot be placed: {said}") for i in range(3)]
    state = _one(*pods)
    assert (state.state, state.waiting_kind, state.waiting) == ("Pending", kind, said)


def test_the_binder_s_latest_words_count() -> None:
    old = pod("w-0", said="gang team-a/train cannot be placed: old", said_at="2026-11-23T11:00:00Z")
    new = pod("w-1", said=f"gang team-a/train cannot be placed: {CAPACITY}")
    assert _one(old, new, pod("w-2")).waiting == CAPACITY


def test_a_whole_binder_gang_the_binder_says_nothing_of_is_asked_about() -> None:
    state = _one(pod("w-0"), pod("w-1"), pod("w-2"))
    assert state.waiting_kind == "unknown" and "is it running" in state.waiting


def test_a_gang_bound_to_its_minimum_runs_and_one_finished_is_finished() -> None:
    running = _one(*(pod(f"w-{i}", node="n1", phase="Running") for i in range(3)),
                   pod("spare"))
    assert (running.state, running.bound, running.present, running.waiting) == (
        "Running", 3, 4, "")
    done = _one(*(pod(f"w-{i}", node="n1", phase="Succeeded") for i in range(3)))
    assert (done.state, done.present, done.bound) == ("Finished", 0, 0)


def test_a_volcano_gang_says_what_volcano_says_on_its_podgroup() -> None:
    group = podgroup(phase="Inqueue", conditions=[
        {"type": "Unschedulable", "status": "True", "message": "3/3 tasks in gang unschedulable",
         "lastTransitionTime": AT}])
    pods = [pod(f"w-{i}", gang="volcano/train", scheduler="volcano") for i in range(3)]
    state = _one(*pods, groups=(group,))
    assert (state.backend, state.minimum, state.phase, state.waiting_kind, state.waiting) == (
        "volcano", 3, "Inqueue", "scheduler", "3/3 tasks in gang unschedulable")
    assert state.job == "MPIJob/train"


def test_a_gang_no_scheduler_looks_at_names_its_scheduler() -> None:
    group = podgroup(api="scheduling.x-k8s.io/v1alpha1", min_member=2)
    pods = [pod(f"w-{i}", gang="coscheduling/train", scheduler="scheduler-plugins")
            for i in range(2)]
    state = _one(*pods, groups=(group,))
    assert state.waiting_kind == "no-scheduler"
    assert "schedulerName scheduler-plugins: is it running?" in state.waiting


def test_the_minimum_of_a_native_gang_is_its_pod_group_s() -> None:
    group = podgroup(api="scheduling.k8s.io/v1beta1")
    group["spec"] = {"schedulingPolicy": {"gang": {"minCount": 4}}}
    workload = podgroup(api="scheduling.k8s.io/v1alpha1")
    workload["spec"] = {"podGroups": [{"name": "members", "policy": {"gang": {"minCount": 5}}}]}
    for obj, least in ((group, 4), (workload, 5)):
        state = _one(pod("w-0", gang="kubernetes/train", scheduler="default-scheduler"),
                     groups=(obj,))
        assert (state.backend, state.minimum, state.waiting_kind) == ("kubernetes", least,
                                                                     "members")


def test_a_gang_names_the_job_of_its_members_without_a_gang_object() -> None:
    launcher_job = {"apiVersion": "batch/v1", "kind": "Job",
                    "metadata": {"name": "train-launcher", "uid": "uid-l"}}
    state = _one(pod("w-0"), pod("l", owner=launcher_job))
    assert state.job == "MPIJob/train"
    assert _one(pod("l", owner=mpijob("other", uid="u2"))).job == "MPIJob/other"


def test_analyze_says_what_explain_says_of_a_waiting_binder_gang() -> None:
    """`muster analyze`'s GangWaiting and `muster explain` read the binder's words alike."""
    from test_findings import healthy  # noqa: PLC0415 (the analyze tests' healthy cluster)

    said = f"gang team-a/train cannot be placed: {BLOCKED_WAIT} team-a/big, which has waited"
    waiting = pod("w-0", said=said)
    waiting["metadata"]["annotations"]["muster.io/gang-timeout-seconds"] = "60"
    [finding] = analyze(dataclasses.replace(healthy(), waiting_pods=[waiting]), NOW)
    state = _one(waiting)
    assert finding.fix == advice(state.waiting_kind, "muster-system")
    assert wait_kind(said) == state.waiting_kind == "blocked"


def test_a_gang_waiting_for_a_nodes_agent_is_told_to_wait_for_it() -> None:
    assert "GPU agent restarting" in advice("agent", "muster-system")
    assert "kubectl -n muster-system get pods -l app.kubernetes.io/component=agent" in \
        advice("agent", "muster-system")


def test_age_reads_as_kubectl_shows_it() -> None:
    assert [age(t, NOW) for t in ("2026-11-23T11:59:15Z", "2026-11-23T11:00:00Z",
                                  "2026-11-22T12:00:00Z", "2026-11-19T12:00:00Z", "soon")] == [
        "45s", "60m", "24h", "4d", "?"]
    assert BINDER == "muster-binder"
