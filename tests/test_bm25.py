"""The lexical leg is a real BM25: same scores as bm25s on clean text, query term frequency, length rules."""

from __future__ import annotations

import re
from importlib import resources

import asyncpg
import numpy as np
import pytest

from index.search.bm25 import CorpusStats, scored_terms
from index.search.lexical_leg import lexical_search
from index.search.stopwords import STOPWORDS
from index.store import store
from index.store.hits import Scope
from index.store.partitions import ensure_partition

# Plain English with no stop word of any language the query side knows, so bm25s's tokenizer
# (2+ character words, English stop words) and ours see exactly the same tokens and lengths.
DOCS = [
    "message passing between remote processes message queues",
    "remote procedure calls over networks",
    "compilers translate programs into machine code",
    "garbage collection compilers runtime systems garbage",
    "distributed systems message ordering clocks",
    "matrix inversion numerical methods",
]


def test_query_terms_keep_their_frequency_and_lose_one_letter_tokens() -> None:
    # "I'm interested in message passing, message queues": the parser's lexemes with counts.
    terms = {"i": 1, "m": 1, "interested": 1, "in": 1, "message": 2, "passing": 1, "queues": 1}
    assert scored_terms(terms) == {"interested": 1, "message": 2, "passing": 1, "queues": 1}
    assert scored_terms({"sala": 1, "7": 1, "b": 1}) == {"sala": 1, "7": 1}  # a lone digit can be a signature
    assert scored_terms({"a": 1}) == {"a": 1}  # nothing else left: keep what there is


def test_the_length_migration_lists_every_stop_word_the_query_side_drops() -> None:
    sql = resources.files("schema.migrations").joinpath("0012_bm25_length.sql").read_text()
    listed = re.search(r"ANY \('\{(.*?)\}'::text\[\]\)", sql, re.S)
    assert listed is not None
    assert {w.strip() for w in listed.group(1).split(",")} == frozenset().union(*STOPWORDS.values())


async def test_chunk_length_counts_what_bm25_scores(db_pool: asyncpg.Pool) -> None:
    # the (stop) · message-passing (compound: its parts count) · message · passing · of (stop) ·
    # i, m, s, 7 (one character) · system · systems  ->  4
    text = "the message-passing of I'm system's 7 systems"
    assert await db_pool.fetchval("SELECT rag_bm25_length($1)", text) == 4


async def _store(pool: asyncpg.Pool, docs: list[str], model: str = "bm25-test"):
    partition = await ensure_partition(pool, model, 3)
    async with pool.acquire() as conn:
        for i, text in enumerate(docs, start=1):
            row = store.EmbeddingRow(
                "text", "bm25", i, "rag:doc", "lg-eng", 0, f"h{i}", text, text, np.ones(3)
            )
            await store.upsert_rows(conn, partition, [row])
    return partition


@pytest.mark.parametrize(
    "query",
    ["message passing message", "remote compilers", "garbage systems garbage garbage", "clocks"],
)
async def test_scores_match_bm25s(db_pool: asyncpg.Pool, query: str) -> None:
    import bm25s

    partition = await _store(db_pool, DOCS)
    hits = await lexical_search(db_pool, partition, query, Scope(), 10, stats=CorpusStats())
    reference = bm25s.BM25()  # Lucene BM25, k1 1.5, b 0.75: the same constants
    reference.index(bm25s.tokenize(DOCS, stopwords="en", show_progress=False), show_progress=False)
    expected = reference.get_scores(query.split())  # bm25s sums over query tokens, repeats included
    got = {hit.section_id: hit.score for hit in hits}
    assert set(got) == {i + 1 for i, s in enumerate(expected) if s > 0}
    for section_id, score in got.items():
        assert score == pytest.approx(float(expected[section_id - 1]), rel=1e-5)


async def test_expired_statistics_serve_while_one_background_recount_runs(db_pool: asyncpg.Pool) -> None:
    """Past the ttl the held statistics answer at once and one task recounts them (the count, and the
    frequencies of the terms used), so no request waits for a recount; then the new counts serve."""
    now = [1000.0]
    stats = CorpusStats(ttl=60, clock=lambda: now[0])
    stats.refresh_on(db_pool)
    partition = await _store(db_pool, DOCS, model="bm25-recount")  # its own: rows are added below
    first, idf = await stats.idf(db_pool, partition, ["message", "clocks"])
    assert (first.n, first.df["message"], first.df["clocks"]) == (6, 2, 1)
    async with db_pool.acquire() as conn:  # two more chunks with "clocks" after the count
        rows = [
            store.EmbeddingRow("text", "bm25", 7 + i, "rag:doc", "lg-eng", 0, f"n{i}", t, t, np.ones(3))
            for i, t in enumerate(["clocks drift", "vector clocks"])
        ]
        await store.upsert_rows(conn, partition, rows)
    now[0] += 30  # within the ttl: the held counts
    held, _ = await stats.idf(db_pool, partition, ["clocks"])
    assert held is first and held.df["clocks"] == 1
    now[0] += 31  # past it: still the held counts, answered without waiting, and one recount started
    stale, stale_idf = await stats.idf(db_pool, partition, ["clocks"])
    again, _ = await stats.idf(db_pool, partition, ["message"])
    assert stale is first and again is first and stale_idf["clocks"] == idf["clocks"]
    (recount,) = stats._refreshing.values()  # one task for the scope, however many callers
    await recount
    fresh, fresh_idf = await stats.idf(db_pool, partition, ["clocks", "message"])
    assert (fresh.n, fresh.df["clocks"], fresh.df["message"]) == (8, 3, 2)
    assert fresh_idf["clocks"] < idf["clocks"]  # a commoner term now
    await stats.stop()
