"""Faults with the real sidecar and real PostgreSQL: an outage loses nothing, a killed drain leaves
no half-written record, a failing record backs off, parks and is retried."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

import index.store.store
from index.ingest import queue
from index.ingest.drain import DrainLoop, drain_once
from index.ingest.intake import enqueue_records
from index.ingest.metrics import IngestMetrics
from index.store.sections import SectionStore
from inference.client import EmbedResult, SidecarClient
from tests.ingest_support import (
    ORAL_HISTORY,
    SETTINGS,
    TEXT_MODEL,
    CountingClient,
    closed_port_url,
    make_ready,
    queue_rows,
    record,
    text_rows,
)
from tests.waiting import until


@pytest.fixture
async def pool(db_pool: asyncpg.Pool) -> asyncpg.Pool:
    await SectionStore(db_pool).put("oh1", ORAL_HISTORY)
    return db_pool


async def _records_in_store(pool: asyncpg.Pool) -> set[int]:
    return {r["section_id"] for r in await text_rows(pool)}


async def test_a_sidecar_outage_loses_nothing(pool: asyncpg.Pool, sidecar_url: str) -> None:
    ids = list(range(1, 12))  # more than one claim batch
    await enqueue_records(pool, [record(i) for i in ids])
    async with SidecarClient(closed_port_url(), max_retries=1, timeout=2) as down:
        for _ in range(3):  # an outage spends no attempts, however long it lasts
            report = await drain_once(pool, down, SETTINGS, text_model=TEXT_MODEL)
            assert report.unavailable and report.processed == 0 and report.failed == 0
    rows = await queue_rows(pool)
    assert [r["section_id"] for r in rows] == ids and all(r["attempts"] == 0 for r in rows)
    stats = await queue.stats(pool, SETTINGS.max_attempts)
    assert (stats.pending, stats.ready, stats.failed) == (len(ids), len(ids), 0)
    assert stats.waiting_on_sidecar == SETTINGS.batch_records  # the batch the pass had claimed
    assert await _records_in_store(pool) == set()

    async with CountingClient(sidecar_url) as up:  # the sidecar is back
        report = await drain_once(pool, up, SETTINGS, text_model=TEXT_MODEL)
    assert (report.indexed, report.failed, report.unavailable) == (len(ids), 0, False)
    assert await queue_rows(pool) == []
    assert await _records_in_store(pool) == set(ids)


async def _snapshot(pool: asyncpg.Pool) -> list[tuple[Any, ...]]:
    return [
        (r["component_tipo"], r["lang"], r["chunk_index"], r["source_hash"], r["projects"], r["updated_at"])
        for r in await text_rows(pool)
    ]


async def _indexed_then_edited(pool: asyncpg.Pool, client: CountingClient) -> list[tuple[Any, ...]]:
    """Index record 1, queue an edit of it (new projects, one group gone); return the stored rows."""
    await enqueue_records(pool, [record(1)])
    await drain_once(pool, client, SETTINGS, text_model=TEXT_MODEL)
    before = await _snapshot(pool)
    edited = record(1, projects=[9])
    edited["groups"]["summary"]["lg-eng"] = "A new summary: the bells of the drowned church."
    del edited["groups"]["transcription"]
    await enqueue_records(pool, [edited])
    return before


async def test_a_drain_killed_between_embedding_and_commit_leaves_the_record_as_it_was(
    pool: asyncpg.Pool, sidecar_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with CountingClient(sidecar_url) as client:
        before = await _indexed_then_edited(pool, client)

        real_prune = index.store.store.prune_rows

        async def killed(*args: Any, **kwargs: Any) -> int:
            await real_prune(*args, **kwargs)  # the upsert and the prune both ran...
            raise RuntimeError("process killed before commit")  # ...and then the process died

        monkeypatch.setattr(index.store.store, "prune_rows", killed)
        with pytest.raises(RuntimeError, match="killed"):
            await drain_once(pool, client, SETTINGS, text_model=TEXT_MODEL)
        assert await _snapshot(pool) == before
        (row,) = await queue_rows(pool)
        assert (row["version"], row["attempts"]) == (1, 0)  # still queued, no attempt spent

        monkeypatch.setattr(index.store.store, "prune_rows", real_prune)
        report = await drain_once(pool, client, SETTINGS, text_model=TEXT_MODEL)
        assert report.indexed == 1 and await queue_rows(pool) == []
        rows = await text_rows(pool)
        assert {(r["component_tipo"], r["lang"]) for r in rows} == {
            ("rag:summary", "lg-eng"),
            ("rag:summary", "lg-spa"),
        }
        assert all(r["projects"] == [9] for r in rows)


async def test_a_drain_cancelled_inside_the_write_transaction_rolls_back(
    pool: asyncpg.Pool, sidecar_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with CountingClient(sidecar_url) as client:
        before = await _indexed_then_edited(pool, client)

        real_upsert = index.store.store.upsert_rows
        inside = asyncio.Event()

        async def stalled(*args: Any, **kwargs: Any) -> int:
            n = await real_upsert(*args, **kwargs)
            inside.set()
            await asyncio.Event().wait()  # hangs inside the open transaction until cancelled
            return n

        monkeypatch.setattr(index.store.store, "upsert_rows", stalled)
        task = asyncio.create_task(drain_once(pool, client, SETTINGS, text_model=TEXT_MODEL))
        await asyncio.wait_for(inside.wait(), 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await _snapshot(pool) == before
        assert [(r["version"], r["attempts"]) for r in await queue_rows(pool)] == [(1, 0)]

        monkeypatch.setattr(index.store.store, "upsert_rows", real_upsert)
        report = await drain_once(pool, client, SETTINGS, text_model=TEXT_MODEL)
        assert report.indexed == 1  # the lease was given back on cancel
        assert {tuple(r["projects"]) for r in await text_rows(pool)} == {(9,)}


class StalledClient(SidecarClient):
    """The real client, except that ``/embed`` never answers (until the drain is cancelled)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.embedding = asyncio.Event()

    async def embed(self, model: str, texts: Sequence[str], **kwargs: Any) -> EmbedResult:
        self.embedding.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_drain_cancelled_while_embedding_writes_nothing(pool: asyncpg.Pool, sidecar_url: str) -> None:
    await enqueue_records(pool, [record(1), record(2)])
    async with StalledClient(sidecar_url) as stalled:
        task = asyncio.create_task(drain_once(pool, stalled, SETTINGS, text_model=TEXT_MODEL))
        await asyncio.wait_for(stalled.embedding.wait(), 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await text_rows(pool) == []
    assert [(r["section_id"], r["attempts"]) for r in await queue_rows(pool)] == [(1, 0), (2, 0)]
    async with CountingClient(sidecar_url) as client:
        assert (await drain_once(pool, client, SETTINGS, text_model=TEXT_MODEL)).indexed == 2


async def test_a_failing_record_backs_off_parks_and_is_retried(pool: asyncpg.Pool, sidecar_url: str) -> None:
    await enqueue_records(pool, [record(1), record(2)])
    await pool.execute("DELETE FROM rag_sections")  # the descriptor vanished after intake
    async with CountingClient(sidecar_url) as client:
        report = await drain_once(pool, client, SETTINGS, text_model=TEXT_MODEL)
        assert (report.failed, report.parked, report.indexed) == (2, 0, 0)
        row = (await queue_rows(pool))[0]
        assert row["attempts"] == 1 and "no descriptor" in row["last_error"]
        assert row["backoff"] == timedelta(seconds=queue.backoff_seconds(1, SETTINGS.backoff_cap))
        # Backing off: a pass now does nothing.
        assert (await drain_once(pool, client, SETTINGS, text_model=TEXT_MODEL)).processed == 0
        for _ in range(SETTINGS.max_attempts - 1):
            await make_ready(pool)
            report = await drain_once(pool, client, SETTINGS, text_model=TEXT_MODEL)
        assert report.parked == 2
        stats = await queue.stats(pool, SETTINGS.max_attempts)
        assert (stats.pending, stats.failed) == (0, 2)
        await make_ready(pool)
        assert (
            await drain_once(pool, client, SETTINGS, text_model=TEXT_MODEL)
        ).processed == 0  # parked stays

        # Fixed upstream, then retried by hand: indexed.
        await SectionStore(pool).put("oh1", ORAL_HISTORY)
        assert (
            await queue.retry(pool, section_tipo="oh1", section_id=1, max_attempts=SETTINGS.max_attempts) == 1
        )
        report = await drain_once(pool, client, SETTINGS, text_model=TEXT_MODEL)
        assert report.indexed == 1
    assert await _records_in_store(pool) == {1}
    assert [r["section_id"] for r in await queue_rows(pool)] == [2]


class _MetricsThatFailOnce(IngestMetrics):
    """A real metrics registry whose first report raises: a bug outside a pass's own error handling."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def observe_report(self, report: Any) -> None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("injected: the metrics backend broke")
        super().observe_report(report)


async def test_a_crashed_drain_loop_is_reported_and_restarts(pool: asyncpg.Pool, sidecar_url: str) -> None:
    metrics = _MetricsThatFailOnce()
    stop = asyncio.Event()
    async with CountingClient(sidecar_url) as client:
        drain = DrainLoop(pool, client, SETTINGS, text_model=TEXT_MODEL, metrics=metrics)
        runner = asyncio.create_task(drain.supervise(stop))
        try:
            await until("drain.crashes == 1", lambda: drain.crashes == 1, every_s=0.001)
            status = drain.status()
            assert status["state"] == "crashed" and "injected" in status["last_crash"], status
            assert metrics.registry.get_sample_value("mnemo_ingest_drain_crashes_total") == 1
            assert metrics.registry.get_sample_value("mnemo_ingest_drain_up") == 0
            await enqueue_records(pool, [record(7)])  # accepted while the loop is down
            await until(
                "drain.status()['state'] == 'running'",
                lambda: drain.status()["state"] == "running",
                every_s=0.001,
            )
            assert metrics.registry.get_sample_value("mnemo_ingest_drain_up") == 1
            drain.wake()

            async def queue_empty() -> bool:
                return not await queue_rows(pool)

            await until("the queue to empty", queue_empty, every_s=0.1)
            assert 7 in await _records_in_store(pool)
        finally:
            stop.set()
            await asyncio.wait_for(runner, 30)
