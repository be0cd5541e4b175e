"""The FAISS vector cache answers the dense leg exactly as the SQL leg does, under any ACL scope,
and never returns a row the store no longer holds (real PostgreSQL, real FAISS)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator

import asyncpg
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.access.acl import pushdown
from gateway.access.auth import Principal
from index.search.dense_leg import dense_search
from index.store.change_feed import Watermark, changes_since, current_watermark
from index.store.hits import Scope
from index.store.partitions import ModelPartition, ensure_partition
from index.store.pg_copy import parse_copy
from index.store.store import EmbeddingRow, delete_record, upsert_rows
from index.vectors.cache import VectorCache
from index.vectors.metrics import CacheMetrics
from index.vectors.packed_scopes import PackedScopes
from index.vectors.partition import CacheConfig
from tests.waiting import until

MODEL = "cache-test-16"
DIM = 16
SECTIONS = ["oh1", "rsc1", "fill1"]
COMPONENTS = ["rag:card", "rag:bio", "oh22", "oh23"]
CONTRIBUTORS = [["oh22"], ["oh22", "oh23"], ["rsc1/rsc140"], [], ["fill1/f1", "oh22"]]
PERM_KEYS = [*SECTIONS, "oh1/oh22", "oh1/oh23", "rsc1/rsc140", "fill1/f1", "rsc1/oh22"]


def _rows(rng: random.Random, section: str, record: int, projects: list[int], n: int) -> list[EmbeddingRow]:
    rows = []
    for i in range(n):
        component = rng.choice(COMPONENTS)
        meta = {"contributors": rng.choice(CONTRIBUTORS)} if component.startswith("rag:") else {}
        vec = np.asarray([rng.gauss(0, 1) for _ in range(DIM)], dtype=np.float32)
        rows.append(
            EmbeddingRow("text", section, record, component, "lg-spa", i, f"h{record}-{i}-{rng.random()}",
                         f"t{record}", "t", vec, projects=projects, chunk_meta=meta)
        )  # fmt: skip
    return rows


async def _write(pool: asyncpg.Pool, partition: ModelPartition, rng: random.Random, record: int) -> None:
    section = SECTIONS[record % len(SECTIONS)]
    projects = rng.sample([1, 2, 3], rng.randint(0, 2))
    rows = _rows(rng, section, record, projects, rng.randint(1, 4))
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            f"DELETE FROM {partition.table} WHERE section_tipo = $1 AND section_id = $2", section, record
        )
        await upsert_rows(conn, partition, rows)


async def _populate(pool: asyncpg.Pool, records: int, seed: int = 7) -> ModelPartition:
    partition = await ensure_partition(pool, MODEL, DIM)
    rng = random.Random(seed)
    for record in range(1, records + 1):
        await _write(pool, partition, rng, record)
    return partition


@pytest.fixture
async def cache_pool(db_pool: asyncpg.Pool) -> AsyncIterator[tuple[asyncpg.Pool, ModelPartition]]:
    yield db_pool, await _populate(db_pool, 120)


async def _cache(pool: asyncpg.Pool, url: str, **config: object) -> VectorCache:
    cache = VectorCache(pool, url, CacheConfig(mode="cpu", **config))  # type: ignore[arg-type]
    return cache


async def _exact(pool: asyncpg.Pool, partition: ModelPartition, q: np.ndarray, scope: Scope, k: int):
    async with pool.acquire() as conn:
        return await dense_search(conn, partition, q, scope, k, exact=True)


async def _cached(cache: VectorCache, pool: asyncpg.Pool, partition: ModelPartition, q, scope, k):
    async with pool.acquire() as conn:
        hits = await cache.search(conn, partition, q, scope, k)
    assert hits is not None, "the cache should have served this search"
    return hits


def _same(a, b) -> None:
    assert [h.key for h in a] == [h.key for h in b]
    assert [h.score for h in a] == [h.score for h in b]
    assert [h.projects for h in a] == [h.projects for h in b]


principals = st.builds(
    Principal,
    sub=st.just("p"),
    projects=st.one_of(st.none(), st.frozensets(st.sampled_from([1, 2, 3, 9]), max_size=3)),
    perms=st.dictionaries(st.sampled_from(PERM_KEYS), st.integers(0, 1), max_size=7),
    admin=st.booleans(),
)
scopes = st.builds(
    lambda sections, group, exclude: (sections, group, exclude),
    st.one_of(st.none(), st.lists(st.sampled_from(SECTIONS), min_size=1, max_size=2, unique=True).map(tuple)),
    st.sampled_from([None, None, "card", "bio"]),
    st.one_of(st.none(), st.integers(1, 120)),
)


def _scope(principal: Principal, raw) -> Scope:
    sections, group, exclude = raw
    excluded = None if exclude is None else (SECTIONS[exclude % len(SECTIONS)], exclude)
    return Scope(sections, group, excluded, pushdown(principal))


@pytest.fixture
async def loaded(cache_pool, database_url):
    pool, partition = cache_pool
    cache = await _cache(pool, database_url)
    await cache.load(partition)
    yield pool, partition, cache
    await cache.stop()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(principal=principals, raw=scopes, seed=st.integers(0, 2**31), k=st.sampled_from([1, 5, 20, 60]))
async def test_cache_equals_exact_sql_under_random_scopes(loaded, principal, raw, seed, k) -> None:
    """Both ways of searching a scope: its packed copy (every scope here is small) and the bitmap."""
    pool, partition, cache = loaded
    q = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    scope = _scope(principal, raw)
    exact = await _exact(pool, partition, q, scope, k)
    packing = cache.packed
    _same(await _cached(cache, pool, partition, q, scope, k), exact)
    cache.packed = PackedScopes(0, 0)
    try:
        _same(await _cached(cache, pool, partition, q, scope, k), exact)
    finally:
        cache.packed = packing


async def test_feed_applies_inserts_updates_deletes(loaded) -> None:
    pool, partition, cache = loaded
    rng = random.Random(3)
    hits = cache.metrics.searches.labels("hit")
    before = hits._value.get()
    for round_ in range(4):
        for record in rng.sample(range(1, 160), 12):  # new records (121..) and rewritten ones
            await _write(pool, partition, rng, record)
        async with pool.acquire() as conn:
            for record in rng.sample(range(1, 160), 4):
                await delete_record(conn, (SECTIONS[record % 3], record))
        applied = await cache.sync()
        assert applied > 0
        for trial in range(6):
            principal = Principal(
                "p", frozenset({1, 2}), {"oh1": 1, "rsc1": 1, "rsc1/oh22": 0}, admin=trial % 2 == 0
            )
            q = np.random.default_rng(round_ * 10 + trial).standard_normal(DIM).astype(np.float32)
            scope = Scope(acl=pushdown(principal))
            _same(
                await _cached(cache, pool, partition, q, scope, 10),
                await _exact(pool, partition, q, scope, 10),
            )
    assert hits._value.get() - before == 24
    live = await pool.fetchval(f"SELECT count(*) FROM {partition.table}")
    assert cache.partitions[partition.partition].live == live


async def test_deleted_row_is_never_returned_while_the_feed_lags(cache_pool, database_url) -> None:
    pool, partition = cache_pool
    cache = await _cache(pool, database_url)
    await cache.start()  # loads and listens
    try:
        await until(
            "the partition to load",
            lambda: (
                partition.partition in cache.partitions
                and cache.partitions[partition.partition].state == "ready"
            ),
        )
        await cache.stop_listening()  # the feed stops here: nothing more is applied
        q = np.random.default_rng(1).standard_normal(DIM).astype(np.float32)
        top = await _cached(cache, pool, partition, q, Scope(), 5)
        victim = top[0].record
        async with pool.acquire() as conn:
            await delete_record(conn, victim)
        fresh = EmbeddingRow("text", "oh1", 500, "oh22", "lg-spa", 0, "fresh", "t", "t", q, projects=[1])
        async with pool.acquire() as conn:  # ^ the new best match
            await upsert_rows(conn, partition, [fresh])
        watermark = cache.partitions[partition.partition].watermark
        after = await _cached(cache, pool, partition, q, Scope(), 5)
        assert cache.partitions[partition.partition].watermark == watermark  # really lagging
        assert victim not in {h.record for h in after}
        assert after[0].record == ("oh1", 500)  # unseen by the cache, found through the pending keys
        _same(after, await _exact(pool, partition, q, Scope(), 5))
        # The stale vector is still in the cache; the answer is exact anyway.
        assert victim in {k[:2] for k in cache.partitions[partition.partition].slot_of}
    finally:
        await cache.stop()


async def test_pending_changes_crowding_the_top_widen_the_search(loaded) -> None:
    """Rows rewritten (not yet applied) right at the top of the cache's list must not cost exactness."""
    pool, partition, cache = loaded
    q = np.random.default_rng(5).standard_normal(DIM).astype(np.float32)
    top = await _cached(cache, pool, partition, q, Scope(), 40)  # more than the cache's first fetch
    async with pool.acquire() as conn:  # push the current top far away, without telling the cache
        await conn.execute(
            f"UPDATE {partition.table} SET embedding = $1 WHERE section_tipo = ANY($2::text[]) AND section_id = ANY($3::bigint[])",
            -q,
            [h.section_tipo for h in top],
            [h.section_id for h in top],
        )
    _same(
        await _cached(cache, pool, partition, q, Scope(), 10), await _exact(pool, partition, q, Scope(), 10)
    )


async def test_over_budget_partition_falls_back_logged_and_counted(cache_pool, database_url, caplog) -> None:
    pool, partition = cache_pool
    cache = await _cache(pool, database_url, max_bytes=1024)  # far less than 300 x 16 floats
    with caplog.at_level(logging.WARNING, logger="index.vectors.cache"):
        await cache.load(partition)
    assert cache.partitions[partition.partition].state == "over_budget"
    assert "RAG_FAISS_MAX_BYTES" in caplog.text
    assert cache.metrics.over_budget._value.get() == 1
    async with pool.acquire() as conn:
        assert await cache.search(conn, partition, np.ones(DIM, np.float32), Scope(), 5) is None
    assert cache.metrics.searches.labels("over_budget")._value.get() == 1


async def test_unfiltered_scopes_past_the_cpu_scan_bound_go_to_hnsw(cache_pool, database_url) -> None:
    """On CPU an admin's unfiltered search over a partition past ``cpu_broad_scan_max`` is left to
    pgvector (counted as ``broad``); a scope with any filter is still the cache's, exactly."""
    pool, partition = cache_pool
    cache = await _cache(pool, database_url, cpu_broad_scan_max=10)  # the partition holds ~300 rows
    await cache.load(partition)
    q = np.random.default_rng(3).standard_normal(DIM).astype(np.float32)
    async with pool.acquire() as conn:
        assert await cache.search(conn, partition, q, Scope(), 5) is None
        assert await cache.search(conn, partition, q, Scope(exclude_record=("oh1", 3)), 5) is None
    assert cache.metrics.searches.labels("broad")._value.get() == 2
    researcher = Principal(sub="r", projects=frozenset({1}), perms={"oh1": 1})
    for scope in (Scope(section_tipos=("oh1",)), Scope(group="card"), Scope(acl=pushdown(researcher))):
        _same(await _cached(cache, pool, partition, q, scope, 5), await _exact(pool, partition, q, scope, 5))
    await cache.stop()


async def test_partition_growing_past_the_budget_is_dropped(cache_pool, database_url) -> None:
    pool, partition = cache_pool
    rows = await pool.fetchval(f"SELECT count(*) FROM {partition.table}")
    cache = await _cache(pool, database_url, max_bytes=(rows + 2) * DIM * 4)
    await cache.load(partition)
    assert cache.partitions[partition.partition].state == "ready"
    rng = random.Random(2)
    for record in range(600, 610):
        await _write(pool, partition, rng, record)
    await cache.sync()
    assert cache.partitions[partition.partition].state == "over_budget"
    assert cache.partitions[partition.partition].index.nbytes == 0


async def test_off_mode_serves_nothing(cache_pool, database_url) -> None:
    pool, partition = cache_pool
    cache = VectorCache(pool, database_url, CacheConfig(mode="off"))
    await cache.start()
    async with pool.acquire() as conn:
        assert await cache.search(conn, partition, np.ones(DIM, np.float32), Scope(), 5) is None
    assert cache.partitions == {}
    await cache.stop()


async def test_watermark_rereads_changes_of_transactions_running_at_the_last_read(cache_pool) -> None:
    """A sequence number taken by a transaction that commits *after* a later one was read is not lost."""
    pool, partition = cache_pool
    async with pool.acquire() as reader:
        start = await current_watermark(reader, partition)
    slow = await pool.acquire()
    try:
        tx = slow.transaction()
        await tx.start()
        await slow.execute(f"UPDATE {partition.table} SET chunk_meta = chunk_meta WHERE section_id = 1")
        await _write(pool, partition, random.Random(4), 2)  # commits with a larger seq, first
        async with pool.acquire() as reader:
            first = await changes_since(reader, partition, start)
        assert {c.key[1] for c in first.changes} == {2}
        await tx.commit()
    finally:
        await pool.release(slow)
    async with pool.acquire() as reader:
        second = await changes_since(reader, partition, first.watermark)
    assert 1 in {c.key[1] for c in second.changes}
    assert second.watermark.seq >= first.watermark.seq
    assert isinstance(second.watermark, Watermark)


def test_parse_copy_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_copy(b"not a copy", 4)


def test_metrics_render_the_cache_families() -> None:
    from prometheus_client import generate_latest

    metrics = CacheMetrics()
    metrics.searches.labels("hit").inc()
    text = generate_latest(metrics.registry).decode()
    for family in ("mnemo_faiss_searches_total", "mnemo_faiss_sync_lag_seconds", "mnemo_faiss_partitions"):
        assert family in text
    assert json.dumps({"ok": True})


async def test_cache_survives_a_postgres_restart_and_catches_up() -> None:
    """A dedicated server (stopping the session one would disturb other tests): the listener
    reconnects, the feed catches up on what was written after the restart, answers stay exact."""
    import shutil
    import tempfile
    from pathlib import Path

    from schema import EmbeddedPostgres, create_pool, init_connection, migrate

    root = Path(tempfile.mkdtemp(prefix="mnemo-test-restart-"))
    server = EmbeddedPostgres(root / "pg")
    url = server.start()
    try:
        await migrate(url)
        pool = await create_pool(url, max_size=3)
        cache = VectorCache(pool, url, CacheConfig(mode="cpu", poll_s=0.5))
        try:
            partition = await _populate(pool, 40)
            await cache.start()

            def ready() -> bool:
                pc = cache.partitions.get(partition.partition)
                return (
                    pc is not None
                    and pc.state == "ready"
                    and bool(cache.listener and cache.listener.connected)
                )

            await until("the partition to load and the feed to listen", ready)
            reconnects = cache.listener.reconnects
            server.stop()
            server = EmbeddedPostgres(root / "pg")
            url = server.start()
            conn = await asyncpg.connect(url)
            await init_connection(conn)
            try:
                q = np.random.default_rng(2).standard_normal(DIM).astype(np.float32)
                fresh = EmbeddingRow(
                    "text", "oh1", 900, "oh22", "lg-spa", 0, "fresh", "t", "t", q, projects=[1]
                )
                await upsert_rows(conn, partition, [fresh])
                await delete_record(conn, ("rsc1", 1))
                seq = await conn.fetchval("SELECT max(seq) FROM rag_embedding_changes")
                pc = cache.partitions[partition.partition]
                # The feed reconnects (backoff) and catches up by itself (a loaded run took over a minute).
                await until(
                    "the cache to catch up after the restart",
                    lambda: pc.watermark.seq >= seq and cache.listener.connected,
                )
                assert cache.listener.reconnects > reconnects
                assert ("oh1", 900) in {k[:2] for k in pc.slot_of}
                assert ("rsc1", 1) not in {k[:2] for k in pc.slot_of}
                hits = await cache.search(conn, partition, q, Scope(), 5)
                assert hits is not None and hits[0].record == ("oh1", 900)
                exact = await dense_search(conn, partition, q, Scope(), 5, exact=True)
                _same(hits, exact)
            finally:
                await conn.close()
        finally:
            await cache.stop()
            await pool.close()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def test_concurrent_searches_share_a_scan_and_stay_exact(loaded) -> None:
    """Searches arriving together are answered by one batched scan, each under its own scope."""
    pool, partition, cache = loaded
    cache.packed = PackedScopes(0, 0)  # every scope through the shared scan, none packed
    principals = [
        Principal("root", None, {}, admin=True),
        Principal("p", frozenset({1}), {"oh1": 1, "rsc1": 1}),
        Principal("p", frozenset({2, 3}), {"fill1": 1, "oh1": 1, "oh1/oh23": 0}),
        Principal("p", None, {"rsc1": 1, "rsc1/rsc140": 1}),
    ]
    cases = [
        (np.random.default_rng(100 + i).standard_normal(DIM).astype(np.float32), Scope(acl=pushdown(p)), k)
        for i, (p, k) in enumerate((p, k) for p in principals for k in (3, 10, 25))
    ]
    calls = []
    for q, scope, k in cases:
        calls.append(_cached(cache, pool, partition, q, scope, k))
    got = await asyncio.gather(*calls)
    for (q, scope, k), hits in zip(cases, got, strict=True):
        _same(hits, await _exact(pool, partition, q, scope, k))


def test_batched_scan_equals_selector_search() -> None:
    from index.vectors.faiss_backend import FlatIndex

    rng = np.random.default_rng(0)
    index = FlatIndex(8)
    index.append(rng.standard_normal((500, 8)).astype(np.float32))
    queries = rng.standard_normal((6, 8)).astype(np.float32)
    masks = [rng.random(500) < share for share in (1.0, 0.5, 0.1, 0.01, 0.002, 0.0)]
    batched = index.search_batch(queries, 7, masks)
    for q, mask, (scores, slots) in zip(queries, masks, batched, strict=True):
        one_scores, one_slots = index.search(q, 7, np.packbits(mask, bitorder="little"))
        assert slots.tolist() == one_slots.tolist()
        assert np.allclose(scores, one_scores, atol=1e-5)
        assert all(mask[s] for s in slots)


def test_cpu_threads_are_capped_per_search() -> None:
    """RAG_FAISS_THREADS (CacheConfig.threads) caps FAISS's OpenMP and numpy's BLAS process-wide; in a
    child process, so this one keeps its defaults."""
    import subprocess
    import sys

    code = (
        "import faiss, threadpoolctl\n"
        "from index.vectors.faiss_backend import limit_cpu_threads\n"
        "limit_cpu_threads(1)\n"
        "blas = [i['num_threads'] for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas']\n"
        "print(faiss.omp_get_max_threads(), sorted(set(blas)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[0] == "1 [1]"
    with pytest.raises(ValueError):
        CacheConfig(threads=-1)


async def test_reread_is_planned_with_its_values_every_time(loaded) -> None:
    """The cache re-reads its candidates by key; a generic plan (PostgreSQL's choice after five runs of
    one prepared statement) cannot see how few keys there are: 5.6 ms a search against 2.4 at 10k."""
    pool, partition, cache = loaded
    rng = np.random.default_rng(4)
    async with pool.acquire() as conn:
        for _ in range(12):
            assert await cache.search(
                conn, partition, rng.standard_normal(DIM).astype(np.float32), Scope(), 10
            )
        plans = await conn.fetch(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE $1",
            "%WITH cand AS%",
        )
    assert plans and sum(p["custom_plans"] for p in plans) >= 12
    assert sum(p["generic_plans"] for p in plans) == 0


async def test_small_scopes_are_searched_over_a_packed_copy_until_a_change_is_applied(loaded) -> None:
    """A small scope's copy is kept across searches and empty syncs, and never used once a change was
    applied: a row moved to the query's best match is found at once."""
    pool, partition, cache = loaded
    researcher = Principal("r", frozenset({1}), {"oh1": 1})
    scope = Scope(acl=pushdown(researcher))
    q = np.random.default_rng(8).standard_normal(DIM).astype(np.float32)
    _same(await _cached(cache, pool, partition, q, scope, 5), await _exact(pool, partition, q, scope, 5))
    assert len(cache.packed) == 1
    (key,) = cache.packed._copies
    copy = cache.packed._copies[key]
    assert len(copy.slots) == len(await _exact(pool, partition, q, scope, 10_000))  # the scope's rows
    await cache.sync()  # nothing changed: the copy stays
    await _cached(cache, pool, partition, q, scope, 5)
    assert cache.packed._copies[key] is copy
    # The scope's worst row becomes the best match and a new row joins the scope; the feed applies both.
    worst = (await _exact(pool, partition, -q, scope, 1))[0]
    async with pool.acquire() as conn:
        await conn.execute(
            f"UPDATE {partition.table} SET embedding = $1 WHERE section_tipo = $2 AND section_id = $3",
            q, worst.section_tipo, worst.section_id,
        )  # fmt: skip
        joined = EmbeddingRow(
            "text", "oh1", 900, "oh22", "lg-spa", 0, "joined", "t", "t", q * 0.5, projects=[1]
        )
        await upsert_rows(conn, partition, [joined])
    assert await cache.sync() > 0
    after = await _cached(cache, pool, partition, q, scope, 5)
    _same(after, await _exact(pool, partition, q, scope, 5))
    assert {worst.record, ("oh1", 900)} <= {h.record for h in after[:3]}
    assert (
        cache.packed._copies[key] is not copy and len(cache.packed._copies[key].slots) == len(copy.slots) + 1
    )
    assert cache.status()["packed_scopes"] == {"count": 1, "bytes": cache.packed.nbytes}
    assert cache.metrics.packed_bytes._value.get() == cache.packed.nbytes > 0


async def test_a_scope_past_the_packing_bound_uses_the_bitmap(cache_pool, database_url) -> None:
    pool, partition = cache_pool
    cache = await _cache(pool, database_url, packed_scope_rows=5)  # every filtered scope here is larger
    await cache.load(partition)
    scope = Scope(section_tipos=("oh1",))
    q = np.random.default_rng(9).standard_normal(DIM).astype(np.float32)
    _same(await _cached(cache, pool, partition, q, scope, 8), await _exact(pool, partition, q, scope, 8))
    assert len(cache.packed) == 0
    await cache.stop()
