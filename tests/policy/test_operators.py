"""A job as submitted, expanded into the pods its operator and controllers create: the pods
`muster policy explain | test` show for a job manifest. Each pod gets the decision admission
gives the pods captured from a cluster, and every pod of one job joins one gang."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.demo import EXAMPLE_POLICIES
from webhook.policy import evaluate, load_policies, operators

OBJECTS = EXAMPLE_POLICIES / "tests/objects"
POLICIES = load_policies([EXAMPLE_POLICIES])


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((OBJECTS / name).read_text())
    return data


def _name(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return str(meta.get("name") or meta["generateName"] + "*")


#: job file → (pod, its owners' kinds, gang and minMember or None) for each pod, in order
EXPECTED: dict[str, list[tuple[str, str, tuple[str, int] | None]]] = {
    "mpijob-team-a.yaml": [
        ("tensorflow-topo-4-vgg16-launcher-*", "Job MPIJob", ("tensorflow-topo-4-vgg16", 5)),
        *((f"tensorflow-topo-4-vgg16-worker-{i}", "MPIJob", ("tensorflow-topo-4-vgg16", 5))
          for i in range(4))],
    "pytorchjob-elastic.yaml": [
        (f"elastic-bert-worker-{i}", "PyTorchJob", ("elastic-bert", 2)) for i in range(4)],
    "lws-vllm.yaml": [
        p for g in range(2) for p in [
            (f"vllm-{g}", "StatefulSet LeaderWorkerSet", (f"vllm-{g}", 4)),
            *((f"vllm-{g}-{i}", "StatefulSet Pod StatefulSet LeaderWorkerSet", (f"vllm-{g}", 4))
              for i in range(3))]],
    "jobset-llm.yaml": [
        ("llm-driver-0-0-*", "Job JobSet", ("llm", 9)),
        *((f"llm-workers-{j}-{i}-*", "Job JobSet", ("llm", 9))
          for j in range(2) for i in range(4))],
    "trainjob-bert.yaml": [  # the initializer completes before the gang starts: not in it
        ("bert-dataset-initializer-0-0-*", "Job JobSet TrainJob", None),
        *((f"bert-node-0-{i}-*", "Job JobSet TrainJob", ("bert", 4)) for i in range(4))],
    "indexed-job.yaml": [(f"ranks-{i}-*", "Job", ("ranks", 4)) for i in range(4)],
    "batch-job.yaml": [("nightly-eval-*", "Job", None)] * 2,  # no policy gangs it
}


@pytest.mark.parametrize("file", sorted(EXPECTED))
def test_each_kind_expands_into_the_pods_its_controllers_create(file: str) -> None:
    found = []
    for made in operators.expand(_load(file)):
        decision = evaluate(made.pod, namespace_labels={}, owners=list(made.owners),
                            policies=POLICIES)
        group = decision.pod_group
        found.append((_name(made.pod), " ".join(o["kind"] for o in made.owners),
                      (group.name, group.min_member) if group else None))
        # each owner is the controller of the object below it
        for child, owner in zip((made.pod, *made.owners), made.owners, strict=False):
            (ref,) = child["metadata"]["ownerReferences"]
            assert ref["uid"] == owner["metadata"]["uid"] and ref["controller"] is True
    assert found == EXPECTED[file]


@pytest.mark.parametrize(("pod", "owners"), [
    ("worker-team-a.yaml", ["mpijob-team-a.yaml"]),
    ("launcher-team-a.yaml", ["launcher-job.yaml", "mpijob-team-a.yaml"])])
def test_an_mpijobs_pods_are_decided_as_the_captured_ones(pod: str, owners: list[str]) -> None:
    """The pods the MPI operator and the Job controller really created (captured requests)
    and the expanded ones get the same policies and the same gang."""
    captured = evaluate(_load(pod), namespace_labels={}, owners=[_load(o) for o in owners],
                        policies=POLICIES)
    role = "launcher" if "launcher" in pod else "worker"
    made = next(m for m in operators.expand(_load("mpijob-team-a.yaml"))
                if m.pod["metadata"]["labels"][operators.JOB_ROLE_LABEL] == role)
    expanded = evaluate(made.pod, namespace_labels={}, owners=list(made.owners),
                        policies=POLICIES)
    assert expanded.policies == captured.policies
    assert expanded.pod_group == captured.pod_group is not None


def test_a_manifest_not_created_yet_gets_stand_in_uids() -> None:
    """No uid yet (the API server gives it at creation): the job gets one derived from its kind
    and name, the same every time, so its gang has an owner and the output is stable."""
    job = _load("pytorchjob-elastic.yaml")
    del job["metadata"]["uid"]
    first, again = operators.expand(job), operators.expand(job)
    uid = first[0].owners[0]["metadata"]["uid"]
    assert uid and uid == again[0].owners[0]["metadata"]["uid"]
    assert "uid" not in job["metadata"]  # the manifest itself is left alone
    decision = evaluate(first[0].pod, namespace_labels={}, owners=list(first[0].owners),
                        policies=POLICIES)
    assert decision.pod_group is not None and decision.pod_group.owner is not None
    assert decision.pod_group.owner.uid == uid


def test_a_job_without_a_name_cannot_be_expanded() -> None:
    job = _load("indexed-job.yaml")
    del job["metadata"]["name"]
    with pytest.raises(ValueError, match=r"the batch/Job has no metadata\.name"):
        operators.expand(job)


_SCALARS = st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=3)
_FIELDS = ["metadata", "spec", "name", "replicas", "template", "mpiReplicaSpecs", "Worker",
           "Launcher", "pytorchReplicaSpecs", "replicatedJobs", "leaderWorkerTemplate", "size",
           "workerTemplate", "trainer", "numNodes", "parallelism", "completions", "labels"]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["kubeflow.org/v2beta1 MPIJob", "kubeflow.org/v1 PyTorchJob",
                        "kubeflow.org/v1 TFJob", "batch/v1 Job", "jobset.x-k8s.io/v1alpha2 JobSet",
                        "trainer.kubeflow.org/v1alpha1 TrainJob",
                        "leaderworkerset.x-k8s.io/v1 LeaderWorkerSet"]),
       st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(_FIELDS), inner, max_size=4),
                    max_leaves=25))
def test_any_manifest_expands_or_says_why(kind: str, spec: Any) -> None:
    """A hand-written manifest may hold anything: pods, or a ValueError that names the
    problem, never a crash."""
    api_version, name = kind.split()
    job = {"apiVersion": api_version, "kind": name, "metadata": {"name": "j"}, "spec": spec}
    for made in operators.expand(job):
        assert made.pod["kind"] == "Pod" and made.owners


def test_expanding_leaves_the_manifest_as_it_was() -> None:
    job = _load("lws-vllm.yaml")
    text = yaml.safe_dump(job)
    operators.expand(job)
    assert yaml.safe_dump(job) == text
