"""Policy decision cost vs. parsing the request, in one run (issue 2).

    .venv/bin/python bench/bench_engine.py [--rounds 7]

Baseline: `json.loads` of the real captured AdmissionReview of the MPI worker
(../shared/fixtures/admission/pod-create-worker.json), the least work any webhook does per
request. Measured: what admission does for a pod the outcome memo has not seen (50 policies):
the pod's view (`view_of`), the decision on it (`decide`) and its patch (`render`), on the pod of
that same request,
with its MPIJob as owner (as the admission server passes it from its cache).

Two policy sets of 50:
- realistic: the shipped examples + team policies up to 50, each scoped to another namespace
  (one team per namespace, the usual way admins split policies); the worker matches 2 of them
  (mpi-volcano, and istio-optout-mpi-jobs, which opts whole MPI jobs out of Istio).
- audited: the realistic set with mpi-volcano, which the worker matches, in audit mode: the
  engine decides once more for it (what it would do); the enforce-only sets never do.
- adversarial: 50 policies that all must be examined to the end (no namespace scope, each with a
  pod selector and owner kinds, 10 of them matching, merged by priority).

Each round times the baseline and then each engine case right after it (best of 3 batches), so
that load from other processes on a shared machine hits both alike; the ratio is taken per
round and the median over the rounds is reported, with the best times seen.
Target: ratio engine / json.loads <= 1.0.

Before timing, the bench checks each set's decision (the policies applied, the gang, the
audit, a non-empty patch) and fails with what differs: a ratio of work not done means nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
sys.path.insert(0, str(REPO))

from webhook.demo import EXAMPLE_POLICIES  # noqa: E402
from webhook.policy import (  # noqa: E402 (runnable without installing the package)
    PolicySet,
    load_policy_texts,
)
from webhook.policy.decision import Decision  # noqa: E402
from webhook.policy.engine import decide  # noqa: E402
from webhook.policy.patch import render  # noqa: E402
from webhook.policy.podview import view_of  # noqa: E402


def _doc(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "muster.io/v1alpha1", "kind": "SchedulingPolicy",
            "metadata": {"name": name}, "spec": spec}


def realistic(audited: str = "") -> PolicySet:
    texts = {p.name: p.read_text() for p in EXAMPLE_POLICIES.glob("*.yaml")}
    if audited:
        texts[f"{audited}.yaml"] = texts[f"{audited}.yaml"].replace(
            "\nspec:\n", "\nspec:\n  enforcement: audit\n", 1)
    docs = []
    for i in range(50 - len(load_policy_texts(texts))):
        backend = ("volcano", "coscheduling", "muster")[i % 3]
        gang: dict[str, Any] = {"backend": backend, "minAvailable": "auto"}
        if backend == "volcano":
            gang["queue"] = f"queue-{i}"
        spec: dict[str, Any] = {"match": {"namespaces": [f"team-{i}"],
                                          "ownerKinds": ["kubeflow.org/MPIJob", "batch/Job"]},
                                "gang": gang, "labels": {"team": f"t{i}"}}
        if backend == "muster":
            spec["topology"] = {"mode": "preferred"}
        docs.append(_doc(f"team-{i}", spec))
    texts["teams.yaml"] = yaml.safe_dump_all(docs)
    policies = load_policy_texts(texts)
    assert len(policies) == 50, len(policies)
    return policies


def adversarial() -> PolicySet:
    docs = []
    for i in range(50):
        matching = i % 5 == 0
        role = "worker" if matching else "launcher"
        spec: dict[str, Any] = {
            "priority": i,
            "match": {"podSelector": {"matchLabels": {"training.kubeflow.org/job-role": role},
                                      "matchExpressions": [{"key": "tier", "operator":
                                                            "DoesNotExist"}]},
                      "ownerKinds": ["kubeflow.org/MPIJob"], "gpus": {"min": 1}},
            "annotations": {f"example.com/p{i}": "x"}}
        if i == 45:
            spec["gang"] = {"backend": "volcano", "queue": "research"}
        docs.append(_doc(f"p{i}", spec))
    policies = load_policy_texts({"adversarial.yaml": yaml.safe_dump_all(docs)})
    assert len(policies) == 50
    return policies


#: per set: the policies the worker's decision applies, whether it has a gang, its audits
EXPECTED: dict[str, tuple[int, bool, int]] = {
    "realistic": (2, True, 0), "audited": (1, False, 1), "adversarial": (10, True, 0)}


def check(name: str, decision: Decision, ops: list[Any]) -> str | None:
    """Why the decision is not the one this set should give, or None when it is."""
    applied, gang, audits = EXPECTED[name]
    got = (len(decision.policies), decision.pod_group is not None, len(decision.audits))
    if got != (applied, gang, audits) or not ops or decision.gang_blocked:
        return (f"{name}: {got[0]} policies applied {decision.policies}, gang {got[1]}, "
                f"{got[2]} audits, {len(ops)} patch ops, blocked {decision.gang_blocked!r}; "
                f"expected {applied} applied, gang {gang}, {audits} audits, ops > 0")
    return None


def best_per_call(fn: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=3)) / number


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    raw = (SHARED / "fixtures/admission/pod-create-worker.json").read_bytes()
    pod = json.loads(raw)["request"]["object"]
    mpijob = yaml.safe_load((EXAMPLE_POLICIES / "tests/objects/mpijob-team-a.yaml").read_text())
    results: dict[str, list[float]] = {"json.loads": []}
    sets = {"realistic": realistic(), "audited": realistic("mpi-volcano"),
            "adversarial": adversarial()}

    def admit(policies: PolicySet) -> Callable[[], object]:
        def run() -> object:
            view = view_of(pod, namespace_labels={}, owners=[mpijob], index=policies.index)
            return render(view.shape, decide(view, policies))
        return run

    failed = []
    for name, policies in sets.items():
        view = view_of(pod, namespace_labels={}, owners=[mpijob], index=policies.index)
        decision = decide(view, policies)
        ops = render(view.shape, decision)
        print(f"{name}: {len(policies)} policies, {len(decision.policies)} applied, "
              f"{len(decision.audits)} audited, patch of {len(ops)} ops")
        if (why := check(name, decision, ops)) is not None:
            failed.append(why)
        results[name] = []
    for why in failed:
        print(f"FAILED: {why}")
    if failed:
        return 1
    ratios: dict[str, list[float]] = {name: [] for name in sets}
    for _ in range(args.rounds):
        base_round = best_per_call(lambda: json.loads(raw), 1000)
        results["json.loads"].append(base_round)
        for name, policies in sets.items():
            t = best_per_call(admit(policies), 300)
            results[name].append(t)
            ratios[name].append(t / base_round)

    print(f"request: {len(raw)} bytes (pod-create-worker.json), {args.rounds} paired rounds")
    print(f"json.loads(AdmissionReview)            best {min(results['json.loads']) * 1e6:6.1f} us"
          "   (baseline)")
    for name in sets:
        print(f"view+decide+render, 50 {name:<11}     best {min(results[name]) * 1e6:6.1f} us"
              f"   ratio median {statistics.median(ratios[name]):4.2f}"
              f" (rounds: {min(ratios[name]):4.2f}-{max(ratios[name]):4.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
