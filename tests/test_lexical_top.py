"""The in-memory lexical index's top-k against a brute-force BM25 over the same chunks.

:meth:`index.lexical_index.PartitionLexicon.top` builds its match set three ways (one selective
term's postings as they are; a small union sorted; a large one marked in per-slot scratch and
scanned) and reuses that scratch across searches. Each way must give every matching chunk its exact
BM25 sum, and leave the scratch clean. No database: the lexicon is fed rows as the change feed
would.
"""

from __future__ import annotations

import random

import pytest

from index.lexical_index import PartitionLexicon
from index.partitions import ModelPartition
from index.search import BM25_B, BM25_K1, Bm25Plan

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


def _bm25(tf: int, dl: int) -> float:
    return tf / (tf + BM25_K1 * (1 - BM25_B + BM25_B * dl / AVGDL))


@pytest.mark.parametrize("seed", range(8))
def test_top_scores_every_match_exactly_and_leaves_its_scratch_clean(lexicon, seed: int) -> None:
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
