"""The chart's annotation guard on what a pod's owner may write after its CREATE, evaluated as
kube-apiserver evaluates it (tests/chart/cel_policy.py): the one muster.io/ key a job writes,
when it last saved its state, and only as a time the binder reads.
tests/real/test_forgery.py makes the same writes against a real API server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from cel_policy import Policy, Verdict
from chart_helpers import CHART, NAMESPACE, Obj, one, run_helm

from webhook import keys
from webhook.binder.pods import parse_pod

OWNER = "system:serviceaccount:ml:trainer"
#: what the guard says to a checkpoint time it refuses
UNREADABLE = (f"{keys.ANN_LAST_CHECKPOINT} is an RFC 3339 time with its zone, such as "
              "2026-12-06T18:00:00Z (date -u +%Y-%m-%dT%H:%M:%SZ)")


@pytest.fixture(scope="module")
def guard() -> Policy:
    proc = run_helm("template", "muster", str(CHART), "--namespace", NAMESPACE)
    assert proc.returncode == 0, proc.stderr
    objs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return Policy(one(objs, "ValidatingAdmissionPolicy", "muster-annotation-guard"))


def _pod(annotations: dict[str, str]) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-0", "namespace": "ml", "uid": "uid-w-0",
                         "annotations": {keys.ANN_GANG_NAME: "train",
                                         keys.ANN_GANG_MIN_MEMBER: "2", **annotations}},
            "spec": {"schedulerName": keys.DEFAULT_BINDER_SCHEDULER_NAME, "nodeName": "gpu-a",
                     "containers": [{"name": "c", "image": "trainer:1"}]}}


def _update(guard: Policy, old: dict[str, str], new: dict[str, str], sub: str = "") -> Verdict:
    request: Obj = {"uid": "r-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "name": "w-0", "namespace": "ml", "operation": "UPDATE", "dryRun": False,
                    "userInfo": {"username": OWNER, "uid": "u-1",
                                 "groups": ["system:serviceaccounts", "system:authenticated"]}}
    if sub:
        request["subResource"] = sub
    return guard.admit(request, _pod(new), _pod(old))


#: times a job may write, and the Unix time each is (date -u -d VALUE +%s)
READABLE = {"2026-12-06T18:00:00Z": 1796580000, "2026-12-06T18:00:00.5Z": 1796580000.5,
            "2026-12-06T18:00:00.123456789+01:00": 1796576400.123456,
            "2026-12-06T18:00:00-05:30": 1796599800, "2026-02-28T23:59:59Z": 1772323199}
GOOD = "2026-12-06T18:00:00Z"


@pytest.mark.parametrize("value", READABLE)
@pytest.mark.parametrize("sub", ["", "status"])
def test_a_job_says_when_it_saved_as_a_time_the_binder_reads(guard: Policy, value: str,
                                                              sub: str) -> None:
    assert _update(guard, {}, {keys.ANN_LAST_CHECKPOINT: value}, sub).allowed
    # what the guard lets by, the binder reads: the gang's price as a victim counts from it
    pod = parse_pod(_pod({keys.ANN_LAST_CHECKPOINT: value}))
    assert pod.checkpointed == pytest.approx(READABLE[value]) and not pod.problems


@pytest.mark.parametrize("value", [
    "yesterday", "", "1765044000",                   # words, nothing, Unix seconds
    "2026-12-06T18:00:00",                           # no zone: whose 18:00?
    "2026-12-06 18:00:00Z", "20261206T180000Z",      # ISO 8601, not RFC 3339
    "2026-12-06T18:00:00+0100", "2026-12-06T18:00Z", "2026-12-06t18:00:00z",
    "2026-13-06T18:00:00Z", "2026-12-32T18:00:00Z", "2026-12-06T24:00:00Z",
    "2026-12-06T18:60:00Z", "2026-12-06T18:00:00+24:00",
    "2026-12-06T18:00:00Z\n", " 2026-12-06T18:00:00Z",
])
def test_a_time_the_binder_could_not_read_is_refused_with_the_form_to_write(
        guard: Policy, value: str) -> None:
    verdict = _update(guard, {}, {keys.ANN_LAST_CHECKPOINT: value})
    assert verdict == Verdict(False, UNREADABLE) and verdict.reason == "Invalid"
    # changed from a good one, too
    assert not _update(guard, {keys.ANN_LAST_CHECKPOINT: GOOD},
                       {keys.ANN_LAST_CHECKPOINT: value}).allowed
    assert not parse_pod(_pod({keys.ANN_LAST_CHECKPOINT: value})).checkpointed


@pytest.mark.parametrize("value", ["2026-02-29T00:00:00Z", "2026-04-31T00:00:00Z"])
def test_a_day_no_month_has_is_refused_as_the_api_server_refuses_an_error(
        guard: Policy, value: str) -> None:
    """The pattern lets it by; timestamp() fails on it, and an expression that fails refuses
    the request (failurePolicy Fail)."""
    verdict = _update(guard, {}, {keys.ANN_LAST_CHECKPOINT: value})
    assert not verdict.allowed and verdict.message.startswith("error:"), verdict
    assert not parse_pod(_pod({keys.ANN_LAST_CHECKPOINT: value})).checkpointed
    # changed from a good one, too
    assert not _update(guard, {keys.ANN_LAST_CHECKPOINT: GOOD},
                       {keys.ANN_LAST_CHECKPOINT: value}).allowed


def test_only_a_change_of_the_key_is_checked(guard: Policy) -> None:
    """A value written while the guard was off stays the owner's to remove or replace, and
    does not stop the pod's other annotations from changing."""
    old = {keys.ANN_LAST_CHECKPOINT: "yesterday"}
    assert _update(guard, old, {}).allowed
    assert _update(guard, old, {**old, "example.com/note": "mine"}).allowed
    assert _update(guard, old, {keys.ANN_LAST_CHECKPOINT: GOOD}).allowed
    assert _update(guard, {}, {"example.com/note": "mine"}).allowed


def test_beside_another_muster_key_the_checkpoint_is_still_refused(guard: Policy) -> None:
    new = {keys.ANN_LAST_CHECKPOINT: GOOD, keys.ANN_GANG_NAME: "other"}
    verdict = _update(guard, {}, new)
    assert not verdict.allowed and verdict.reason == "Forbidden"
    assert verdict.message.startswith("only the Muster binder and node agent")
    assert _update(guard, {}, {keys.ANN_LAST_CHECKPOINT: GOOD}).allowed


def test_the_guard_and_the_binder_read_one_form(guard: Policy) -> None:
    (rule,) = [v for v in guard.spec["validations"]
               if f"'{keys.ANN_LAST_CHECKPOINT}' in variables.changed" in v["expression"]]
    assert f"'{keys.CHECKPOINT_TIME.pattern}'" in rule["expression"]
