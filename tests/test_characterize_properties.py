"""Property tests of the characterization math on hand-made neighbours (gateway.retrieval.characterize)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.retrieval.characterize import EVIDENCE, Vote, categorical_vote, date_range, date_summary

# Similarities as weights: none, or a real amount (denormal floats are not similarities).
weights = st.one_of(st.just(0.0), st.floats(min_value=1e-6, max_value=10.0))
terms = st.sampled_from(["1c", "2c", "1e", "bronze", "silver"])
categorical = st.lists(
    st.builds(
        Vote, key=st.integers(0, 10_000), weight=weights, value=st.one_of(terms, st.lists(terms, max_size=3))
    ),
    max_size=30,
)
years = st.integers(-3000, 2100)
ranges = st.tuples(years, years).map(lambda t: {"from": min(t), "to": max(t)})
dated = st.lists(
    st.builds(Vote, key=st.integers(0, 10_000), weight=weights, value=st.one_of(years, ranges)), max_size=30
)


@given(categorical)
@settings(max_examples=80, deadline=None)
def test_vote_shares_confidence_and_evidence(votes: list[Vote]) -> None:
    proposal = categorical_vote(votes)
    if all(v.weight <= 0 or not v.value for v in votes):
        assert proposal is None
        return
    assert proposal is not None
    assert 0.0 <= proposal.confidence <= 1.0
    shares = [s for _, s in proposal.distribution]
    assert sum(shares) == pytest.approx(1.0)
    assert shares == sorted(shares, reverse=True) and proposal.confidence == shares[0]
    assert proposal.distribution[0][0] == proposal.value
    assert 1 <= len(proposal.evidence) <= EVIDENCE
    evidence_weights = [v.weight for v in proposal.evidence]
    assert evidence_weights == sorted(evidence_weights, reverse=True)
    for vote in proposal.evidence:  # every cited neighbour voted for the winner, with a real weight
        assert vote.weight > 0
        assert proposal.value in (vote.value if isinstance(vote.value, list) else [vote.value])


@given(categorical, st.floats(min_value=0.01, max_value=100.0))
@settings(max_examples=50, deadline=None)
def test_vote_is_invariant_to_the_weight_scale(votes: list[Vote], factor: float) -> None:
    a = categorical_vote(votes)
    b = categorical_vote([Vote(v.key, v.weight * factor, v.value) for v in votes])
    assert (a is None) == (b is None)
    if a is not None and b is not None:
        assert b.confidence == pytest.approx(a.confidence)
        assert {v for v, _ in a.distribution} == {v for v, _ in b.distribution}


def test_vote_by_hand() -> None:
    votes = [Vote("a", 0.9, "1e"), Vote("b", 0.8, "2e"), Vote("c", 0.7, "1e"), Vote("d", 0.0, "2e")]
    p = categorical_vote(votes)
    assert p is not None and p.value == "1e"
    assert p.confidence == pytest.approx(1.6 / 2.4)
    assert [v.key for v in p.evidence] == ["a", "c"]
    # A tie goes to the value met first (the better-ranked neighbour's).
    tie = categorical_vote([Vote("x", 0.5, "2e"), Vote("y", 0.5, "1e")])
    assert tie is not None and tie.value == "2e" and tie.confidence == 0.5


@given(dated)
@settings(max_examples=80, deadline=None)
def test_date_summary_keeps_the_centre_inside_its_range(votes: list[Vote]) -> None:
    proposal = date_summary(votes)
    if all(v.weight <= 0 for v in votes):
        assert proposal is None
        return
    assert proposal is not None
    assert proposal.earliest <= proposal.central <= proposal.latest
    assert 0.0 <= proposal.confidence <= 1.0
    voted = [date_range(v.value) for v in votes if v.weight > 0]
    assert proposal.earliest == min(r[0] for r in voted if r)
    assert proposal.latest == max(r[1] for r in voted if r)
    assert len(proposal.evidence) <= EVIDENCE


@given(ranges, st.lists(st.floats(min_value=1e-6, max_value=10.0), min_size=1, max_size=10))
@settings(max_examples=50, deadline=None)
def test_agreeing_neighbours_give_full_confidence(value: dict[str, int], ws: list[float]) -> None:
    proposal = date_summary([Vote(i, w, value) for i, w in enumerate(ws)])
    assert proposal is not None
    assert proposal.confidence == 1.0
    assert proposal.central == (value["from"] + value["to"]) / 2


def test_date_summary_by_hand() -> None:
    votes = [
        Vote("a", 0.9, {"from": 100, "to": 200}),  # midpoint 150
        Vote("b", 0.5, 180),
        Vote("c", 0.1, {"from": -50, "to": 50}),  # an outlier with little weight
        Vote("d", 0.4, "not a date"),
    ]
    p = date_summary(votes)
    assert p is not None
    assert (p.earliest, p.latest) == (-50, 200)
    assert p.central == 150  # the weighted median, not dragged by the outlier
    assert p.confidence == pytest.approx(1 - (180 - 0) / 250)
    assert [v.key for v in p.evidence] == ["a", "b", "c"]
    assert date_range({"to": 1999}) == (1999, 1999) and date_range(True) is None
