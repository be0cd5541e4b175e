"""Reciprocal Rank Fusion: the archive's arithmetic and the properties fusion must keep."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.fusion import collapse, rrf

keys = st.integers(min_value=0, max_value=30)
ranked = st.lists(keys, max_size=15, unique=True)
named_lists = st.dictionaries(st.sampled_from(["dense", "lexical", "sparse", "x"]), ranked, min_size=1)
weights = st.dictionaries(
    st.sampled_from(["dense", "lexical", "sparse", "x"]),
    st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 3.0]),
)


def _order(lists, **kw) -> list[int]:
    return [f.key for f in rrf(lists, **kw)]


def test_archive_arithmetic() -> None:
    fused = rrf({"dense": ["a", "b"], "lexical": ["a", "c"]})
    assert fused[0].key == "a" and fused[0].score == 2 / 61
    assert {f.key: f.score for f in fused[1:]} == {"b": 1 / 62, "c": 1 / 62}
    assert [f.key for f in fused] == ["a", "b", "c"]  # b/c tie: best rank equal, then key
    assert rrf({"d": ["x"]}, k=0)[0].score == 1.0
    assert rrf({"d": ["x", "y"]}, weights={"d": 0.5})[1].score == 0.5 / 62


def test_duplicates_in_a_list_count_once_at_their_best_rank() -> None:
    assert rrf({"d": ["a", "b", "a"]})[0].ranks == {"d": 1}


def test_zero_weight_lists_are_ignored() -> None:
    assert _order({"dense": ["a"], "lexical": ["b"]}, weights={"dense": 0.0}) == ["b"]


@settings(max_examples=300, deadline=None)
@given(named_lists, weights, st.randoms(use_true_random=False))
def test_invariant_to_the_order_of_the_input_lists(lists, w, rnd: random.Random) -> None:
    names = list(lists)
    rnd.shuffle(names)
    shuffled = {n: lists[n] for n in names}
    assert _order(lists, weights=w) == _order(shuffled, weights=w)
    assert [f.score for f in rrf(lists, weights=w)] == [f.score for f in rrf(shuffled, weights=w)]


@settings(max_examples=300, deadline=None)
@given(named_lists, weights, st.data())
def test_monotone_raising_an_item_never_lowers_its_fused_position(lists, w, data) -> None:
    name = data.draw(st.sampled_from(sorted(lists)))
    ranking = lists[name]
    if len(ranking) < 2:
        return
    i = data.draw(st.integers(min_value=1, max_value=len(ranking) - 1))
    j = data.draw(st.integers(min_value=0, max_value=i - 1))
    item = ranking[i]
    raised = [*ranking[:j], item, *(x for x in ranking[j:] if x != item)]
    before = _order(lists, weights=w)
    after = _order({**lists, name: raised}, weights=w)
    if item in before:
        assert after.index(item) <= before.index(item)


@settings(max_examples=300, deadline=None)
@given(named_lists, weights, keys)
def test_an_item_first_in_every_list_is_first(lists, w, top) -> None:
    lists = {n: [top, *(x for x in r if x != top)] for n, r in lists.items()}
    if not any(w.get(n, 1.0) > 0 for n in lists):
        return
    assert _order(lists, weights=w)[0] == top


def test_collapse_keeps_the_best_chunk_per_record() -> None:
    chunks = [("r1", 2), ("r2", 0), ("r1", 0), ("r3", 1), ("r2", 5)]
    assert collapse(chunks, lambda c: c[0]) == [("r1", 2), ("r2", 0), ("r3", 1)]
