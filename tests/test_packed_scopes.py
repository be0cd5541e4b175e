"""A packed scope copy answers like a brute-force search over its slots, and the copies stay within
their budget, least recently used dropped first."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from index.vectors.packed_scopes import PackedScope, PackedScopes


def _copy(slots: list[int], content: int = 0, dim: int = 4, seed: int = 0) -> PackedScope:
    vectors = np.random.default_rng(seed).standard_normal((len(slots), dim)).astype(np.float32)
    return PackedScope(np.asarray(slots, dtype=np.int64), vectors, content)


@settings(max_examples=60, deadline=None)
@given(
    slots=st.lists(st.integers(0, 10_000), unique=True, max_size=60).map(sorted),
    data=st.data(),
    k=st.integers(1, 70),
    seed=st.integers(0, 2**31),
)
def test_top_equals_brute_force_with_exclusions(slots, data, k, seed) -> None:
    # An excluded record's slots are mostly the scope's own; one may lie outside it.
    excluded = data.draw(st.lists(st.sampled_from(slots), max_size=6)) if slots else []
    excluded += data.draw(st.lists(st.integers(0, 10_000), max_size=2))
    copy = _copy(slots, seed=seed)
    query = np.random.default_rng(seed + 1).standard_normal(4).astype(np.float32)
    left_out = np.asarray(excluded, dtype=np.int64)
    got = copy.top(query, k, left_out)
    scores = {s: float(v @ query) for s, v in zip(slots, copy.vectors, strict=True) if s not in set(excluded)}
    want = sorted(scores, key=lambda s: -scores[s])[:k]
    assert len(got) == len(want) == min(k, copy.permitted(left_out))
    assert np.allclose([scores[s] for s in got], [scores[s] for s in want])  # ties may swap slots
    assert not set(got.tolist()) & set(excluded)


def test_copies_stay_within_the_budget_least_recently_used_first() -> None:
    one = _copy(list(range(10))).nbytes
    packed = PackedScopes(max_rows=100, max_bytes=2 * one)
    packed.put("a", _copy(list(range(10))))
    packed.put("b", _copy(list(range(10))))
    assert packed.get("a", 0) is not None  # "b" is now the least recently used
    packed.put("c", _copy(list(range(10))))
    assert packed.get("b", 0) is None and packed.get("a", 0) is not None and packed.get("c", 0) is not None
    assert packed.nbytes == 2 * one and len(packed) == 2
    packed.put("huge", _copy(list(range(30))))  # larger than the whole budget: not kept, nothing dropped
    assert packed.get("huge", 0) is None and len(packed) == 2


def test_a_copy_of_another_content_version_is_dropped() -> None:
    packed = PackedScopes(max_rows=100, max_bytes=1 << 20)
    packed.put("a", _copy([1, 2, 3], content=4))
    assert packed.get("a", 5) is None
    assert len(packed) == 0 and packed.nbytes == 0


def test_small_counts_the_mask_and_zero_turns_packing_off() -> None:
    mask = np.zeros(100, dtype=bool)
    mask[:10] = True
    assert PackedScopes(10, 1 << 20).small(mask)
    assert not PackedScopes(9, 1 << 20).small(mask)
    assert not PackedScopes(0, 1 << 20).small(mask) and not PackedScopes(10, 0).small(mask)
    with pytest.raises(ValueError):
        PackedScopes(-1, 0)
