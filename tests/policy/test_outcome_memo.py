"""The outcome memo (webhook.policy.outcome) gives exactly what a fresh evaluate + render_patch
gives: for random pods, policies, namespace labels and owners, and for a second pod that differs
from the first in exactly one field the engine or the renderer reads (or one it must not need:
name, containers, priorityClassName), evaluated after the first has filled the memo."""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from e2e import jobkinds
from webhook import keys
from webhook.jsonpatch import apply_patch
from webhook.policy import (
    PolicyError,
    PolicySet,
    evaluate,
    load_policy_texts,
    operators,
    render_patch,
)
from webhook.policy.engine import TOPOLOGY_TOLERATION
from webhook.policy.outcome import evaluate_and_render, outcome_key

from .test_properties import JOB, LAUNCHER, MPIJOB, WORKER, label_values, policy_sets, spec

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _owner(obj: dict[str, Any], rv: str, workers: int = 4) -> dict[str, Any]:
    """A copy with a resourceVersion, as the API server returns it (equal rv: equal content)."""
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = f"{rv}-{workers}"
    for role in out["spec"].get("mpiReplicaSpecs", {}).values():
        if role.get("replicas", 1) != 1:
            role["replicas"] = workers
    return out


MPI_OWNERS = [_owner(MPIJOB, "1")]
LAUNCHER_OWNERS = [_owner(JOB, "2"), _owner(MPIJOB, "1")]


def _stored(obj: dict[str, Any], n: int) -> dict[str, Any]:
    obj["metadata"].update(uid=f"lws-{n}", resourceVersion=str(n))
    return obj


def _lws_pods() -> tuple[tuple[dict[str, Any], list[dict[str, Any]]], ...]:
    """A LeaderWorkerSet's group-1 leader and worker, with their owner chains."""
    lws = _stored(jobkinds.leaderworkerset("vllm", "team-a", groups=2, size=3), 1)
    leaders = _stored(operators.leader_statefulset(lws), 2)
    leader = _stored(operators.statefulset_pods(leaders)[1], 3)
    workers = _stored(operators.worker_statefulset(lws, leader, 1), 4)
    worker = operators.statefulset_pods(workers)[0]
    return ((copy.deepcopy(leader), [leaders, lws]), (worker, [workers, leader, leaders, lws]))


LWS_LEADER, LWS_WORKER = _lws_pods()

simple_match = st.sampled_from([
    {}, {"ownerKinds": ["kubeflow.org/MPIJob"]},
    {"podSelector": {"matchLabels": {"role": "worker"}}},
    {"podSelector": {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}},
    {"namespaceSelector": {"matchLabels": {"tier": "a"}}},
    {"namespaces": ["team-a"]}])


@st.composite
def rich_sets(draw: st.DrawFn) -> PolicySet:
    """Few policies that mostly match job pods, so that their gang/topology/istio/static-key
    writes are exercised."""
    docs = []
    for i in range(draw(st.integers(1, 3))):
        body = draw(spec(i))
        body["match"] = draw(simple_match)
        docs.append({"apiVersion": "muster.io/v1alpha1", "kind": "SchedulingPolicy",
                     "metadata": {"name": f"r{i}"}, "spec": body})
    try:
        return load_policy_texts({"p.yaml": yaml.safe_dump_all(docs)})
    except PolicyError:
        assume(False)
        raise


# Written out here, not imported from the memo: dropping a key there must make this test fail.
LABEL_KEYS = ["role", "tier", "team", "x", keys.COSCHEDULING_GROUP_LABEL,
              keys.LEGACY_COSCHEDULING_GROUP_LABEL, keys.ISTIO_INJECT, keys.ISTIO_DATAPLANE_MODE,
              # read from a pod of a known job: its LeaderWorkerSet group, its JobSet job
              "leaderworkerset.sigs.k8s.io/group-index", "apps.kubernetes.io/pod-index",
              "jobset.sigs.k8s.io/replicatedjob-name"]
ANNOTATION_KEYS = [
    "example.com/note", "x", keys.ANN_GPU_ASSIGNMENT, keys.ANN_POLICY, keys.ANN_GPU_TOPOLOGY,
    keys.ANN_GANG_NAME, keys.ANN_GANG_MIN_MEMBER, keys.ANN_GANG_TIMEOUT, keys.ANN_JOINED_GANG,
    keys.ANN_GANG_PREEMPTION, keys.VOLCANO_GROUP_ANNOTATION, keys.VOLCANO_QUEUE_ANNOTATION,
    keys.ISTIO_INJECT]
AFFINITIES = [
    None, {}, {"nodeAffinity": {}},
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": []}, {"matchExpressions": []}]}}},
    {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": []}}]}}]
TOLERATIONS = [None, [], [dict(TOPOLOGY_TOLERATION)],
               [{"key": "x", "operator": "Exists", "effect": "NoSchedule"}]]
SCHEDULERS = [None, "default-scheduler", "volcano", keys.DEFAULT_BINDER_SCHEDULER_NAME, "other"]


def fresh(pod: dict[str, Any], ns_labels: dict[str, str], owners: list[dict[str, Any]],
          ps: PolicySet) -> tuple[Any, ...]:
    # the workload memo under evaluate must not answer either: its key is under test too
    ps.index.workloads.clear()
    decision = evaluate(pod, namespace_labels=ns_labels, owners=owners, policies=ps)
    return decision, tuple(render_patch(pod, decision)) if decision.changes_pod else ()


def memo(pod: dict[str, Any], ns_labels: dict[str, str], owners: list[dict[str, Any]],
         ps: PolicySet) -> tuple[Any, ...]:
    """evaluate_and_render's (decision, ops), after checking its encoded patch against the ops."""
    decision, ops, patch_json = evaluate_and_render(pod, namespace_labels=ns_labels,
                                                    owners=owners, policies=ps)
    assert (json.loads(patch_json) if patch_json else []) == list(ops)
    return decision, ops


def _set(mapping: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        mapping.pop(key, None)
    else:
        mapping[key] = value


def mutate(  # noqa: PLR0917 (one call site, arguments named by position)
        pod: dict[str, Any], ns_labels: dict[str, str], owners: list[dict[str, Any]],
           field: str, key: str, wanted: Any, data: st.DataObject
           ) -> tuple[dict[str, Any], dict[str, str], list[dict[str, Any]]]:
    """A copy of the inputs with exactly one field (`key` of it, for maps) changed to a drawn
    value; `wanted` (the first pod's decision) supplies values the decision writes, so that
    'already set' cases come up."""
    pod, ns_labels, owners = copy.deepcopy(pod), dict(ns_labels), list(owners)
    meta, spec_ = pod["metadata"], pod["spec"]
    if field == "namespace":
        meta["namespace"] = data.draw(st.sampled_from(["team-a", "team-b", "team-c"]))
    elif field == "ns_label":
        _set(ns_labels, key, data.draw(st.sampled_from([None, "a"]) | label_values))
    elif field in ("label", "annotation"):
        written = (wanted.labels if field == "label" else wanted.annotations).get(key)
        group = wanted.pod_group.name if wanted.pod_group else None
        value = data.draw(st.sampled_from([None, written, group, "x", "1"]) | label_values)
        target = meta.get(field + "s")
        if not isinstance(target, dict):
            target = meta[field + "s"] = {}
        _set(target, key, value)
    elif field in ("labels_map", "annotations_map"):
        _set(meta, field.replace("_map", ""), data.draw(st.sampled_from([None, {}])))
    elif field == "scheduler":
        _set(spec_, "schedulerName", data.draw(st.sampled_from(SCHEDULERS)))
    elif field == "tolerations":
        _set(spec_, "tolerations", copy.deepcopy(data.draw(st.sampled_from(TOLERATIONS))))
    elif field == "affinity":
        choices = list(AFFINITIES)
        if wanted.node_affinity:
            choices.append({"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [dict(e) for e in wanted.node_affinity]}]}}})
        if wanted.node_preferences:
            choices.append({"nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    dict(t) for t in wanted.node_preferences[:1]]}})
        _set(spec_, "affinity", copy.deepcopy(data.draw(st.sampled_from(choices))))
    elif field == "owner_version":
        workers = data.draw(st.integers(0, 9))
        owners = [_owner(o, "9", workers) if o["kind"] == "MPIJob" else o for o in owners]
    elif field == "owner_ref":
        refs = meta.get("ownerReferences") or [{}]
        refs[0][key] = data.draw(st.sampled_from(["other", False, True]))
        meta["ownerReferences"] = refs
    elif field == "name":
        meta.pop("name", None)
        meta["generateName"] = "renamed-"
        if data.draw(st.booleans()):
            meta["name"] = "renamed-xyz"
    elif field == "containers":
        spec_["containers"][0]["resources"] = {"limits": {keys.GPU_RESOURCE: "7"}}
    else:
        spec_["priorityClassName"] = "urgent"
    return pod, ns_labels, owners


#: (field, key) of every change tried on each example
CHANGES = [("namespace", ""), *(("ns_label", k) for k in ("role", "tier", "x")),
           *(("label", k) for k in LABEL_KEYS), *(("annotation", k) for k in ANNOTATION_KEYS),
           ("labels_map", ""), ("annotations_map", ""), ("scheduler", ""), ("tolerations", ""),
           ("affinity", ""), ("owner_version", ""),
           *(("owner_ref", k) for k in ("uid", "name", "controller")),
           ("name", ""), ("containers", ""), ("priority_class", "")]


@SETTINGS
@given(pod=st.sampled_from([(WORKER, MPI_OWNERS), (LAUNCHER, LAUNCHER_OWNERS),
                            (LAUNCHER, [LAUNCHER_OWNERS[0]]), (WORKER, []), LWS_LEADER,
                            LWS_WORKER]),
       ps=st.one_of(policy_sets(), rich_sets()),
       ns_labels=st.dictionaries(st.sampled_from(["role", "tier", "kubernetes.io/metadata.name"]),
                                 label_values, max_size=2),
       namespace=st.sampled_from(["team-a", "team-b"]), data=st.data())
def test_memo_equals_fresh_evaluation(pod: tuple[dict[str, Any], list[dict[str, Any]]],
                                      ps: PolicySet, ns_labels: dict[str, str],
                                      namespace: str, data: st.DataObject) -> None:
    first, owners = copy.deepcopy(pod[0]), pod[1]
    first["metadata"]["namespace"] = namespace
    want = fresh(first, ns_labels, owners, ps)
    if data.draw(st.booleans(), label="already mutated"):  # our own keys present
        first = apply_patch(first, list(want[1]))
        want = fresh(first, ns_labels, owners, ps)
    assert memo(first, ns_labels, owners, ps) == want
    # the same again: from the memo when the pod is on the job path
    assert memo(first, ns_labels, owners, ps) == want
    for field, key in CHANGES:
        other, other_ns, other_owners = mutate(first, ns_labels, owners, field, key, want[0],
                                               data)
        assert memo(other, other_ns, other_owners, ps) == fresh(other, other_ns, other_owners,
                                                                ps)


def test_pods_of_one_job_share_one_entry() -> None:
    ps = load_policy_texts({"p.yaml": (
        "apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: g}\n"
        "spec:\n  match: {ownerKinds: [kubeflow.org/MPIJob]}\n"
        "  gang: {backend: volcano, minAvailable: auto}\n")})
    keys_seen = set()
    for i in range(4):
        pod = copy.deepcopy(WORKER)
        pod["metadata"]["name"] = f"tensorflow-topo-4-vgg16-worker-{i}"
        pod["metadata"]["labels"]["training.kubeflow.org/replica-index"] = str(i)
        keys_seen.add(outcome_key(pod, {}, MPI_OWNERS, ps))
        decision, ops = memo(pod, {}, MPI_OWNERS, ps)
        assert decision.pod_group is not None and decision.pod_group.min_member == 5
        assert ops
    assert len(keys_seen) == 1 and None not in keys_seen
    assert len(ps.index.outcomes) == 1
    # a bare pod (its name is the gang's) is never remembered
    bare = copy.deepcopy(WORKER)
    del bare["metadata"]["ownerReferences"]
    assert outcome_key(bare, {}, [], ps) is None
