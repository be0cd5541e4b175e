"""The ingestion queue on real PostgreSQL: versions, backoff, parking, outages, stats, leases."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest

from index.ingest import queue
from index.ingest.drain import drain_once
from index.ingest.queue import Job
from inference.client import SidecarClient
from tests.ingest_support import SETTINGS, queue_rows

LEASE = queue.Lease("worker-a", 60)
OTHER = queue.Lease("worker-b", 60)


@pytest.mark.parametrize(
    ("attempts", "seconds"), [(1, 120), (2, 240), (3, 480), (4, 960), (5, 1800), (30, 1800)]
)
def test_backoff_is_two_to_the_attempts_minutes_capped(attempts: int, seconds: float) -> None:
    assert queue.backoff_seconds(attempts, cap=1800) == seconds


async def _claim_one(pool: asyncpg.Pool) -> queue.QueueItem:
    items = await queue.claim_ready(pool, 10, 5, lease=LEASE)
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
        assert row["backoff"] == timedelta(seconds=queue.backoff_seconds(attempt, 1800))
        assert await queue.claim_ready(db_pool, 10, 5, lease=LEASE) == []  # backing off: not ready
        await db_pool.execute("UPDATE rag_index_queue SET next_attempt_at = now()")
    # Parked: never claimed again, counted as failed, error kept.
    assert await queue.claim_ready(db_pool, 10, 5, lease=LEASE) == []
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
    items = await queue.claim_ready(db_pool, 10, 5, lease=LEASE)
    await queue.note_outage(db_pool, items[:2], "connection refused")
    rows = await queue_rows(db_pool)
    assert [r["attempts"] for r in rows] == [0, 0, 0]
    assert rows[0]["last_error"] == queue.OUTAGE_PREFIX + "connection refused"
    stats = await queue.stats(db_pool, 5)
    assert (stats.pending, stats.ready, stats.waiting_on_sidecar) == (3, 3, 2)


async def test_stats_split_ready_blocked_failed_and_age(db_pool: asyncpg.Pool) -> None:
    await queue.enqueue(db_pool, [Job("s1", i, "index", {}) for i in range(1, 5)])
    # One transaction: its now() is one instant, so the oldest record is exactly ten minutes old
    # however long the statements take.
    async with db_pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "UPDATE rag_index_queue SET created_at = now() - interval '10 minutes' WHERE section_id = 1"
        )
        await conn.execute(
            "UPDATE rag_index_queue SET next_attempt_at = now() + interval '1 hour', attempts = 1 "
            "WHERE section_id = 2"
        )
        await conn.execute("UPDATE rag_index_queue SET attempts = 5 WHERE section_id = 3")
        stats = await queue.stats(conn, 5)
    assert (stats.pending, stats.ready, stats.blocked, stats.failed) == (3, 2, 1, 1)
    assert stats.oldest_age_s == 600.0
    assert await queue.retry(db_pool, include_blocked=True, max_attempts=5) == 2
    assert (await queue.stats(db_pool, 5)).ready == 4


async def test_concurrent_claims_lease_disjoint_batches(db_pool: asyncpg.Pool) -> None:
    await queue.enqueue(db_pool, [Job("s1", i, "index", {}) for i in range(1, 41)])
    leases = [queue.Lease(f"worker-{n}", 60) for n in range(6)]
    claims = await asyncio.gather(*(queue.claim_ready(db_pool, 5, 5, lease=lease) for lease in leases))
    claims += await asyncio.gather(*(queue.claim_ready(db_pool, 5, 5, lease=lease) for lease in leases))
    claimed = [(i.section_id, i.lease_owner) for batch in claims for i in batch]
    ids = [section_id for section_id, _ in claimed]
    assert sorted(ids) == list(range(1, 41))  # every record once: none twice, none left out
    owners = dict(claimed)
    rows = await db_pool.fetch("SELECT section_id, lease_owner FROM rag_index_queue")
    assert {r["section_id"]: r["lease_owner"] for r in rows} == owners
    assert (await queue.stats(db_pool, 5)).leased == 40


async def test_a_lease_holds_until_it_expires_then_another_worker_takes_over(db_pool: asyncpg.Pool) -> None:
    await queue.enqueue(db_pool, [Job("oh1", 1, "index", {"v": 1})])
    mine = await _claim_one(db_pool)
    assert mine.lease_owner == LEASE.owner
    assert await queue.claim_ready(db_pool, 10, 5, lease=OTHER) == []
    assert await queue.renew_leases(db_pool, LEASE, [("oh1", 1)]) == 1
    # The holder is killed: it stops renewing, and the lease runs out (time moved by hand).
    await db_pool.execute("UPDATE rag_index_queue SET lease_until = now() - interval '1 second'")
    stats = await queue.stats(db_pool, 5)
    assert (stats.leased, stats.expired_leases, stats.ready) == (0, 1, 1)
    (theirs,) = await queue.claim_ready(db_pool, 10, 5, lease=OTHER)
    assert (theirs.lease_owner, theirs.version) == (OTHER.owner, 1)
    # The old holder, had it survived, may write nothing nor spend the new holder's attempt.
    async with db_pool.acquire() as conn, conn.transaction():
        assert await queue.hold(conn, mine) is False
    await queue.fail(db_pool, mine, "late", max_attempts=5, backoff_cap=1800)
    assert await queue.renew_leases(db_pool, LEASE, [("oh1", 1)]) == 0
    row = (await queue_rows(db_pool))[0]
    assert (row["attempts"], row["last_error"]) == (0, None)
    async with db_pool.acquire() as conn, conn.transaction():
        assert await queue.hold(conn, theirs) is True
        assert await queue.complete(conn, theirs) is True
    assert await queue_rows(db_pool) == []


async def test_a_push_mid_processing_waits_for_the_holder_then_wins(db_pool: asyncpg.Pool) -> None:
    await queue.enqueue(db_pool, [Job("oh1", 1, "index", {"v": 1})])
    processing = await _claim_one(db_pool)
    await queue.enqueue(db_pool, [Job("oh1", 1, "index", {"v": 2})])
    # The newer version stays with the holder: no second worker may process the record now.
    assert await queue.claim_ready(db_pool, 10, 5, lease=OTHER) == []
    async with db_pool.acquire() as conn, conn.transaction():
        assert await queue.hold(conn, processing) is True
        assert await queue.complete(conn, processing) is False  # superseded: lease given back
    (newer,) = await queue.claim_ready(db_pool, 10, 5, lease=OTHER)
    assert (newer.payload, newer.version, newer.lease_owner) == ({"v": 2}, 2, OTHER.owner)


async def test_a_stopping_worker_gives_its_leases_back(db_pool: asyncpg.Pool) -> None:
    await queue.enqueue(db_pool, [Job("s1", i, "index", {}) for i in (1, 2, 3)])
    assert len(await queue.claim_ready(db_pool, 2, 5, lease=LEASE)) == 2
    assert await queue.release_all(db_pool, LEASE.owner) == 2
    assert len(await queue.claim_ready(db_pool, 10, 5, lease=OTHER)) == 3


async def test_a_pass_that_meets_an_outage_leaves_the_record_queued_and_unleased(
    db_pool: asyncpg.Pool,
) -> None:
    await queue.enqueue(db_pool, [Job("oh1", 1, "index", {})])
    async with SidecarClient("http://127.0.0.1:9", max_retries=0, timeout=1) as client:
        report = await drain_once(db_pool, client, SETTINGS)
    assert report.unavailable and report.processed == 0
    row = (await queue_rows(db_pool))[0]
    assert row["attempts"] == 0 and row["last_error"].startswith(queue.OUTAGE_PREFIX)
    assert await db_pool.fetchval("SELECT lease_owner FROM rag_index_queue") is None
    assert await db_pool.fetchval("SELECT count(*) FROM rag_drain_workers") == 0  # unregistered


async def test_renewal_skips_the_row_its_owner_is_writing_instead_of_waiting(db_pool: asyncpg.Pool) -> None:
    """The heartbeat must not stall behind the worker's own long write (the row is locked, so
    nobody can claim it meanwhile); it renews the other leases with the clock of the moment."""
    await queue.enqueue(db_pool, [Job("s1", i, "index", {}) for i in (1, 2)])
    writing, other = await queue.claim_ready(db_pool, 10, 5, lease=LEASE)
    await db_pool.execute("UPDATE rag_index_queue SET lease_until = now() - interval '1 second'")
    async with db_pool.acquire() as conn, conn.transaction():
        assert await queue.hold(conn, writing)
        # Bounded only so that a regression fails instead of hanging: a renewal waiting on the
        # lock would never return while this transaction is open.
        keys = [(i.section_tipo, i.section_id) for i in (writing, other)]
        assert await asyncio.wait_for(queue.renew_leases(db_pool, LEASE, keys), 60) == 1
        assert await queue.claim_ready(db_pool, 10, 5, lease=OTHER) == []  # locked, or renewed
    leases = await db_pool.fetch("SELECT section_id, lease_until > now() AS live FROM rag_index_queue")
    assert {r["section_id"]: r["live"] for r in leases} == {writing.section_id: False, other.section_id: True}
