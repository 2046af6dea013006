"""The webhook's log of pods admitted failing open or with warnings: one line per reason per
interval, with how many were left out (webhook.admission.outcomes)."""

from __future__ import annotations

import logging

import pytest

from webhook.admission.outcomes import OutcomeLog, Sampled


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_key_per_interval_says_how_many_were_left_out() -> None:
    clock = Clock()
    sampled = Sampled(10.0, clock)
    assert sampled.allow("owner", "team-a") == 0
    assert [sampled.allow("owner", "team-a") for _ in range(3)] == [None, None, None]
    assert sampled.allow("deadline", "team-a") == 0  # another reason has its own interval
    assert sampled.allow("owner", "team-b") == 0  # and another namespace
    clock.now += 9.9
    assert sampled.allow("owner", "team-a") is None
    clock.now += 0.1
    assert sampled.allow("owner", "team-a") == 4  # the 4 left out since the last line
    assert sampled.allow("owner", "team-a") is None


def test_the_keys_remembered_are_bounded() -> None:
    """A namespace flood (many namespaces) keeps `size` keys; one forgotten is said again."""
    sampled = Sampled(10.0, Clock(), size=2)
    assert [sampled.allow("warned", ns) for ns in ("a", "b", "c")] == [0, 0, 0]
    assert sampled.allow("warned", "c") is None
    assert sampled.allow("warned", "a") == 0  # forgotten: said again


def test_a_pod_admitted_failing_open_is_a_warning_and_one_with_warnings_is_info(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="webhook.admission.outcomes")
    told = OutcomeLog(Sampled(10.0, Clock()))
    pod = {"metadata": {"generateName": "train-worker-", "ownerReferences": [
        {"kind": "Job", "name": "train", "uid": "u1", "controller": True}]}}
    for _ in range(2):
        told.admitted("r1", "team-a", pod, fail_open="deadline", warnings=["w" * 400])
    told.admitted("r2", "team-a", {"metadata": "not a map"}, fail_open=None,
                  warnings=["muster: removed muster.io/gpu-assignment"])
    first, second = caplog.records
    assert (first.levelno, first.getMessage(), first.reason, first.pod, first.owner,  # type: ignore[attr-defined]
            first.warnings) == (logging.WARNING, "pod admitted failing open", "deadline",  # type: ignore[attr-defined]
                                "train-worker-", "Job/train", ["w" * 300])
    assert (second.levelno, second.getMessage(), second.pod, second.owner) == (  # type: ignore[attr-defined]
        logging.INFO, "pod admitted with warnings", None, None)
