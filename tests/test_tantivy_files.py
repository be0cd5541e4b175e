"""The Tantivy index's stored BM25 inputs: each row's lexeme counts, read back exactly.

A search scores its candidates from these bytes (``index.lexical.engine``), so a count read wrong
would be a wrong score served: every lexeme is read back with its stored count, and a term the row
does not hold, however close to one it holds (a prefix, a suffix, a count's digits, a lexeme with a
colon or a space), counts 0.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from index.lexical import files as tantivy_files
from index.lexical.files import MAX_COUNT, key_of, key_text, term_counts_bytes, term_counts_of
from index.search.bm25 import bm25_summand

lexemes = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8)
rows = st.dictionaries(lexemes, st.integers(1, 300), max_size=12)


@settings(max_examples=300, deadline=None)
@given(held=st.lists(rows, min_size=1, max_size=6), extra=st.lists(lexemes, max_size=6))
def test_each_rows_count_of_each_term_is_read_back_exactly(held, extra) -> None:
    stored = [term_counts_bytes(list(row), list(row.values())) for row in held]
    probes = {t for row in held for t in row} | set(extra)
    probes |= {t[:-1] for t in probes if len(t) > 1} | {t[1:] for t in probes if len(t) > 1}
    probes |= {str(tf) for row in held for tf in row.values()} | {f"{t}:1" for t in list(probes)[:3]}
    terms = sorted(probes)
    # A row holding a lexeme more than MAX_COUNT times stores no counts: PostgreSQL scores it.
    readable = [row if max(row.values(), default=0) <= MAX_COUNT else {} for row in held]
    assert [s is None for s in stored] == [r is not row for r, row in zip(readable, held, strict=True)]
    held = readable
    expected = [[row.get(term, 0) for row in held] for term in terms]
    assert term_counts_of(stored, terms).tolist() == expected  # all the terms in one pass
    for term in terms[:5]:
        assert term_counts_of(stored, [term]).tolist() == [[row.get(term, 0) for row in held]]


def test_a_row_whose_lexemes_share_a_hash_stores_no_counts_and_counts_nothing(monkeypatch) -> None:
    """Its score is then PostgreSQL's (the engine passes no score for it), never a guess."""
    assert term_counts_bytes(["new york", "harbour"], [1, 2]) is not None  # any text is a lexeme
    harbour = term_counts_bytes(["harbour"], [3])
    with monkeypatch.context() as patched:
        patched.setattr(tantivy_files, "lexeme_hash", lambda lexeme: 7)
        assert term_counts_bytes(["quay", "harbour"], [1, 2]) is None
    stored = [None, harbour]
    assert term_counts_of(stored, ["harbour"]).tolist() == [[0, 3]]
    assert term_counts_of([None, None], ["harbour"]).tolist() == [[0, 0]]
    assert term_counts_of(stored, []).shape == (0, 2)


def test_a_count_past_the_largest_stored_is_left_to_postgresql() -> None:
    assert term_counts_of([term_counts_bytes(["bell"], [MAX_COUNT])], ["bell"]).tolist() == [[MAX_COUNT]]
    assert term_counts_bytes(["bell", "tower"], [1, MAX_COUNT + 1]) is None


texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)


@settings(max_examples=200, deadline=None)
@given(key=st.tuples(texts, st.integers(-(2**31), 2**31 - 1), texts, texts, texts, st.integers(0, 2**31 - 1)))
def test_a_row_key_survives_its_text(key) -> None:
    """The key term a document is found and deleted by names its row and no other (PostgreSQL
    text holds no NUL, the separator)."""
    assert key_of(key_text(key)) == key


@settings(max_examples=100, deadline=None)
@given(
    tfs=st.lists(st.lists(st.integers(0, 50), min_size=3, max_size=3), min_size=1, max_size=6),
    weights=st.lists(st.floats(0.01, 20.0), min_size=1, max_size=6),
    lengths=st.lists(st.integers(1, 500), min_size=3, max_size=3),
)
def test_every_terms_summands_at_once_equal_each_terms_own(tfs, weights, lengths) -> None:
    """The Tantivy engine scores all its candidates' terms in one broadcast call; the benchmarks'
    in-memory baseline one term at a time: the same floats, bit for bit, summed in the plan's order."""
    n = min(len(tfs), len(weights))
    matrix, w, dl = np.array(tfs[:n]), np.array(weights[:n]), np.array(lengths)
    at_once = bm25_summand(w[:, None], matrix, dl, 87.5).sum(axis=0)
    one_by_one = np.zeros(3)
    for weight, row in zip(w, matrix, strict=True):
        one_by_one += bm25_summand(float(weight), row, dl, 87.5)
    assert at_once.tolist() == one_by_one.tolist()
