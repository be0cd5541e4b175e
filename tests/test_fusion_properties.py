"""Reciprocal Rank Fusion: the archive's arithmetic and the properties fusion must keep."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.retrieval.fusion import collapse, rrf, score_fusion

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


@given(st.lists(st.tuples(keys, keys), max_size=40), st.integers(min_value=-1, max_value=35))
def test_collapse_with_a_limit_is_the_prefix_of_the_whole_collapse(chunks, limit: int) -> None:
    whole = collapse(chunks, lambda c: c[0])
    assert collapse(chunks, lambda c: c[0], limit) == whole[: max(limit, 0)]


# -- score fusion (min-max normalized scores, summed) -------------------------------------------------

scores = st.integers(min_value=-5000, max_value=5000).map(lambda i: i / 100)  # no float-rounding ties
scored_lists = st.dictionaries(
    st.sampled_from(["dense", "lexical", "sparse", "x"]),
    st.lists(st.tuples(keys, scores), max_size=15, unique_by=lambda t: t[0]).map(
        lambda rows: sorted(rows, key=lambda t: -t[1])
    ),
    min_size=1,
)


normalizations = st.sampled_from(["dbsf", "minmax"])


def _sorder(lists, **kw) -> list[int]:
    return [f.key for f in score_fusion(lists, **kw)]


def test_dbsf_arithmetic() -> None:
    # mean 2, sigma sqrt(8/3): [2 - 3 sigma, 2 + 3 sigma] -> [0, 1], so 4 -> 0.5 + 2 / (6 sigma).
    sigma = (8 / 3) ** 0.5
    fused = {f.key: f.score for f in score_fusion({"d": [("a", 4.0), ("b", 2.0), ("c", 0.0)]})}
    assert fused == pytest.approx({"a": 0.5 + 1 / (3 * sigma), "b": 0.5, "c": 0.5 - 1 / (3 * sigma)})
    # An outlier far above its list's bulk is clipped at 1, the bulk stays near the middle.
    rows = [("top", 1000.0), *((str(i), 1.0) for i in range(20))]
    far = {f.key: f.score for f in score_fusion({"d": rows})}
    assert far["top"] == 1.0 and 0.4 < far["0"] < 0.5


def test_minmax_arithmetic() -> None:
    fused = score_fusion(
        {"dense": [("a", 0.9), ("b", 0.5), ("c", 0.1)], "lexical": [("c", 12.0), ("a", 2.0)]},
        normalize="minmax",
    )
    assert {f.key: round(f.score, 6) for f in fused} == {"a": 1.0, "b": 0.5, "c": 1.0}
    # a/c tie on score and best rank (1): the key decides, whatever the input order.
    assert [f.key for f in fused] == ["a", "c", "b"]
    assert score_fusion({"d": [("x", 3.0), ("y", 3.0)]})[1].score == 1.0  # all alike: all 1
    assert score_fusion({"d": [("x", 3.0)]})[0].score == 1.0
    assert _sorder({"dense": [("a", 1.0)], "lexical": [("b", 1.0)]}, weights={"dense": 0.0}) == ["b"]
    assert score_fusion({"d": [("x", 3.0)]})[0].score == 1.0


def test_a_sure_leg_outweighs_a_flat_one() -> None:
    """The case RRF gets wrong: lexical is sure of d1, dense barely prefers d2 over d1."""
    lists = {
        "lexical": [("d1", 30.0), ("d2", 3.0), ("d3", 2.5), ("d4", 0.0)],
        "dense": [("d2", 0.41), ("d3", 0.40), ("d1", 0.39), ("d4", 0.20)],
    }
    assert _sorder(lists)[0] == "d1" and _sorder(lists, normalize="minmax")[0] == "d1"
    assert _order({n: [k for k, _ in rows] for n, rows in lists.items()})[0] == "d2"  # RRF sees ranks only


@settings(max_examples=300, deadline=None)
@given(scored_lists, weights, normalizations, st.randoms(use_true_random=False))
def test_score_fusion_invariant_to_the_order_of_the_input_lists(lists, w, norm, rnd: random.Random) -> None:
    names = list(lists)
    rnd.shuffle(names)
    shuffled = {n: lists[n] for n in names}
    assert _sorder(lists, weights=w, normalize=norm) == _sorder(shuffled, weights=w, normalize=norm)


@settings(max_examples=300, deadline=None)
@given(scored_lists, weights, normalizations, st.data())
def test_score_fusion_ignores_each_legs_scale(lists, w, norm, data) -> None:
    """A positive affine change of one leg's scores (cosine vs BM25 sums) changes nothing."""
    name = data.draw(st.sampled_from(sorted(lists)))
    a = data.draw(st.sampled_from([0.01, 0.5, 3.0, 40.0]))
    b = data.draw(st.sampled_from([-7.0, 0.0, 0.25, 100.0]))
    rescaled = {**lists, name: [(k, a * s + b) for k, s in lists[name]]}
    before = score_fusion(lists, weights=w, normalize=norm)
    after = score_fusion(rescaled, weights=w, normalize=norm)
    assert [f.score for f in after] == pytest.approx([f.score for f in before], abs=1e-6)


@settings(max_examples=300, deadline=None)
@given(scored_lists, weights, st.data())
def test_minmax_monotone_raising_a_score_never_lowers_the_item(lists, w, data) -> None:
    """Min-max only: under dbsf a raised score also moves its list's mean and spread, so another
    item of that list can gain on it (it still never falls below items it was above in that list:
    see the next test)."""
    norm = "minmax"
    name = data.draw(st.sampled_from(sorted(lists)))
    rows = lists[name]
    if not rows:
        return
    i = data.draw(st.integers(min_value=0, max_value=len(rows) - 1))
    key, score = rows[i]
    bump = data.draw(st.floats(min_value=0, max_value=100))
    raised = sorted([*rows[:i], (key, score + bump), *rows[i + 1 :]], key=lambda t: -t[1])
    before = {f.key: f.score for f in score_fusion(lists, weights=w, normalize=norm)}
    after = {f.key: f.score for f in score_fusion({**lists, name: raised}, weights=w, normalize=norm)}
    if key in before:
        assert after[key] >= before[key] - 1e-9
        # nobody else gains on it: every other item's lead over it can only shrink
        for other in before:
            assert after[other] - after[key] <= before[other] - before[key] + 1e-9


@settings(max_examples=300, deadline=None)
@given(scored_lists, normalizations)
def test_one_list_keeps_its_order(lists, norm) -> None:
    """Normalization never reorders a list: fusing one list alone returns it as it was ranked."""
    name = sorted(lists)[0]
    assert _sorder({name: lists[name]}, normalize=norm) == [k for k, _ in lists[name]]


@settings(max_examples=300, deadline=None)
@given(scored_lists, weights, normalizations, keys)
def test_score_fusion_an_item_best_in_every_list_is_first(lists, w, norm, top) -> None:
    lists = {
        n: [(top, (rows[0][1] + 1.0) if rows else 1.0), *((k, s) for k, s in rows if k != top)]
        for n, rows in lists.items()
    }
    if not any(w.get(n, 1.0) > 0 for n in lists):
        return
    assert _sorder(lists, weights=w, normalize=norm)[0] == top
