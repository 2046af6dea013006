"""A gang's network request: from the policy, or the job's Kueue / KAI / Volcano annotations it
honours."""

from __future__ import annotations

import json
from typing import Any

import pytest

from webhook import keys
from webhook.cli import main
from webhook.demo import EXAMPLE_POLICIES
from webhook.policy import PolicyError, PolicySet
from webhook.policy.decision import Decision

from .conftest import Policies, deep, policy
from .test_engine import run

RACK, BLOCK, CLIQUE = "example.com/rack", "example.com/block", "nvidia.com/gpu.clique"
VOLCANO_MODE, VOLCANO_TIER = (keys.VOLCANO_NETWORK_TOPOLOGY_MODE,
                              keys.VOLCANO_NETWORK_TOPOLOGY_HIGHEST_TIER)


def muster(network: str = "", name: str = "net") -> str:
    return policy(name, "match:\n  ownerKinds: [kubeflow.org/MPIJob]\ngang:\n  backend: muster\n"
                  "topology:\n  mode: preferred\n" + network)


def with_annotations(pod: dict[str, Any], **ann: str) -> dict[str, Any]:
    pod = deep(pod)
    pod["metadata"].setdefault("annotations", {}).update(ann)
    return pod


def asked(pod: dict[str, Any]) -> Any:
    return json.loads(pod["metadata"]["annotations"][keys.ANN_GPU_TOPOLOGY]).get("network")


def decide(pod: dict[str, Any], mpijob: dict[str, Any], ps: PolicySet) -> tuple[Decision, Any]:
    return run(pod, [mpijob], ps)


def test_the_policy_level_and_slices_reach_the_binder(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    ps = policies(muster(f"  network:\n    required: {RACK}\n    slice: {{level: {CLIQUE}, "
                         "size: 4}"))
    d, pod = decide(worker_pod, mpijob, ps)
    assert asked(pod) == {"level": RACK, "mode": "required", "sliceLevel": CLIQUE, "sliceSize": 4}
    assert d.network == (f"network: required {RACK}; slices of 4 pods, each within one {CLIQUE}"
                         " (from policy net)")


@pytest.mark.parametrize(("ann", "want"), [
    ({keys.KUEUE_REQUIRED_TOPOLOGY: RACK}, {"level": RACK, "mode": "required"}),
    ({keys.KUEUE_PREFERRED_TOPOLOGY: BLOCK}, {"level": BLOCK, "mode": "preferred"}),
    ({keys.KAI_REQUIRED_PLACEMENT: RACK}, {"level": RACK, "mode": "required"}),
    ({keys.KAI_PREFERRED_PLACEMENT: BLOCK}, {"level": BLOCK, "mode": "preferred"}),
    ({keys.KUEUE_PREFERRED_TOPOLOGY: BLOCK, keys.KUEUE_SLICE_REQUIRED_TOPOLOGY: CLIQUE,
      keys.KUEUE_SLICE_SIZE: "4"},
     {"level": BLOCK, "mode": "preferred", "sliceLevel": CLIQUE, "sliceSize": 4}),
    # KAI's two together: the preferred level, within one domain of the required one
    ({keys.KAI_REQUIRED_PLACEMENT: BLOCK, keys.KAI_PREFERRED_PLACEMENT: RACK},
     {"level": RACK, "mode": "preferred", "maxLevel": BLOCK}),
    ({keys.KAI_REQUIRED_PLACEMENT: RACK, keys.KAI_PREFERRED_PLACEMENT: RACK},
     {"level": RACK, "mode": "required"}),
    # KAI's segments are slices; its soft ones, preferred slices
    ({keys.KAI_REQUIRED_PLACEMENT: BLOCK, keys.KAI_SEGMENT_SIZE: "4",
      keys.KAI_SEGMENT_REQUIRED_PLACEMENT: CLIQUE},
     {"level": BLOCK, "mode": "required", "sliceLevel": CLIQUE, "sliceSize": 4}),
    ({keys.KAI_SEGMENT_SIZE: "8", keys.KAI_SEGMENT_PREFERRED_PLACEMENT: RACK},
     {"level": CLIQUE, "mode": "preferred", "sliceLevel": RACK, "sliceSize": 8,
      "sliceMode": "preferred"}),
    # Volcano's hard: one domain of at most the highest tier, the narrowest first (tier 1
    # alone: required; hard is its default mode); soft: the narrowest that fits, then wider,
    # the highest tier unread (as Volcano reads none there)
    ({VOLCANO_MODE: "hard", VOLCANO_TIER: "2"},
     {"level": "tier:1", "mode": "preferred", "maxLevel": "tier:2"}),
    ({VOLCANO_MODE: "hard", VOLCANO_TIER: "1"}, {"level": "tier:1", "mode": "required"}),
    ({VOLCANO_TIER: "3"}, {"level": "tier:1", "mode": "preferred", "maxLevel": "tier:3"}),
    ({VOLCANO_TIER: "0"}, {"level": keys.HOSTNAME_LABEL, "mode": "required"}),  # one node
    ({VOLCANO_MODE: "soft", VOLCANO_TIER: "1"}, {"level": "tier:1", "mode": "preferred"}),
])
def test_kueue_kai_and_volcano_annotations_mean_the_same(
        ann: dict[str, str], want: dict[str, Any], worker_pod: dict[str, Any],
        mpijob: dict[str, Any], policies: Policies) -> None:
    ps = policies(muster(f"  network:\n    preferred: {CLIQUE}"))
    d, pod = decide(with_annotations(worker_pod, **ann), mpijob, ps)
    assert asked(pod) == want
    assert d.network is not None and "honoured by policy net" in d.network
    assert next(iter(ann)) in d.network


@pytest.mark.parametrize(("ann", "warning"), [
    ({VOLCANO_MODE: "hard"}, f"hard needs a {VOLCANO_TIER} (a whole number)"),
    ({VOLCANO_MODE: "hard", VOLCANO_TIER: "-1"}, f"hard needs a {VOLCANO_TIER} (a whole"),
    ({VOLCANO_MODE: "hard", VOLCANO_TIER: "\u00b2"}, f"hard needs a {VOLCANO_TIER} (a whole"),
    ({VOLCANO_MODE: "strict", VOLCANO_TIER: "2"}, "'strict' is not hard or soft"),
])
def test_volcano_annotations_that_cannot_be_used_are_warned_about(
        ann: dict[str, str], warning: str, worker_pod: dict[str, Any],
        mpijob: dict[str, Any], policies: Policies) -> None:
    d, pod = decide(with_annotations(worker_pod, **ann), mpijob, policies(muster()))
    assert asked(pod) is None
    assert any(warning in w for w in d.warnings), d.warnings


def test_explain_counts_volcanos_tiers_up_from_the_narrowest_level(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    pod = with_annotations(worker_pod, **{VOLCANO_TIER: "2"})
    d, _ = decide(pod, mpijob, policies(muster()))
    assert d.network == (
        "network: preferred tier 1 within one tier 2 (the binder's HyperNode tiers, or its "
        "levels counted up from the narrowest, tier 1) (from the pod's "
        f"{VOLCANO_TIER}, honoured by policy net)")


def test_kueue_and_kai_levels_are_read_before_volcanos(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    for first in (keys.KUEUE_REQUIRED_TOPOLOGY, keys.KAI_REQUIRED_PLACEMENT):
        pod = with_annotations(worker_pod, **{first: RACK, VOLCANO_MODE: "soft"})
        d, mutated = decide(pod, mpijob, policies(muster()))
        assert asked(mutated) == {"level": RACK, "mode": "required"}
        assert f"{VOLCANO_MODE} ignored: {first} is read first" in d.warnings


def test_a_segment_size_in_other_digits_is_warned_about_not_a_crash(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    # "²" is a digit to str.isdigit, and int() refuses it
    pod = with_annotations(worker_pod, **{keys.KAI_SEGMENT_SIZE: "\u00b2",
                                          keys.KAI_SEGMENT_REQUIRED_PLACEMENT: RACK})
    d, mutated = decide(pod, mpijob, policies(muster()))
    assert asked(mutated) is None
    assert any("(more than 1)" in w for w in d.warnings)


def test_the_job_objects_annotations_count_the_pods_win(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    """KAI reads its annotations on the workload itself: on the MPIJob, they mean the same as
    on the pod template; where both carry a key, the pod's value wins."""
    job = deep(mpijob)
    job["metadata"].setdefault("annotations", {}).update({
        keys.KAI_REQUIRED_PLACEMENT: BLOCK, keys.KAI_PREFERRED_PLACEMENT: RACK,
        keys.KAI_SEGMENT_SIZE: "2", keys.KAI_SEGMENT_REQUIRED_PLACEMENT: CLIQUE})
    ps = policies(muster())
    d, pod = decide(worker_pod, job, ps)
    assert asked(pod) == {"level": RACK, "mode": "preferred", "maxLevel": BLOCK,
                          "sliceLevel": CLIQUE, "sliceSize": 2}
    assert d.network == (
        f"network: preferred {RACK} within one {BLOCK}; slices of 2 pods, each within one "
        f"{CLIQUE} (from the job's {keys.KAI_REQUIRED_PLACEMENT}, {keys.KAI_PREFERRED_PLACEMENT}"
        f", {keys.KAI_SEGMENT_SIZE}, {keys.KAI_SEGMENT_REQUIRED_PLACEMENT}, honoured by policy "
        "net)")
    d, pod = decide(with_annotations(worker_pod, **{keys.KAI_SEGMENT_SIZE: "4"}), job, ps)
    assert asked(pod)["sliceSize"] == 4
    assert d.network is not None and f"the pod's {keys.KAI_SEGMENT_SIZE} and the job's" in \
        d.network


def test_the_policy_may_give_both_levels_and_preferred_slices(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    ps = policies(muster(f"  network:\n    required: {BLOCK}\n    preferred: {RACK}\n"
                         f"    slice: {{level: {CLIQUE}, size: 4, mode: preferred}}"))
    d, pod = decide(worker_pod, mpijob, ps)
    assert asked(pod) == {"level": RACK, "mode": "preferred", "maxLevel": BLOCK,
                          "sliceLevel": CLIQUE, "sliceSize": 4, "sliceMode": "preferred"}
    assert d.network == (f"network: preferred {RACK} within one {BLOCK}; slices of 4 pods, "
                         f"preferably within one {CLIQUE} (from policy net)")
    # the job's level replaces the policy's whole, its bound too
    _, pod = decide(with_annotations(worker_pod, **{keys.KUEUE_PREFERRED_TOPOLOGY: CLIQUE}),
                    mpijob, ps)
    assert asked(pod) == {"level": CLIQUE, "mode": "preferred", "sliceLevel": CLIQUE,
                          "sliceSize": 4, "sliceMode": "preferred"}


def test_kueues_unconstrained_pod_set_replaces_the_policys_level(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    """kueue.x-k8s.io/podset-unconstrained-topology: "true": no level, each member where it
    fits best (Kueue's LeastFreeCapacity); "false" is as if it were not there."""
    ps = policies(muster(f"  network:\n    required: {BLOCK}\n    preferred: {RACK}"))
    d, pod = decide(with_annotations(worker_pod, **{keys.KUEUE_UNCONSTRAINED_TOPOLOGY: "true"}),
                    mpijob, ps)
    assert asked(pod) == {"unconstrained": True}
    assert d.network == (
        "network: unconstrained (no level: each member where it fits best, filling gaps) "
        f"(from the pod's {keys.KUEUE_UNCONSTRAINED_TOPOLOGY}, honoured by policy net)")
    _, pod = decide(with_annotations(worker_pod, **{keys.KUEUE_UNCONSTRAINED_TOPOLOGY: "False"}),
                    mpijob, ps)
    assert asked(pod) == {"level": RACK, "mode": "preferred", "maxLevel": BLOCK}


@pytest.mark.parametrize(("network", "ann", "want", "warning"), [
    # Kueue's levels are read first (Kueue refuses both together)
    ("", {keys.KUEUE_UNCONSTRAINED_TOPOLOGY: "true", keys.KUEUE_REQUIRED_TOPOLOGY: RACK},
     {"level": RACK, "mode": "required"},
     f"{keys.KUEUE_UNCONSTRAINED_TOPOLOGY} ignored: {keys.KUEUE_REQUIRED_TOPOLOGY} is read "
     "first"),
    # a slice keeps its members together: the policy's level stays
    (f"  network:\n    preferred: {BLOCK}\n    slice: {{level: {CLIQUE}, size: 4}}",
     {keys.KUEUE_UNCONSTRAINED_TOPOLOGY: "true"},
     {"level": BLOCK, "mode": "preferred", "sliceLevel": CLIQUE, "sliceSize": 4},
     f"{keys.KUEUE_UNCONSTRAINED_TOPOLOGY} ignored: the gang has slices"),
    ("", {keys.KUEUE_UNCONSTRAINED_TOPOLOGY: "yes"}, None, "is not \"true\" or \"false\""),
])
def test_an_unconstrained_pod_set_that_cannot_be_is_warned_about(
        network: str, ann: dict[str, str], want: dict[str, Any] | None, warning: str, *,
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    d, pod = decide(with_annotations(worker_pod, **ann), mpijob, policies(muster(network)))
    assert asked(pod) == want
    assert any(warning in w for w in d.warnings), d.warnings


def test_annotations_are_honoured_without_a_network_section(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    _, pod = decide(with_annotations(worker_pod, **{keys.KUEUE_REQUIRED_TOPOLOGY: RACK}),
                    mpijob, policies(muster()))
    assert asked(pod) == {"level": RACK, "mode": "required"}


def test_a_policy_that_ignores_them_decides_alone(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    ps = policies(muster(f"  network:\n    preferred: {BLOCK}\n    jobAnnotations: ignore"))
    d, pod = decide(with_annotations(worker_pod, **{keys.KUEUE_REQUIRED_TOPOLOGY: RACK}),
                    mpijob, ps)
    assert asked(pod) == {"level": BLOCK, "mode": "preferred"}
    assert d.network is not None and "ignores the pod's " + keys.KUEUE_REQUIRED_TOPOLOGY in \
        d.network


def test_bad_annotations_are_warned_about_and_ignored(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    pod = with_annotations(worker_pod, **{keys.KUEUE_REQUIRED_TOPOLOGY: "not a label!",
                                          keys.KUEUE_SLICE_SIZE: "4"})
    d, mutated = decide(pod, mpijob, policies(muster()))
    assert asked(mutated) is None
    assert any("not a node label key" in w for w in d.warnings)
    assert any("go together" in w for w in d.warnings)


@pytest.mark.parametrize(("ann", "warning"), [
    ({keys.KAI_SEGMENT_SIZE: "1", keys.KAI_SEGMENT_REQUIRED_PLACEMENT: RACK}, "(more than 1)"),
    ({keys.KAI_SEGMENT_SIZE: "4"}, "(more than 1)"),
    ({keys.KUEUE_REQUIRED_TOPOLOGY: RACK, keys.KAI_PREFERRED_PLACEMENT: BLOCK},
     f"{keys.KAI_PREFERRED_PLACEMENT} ignored: {keys.KUEUE_REQUIRED_TOPOLOGY} is read first"),
    ({keys.KUEUE_SLICE_REQUIRED_TOPOLOGY: RACK, keys.KUEUE_SLICE_SIZE: "2",
      keys.KAI_SEGMENT_SIZE: "4"},
     f"{keys.KAI_SEGMENT_SIZE} ignored: {keys.KUEUE_SLICE_REQUIRED_TOPOLOGY} is read first"),
])
def test_kai_annotations_that_cannot_be_used_are_warned_about(
        ann: dict[str, str], warning: str, worker_pod: dict[str, Any],
        mpijob: dict[str, Any], policies: Policies) -> None:
    d, _ = decide(with_annotations(worker_pod, **ann), mpijob, policies(muster()))
    assert any(warning in w for w in d.warnings), d.warnings


def test_kais_topology_names_the_levels_of_the_kai_annotations_honoured(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    ps = policies(muster(f"  network:\n    preferred: {CLIQUE}"))
    ann = {keys.KAI_TOPOLOGY: "gb200", keys.KAI_REQUIRED_PLACEMENT: "rack"}
    d, pod = decide(with_annotations(worker_pod, **ann), mpijob, ps)
    assert asked(pod) == {"level": "rack", "mode": "required", "topology": "kai:gb200"}
    assert d.network == (
        "network: required rack (the levels of KAI Topology gb200, where the binder reads KAI's "
        f"Topologies) (from the pod's {keys.KAI_TOPOLOGY}, {keys.KAI_REQUIRED_PLACEMENT}, "
        "honoured by policy net)")
    # segments alone name it too
    segments = {keys.KAI_TOPOLOGY: "gb200", keys.KAI_SEGMENT_SIZE: "4",
                keys.KAI_SEGMENT_REQUIRED_PLACEMENT: CLIQUE}
    _, pod = decide(with_annotations(worker_pod, **segments), mpijob, ps)
    assert asked(pod)["topology"] == "kai:gb200"
    # the policy's level, or Kueue's, is no KAI Topology's
    for other in ({}, {keys.KUEUE_REQUIRED_TOPOLOGY: RACK}):
        d, pod = decide(with_annotations(worker_pod, **{keys.KAI_TOPOLOGY: "gb200", **other}),
                        mpijob, ps)
        assert "topology" not in asked(pod)
    # a name that is no object's name is warned about, and the binder's levels decide
    bad = {keys.KAI_TOPOLOGY: "GB_200", keys.KAI_REQUIRED_PLACEMENT: "rack"}
    d, pod = decide(with_annotations(worker_pod, **bad), mpijob, ps)
    assert asked(pod) == {"level": "rack", "mode": "required"}
    assert any("'GB_200' is not a Topology's name; ignored" in w for w in d.warnings)


def test_without_a_topology_policy_no_request_reaches_the_binder(
        worker_pod: dict[str, Any], mpijob: dict[str, Any], policies: Policies) -> None:
    forged = json.dumps({"v": 1, "mode": "required", "network": {"level": RACK}})
    pod = with_annotations(worker_pod, **{keys.ANN_GPU_TOPOLOGY: forged})
    ps = policies(policy("g", "match:\n  ownerKinds: [kubeflow.org/MPIJob]\ngang:\n"
                              "  backend: muster"))
    d, mutated = decide(pod, mpijob, ps)
    assert keys.ANN_GPU_TOPOLOGY not in mutated["metadata"]["annotations"]
    assert d.network is None


@pytest.mark.parametrize(("network", "error"), [
    (f"  network:\n    slice: {{level: {CLIQUE}, size: 2, mode: soft}}", "'required' or"),
    ("  network:\n    required: 'not a label!'", "not a valid label"),
    (f"  network:\n    slice: {{level: {CLIQUE}, size: 0}}", "greater than or equal to 1"),
])
def test_network_fields_that_cannot_be_used(network: str, error: str,
                                            policies: Policies) -> None:
    with pytest.raises(PolicyError, match=error):
        policies(muster(network))


def test_mode_off_with_a_network_is_a_contradiction(policies: Policies) -> None:
    text = policy("off", f"gang:\n  backend: muster\ntopology:\n  mode: 'off'\n  network:\n"
                         f"    required: {RACK}")
    with pytest.raises(PolicyError, match="network would have no effect"):
        policies(text)


def test_explain_says_which_level_the_gang_asks_for_and_why(
        capsys: pytest.CaptureFixture[str]) -> None:
    objects = EXAMPLE_POLICIES / "tests" / "objects"
    code = main(["policy", "explain", "-p", str(EXAMPLE_POLICIES),
                 str(objects / "indexed-job-pod.yaml"), "--owner",
                 str(objects / "indexed-job.yaml"), "--namespace-labels",
                 "kubernetes.io/metadata.name=team-d,muster.io/network=rack"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "  network: required network.topology.nvidia.com/leaf (from policy network-rack)" \
        in out
