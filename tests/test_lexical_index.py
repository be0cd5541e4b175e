"""The in-memory lexical index answers the lexical leg exactly as the SQL leg does, under any scope and
ACL, follows inserts, updates and deletes, and rebuilds from the store alone (real PostgreSQL).

The index is the benchmarks' reference baseline (:mod:`benchmarks.memory_lexical`), no product
engine (``RAG_LEXICAL_INDEX=memory`` was retired); the Tantivy engine's latency bars are ratios to
it, so it must stay exact. Its helpers (``VOCAB``, ``_populate``, ``_rows``, ``_write``, ``_sql``,
``_same``) serve the Tantivy engine's tests too."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import asyncpg
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.memory_lexical import LexicalConfig, LexicalIndex
from gateway.access.acl import pushdown
from gateway.access.auth import Principal
from index.lexical.metrics import LexicalMetrics
from index.search.bm25 import CorpusStats
from index.search.lexical_leg import lexical_search
from index.store.hits import Scope
from index.store.partitions import ModelPartition, ensure_partition
from index.store.store import EmbeddingRow, delete_record, upsert_rows
from tests.test_bm25 import DOCS
from tests.test_vector_cache import COMPONENTS, CONTRIBUTORS, SECTIONS, _scope, principals, scopes

MODEL = "lexical-test-4"
# A Zipf-like vocabulary: "archive" is in most chunks (a common term: it scores, it does not widen
# the match set), the tail is rare; "7" is a lone digit the query side keeps.
VOCAB = ["archive", "letter", "photograph", "mayor", "harbour", "vessel", "inventory", "signature",
         "valencia", "carpenter", "drawing", "ceramic", "amphora", "bronze", "ledger", "7", "cadastre",
         "notary", "orchard", "lighthouse", "weaver", "tannery", "procession", "bishop", "quarry"]  # fmt: skip
WEIGHTS = [1.0 / (i + 1) for i in range(len(VOCAB))]


def _text(rng: random.Random) -> str:
    words = rng.choices(VOCAB, WEIGHTS, k=rng.randint(1, 14))
    if rng.random() < 0.7:
        words.append("archive")
    return " ".join(words)


def _rows(rng: random.Random, record: int, n: int) -> list[EmbeddingRow]:
    section = SECTIONS[record % len(SECTIONS)]
    projects = rng.sample([1, 2, 3], rng.randint(0, 2))
    rows = []
    for i in range(n):
        component = rng.choice(COMPONENTS)
        meta = {"contributors": rng.choice(CONTRIBUTORS)} if component.startswith("rag:") else {}
        text = _text(rng)
        rows.append(
            EmbeddingRow("text", section, record, component, "lg-eng", i, f"h{record}-{i}-{rng.random()}",
                         text, text, np.ones(4, dtype=np.float32), projects=projects, chunk_meta=meta)
        )  # fmt: skip
    return rows


async def _write(pool: asyncpg.Pool, partition: ModelPartition, rows: list[EmbeddingRow]) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            f"DELETE FROM {partition.table} WHERE section_tipo = $1 AND section_id = $2",
            rows[0].section_tipo,
            rows[0].section_id,
        )
        await upsert_rows(conn, partition, rows)


async def _populate(pool: asyncpg.Pool, records: int, seed: int = 11) -> ModelPartition:
    partition = await ensure_partition(pool, MODEL, 4)
    rng = random.Random(seed)
    for record in range(1, records + 1):
        await _write(pool, partition, _rows(rng, record, rng.randint(1, 4)))
    return partition


@pytest.fixture
async def loaded(db_pool: asyncpg.Pool, database_url: str) -> AsyncIterator[tuple]:
    partition = await _populate(db_pool, 120)
    index = LexicalIndex(db_pool, database_url, LexicalConfig())
    await index.load(partition)
    yield db_pool, partition, index
    await index.stop()


async def _sql(pool: asyncpg.Pool, partition: ModelPartition, query: str, scope: Scope, k: int):
    # Fresh statistics: the SQL leg's cache would otherwise keep counts from before a change.
    return await lexical_search(pool, partition, query, scope, k, stats=CorpusStats(ttl=0))


async def _indexed(index: LexicalIndex, pool: asyncpg.Pool, partition: ModelPartition, query, scope, k):
    async with pool.acquire() as conn:
        hits = await index.search(conn, partition, query, scope, k)
    assert hits is not None, "the index should have served this search"
    return hits


def _same(a, b) -> None:
    assert [h.key for h in a] == [h.key for h in b]
    assert [h.score for h in a] == pytest.approx([h.score for h in b], rel=1e-9)
    assert [h.text for h in a] == [h.text for h in b]


queries = st.lists(st.sampled_from([*VOCAB, "the", "of", "unknownword", "a"]), min_size=1, max_size=12).map(
    " ".join
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(principal=principals, raw=scopes, query=queries, k=st.sampled_from([1, 5, 20, 60]))
async def test_index_equals_the_sql_leg_under_random_scopes(loaded, principal, raw, query, k) -> None:
    pool, partition, index = loaded
    scope = _scope(principal, raw)
    _same(
        await _indexed(index, pool, partition, query, scope, k), await _sql(pool, partition, query, scope, k)
    )
    lexicon = index.ready(partition)  # top()'s per-slot scratch is left clean for the next search
    assert lexicon is not None and not lexicon.scratch_member.any() and not lexicon.scratch_total.any()


async def test_scores_match_bm25s_on_plain_text(db_pool: asyncpg.Pool, database_url: str) -> None:
    import bm25s

    partition = await ensure_partition(db_pool, "bm25-index-test", 4)
    await upsert_rows(
        db_pool,
        partition,
        [
            EmbeddingRow("text", "bm25", i, "rag:doc", "lg-eng", 0, f"h{i}", t, t, np.ones(4))
            for i, t in enumerate(DOCS, 1)
        ],
    )
    index = LexicalIndex(db_pool, database_url, LexicalConfig())
    await index.load(partition)
    reference = bm25s.BM25()
    reference.index(bm25s.tokenize(DOCS, stopwords="en", show_progress=False), show_progress=False)
    for query in ["message passing message", "remote compilers", "garbage systems garbage garbage", "clocks"]:
        expected = reference.get_scores(query.split())
        hits = await _indexed(index, db_pool, partition, query, Scope(), 10)
        assert {h.section_id: h.score for h in hits} == pytest.approx(
            {i + 1: float(s) for i, s in enumerate(expected) if s > 0}, rel=1e-5
        )


async def test_a_tiny_visible_share_still_fills_the_limit(db_pool: asyncpg.Pool, database_url: str) -> None:
    partition = await ensure_partition(db_pool, MODEL, 4)
    rows = []
    for record in range(1, 401):  # 400 records; project 9 holds every 50th: 2% of the chunks
        text = "archive letter harbour" if record % 50 else "archive harbour ledger"
        rows.append(
            EmbeddingRow("text", "oh1", record, "oh22", "lg-eng", 0, f"h{record}", text, text,
                         np.ones(4, dtype=np.float32), projects=[9] if record % 50 == 0 else [1])
        )  # fmt: skip
    await upsert_rows(db_pool, partition, rows)
    index = LexicalIndex(db_pool, database_url, LexicalConfig())
    await index.load(partition)
    narrow = Scope(acl=pushdown(Principal("p", frozenset({9}), {"oh1": 1})))
    # Both terms are common (no selective term: all match); the 8 visible chunks lack "letter", so
    # 392 invisible ones outrank them: a post-filtered top 8 would come back empty.
    hits = await _indexed(index, db_pool, partition, "letter harbour", narrow, 8)
    assert len(hits) == 8 and {h.section_id % 50 for h in hits} == {0}
    _same(hits, await _sql(db_pool, partition, "letter harbour", narrow, 8))


async def test_the_feed_applies_inserts_updates_deletes(loaded) -> None:
    pool, partition, index = loaded
    lexicon = index.ready(partition)
    assert lexicon is not None
    before = lexicon.live
    text = "zanzibar lighthouse lighthouse"
    row = EmbeddingRow("text", "oh1", 999, "oh22", "lg-eng", 0, "h999", text, text,
                       np.ones(4, dtype=np.float32), projects=[1])  # fmt: skip
    await upsert_rows(pool, partition, [row])
    # Not applied yet: the new row is still found by a term the index knows (pending keys are
    # re-read and scored in SQL); statistics, and so a term no chunk had, wait for the apply.
    hits = await _indexed(index, pool, partition, "lighthouse", Scope(), 3)
    assert hits[0].section_id == 999
    assert await _indexed(index, pool, partition, "zanzibar", Scope(), 3) == []
    assert await index.sync() == 1
    assert [h.section_id for h in await _indexed(index, pool, partition, "zanzibar", Scope(), 3)] == [999]
    assert lexicon.live == before + 1 and lexicon.df("zanzibar", None) == 1
    _same(await _indexed(index, pool, partition, "zanzibar archive", Scope(), 20),
          await _sql(pool, partition, "zanzibar archive", Scope(), 20))  # fmt: skip

    updated = EmbeddingRow("text", "oh1", 999, "oh22", "lg-eng", 0, "h999b", "lighthouse weaver",
                           "lighthouse weaver", np.ones(4, dtype=np.float32), projects=[1])  # fmt: skip
    await upsert_rows(pool, partition, [updated])
    assert await _indexed(index, pool, partition, "zanzibar", Scope(), 5) == []  # before the sync too
    await index.sync()
    assert lexicon.df("zanzibar", None) == 0 and lexicon.live == before + 1
    _same(await _indexed(index, pool, partition, "lighthouse weaver", Scope(), 20),
          await _sql(pool, partition, "lighthouse weaver", Scope(), 20))  # fmt: skip

    await delete_record(pool, ("oh1", 999))
    assert 999 not in {
        h.section_id for h in await _indexed(index, pool, partition, "lighthouse", Scope(), 200)
    }
    await index.sync()
    assert lexicon.live == before
    for query in ["lighthouse weaver", "archive 7", "bishop quarry archive"]:
        _same(
            await _indexed(index, pool, partition, query, Scope(), 30),
            await _sql(pool, partition, query, Scope(), 30),
        )


async def test_a_rebuild_from_the_store_equals_the_followed_index(loaded, database_url) -> None:
    pool, partition, index = loaded
    rng = random.Random(5)
    for record in (3, 17, 40, 121, 122):  # updates and inserts
        await _write(pool, partition, _rows(rng, record, rng.randint(1, 3)))
    await delete_record(pool, (SECTIONS[8 % 3], 8))
    await index.sync()
    followed = index.ready(partition)
    rebuilt = await LexicalIndex(pool, database_url, LexicalConfig()).load(partition)
    assert followed is not None and followed.live == rebuilt.live
    for sections in (None, ("oh1",), ("rsc1", "fill1")):
        n, avgdl, f_mask = followed.corpus(sections)
        assert (n, avgdl) == rebuilt.corpus(sections)[:2]
        r_mask = rebuilt.corpus(sections)[2]
        for term in VOCAB:
            assert followed.df(term, f_mask) == rebuilt.df(term, r_mask)
    principal = Principal("p", frozenset({1, 2}), {"oh1": 1, "rsc1": 1, "oh1/oh22": 1})
    scope = Scope(acl=pushdown(principal))
    for query in ["archive letter", "mayor harbour vessel", "7 inventory signature"]:
        _same(
            await _indexed(index, pool, partition, query, scope, 25),
            await _sql(pool, partition, query, scope, 25),
        )


async def test_cold_and_image_searches_go_to_the_sql_leg_and_are_counted(db_pool, database_url) -> None:
    partition = await _populate(db_pool, 5)
    metrics = LexicalMetrics()
    index = LexicalIndex(db_pool, database_url, LexicalConfig(), metrics)
    async with db_pool.acquire() as conn:
        assert await index.search(conn, partition, "archive", Scope(), 5) is None  # not loaded: cold
        await index.load(partition)
        assert await index.search(conn, partition, "archive", Scope(), 5, modality="image") is None
        assert await index.search(conn, partition, "archive", Scope(), 5) is not None
    assert metrics.searches.labels("cold")._value.get() == 1
    assert metrics.searches.labels("image")._value.get() == 1
    assert metrics.searches.labels("hit")._value.get() == 1
    assert index.status()["partitions"][partition.partition]["state"] == "ready"


async def test_a_class_new_since_the_scope_was_evaluated_is_not_selected(loaded) -> None:
    pool, partition, index = loaded
    lexicon = index.ready(partition)
    assert lexicon is not None
    scope = Scope(acl=pushdown(Principal("p", frozenset({7}), {"oh1": 1})))
    async with pool.acquire() as conn:
        allowed = await index._allowed(conn, lexicon, scope)
        assert allowed is not None and not allowed.any()  # nobody is in project 7 yet
        text = "quarry quarry lighthouse"
        row = EmbeddingRow("text", "oh1", 777, "oh22", "lg-eng", 0, "h777", text, text,
                           np.ones(4, dtype=np.float32), projects=[7])  # fmt: skip
        await upsert_rows(pool, partition, [row])
        await index.sync()  # the row's class is new: the evaluated scope does not cover it
        plan = await index.plan(conn, lexicon, "quarry", None)
        assert plan is not None
        slots, _, _ = lexicon.top(plan, allowed, (), 10)
        assert len(slots) == 0
        # A search evaluates the new class and finds the row, as the SQL leg does.
        _same(
            await index.search(conn, partition, "quarry", scope, 10),
            await _sql(pool, partition, "quarry", scope, 10),
        )
        assert [h.section_id for h in await index.search(conn, partition, "quarry", scope, 10)] == [777]


async def test_pending_changes_crowding_the_candidates_widen_then_fall_back_counted(
    db_pool, database_url
) -> None:
    partition = await _populate(db_pool, 120)
    metrics = LexicalMetrics()
    index = LexicalIndex(db_pool, database_url, LexicalConfig(max_fetch_factor=4), metrics)
    await index.load(partition)
    # Every chunk changes and nothing is applied: no candidate can be trusted.
    await db_pool.execute(f"UPDATE {partition.table} SET source_hash = source_hash || 'x'")
    async with db_pool.acquire() as conn:
        assert await index.search(conn, partition, "letter archive", Scope(), 5) is None
        assert metrics.searches.labels("fallback")._value.get() == 1
        # A query whose whole match set fits the candidates is still answered exactly from the re-read.
        hits = await index.search(conn, partition, "bishop quarry", Scope(), 200)
        assert hits is not None
        _same(hits, await _sql(db_pool, partition, "bishop quarry", Scope(), 200))
    await index.sync()
    async with db_pool.acquire() as conn:
        hits = await index.search(conn, partition, "letter archive", Scope(), 5)
    assert hits is not None and metrics.searches.labels("hit")._value.get() == 2
    _same(hits, await _sql(db_pool, partition, "letter archive", Scope(), 5))
