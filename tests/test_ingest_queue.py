"""The ingestion queue on real PostgreSQL: versions, backoff, parking, outages, stats, single flight."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import pytest

from index import queue
from index.drain import drain_once
from index.queue import Job
from inference.client import SidecarClient
from tests.ingest_support import SETTINGS, queue_rows


@pytest.mark.parametrize(
    ("attempts", "seconds"), [(1, 120), (2, 240), (3, 480), (4, 960), (5, 1800), (30, 1800)]
)
def test_backoff_is_two_to_the_attempts_minutes_capped(attempts: int, seconds: float) -> None:
    assert queue.backoff_seconds(attempts, cap=1800) == seconds


async def _claim_one(pool: asyncpg.Pool) -> queue.QueueItem:
    items = await queue.claim_ready(pool, 10, 5)
    assert len(items) == 1
    return items[0]


async def test_a_failing_record_backs_off_then_parks_and_retry_unparks_it(db_pool: asyncpg.Pool) -> None:
    await queue.enqueue(db_pool, [Job("oh1", 1, "index", {"k": 1})])
    for attempt in range(1, 6):
        item = await _claim_one(db_pool)
        assert item.attempts == attempt - 1
        parked = await queue.fail(db_pool, item, f"boom {attempt}", max_attempts=5, backoff_cap=1800)
        assert parked == (attempt == 5)
        row = (await queue_rows(db_pool))[0]
        assert row["attempts"] == attempt and row["last_error"] == f"boom {attempt}"
        expected = timedelta(seconds=queue.backoff_seconds(attempt, 1800))
        assert expected - timedelta(seconds=5) < row["wait"] <= expected
        assert await queue.claim_ready(db_pool, 10, 5) == []  # backing off: not ready
        await db_pool.execute("UPDATE rag_index_queue SET next_attempt_at = now()")
    # Parked: never claimed again, counted as failed, error kept.
    assert await queue.claim_ready(db_pool, 10, 5) == []
    stats = await queue.stats(db_pool, 5)
    assert (stats.pending, stats.ready, stats.blocked, stats.failed) == (0, 0, 0, 1)
    assert stats.oldest_age_s is None
    failed = await queue.list_entries(db_pool, max_attempts=5, failed_only=True)
    assert [(r["state"], r["last_error"]) for r in failed] == [("failed", "boom 5")]

    assert await queue.retry(db_pool, section_tipo="other", max_attempts=5) == 0
    assert await queue.retry(db_pool, section_tipo="oh1", section_id=1, max_attempts=5) == 1
    item = await _claim_one(db_pool)
    assert item.attempts == 0 and item.payload == {"k": 1}


async def test_an_edit_during_the_drain_is_never_lost(db_pool: asyncpg.Pool) -> None:
    await queue.enqueue(db_pool, [Job("oh1", 1, "index", {"v": 1})])
    processing = await _claim_one(db_pool)
    await queue.enqueue(db_pool, [Job("oh1", 1, "index", {"v": 2})])  # lands mid-drain
    async with db_pool.acquire() as conn, conn.transaction():
        assert await queue.complete(conn, processing) is False
    # A failure of the old version does not touch the new one either.
    await queue.fail(db_pool, processing, "late failure", max_attempts=5, backoff_cap=1800)
    again = await _claim_one(db_pool)
    assert (again.payload, again.version, again.attempts) == ({"v": 2}, 2, 0)
    async with db_pool.acquire() as conn, conn.transaction():
        assert await queue.complete(conn, again) is True
    assert await queue_rows(db_pool) == []


async def test_a_push_resets_a_parked_record(db_pool: asyncpg.Pool) -> None:
    await queue.enqueue(db_pool, [Job("oh1", 1, "index", {"v": 1})])
    await db_pool.execute("UPDATE rag_index_queue SET attempts = 5, last_error = 'old'")
    assert (await queue.stats(db_pool, 5)).failed == 1
    await queue.enqueue(db_pool, [Job("oh1", 1, "index", {"v": 2})])
    row = (await queue_rows(db_pool))[0]
    assert (row["attempts"], row["last_error"], row["version"]) == (0, None, 2)


async def test_an_outage_spends_no_attempt_and_shows_in_stats(db_pool: asyncpg.Pool) -> None:
    await queue.enqueue(db_pool, [Job("oh1", i, "index", {}) for i in (1, 2, 3)])
    items = await queue.claim_ready(db_pool, 10, 5)
    await queue.note_outage(db_pool, items[:2], "connection refused")
    rows = await queue_rows(db_pool)
    assert [r["attempts"] for r in rows] == [0, 0, 0]
    assert rows[0]["last_error"] == queue.OUTAGE_PREFIX + "connection refused"
    stats = await queue.stats(db_pool, 5)
    assert (stats.pending, stats.ready, stats.waiting_on_sidecar) == (3, 3, 2)


async def test_stats_split_ready_blocked_failed_and_age(db_pool: asyncpg.Pool) -> None:
    await queue.enqueue(db_pool, [Job("s1", i, "index", {}) for i in range(1, 5)])
    aged_at = await db_pool.fetchval("SELECT clock_timestamp()")
    await db_pool.execute(
        "UPDATE rag_index_queue SET created_at = now() - interval '10 minutes' WHERE section_id = 1"
    )
    await db_pool.execute(
        "UPDATE rag_index_queue SET next_attempt_at = now() + interval '1 hour', attempts = 1 "
        "WHERE section_id = 2"
    )
    await db_pool.execute("UPDATE rag_index_queue SET attempts = 5 WHERE section_id = 3")
    stats = await queue.stats(db_pool, 5)
    assert (stats.pending, stats.ready, stats.blocked, stats.failed) == (3, 2, 1, 1)
    # Ten minutes plus however long the statements between took: the database's own clock, no guess.
    since = await db_pool.fetchval("SELECT extract(epoch FROM clock_timestamp() - $1::timestamptz)", aged_at)
    assert 600 <= stats.oldest_age_s <= 600 + float(since), (stats.oldest_age_s, since)
    assert await queue.retry(db_pool, include_blocked=True, max_attempts=5) == 2
    assert (await queue.stats(db_pool, 5)).ready == 4


async def test_the_drain_is_single_flighted_by_an_advisory_lock(db_pool: asyncpg.Pool) -> None:
    await queue.enqueue(db_pool, [Job("oh1", 1, "index", {})])
    # A client that cannot reach anything: a skipped pass must not even try.
    async with SidecarClient("http://127.0.0.1:9", max_retries=0, timeout=1) as client:
        async with db_pool.acquire() as holder:
            assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", queue.DRAIN_LOCK_KEY)
            try:
                report = await drain_once(db_pool, client, SETTINGS)
            finally:
                await holder.execute("SELECT pg_advisory_unlock($1)", queue.DRAIN_LOCK_KEY)
        assert report.skipped and report.processed == 0
        row = (await queue_rows(db_pool))[0]
        assert row["last_error"] is None and row["attempts"] == 0
        # With the lock free the pass runs, meets the outage and leaves the record queued.
        report = await drain_once(db_pool, client, SETTINGS)
        assert not report.skipped and report.unavailable
        row = (await queue_rows(db_pool))[0]
        assert row["attempts"] == 0 and row["last_error"].startswith(queue.OUTAGE_PREFIX)
        # The lock was released: another session can take it.
        async with db_pool.acquire() as other:
            assert await other.fetchval("SELECT pg_try_advisory_lock($1)", queue.DRAIN_LOCK_KEY)
            await other.execute("SELECT pg_advisory_unlock($1)", queue.DRAIN_LOCK_KEY)
