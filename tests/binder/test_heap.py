"""HeapFreezer: what survives a slow full collection is frozen between cycles, and only then."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from webhook.binder.heap import HeapFreezer


@pytest.fixture
def heap() -> Iterator[list[list[int]]]:
    """A long-lived heap of tracked containers, as the binder's node states and groups are."""
    big = [[i] for i in range(200_000)]
    yield big
    gc.unfreeze()


def _in_oldest(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects(generation=2))


def test_the_survivors_of_a_slow_full_collection_are_frozen_at_settle(
        heap: list[list[int]]) -> None:
    with HeapFreezer(budget=0.0) as freezer:
        assert not freezer.settle()  # no full collection yet
        gc.collect()
        assert _in_oldest(heap)
        assert freezer.settle()
        assert not _in_oldest(heap) and gc.get_freeze_count() >= len(heap)
        assert not freezer.settle()  # once per slow collection
    assert freezer._observe not in gc.callbacks


def test_a_full_collection_within_the_budget_freezes_nothing(heap: list[list[int]]) -> None:
    with HeapFreezer(budget=60.0) as freezer:
        gc.collect()
        assert not freezer.settle()
    assert _in_oldest(heap)


def test_young_collections_are_not_watched(heap: list[list[int]]) -> None:
    with HeapFreezer(budget=0.0) as freezer:
        gc.collect(0)
        gc.collect(1)
        assert not freezer.settle()
