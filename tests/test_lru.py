"""The bounded LRU mapping shared by the request paths' small caches."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from index.lru import Lru


def test_the_least_recently_used_entry_goes_first_and_a_read_refreshes_one() -> None:
    lru: Lru[str, int] = Lru(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # "a" is now the most recently used
    lru.put("c", 3)
    assert "b" not in lru and lru.get("a") == 1 and lru.get("c") == 3 and len(lru) == 2
    lru.replace("a", 10)  # in place: "a" stays the least recently used
    lru.replace("zzz", 0)  # a missing key is not added
    lru.put("d", 4)
    assert [k for k, _ in lru.items()] == ["c", "d"] and "zzz" not in lru
    assert lru.pop("c") == 3 and lru.pop("c") is None
    lru.clear()
    assert len(lru) == 0 and lru.get("d") is None


def test_a_capacity_of_zero_keeps_nothing_and_a_negative_one_is_refused() -> None:
    lru: Lru[str, int] = Lru(0)
    lru.put("a", 1)
    assert len(lru) == 0 and lru.get("a") is None
    with pytest.raises(ValueError, match="capacity is 0 or more"):
        Lru(-1)


@given(st.integers(1, 5), st.lists(st.tuples(st.booleans(), st.integers(0, 9)), max_size=60))
def test_it_holds_what_a_reference_list_model_holds(capacity: int, ops: list[tuple[bool, int]]) -> None:
    """Against a plain list kept in recency order: same entries, same order, after any reads and writes."""
    lru: Lru[int, int] = Lru(capacity)
    model: list[tuple[int, int]] = []
    for write, key in ops:
        hit = next((e for e in model if e[0] == key), None)
        if write:
            if hit:
                model.remove(hit)
            model.append((key, key * 7))
            del model[:-capacity]
            lru.put(key, key * 7)
        else:
            if hit:
                model.remove(hit)
                model.append(hit)
            assert lru.get(key) == (hit[1] if hit else None)
        assert lru.items() == model
