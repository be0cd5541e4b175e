"""Cross-validated tuning: every query is scored by a choice made without it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.tuning import cross_validate, two_folds


def test_folds_split_every_query_once_whatever_the_order() -> None:
    qids = [str(i) for i in range(11)]
    a, b = two_folds(qids)
    assert sorted(a + b) == sorted(qids) and abs(len(a) - len(b)) <= 1
    assert two_folds(list(reversed(qids))) == (a, b)


def test_a_choice_that_only_fits_the_queries_it_was_chosen_on_scores_nothing() -> None:
    qids = [str(i) for i in range(8)]
    a, b = two_folds(qids)
    table = {
        "fits-a": {q: {"ndcg@10": 1.0 if q in a else 0.0} for q in qids},
        "fits-b": {q: {"ndcg@10": 1.0 if q in b else 0.0} for q in qids},
        "steady": {q: {"ndcg@10": 0.6} for q in qids},
    }
    result = cross_validate(list(table), table.__getitem__, qids)
    assert result["chosen"] == "steady" and result["in_sample"]["ndcg@10"] == 0.6
    # Each fold prefers the candidate that fits it, which then scores 0 on the other fold.
    assert [f["chosen"] for f in result["folds"]] == ["fits-a", "fits-b"]
    assert result["cv"]["ndcg@10"] == 0.0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.floats(0, 1), min_size=6, max_size=6), min_size=1, max_size=5))
def test_cross_validated_never_beats_the_per_fold_oracle(rows: list[list[float]]) -> None:
    qids = [f"q{i}" for i in range(6)]
    table = {c: {q: {"ndcg@10": v} for q, v in zip(qids, row, strict=True)} for c, row in enumerate(rows)}
    result = cross_validate(list(table), table.__getitem__, qids)
    a, b = two_folds(qids)
    oracle = sum(max(sum(table[c][q]["ndcg@10"] for q in fold) for c in table) for fold in (a, b)) / 6
    assert result["cv"]["ndcg@10"] <= round(oracle, 4) + 1e-9
    assert (
        result["in_sample"]["ndcg@10"]
        >= max(round(sum(table[c][q]["ndcg@10"] for q in qids) / 6, 4) for c in table) - 1e-9
    )
