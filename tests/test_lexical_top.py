"""The in-memory lexical index's top-k against a brute-force BM25 over the same chunks. The index is the
benchmarks' reference baseline (:mod:`benchmarks.memory_lexical`, no product engine): the bars of the
Tantivy engine are ratios to its latency, so its answers must stay exact.

:meth:`benchmarks.memory_lexicon.PartitionLexicon.top` scores a query two ways. Exhaustively, it builds
the match set three ways (one selective term's postings as they are; a small union sorted; a large
one marked in per-slot scratch and scanned) and scores all of it. With MaxScore it skips what
cannot reach the cut. Each way must give the best chunks (every tie at the cut included) their
exact BM25 sums under any access scope, and leave the reused scratch clean. No database: the
lexicon is fed rows as the change feed would.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from benchmarks import memory_lexicon
from benchmarks.memory_lexicon import PartitionLexicon
from index.search.bm25 import BM25_B, BM25_K1, Bm25Plan, bm25_idf, bm25_plan
from index.store.partitions import ModelPartition

VOCAB = [f"w{i}" for i in range(300)]
ZIPF = [1 / (i + 1) for i in range(len(VOCAB))]
AVGDL = 6.0


class _Row(dict):
    """A change-feed row: its key columns by position, the rest by name."""

    def __getitem__(self, k):
        return self["key"][k] if isinstance(k, int) else dict.__getitem__(self, k)


@pytest.fixture(scope="module")
def lexicon() -> tuple[PartitionLexicon, dict[int, tuple[dict[str, int], int]]]:
    rng = random.Random(3)
    lx = PartitionLexicon(ModelPartition("m", 4, "vector", "t"))
    chunks: dict[int, tuple[dict[str, int], int]] = {}
    for i in range(5000):
        words = sorted(set(rng.choices(VOCAB, ZIPF, k=rng.randint(1, 12))))
        tfs = [rng.randint(1, 3) for _ in words]
        key = ("s", i, "c", "l", "", 0)
        lx.apply([_Row(key=key, lexical_length=sum(tfs), lexemes=words, tfs=tfs, projects=[1], acl_pairs=None, acl_sections=None)])  # fmt: skip
        chunks[lx.slot_of[key]] = (dict(zip(words, tfs, strict=True)), sum(tfs))
    return lx, chunks


def _bm25(tf: int, dl: int, avgdl: float = AVGDL) -> float:
    return tf / (tf + BM25_K1 * (1 - BM25_B + BM25_B * dl / avgdl))


@pytest.mark.parametrize("seed", range(8))
def test_top_scores_every_match_exactly_and_leaves_its_scratch_clean(lexicon, seed: int, monkeypatch) -> None:
    monkeypatch.setattr(memory_lexicon, "MAX_SCORE_MIN_POSTINGS", math.inf)  # every match scored
    lx, chunks = lexicon
    rng = random.Random(seed)
    ways = set()
    for _ in range(50):
        terms = rng.sample(VOCAB, rng.randint(1, 5))
        selective = rng.sample(terms, rng.randint(1, len(terms)))
        weights = [rng.random() for _ in terms]
        plan = Bm25Plan(terms=terms, weights=weights, selective=selective, avgdl=AVGDL)
        slots, scores, whole = lx.top(plan, None, [], 10**9)
        expected = {
            slot: sum(w * _bm25(tf[t], dl) for t, w in zip(terms, weights, strict=True) if t in tf)
            for slot, (tf, dl) in chunks.items()
            if any(t in tf for t in selective)
        }
        got = dict(zip(slots.tolist(), scores.tolist(), strict=True))
        assert whole and got.keys() == expected.keys()
        assert [got[s] for s in expected] == pytest.approx(list(expected.values()), rel=1e-12)
        assert not lx.scratch_member.any() and not lx.scratch_total.any()
        matched = sum(len(lx.postings[t][0]) for t in selective)
        ways.add("one" if len(selective) == 1 else "sorted" if matched * 16 < lx.size else "scanned")
    if seed == 0:
        assert ways == {"one", "sorted", "scanned"}  # the three ways of building the match set ran


def _zipf_rows(rng: random.Random, count: int, first: int = 0) -> list[_Row]:
    """Chunks of Zipfian words, a third of them repeating one of a few texts (ties at every cut),
    spread over 100 access classes (projects)."""
    templates = [rng.choices(VOCAB, ZIPF, k=rng.randint(2, 10)) for _ in range(5)]
    rows = []
    for i in range(first, first + count):
        words = (
            rng.choice(templates) if rng.random() < 0.3 else rng.choices(VOCAB, ZIPF, k=rng.randint(1, 14))
        )
        tf: dict[str, int] = {}
        for w in words:
            tf[w] = tf.get(w, 0) + 1
        key = ("s", i, "c", "l", "", 0)
        lexemes = sorted(tf)
        rows.append(_Row(key=key, lexical_length=len(words), lexemes=lexemes, tfs=[tf[w] for w in lexemes], projects=[i % 100], acl_pairs=None, acl_sections=None))  # fmt: skip
    return rows


@pytest.fixture(scope="module", params=["fresh", "rewritten"])
def zipf_lexicon(request) -> tuple[PartitionLexicon, dict[int, tuple[dict[str, int], int]]]:
    """12,000 chunks as loaded ("fresh": every slot alive, so an unscoped search checks no slot), or
    with 1,500 of them updated and 500 deleted since ("rewritten": dead slots to skip)."""
    lx = PartitionLexicon(ModelPartition("m", 4, "vector", "t"))
    rows = _zipf_rows(random.Random(5), 12_000)
    lx.apply(rows)
    if request.param == "rewritten":
        updated = _zipf_rows(random.Random(6), 1_500)  # the same keys, new texts, new slots
        deleted = [_Row(key=("s", i, "c", "l", "", 0), lexical_length=None) for i in range(1_500, 2_000)]
        lx.apply(updated)  # the words it touches drop their dead postings, so delete after it:
        lx.apply(deleted)  # the deleted chunks' postings stay, dead, in every list
        rows = updated + rows[2_000:]
        assert lx.dead == 2_000
    chunks = {
        lx.slot_of[r["key"]]: (dict(zip(r["lexemes"], r["tfs"], strict=True)), r["lexical_length"])
        for r in rows
    }
    return lx, chunks


def _plan(lx: PartitionLexicon, terms: list[str], avgdl: float) -> Bm25Plan:
    """The search's own plan (bm25_plan) of each term once, over the lexicon's live statistics."""
    n = lx.live
    df = {t: lx.df(t, None) for t in terms}
    idf = {t: bm25_idf(n, d) for t, d in df.items() if d}
    plan = bm25_plan(dict.fromkeys(terms, 1), idf, df, n, avgdl)
    assert plan is not None
    return plan


@pytest.mark.parametrize("seed", range(6))
def test_max_score_returns_the_exhaustive_top_k_with_its_ties_under_any_scope(
    zipf_lexicon, seed, monkeypatch
):
    """MaxScore's answer is the brute-force one: the ``fetch`` best permitted matches and every chunk
    tied with the last, same sums; and it does skip work (candidates dropped, common words' summands
    looked up for the few candidates left)."""
    lx, chunks = zipf_lexicon
    pruned, lookups = [], []
    max_score, summand_at = PartitionLexicon._top_max_score, PartitionLexicon._summand_at
    monkeypatch.setattr(
        PartitionLexicon, "_top_max_score", lambda *a: pruned.append(max_score(*a)) or pruned[-1]
    )
    monkeypatch.setattr(PartitionLexicon, "_summand_at", lambda *a: lookups.append(1) or summand_at(*a))
    rng = random.Random(seed)
    avgdl = float(np.mean([dl for _, dl in chunks.values()]))
    for _ in range(40):
        terms = list(dict.fromkeys(rng.choices(VOCAB, ZIPF, k=rng.randint(2, 9))))
        if len(terms) < 2:
            continue
        plan = _plan(lx, terms, avgdl * rng.choice([1.0, 0.7, 1.4]))  # a section scope's mean length too
        fetch = rng.choice([1, 5, 20, 58])
        allowed = None if rng.random() < 0.4 else np.array([rng.random() < 0.3 for _ in range(100)])
        exclude = rng.sample(sorted(chunks), 40) if rng.random() < 0.5 else []
        expected = {
            slot: sum(
                w * _bm25(tf[t], dl, plan.avgdl)
                for t, w in zip(plan.terms, plan.weights, strict=True)
                if t in tf
            )
            for slot, (tf, dl) in chunks.items()
            if any(t in tf for t in plan.selective)
            and (allowed is None or allowed[slot % 100])  # chunk i (slot i or 12,000 + i): projects [i % 100]
            and slot not in exclude
        }
        slots, scores, whole = lx.top(plan, allowed, exclude, fetch)
        got = dict(zip(slots.tolist(), scores.tolist(), strict=True))
        ranked = sorted(expected.values(), reverse=True)
        if len(ranked) > fetch:
            kth = ranked[fetch - 1]
            expected = {s: v for s, v in expected.items() if v >= kth - 1e-9 * abs(kth)}
        assert got.keys() == expected.keys(), (plan, fetch)
        assert [got[s] for s in expected] == pytest.approx(list(expected.values()), rel=1e-12)
        assert not whole or len(got) == len(expected)
        assert not lx.scratch_member.any() and not lx.scratch_total.any()
    assert any(r is not None and not r[2] for r in pruned), "MaxScore never skipped a match"
    assert lookups, "no summand was looked up by binary search"


def test_term_bounds_cover_every_summand_at_any_mean_length_and_follow_writes() -> None:
    """A term's bound is at least its summand in every chunk, at the mean length it was measured at
    (by a load's measure_bounds, or by the first search) and at others, through writes (new chunks,
    updates of old ones); one that gives the term a stronger chunk raises it."""
    lx = PartitionLexicon(ModelPartition("m", 4, "vector", "t"))
    lx.apply(_zipf_rows(random.Random(8), 3_000))
    lx.measure_bounds(min_postings=100)  # what a load does for long lists, at the partition's mean length
    assert set(lx.term_bounds) == {t for t, (slots, *_) in lx.postings.items() if len(slots) >= 100}

    def strongest(term: str, avgdl: float) -> float:
        slots, tfs, _ = lx.postings[term]
        return max(
            _bm25(int(tf), int(lx.length[s]), avgdl)
            for s, tf in zip(slots.tolist(), tfs.tolist(), strict=True)
            if lx.alive[s]
        )

    for term in VOCAB[:40]:
        for avgdl in (AVGDL, AVGDL / 3, AVGDL * 3):  # measured at the first, scaled to the others
            assert lx._bound(term, avgdl) >= strongest(term, avgdl) * (1 - 1e-12)
    rng = random.Random(9)
    for _ in range(5):  # a batch of new chunks and of updates to old ones (new texts, same keys)
        updates = _zipf_rows(rng, 200, first=rng.randrange(2_800))
        lx.apply(_zipf_rows(rng, 200, first=lx.size + 10**5) + updates)
        for term in VOCAB[:40]:
            assert lx._bound(term, AVGDL) >= strongest(term, AVGDL) * (1 - 1e-12)
    before = lx._bound("w0", AVGDL)
    key = ("s", 10**6, "c", "l", "", 0)
    lx.apply([_Row(key=key, lexical_length=1, lexemes=["w0"], tfs=[50], projects=[1], acl_pairs=None, acl_sections=None)])  # fmt: skip
    assert lx._bound("w0", AVGDL) >= strongest("w0", AVGDL) > before


def test_the_lexicon_keeps_one_copy_of_each_key_text() -> None:
    """Each row from the driver brings its own copies of the key's strings; the lexicon keeps one of
    each value for every key that holds it (a key per chunk: at 1M chunks, copies cost ~200 MiB)."""
    lx = PartitionLexicon(ModelPartition("m", 4, "vector", "t"))

    def fresh(text: str) -> str:
        return "".join(list(text))  # an equal string, another object

    rows = [
        _Row(key=(fresh("oh1"), i, fresh("rag:doc"), fresh("lg-spa"), fresh("v"), 0), lexical_length=1,
             lexemes=["w"], tfs=[1], projects=[1], acl_pairs=None, acl_sections=None)
        for i in range(3)
    ]  # fmt: skip
    assert rows[0]["key"][0] is not rows[1]["key"][0]
    lx.apply(rows)
    keys = [lx.key_of[slot] for slot in range(3)]
    for column in (0, 2, 3, 4):
        assert len({id(k[column]) for k in keys}) == 1, column
    assert keys[0] == rows[0]["key"] and lx.slot_of[rows[2]["key"]] == 2  # found by value as before


def test_counts_past_uint16_widen_the_postings_and_still_score_exactly() -> None:
    """Term frequencies and chunk lengths are kept per posting as uint16; a chunk longer than 65,535
    lexemes widens that term's arrays (never wraps), and its summand stays the exact BM25."""
    assert memory_lexicon._counts([1, 65_535]).dtype == np.uint16
    assert memory_lexicon._counts([1, 65_536]).tolist() == [1, 65_536]
    with pytest.raises(ValueError):
        memory_lexicon._counts([-1])
    lx = PartitionLexicon(ModelPartition("m", 4, "vector", "t"))
    for i, (length, tf) in enumerate([(5, 2), (70_000, 3), (9, 1)]):
        row = _Row(key=("s", i, "c", "l", "", 0), lexical_length=length, lexemes=["w", f"only{i}"], tfs=[tf, 1],
                   projects=[1], acl_pairs=None, acl_sections=None)  # fmt: skip
        lx.apply([row])
    _, tfs, lengths = lx.postings["w"]
    assert lengths.dtype == np.uint32 and lengths.tolist() == [5, 70_000, 9] and tfs.tolist() == [2, 3, 1]
    plan = Bm25Plan(terms=["w"], weights=[1.0], selective=["w"], avgdl=AVGDL)
    got, scores, _ = lx.top(plan, None, [], 10)
    expected = {0: _bm25(2, 5), 1: _bm25(3, 70_000), 2: _bm25(1, 9)}
    assert dict(zip(got.tolist(), scores.tolist(), strict=True)) == pytest.approx(expected, rel=1e-12)
