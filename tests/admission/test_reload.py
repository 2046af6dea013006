"""Hot reload of a mounted directory: ConfigMap ..data symlink swaps, broken updates refused."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from admission_helpers import ALIAS_BOMB, configmap_version

from webhook.admission.metrics import Metrics
from webhook.admission.reload import EVENT_NOTE_LIMIT, PolicyStore, digest, refusal_note
from webhook.admission.server import policy_problems
from webhook.policy import PolicyError, load_policies
from webhook.policy.errors import MAX_LINE, MAX_LISTED


class Broken(Exception):
    pass


def _load(paths: Sequence[Path]) -> dict[str, object]:
    """A stand-in loader: every visible *.json file must parse (the policy loader's contract)."""
    out: dict[str, object] = {}
    for root in paths:
        for f in sorted(root.iterdir()):
            if f.name.startswith("."):
                continue
            try:
                out[f.name] = json.loads(f.read_text())
            except ValueError as exc:
                raise Broken(f"{f.name}: {exc}") from exc
    return out


def _value(metrics: Metrics, result: str) -> float:
    value = metrics.registry.get_sample_value("muster_policy_reloads_total", {"result": result})
    return value or 0.0


def _set_digests(metrics: Metrics) -> dict[str, float]:
    """muster_policy_set_info's samples: digest label → value."""
    return {s.labels["digest"]: s.value for family in metrics.registry.collect()
            if family.name == "muster_policy_set_info" for s in family.samples}


async def test_configmap_swap_reloads_and_broken_update_is_refused(tmp_path: Path) -> None:
    refused: list[str] = []

    async def on_refused(message: str, problems: int) -> None:
        refused.append(message)

    metrics = Metrics()
    store = PolicyStore([tmp_path], _load, error_types=(Broken,), metrics=metrics, count=len,
                        on_refused=on_refused)
    configmap_version(tmp_path, "v1", {"a.json": '{"v": 1}'})
    assert await store.reload()
    assert store.current == {"a.json": {"v": 1}}
    assert not await store.reload()  # nothing changed: no reload, no metric
    assert _value(metrics, "success") == 1
    first = digest([tmp_path])
    assert _set_digests(metrics) == {first[:16]: 1}

    configmap_version(tmp_path, "v2", {"a.json": '{"v": 2'})
    assert not await store.reload()
    assert store.current == {"a.json": {"v": 1}}  # the last good set stays active
    assert store.last_error is not None and "a.json" in store.last_error
    assert refused == [store.last_error]
    assert _value(metrics, "error") == 1
    assert not await store.reload()  # the same broken content is reported once
    assert len(refused) == 1
    assert _set_digests(metrics) == {first[:16]: 1}  # still the active set's, not the refused

    configmap_version(tmp_path, "v3", {"a.json": '{"v": 3}'})
    assert await store.reload()
    assert store.current == {"a.json": {"v": 3}}
    assert store.last_error is None
    gauge = metrics.registry.get_sample_value("muster_policies_loaded")
    assert gauge == 1
    third = digest([tmp_path])
    assert third != first and _set_digests(metrics) == {third[:16]: 1}  # the old one is gone


def test_digest_ignores_hidden_entries_and_follows_symlinks(tmp_path: Path) -> None:
    configmap_version(tmp_path, "v1", {"a.json": "1"})
    before = digest([tmp_path])
    (tmp_path / ".swp").write_text("editor noise")
    assert digest([tmp_path]) == before
    configmap_version(tmp_path, "v2", {"a.json": "2"})
    assert digest([tmp_path]) != before


def test_missing_path_has_a_digest(tmp_path: Path) -> None:
    assert digest([tmp_path / "absent"]) != digest([tmp_path])


POLICY = ("apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: %s}\n"
          "spec:\n  gang: {backend: volcano}\n")


async def test_a_refused_policy_update_names_every_problem(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The real loader: the log and the Event get every problem of every file, the last good
    set stays."""
    refused: list[str] = []

    async def on_refused(message: str, problems: int) -> None:
        refused.append(message)

    store = PolicyStore([tmp_path], load_policies, error_types=(PolicyError,),
                        metrics=Metrics(), count=len, on_refused=on_refused)
    configmap_version(tmp_path, "v1", {"a.yaml": POLICY % "a"})
    assert await store.reload()
    good = store.current
    configmap_version(tmp_path, "v2", {
        "a.yaml": POLICY % "a" + "  match: {gpus: {min: 3, max: 1}}\n",
        "b.yaml": (POLICY % "a").replace("volcano", "slurm") + "---\nspec: [x\n"})
    with caplog.at_level(logging.ERROR):
        assert not await store.reload()
    assert store.current is good
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    expected = [
        f"{a}:6:31: spec.match.gpus.max: max (1) is smaller than min (3) (document 1, policy a)",
        f"{b}:3:18: metadata.name: duplicate policy name 'a', first defined at {a}:3:18 "
        "(document 1, policy a)",
        f"{b}:5:19: spec.gang.backend: Input should be 'volcano', 'coscheduling', "
        "'muster' or 'kubernetes' (document 1, policy a)",
        f"{b}:7:7: '[' opened here is not closed: did not find expected ',' or ']' at line 8, "
        "column 1 (document 2)"]
    assert refused == ["\n".join(expected)]
    [record] = [r for r in caplog.records if r.getMessage().startswith("policy update refused")]
    assert record.error.splitlines() == expected  # type: ignore[attr-defined]
    assert record.problems == 4  # type: ignore[attr-defined]
    assert refusal_note(refused[0]).splitlines() == [
        "policy update refused, previous policies stay active: 4 problems", *expected]


async def test_an_alias_bomb_in_the_configmap_is_refused_at_once(tmp_path: Path) -> None:
    store = PolicyStore([tmp_path], load_policies, error_types=(PolicyError,),
                        metrics=Metrics(), count=len)
    configmap_version(tmp_path, "v1", {"a.yaml": POLICY % "a"})
    assert await store.reload()
    good = store.current
    configmap_version(tmp_path, "v2", {"a.yaml": POLICY % "a", "bomb.yaml": ALIAS_BOMB})
    started = time.perf_counter()
    assert not await store.reload()
    assert time.perf_counter() - started < 1.0
    assert store.current is good
    assert store.last_error == (f"{tmp_path / 'bomb.yaml'}:7:14: alias *a0: aliases are not "
                                "accepted (write the value out) (document 1)")

async def test_a_set_of_many_conflicts_is_refused_in_bounded_lines(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Security review #54: 1,300 conflicting policies made a 67.8 MB log line on reload. The
    log and the Event list the first problems and count the rest; the last good set stays."""
    counts: list[int] = []

    async def on_refused(message: str, problems: int) -> None:
        counts.append(problems)

    store = PolicyStore([tmp_path], load_policies, error_types=(PolicyError,),
                        metrics=Metrics(), count=len, on_refused=on_refused,
                        problems=policy_problems)
    configmap_version(tmp_path, "v1", {"a.yaml": POLICY % "a"})
    assert await store.reload()
    good = store.current
    many = "---\n".join(f"{POLICY % f'p{i}'}  labels: {{team: {'ab'[i % 2]}}}\n"
                        for i in range(200))
    configmap_version(tmp_path, "v2", {"a.yaml": many})
    with caplog.at_level(logging.ERROR):
        assert not await store.reload()
    assert store.current is good
    [record] = [r for r in caplog.records if r.getMessage().startswith("policy update refused")]
    assert record.problems == 100 * 100 == counts[0]  # type: ignore[attr-defined]
    lines = record.error.splitlines()  # type: ignore[attr-defined]
    assert len(lines) == MAX_LISTED + 1 and all(len(line) <= MAX_LINE for line in lines)
    assert lines[-1] == (f"... and {100 * 100 - MAX_LISTED} more problems (the first "
                         f"{MAX_LISTED} are listed)")
    assert refusal_note(record.error, counts[0]).startswith(  # type: ignore[attr-defined]
        "policy update refused, previous policies stay active: 10000 problems\n")


def test_refusal_note_keeps_whole_problems_and_counts_the_rest() -> None:
    problems = [f"p{i}.yaml:1:1: spec.gang.backend: required field is missing" for i in range(40)]
    note = refusal_note("\n".join(problems))
    lines = note.splitlines()
    assert len(note) <= EVENT_NOTE_LIMIT
    assert lines[0] == "policy update refused, previous policies stay active: 40 problems"
    shown = lines[1:-1]
    assert shown == problems[:len(shown)] and len(shown) >= 10
    assert lines[-1] == (f"... and {40 - len(shown)} more in the webhook's log (muster policy "
                         "check lists them)")
    assert refusal_note("cannot read policies: gone") == (
        "policy update refused, previous policies stay active: 1 problem\n"
        "cannot read policies: gone")
