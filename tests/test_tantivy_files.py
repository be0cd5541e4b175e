"""The Tantivy index's stored BM25 inputs: each row's lexeme counts, read back exactly.

A search scores its candidates from these bytes (``index.tantivy_lexical``), so a count read wrong
would be a wrong score served: every lexeme PostgreSQL can produce (any text without a space;
PostgreSQL text holds no NUL) is read back as stored, and a term the row does not hold, however
close to one it holds (a prefix, a suffix, a count's digits, a lexeme with a colon), counts 0.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from index.tantivy_files import term_counts_bytes, term_counts_of

lexemes = st.text(
    st.characters(blacklist_characters=" \x00", blacklist_categories=("Cs",)), min_size=1, max_size=8
)
rows = st.dictionaries(lexemes, st.integers(1, 300), max_size=12)


@settings(max_examples=300, deadline=None)
@given(held=st.lists(rows, min_size=1, max_size=6), extra=st.lists(lexemes, max_size=6))
def test_each_rows_count_of_each_term_is_read_back_exactly(held, extra) -> None:
    stored = [term_counts_bytes(list(row), list(row.values())) for row in held]
    probes = {t for row in held for t in row} | set(extra)
    probes |= {t[:-1] for t in probes if len(t) > 1} | {t[1:] for t in probes if len(t) > 1}
    probes |= {str(tf) for row in held for tf in row.values()} | {f"{t}:1" for t in list(probes)[:3]}
    terms = sorted(probes)
    expected = [[row.get(term, 0) for row in held] for term in terms]
    assert term_counts_of(stored, terms).tolist() == expected  # all the terms in one scan
    for term in terms[:5]:
        assert term_counts_of(stored, [term]).tolist() == [[row.get(term, 0) for row in held]]


def test_a_row_with_a_spaced_lexeme_stores_no_counts_and_counts_nothing() -> None:
    """Its score is then PostgreSQL's (the engine passes no score for it), never a guess."""
    assert term_counts_bytes(["new york", "harbour"], [1, 2]) is None
    stored = [None, term_counts_bytes(["harbour"], [3])]
    assert term_counts_of(stored, ["harbour"]).tolist() == [[0, 3]]
    assert term_counts_of([None, None], ["harbour"]).tolist() == [[0, 0]]
    assert term_counts_of(stored, []).shape == (0, 2)
