"""Every job kind's gang: one PodGroup per job (per group for a LeaderWorkerSet), sized from the
job's own spec as its operator computes it, for every pod the job's controllers create."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from e2e import jobkinds
from e2e.jobkinds import Replicated
from webhook import keys
from webhook.jsonpatch import apply_patch
from webhook.policy import (
    Decision,
    PolicySet,
    evaluate,
    operators,
    podgroup_manifest,
    render_patch,
)
from webhook.policy.cleanup import cleanup_reason
from webhook.policy.outcome import evaluate_and_render
from webhook.policy.podsets import LWS_EXCLUSIVE_ANNOTATION
from webhook.policy.workload import (
    JOBSET_EXCLUSIVE_ANNOTATION,
    JOBSET_NODE_SELECTOR_ANNOTATION,
)

from .conftest import Policies, deep, policy

NS = "team-d"
_uids = itertools.count(1)


def stored(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as the API server returns it: with a uid and a resourceVersion."""
    n = next(_uids)
    obj["metadata"].update(uid=f"00000000-0000-0000-0000-{n:012d}", resourceVersion=str(n))
    return obj


def gang(policies: Policies, backend: str = "volcano", kinds: str = "") -> PolicySet:
    match = f"  ownerKinds: [{kinds}]\n" if kinds else "  namespaces: [team-d]\n"
    return policies(policy("gang", f"match:\n{match}gang:\n  backend: {backend}\n"
                                   "  minResources: auto"))


def decide(pod: dict[str, Any], owners: Sequence[dict[str, Any]], ps: PolicySet) -> Decision:
    return evaluate(pod, namespace_labels={}, owners=list(owners), policies=ps)


def one_group(decisions: Sequence[Decision]) -> Any:
    """The PodGroup every decision agrees on (fails when two pods of a gang differ)."""
    groups = [d.pod_group for d in decisions]
    assert groups and all(g == groups[0] for g in groups), groups
    return groups[0]


def jobset_pods(js: dict[str, Any], only: Sequence[str] | None = None
                ) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(pod, owner chain) of each pod the JobSet's Jobs start."""
    out = []
    for job in map(stored, operators.child_jobs(js, only)):
        out += [(pod, [job, js]) for pod in operators.job_pods(job)]
    return out


def test_a_jobset_is_one_gang_of_replicas_times_parallelism(policies: Policies) -> None:
    js = stored(jobkinds.jobset("llm", NS, [Replicated("driver"),
                                            Replicated("workers", replicas=2, parallelism=4)]))
    ps = gang(policies)
    pods = jobset_pods(js)
    group = one_group([decide(pod, chain, ps) for pod, chain in pods])
    assert len(pods) == 9
    assert group is not None and (group.name, group.min_member) == ("llm", 9)
    assert group.owner is not None and group.owner.kind == "JobSet"
    assert group.min_resources == {"cpu": "9", "memory": "9Gi"}


@pytest.mark.parametrize("order", ["InOrder", "dependsOn Ready"])
def test_a_jobset_started_in_stages_waits_for_its_first_stage_and_reserves_all(
        order: str, policies: Policies) -> None:
    jobs = [Replicated("leader"), Replicated("workers", replicas=3, parallelism=2,
                                             depends_on=None if order == "InOrder"
                                             else ("leader", "Ready"))]
    js = stored(jobkinds.jobset("staged", NS, jobs, in_order=order == "InOrder"))
    ps = gang(policies)
    decisions = [decide(pod, chain, ps) for pod, chain in jobset_pods(js)]
    group = one_group(decisions)
    # the workers are created once the leader is Ready: waiting for them would deadlock
    assert group is not None and group.min_member == 1
    assert group.min_resources == {"cpu": "7", "memory": "7Gi"}
    assert any(order.rsplit(maxsplit=1)[-1] in w and "first 1 of 7 pods" in w
               for w in decisions[0].warnings)


@pytest.mark.parametrize("backend", ["volcano", "muster"])
def test_a_jobset_placed_exclusively_by_its_leaders_is_no_gang(
        backend: str, policies: Policies) -> None:
    # JobSet's pod webhook refuses each Job's followers until its leader is scheduled: a gang of
    # all its pods would wait for pods that wait for it
    js = jobkinds.jobset("excl", NS, [Replicated("workers", replicas=2, parallelism=2)])
    js["metadata"]["annotations"] = {JOBSET_EXCLUSIVE_ANNOTATION: "example.com/rack"}
    ps = gang(policies, backend)
    decisions = [decide(pod, chain, ps) for pod, chain in jobset_pods(stored(js))]
    assert len(decisions) == 4 and all(d.pod_group is None for d in decisions)
    assert all(any("not applied: JobSet exclusive placement" in w and "example.com/rack" in w
                   for w in d.warnings) for d in decisions)
    assert all(d.scheduler_name in (None, "volcano") for d in decisions)
    # with its node-selector strategy the followers wait for no leader: one gang, as always
    js["metadata"]["annotations"][JOBSET_NODE_SELECTOR_ANNOTATION] = "true"
    js["metadata"].pop("uid")
    group = one_group([decide(pod, chain, ps) for pod, chain in jobset_pods(stored(js))])
    assert group is not None and group.min_member == 4


def test_a_jobset_initializer_that_completes_first_is_not_in_the_gang(
        policies: Policies) -> None:
    js = stored(jobkinds.jobset("init", NS, [
        Replicated("initializer"),
        Replicated("node", parallelism=4, depends_on=("initializer", "Complete"))]))
    ps = gang(policies)
    (init_pod, init_chain), *nodes = jobset_pods(js)
    alone = decide(init_pod, init_chain, ps)
    assert alone.pod_group is None and alone.scheduler_name == "volcano"
    assert any("replicatedJob initializer" in w and "not part of the gang" in w
               for w in alone.warnings)
    group = one_group([decide(pod, chain, ps) for pod, chain in nodes])
    assert group is not None and group.min_member == 4 and len(nodes) == 4


def _trainjob(nodes_in_jobset: int, num_nodes: int, pod_labels: dict[str, str] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    tj = stored(jobkinds.trainjob("bert", NS, nodes_in_jobset))
    js = stored(operators.trainjob_jobset(
        tj, jobkinds.pod_template(jobkinds.DEFAULT_CONTAINER, pod_labels)))
    tj["spec"]["trainer"]["numNodes"] = num_nodes
    return tj, js


def test_a_trainjob_is_one_gang_of_its_training_nodes(policies: Policies) -> None:
    tj, js = _trainjob(4, 4)
    ps = gang(policies, "coscheduling", "trainer.kubeflow.org/TrainJob")
    decisions = [decide(pod, [*chain, tj], ps) for pod, chain in jobset_pods(js, ["node"])]
    group = one_group(decisions)
    assert group is not None and (group.name, group.min_member) == ("bert", 4)
    assert group.owner is not None and (group.owner.kind, group.owner.uid) == (
        "TrainJob", tj["metadata"]["uid"])
    assert all(d.labels[keys.COSCHEDULING_GROUP_LABEL] == "bert" for d in decisions)


def test_a_trainjobs_num_nodes_sizes_the_gang(policies: Policies) -> None:
    """numNodes on the TrainJob decides, also before the trainer has resized its JobSet."""
    tj, js = _trainjob(2, 3)
    ps = gang(policies, "coscheduling", "trainer.kubeflow.org/TrainJob")
    pod, chain = jobset_pods(js, ["node"])[0]
    group = decide(pod, [*chain, tj], ps).pod_group
    assert group is not None and group.min_member == 3


def test_a_trainjob_whose_runtime_has_a_pod_group_policy_keeps_the_trainers_gang(
        policies: Policies) -> None:
    # the trainer's coscheduling plugin labels every pod and makes the PodGroup itself
    tj, js = _trainjob(2, 2, {keys.COSCHEDULING_GROUP_LABEL: "bert"})
    ps = gang(policies, "coscheduling", "trainer.kubeflow.org/TrainJob")
    pod, chain = jobset_pods(js, ["node"])[0]
    decision = decide(pod, [*chain, tj], ps)
    assert decision.pod_group is None
    assert any("already joins gang 'bert'" in w for w in decision.warnings)
    # JobSet's pod webhook makes the API server call Muster again, on the pod as it patched it
    patched = apply_patch(pod, render_patch(pod, decision))
    assert patched["metadata"]["annotations"][keys.ANN_POLICY] == "gang"
    again = decide(patched, [*chain, tj], ps)
    assert again.pod_group is None and render_patch(patched, again) == []


@pytest.mark.parametrize(("min_replicas", "max_replicas", "expected"),
                         [(2, 4, 2), (None, 3, 3), (None, None, 4)])
def test_an_elastic_pytorchjob_waits_for_its_elastic_minimum(
        min_replicas: int | None, max_replicas: int | None, expected: int,
        policies: Policies) -> None:
    job = stored(jobkinds.elastic_pytorchjob("elastic", NS, workers=4,
                                             min_replicas=min_replicas))
    if max_replicas is None:
        del job["spec"]["elasticPolicy"]["maxReplicas"]
    else:
        job["spec"]["elasticPolicy"]["maxReplicas"] = max_replicas
    ps = gang(policies)
    decisions = [decide(pod, [job], ps) for pod in operators.kubeflow_pods(job)]
    group = one_group(decisions)
    assert group is not None and group.min_member == expected
    assert group.min_resources == {"cpu": str(expected), "memory": f"{expected}Gi"}
    assert any(f"waits for {expected} of its 4 pods" in w for w in decisions[0].warnings)


def test_a_pytorchjob_without_elastic_policy_waits_for_all(policies: Policies) -> None:
    job = stored(jobkinds.elastic_pytorchjob("rigid", NS, workers=3, min_replicas=1))
    del job["spec"]["elasticPolicy"]
    group = decide(operators.kubeflow_pods(job)[0], [job], gang(policies)).pod_group
    assert group is not None and group.min_member == 3


def _lws_pods(lws: dict[str, Any]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    leaders = stored(operators.leader_statefulset(lws))
    out = []
    for group, leader in enumerate(operators.statefulset_pods(leaders)):
        # the leader is stored by then (its workers' StatefulSet is owned by it)
        out.append((deep(leader), [leaders, lws]))
        workers = stored(operators.worker_statefulset(lws, stored(leader), group))
        out += [(pod, [workers, leader, leaders, lws])
                for pod in operators.statefulset_pods(workers)]
    return out


def test_each_leaderworkerset_group_is_its_own_gang(policies: Policies) -> None:
    lws = stored(jobkinds.leaderworkerset("vllm", NS, groups=2, size=3))
    ps = gang(policies)
    by_group: dict[str, list[Decision]] = {}
    for pod, chain in _lws_pods(lws):
        # through the outcome memo, as admission does: leaders share their whole owner chain
        decision = evaluate_and_render(pod, namespace_labels={}, owners=chain,
                                       policies=ps).decision
        group = decision.pod_group
        assert group is not None
        by_group.setdefault(group.name, []).append(decision)
        assert decision.annotations[keys.VOLCANO_GROUP_ANNOTATION] == group.name
    assert sorted(by_group) == ["vllm-0", "vllm-1"]
    for decisions in by_group.values():
        group = one_group(decisions)
        assert len(decisions) == 3
        assert group.min_member == 3 and group.owner is not None
        assert group.owner.kind == "LeaderWorkerSet"


def test_a_leader_ready_group_waits_for_its_leader_and_reserves_the_group(
        policies: Policies) -> None:
    lws = stored(jobkinds.leaderworkerset("vllm", NS, groups=1, size=4, leader_ready=True))
    leader, chain = _lws_pods(lws)[0]
    group = decide(leader, chain, gang(policies)).pod_group
    assert group is not None and group.min_member == 1
    assert group.min_resources == {"cpu": "4", "memory": "4Gi"}
    assert podgroup_manifest(group)["spec"]["minMember"] == 1  # type: ignore[index]


def test_an_exclusive_group_waits_for_its_leader_and_reserves_the_group(
        policies: Policies) -> None:
    # LWS's controller creates an exclusive group's workers once its leader is scheduled
    lws = jobkinds.leaderworkerset("vllm", NS, groups=2, size=4)
    lws["metadata"]["annotations"] = {LWS_EXCLUSIVE_ANNOTATION: "example.com/rack"}
    leader, chain = _lws_pods(stored(lws))[0]
    decision = decide(leader, chain, gang(policies))
    group = decision.pod_group
    assert group is not None and group.min_member == 1
    assert group.min_resources == {"cpu": "4", "memory": "4Gi"}
    assert any("exclusive placement" in w and "example.com/rack" in w
               for w in decision.warnings)


def test_a_leaderworkerset_pod_without_a_group_index_gets_no_gang(policies: Policies) -> None:
    lws = stored(jobkinds.leaderworkerset("vllm", NS, groups=1, size=2))
    leader, chain = _lws_pods(lws)[0]
    leader["metadata"]["name"] = "renamed"
    del leader["metadata"]["labels"]["apps.kubernetes.io/pod-index"]
    decision = decide(leader, chain, gang(policies))
    assert decision.pod_group is None
    assert any("group index is unknown" in w for w in decision.warnings)


@pytest.mark.parametrize(("parallelism", "completions", "note"),
                         [(4, 4, False), (2, 6, True), (5, 3, False)])
def test_an_indexed_job_gangs_the_pods_that_run_at_once(
        parallelism: int, completions: int, note: bool, policies: Policies) -> None:
    job = stored(jobkinds.indexed_job("ranks", NS, parallelism=parallelism,
                                      completions=completions))
    pods = operators.job_pods(job)
    decisions = [decide(pod, [job], gang(policies)) for pod in pods]
    group = one_group(decisions)
    assert group is not None and group.min_member == min(parallelism, completions) == len(pods)
    assert any("Indexed Job" in w for w in decisions[0].warnings) is note


def test_the_janitor_rules_for_the_new_kinds() -> None:
    js = jobkinds.jobset("a", NS, [Replicated("w")])
    assert cleanup_reason("jobset.x-k8s.io/JobSet", js) is None
    js["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
    assert cleanup_reason("jobset.x-k8s.io/JobSet", js) == "the JobSet completed"
    tj = jobkinds.trainjob("t", NS, 2)
    tj["spec"]["suspend"] = True
    assert cleanup_reason("trainer.kubeflow.org/TrainJob", tj) == "the TrainJob is suspended"
    tj["spec"]["suspend"] = False
    tj["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
    assert cleanup_reason("trainer.kubeflow.org/TrainJob", tj) == "the TrainJob failed"
    lws = jobkinds.leaderworkerset("vllm", NS, groups=2, size=2)
    kind = "leaderworkerset.x-k8s.io/LeaderWorkerSet"
    assert cleanup_reason(kind, lws, "vllm-1") is None
    assert cleanup_reason(kind, lws, "vllm-2") == \
        "group 2 of the LeaderWorkerSet is gone (replicas 2)"
    assert cleanup_reason(kind, lws, "vllm-x") is None
