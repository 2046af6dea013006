"""Hostile policy YAML (security review #24): aliases refused before anything expands them,
bounded bytes and nodes, on every path that loads policies."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from webhook.policy import PolicyError, load_policies, load_policy_texts
from webhook.policy.errors import MAX_LINE, MAX_LISTED
from webhook.policy.loader import MAX_POLICIES, MAX_SET_BYTES
from webhook.yamlpos import MAX_BYTES, MAX_NODES, NodeBudget, YamlProblem, documents

from .conftest import policy

GOOD = policy("good", "gang:\n  backend: volcano\n")


def alias_bomb(levels: int) -> str:
    """A policy whose labels expand to 10**levels leaves through aliases ("billion laughs")."""
    lines = ["    a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"    a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return policy("bomb", "labels:\n" + "\n".join(line[2:] for line in lines))


def issues_of(texts: dict[str, str]) -> list[str]:
    with pytest.raises(PolicyError) as info:
        load_policy_texts(texts)
    return [str(i) for i in info.value.issues]


def test_an_alias_bomb_is_refused_at_its_first_alias_before_any_expansion() -> None:
    bomb = alias_bomb(7)  # 10**7 leaves once expanded
    assert len(bomb) < 2000
    budget = NodeBudget()
    [problem] = list(documents(bomb, budget))
    assert isinstance(problem, YamlProblem)
    # composing stopped at the first alias: the nodes before it read, nothing expanded
    assert MAX_NODES - budget.nodes < 30
    assert (problem.line, problem.column) == (8, 14)

    tracemalloc.start()
    started = time.perf_counter()
    try:
        assert issues_of({"bomb.yaml": bomb}) == [
            "bomb.yaml:8:14: alias *a0: aliases are not accepted (write the value out) "
            "(document 1)"]
        elapsed = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < 0.5, elapsed
    assert peak < 1024 * 1024, peak


def test_a_merge_key_through_an_alias_is_refused_and_the_next_documents_are_read() -> None:
    text = (policy("merged", "gang: &base {backend: volcano}\nistio:\n  <<: *base\n")
            + "---\n" + GOOD.replace("volcano", "x"))
    assert issues_of({"m.yaml": text}) == [
        "m.yaml:8:9: alias *base: aliases are not accepted (write the value out) (document 1)",
        "m.yaml:16:14: spec.gang.backend: Input should be 'volcano', 'coscheduling', "
        "'muster' or 'kubernetes' (document 2, policy good)"]


def test_an_anchor_alone_is_harmless_and_loads() -> None:
    assert load_policy_texts({"a.yaml": GOOD.replace("gang:", "gang: &g")}).names == ("good",)


def test_nodes_are_bounded_across_the_files_of_a_load() -> None:
    labels = "".join(f"  l{i}: v\n" for i in range(MAX_NODES // 4))  # half the budget
    half = policy("half", "labels:\n" + labels)
    load_policy_texts({"a.yaml": half})
    msgs = issues_of({"a.yaml": half, "b.yaml": half.replace("half", "other")})
    assert len(msgs) == 1 and msgs[0].startswith("b.yaml:")
    assert f"more than {MAX_NODES} YAML nodes, the most that are read at once" in msgs[0]
    # one file over the budget: reading stops there, with one problem
    many = "---\n".join(policy(f"p{i}", "labels:\n" + labels) for i in range(2))
    [msg] = issues_of({"many.yaml": many})
    assert f"more than {MAX_NODES} YAML nodes" in msg and "(document 2)" in msg


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path: Path) -> None:
    big = GOOD + "# padding\n" * (MAX_BYTES // 10)
    assert issues_of({"big.yaml": big}) == [
        f"big.yaml: larger than {MAX_BYTES // 1024} KiB, the most a file may hold"]
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as f:  # sparse: reading it whole would take 1 GiB
        f.truncate(1 << 30)
    with pytest.raises(PolicyError) as info:
        load_policies([tmp_path])
    assert [str(i) for i in info.value.issues] == [
        f"{huge}: larger than {MAX_BYTES // 1024} KiB, the most a file may hold"]


def conflicting(n: int) -> str:
    """`n` policies of equal priority writing alternating team labels: every pair of a and b
    conflicts (n * n / 4 conflicts), as in security review #54."""
    return "---\n".join(policy(f"p{i}", f"labels:\n  team: {'ab'[i % 2]}\n") for i in range(n))


def test_conflicts_are_listed_up_to_the_cap_and_the_rest_counted_unbuilt() -> None:
    """200 policies make 10,000 conflicts: the first 50 are built and listed, the rest only
    counted, so memory and the message stay bounded (1,300 made a 104 MB message, 394 MiB)."""
    text = conflicting(200)
    tracemalloc.start()
    try:
        with pytest.raises(PolicyError) as info:
            load_policy_texts({"p.yaml": text})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    exc = info.value
    assert len(exc.issues) == MAX_LISTED and exc.more == 100 * 100 - MAX_LISTED
    assert exc.problem_count == 10_000
    assert all("conflicts with policy" in str(i) for i in exc.issues)
    lines = str(exc).splitlines()
    assert len(lines) == MAX_LISTED + 1
    assert lines[-1] == f"... and 9950 more problems (the first {MAX_LISTED} are listed)"
    assert len(str(exc)) < MAX_LISTED * MAX_LINE
    assert peak < 8 * 1024 * 1024, peak  # the 10,000 issues and their message took ~10 MiB


def test_more_policies_than_a_set_may_hold_are_refused_naming_the_limit() -> None:
    with pytest.raises(PolicyError) as info:
        load_policy_texts({"p.yaml": conflicting(MAX_POLICIES + 1)})
    [issue] = info.value.issues
    assert issue.message == (f"{MAX_POLICIES + 1} policy documents, more than {MAX_POLICIES}, "
                             "the most a policy set may hold; the set was not checked further")
    assert issue.document == MAX_POLICIES + 1


def test_files_larger_together_than_a_set_may_hold_are_refused_unread(tmp_path: Path) -> None:
    # each file within the per-file limit, together over the set's
    for i in range(MAX_SET_BYTES // MAX_BYTES + 2):
        (tmp_path / f"{i}.yaml").write_text("#" * (MAX_BYTES - 1) + "\n")
    (tmp_path / "z.yaml").write_text(GOOD)
    with pytest.raises(PolicyError) as info:
        load_policies([tmp_path])
    [issue] = info.value.issues
    assert issue.message == ("the files of the set hold more than 1024 KiB, the most a policy "
                             "set may hold; nothing was checked")
    assert issue.file == str(tmp_path / f"{MAX_SET_BYTES // MAX_BYTES}.yaml")  # reading stopped
