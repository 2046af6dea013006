"""What `muster analyze` prints and gates on: suppressions, output and failure thresholds."""

from __future__ import annotations

from typing import get_args

import pytest

from webhook.analyze.findings import Finding, Severity
from webhook.analyze.selection import SEVERITIES, Suppression, at_least, select
from webhook.failures import UsageError

FOUND = [
    Finding("error", "WebhookNotReady", "Service/muster-system/muster-webhook", "m", "f"),
    Finding("warning", "TopologyNodeNotTainted", "Node/gpu-1", "m", "f"),
    Finding("warning", "TopologyNodeNotTainted", "Node/cpu-1", "m", "f"),
    Finding("info", "PolicyNotEnforced", "SchedulingPolicy/p", "m", "f"),
]


def test_the_severities_are_the_findings_ordered() -> None:
    assert set(SEVERITIES) == set(get_args(Severity))
    assert at_least("error", "warning") and at_least("warning", "warning")
    assert not at_least("info", "warning")


@pytest.mark.parametrize(("flags", "left"), [
    ([], 4),
    (["TopologyNodeNotTainted"], 2),  # the code on every object
    (["TopologyNodeNotTainted=Node/gpu-*"], 3),
    (["Topology*=Node/*-1"], 2),
    (["topologynodenottainted"], 4),  # codes are matched as written
    (["PolicyNotEnforced", "WebhookNotReady=Service/*"], 2),
    (["Nothing=Node/gpu-1"], 4),
])
def test_a_suppression_leaves_out_what_it_names(flags: list[str], left: int) -> None:
    chosen = select(FOUND, [Suppression.parse(f) for f in flags])
    assert len(chosen.kept) == len(chosen.shown) == left
    assert chosen.suppressed == 4 - left


@pytest.mark.parametrize("flag", ["", "=Node/gpu-1", "Code=", " = "])
def test_a_suppression_without_a_code_or_an_object_after_its_sign_is_refused(flag: str) -> None:
    with pytest.raises(UsageError, match="give CODE or CODE=OBJECT"):
        Suppression.parse(flag)


def test_the_output_threshold_hides_and_the_failure_threshold_still_counts() -> None:
    chosen = select(FOUND, [], "error")
    assert [f.code for f in chosen.shown] == ["WebhookNotReady"] and len(chosen.kept) == 4
    quiet = select(FOUND, [Suppression.parse("WebhookNotReady")], "error")
    assert quiet.shown == [] and not quiet.failed("error")
    assert quiet.failed("warning")  # hidden from the output, still gated on
    assert not select(FOUND[3:], []).failed("warning") and select(FOUND[3:], []).failed("info")
