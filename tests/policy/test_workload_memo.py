"""The WorkloadMemo (pods whose job object is known) gives exactly the fresh analysis, for
any pod sharing the memo key: the key holds everything the owner-chain walk reads."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.policy.workload import Workload, WorkloadMemo, chain_key, workload_of

MEMO = WorkloadMemo()  # one for the whole test: entries from earlier examples must not leak


def memoised(pod: dict[str, Any], owners: list[dict[str, Any]]) -> Workload:
    return MEMO.workload(pod, owners, chain_key(pod, owners))

KINDS = [("kubeflow.org/v2beta1", "MPIJob"), ("batch/v1", "Job"),
         ("kubeflow.org/v1", "PyTorchJob"), ("apps/v1", "ReplicaSet"), ("v1", "Pod")]


def _job(api_version: str, kind: str, name: str, *, uid: str, rv: str, workers: int,
         parent: dict[str, Any] | None) -> dict[str, Any]:
    template = {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "uid": uid,
                            "resourceVersion": rv}
    if parent is not None:
        meta["ownerReferences"] = [parent]
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": {
        "parallelism": workers,
        "mpiReplicaSpecs": {"Launcher": {"replicas": 1, "template": template},
                            "Worker": {"replicas": workers, "template": template}},
        "pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template}}}}


refs = st.builds(
    lambda kind, name, uid, controller: {"apiVersion": kind[0], "kind": kind[1], "name": name,
                                         "uid": uid, "controller": controller},
    st.sampled_from(KINDS), st.sampled_from(["j", "k"]), st.sampled_from(["u1", "u2"]),
    st.sampled_from([True, False, None]))


@settings(max_examples=300, deadline=None)
@given(pod_refs=st.lists(refs, max_size=2), owner_specs=st.lists(st.tuples(
    st.sampled_from(KINDS), st.sampled_from(["j", "k"]), st.sampled_from(["u1", "u2"]),
    st.sampled_from(["1", "2"]), st.integers(0, 3), st.none() | refs), max_size=2),
    labels=st.dictionaries(st.sampled_from([
        "training.kubeflow.org/job-name", "training.kubeflow.org/operator-name", "x"]),
        st.sampled_from(["j", "mpi-operator"]), max_size=3),
    gpus=st.sampled_from(["0", "1", "4"]), name=st.sampled_from(["p-0", "p-1"]),
    data=st.data())
def test_memo_equals_fresh_analysis(  # noqa: PLR0917 (hypothesis passes strategies by name)
        pod_refs: list[dict[str, Any]], owner_specs: list[tuple[Any, ...]],
        labels: dict[str, str], gpus: str, name: str, data: st.DataObject) -> None:
    # as the API server guarantees, equal (uid, resourceVersion) means equal content
    owners = [_job(k[0], k[1], n, uid=uid, rv=repr((k, n, rv, workers, parent)),
                   workers=workers, parent=parent)
              for k, n, uid, rv, workers, parent in owner_specs]
    pod = {"metadata": {"name": name, "labels": labels, "ownerReferences": pod_refs},
           "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": gpus}}}]}}
    assert memoised(pod, owners) == workload_of(pod, owners)
    # another pod with the same references and owners, different everywhere else
    other = copy.deepcopy(pod)
    other["metadata"].update(name="q-9", labels={"x": "y"})
    other["spec"] = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "7"}}}]}
    assert memoised(other, owners) == workload_of(other, owners)
    # a pod whose references differ in one field from a memoised one is not taken for it
    if pod_refs:
        variant = copy.deepcopy(pod)
        ref = variant["metadata"]["ownerReferences"][data.draw(st.integers(0, len(pod_refs) - 1))]
        field = data.draw(st.sampled_from(["controller", "name", "uid", "kind", "apiVersion"]))
        ref[field] = data.draw(refs)[field]
        assert memoised(variant, owners) == workload_of(variant, owners)


def test_references_of_other_types_are_analysed_not_memoised() -> None:
    owner = _job("batch/v1", "Job", "j", uid="u1", rv="1", workers=2, parent=None)
    for odd in (["batch/v1"], {"a": 1}, 5):
        pod = {"metadata": {"ownerReferences": [
            {"apiVersion": odd, "kind": "Job", "name": "j", "uid": "u1", "controller": True}]}}
        assert memoised(pod, [owner]) == workload_of(pod, [owner])
