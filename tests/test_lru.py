"""The one bounded memo every cache is built on."""

from __future__ import annotations

from webhook.lru import Lru


def test_a_hit_keeps_an_entry_and_the_least_recent_goes() -> None:
    memo: Lru[str, int] = Lru(2)
    memo.put("a", 1)
    memo.put("b", 2)
    assert memo.get("a") == 1  # now the most recent
    memo.put("c", 3)
    assert (memo.get("a"), memo.get("b"), memo.get("c")) == (1, None, 3)
    assert len(memo) == 2


def test_a_put_of_a_known_key_refreshes_it_and_clear_empties() -> None:
    memo: Lru[str, int] = Lru(2)
    memo.put("a", 1)
    memo.put("b", 2)
    memo.put("a", 9)
    memo.put("c", 3)
    assert (memo.get("a"), memo.get("b")) == (9, None)
    memo.clear()
    assert len(memo) == 0 and memo.get("a") is None
