"""Draining the ingestion queue: :func:`drain_once` (one pass) and :class:`DrainLoop` (forever).

A pass takes the drain's advisory lock (``pg_try_advisory_lock``: a pass
already running anywhere makes this one a no-op, so it is safe to start from
cron on every host), then claims ready records in batches and indexes them
until none is ready. Per record, the store write and the queue completion share
one transaction: a killed pass leaves the record's rows as they were and the
record queued. A record that fails spends an attempt (backoff, then parked); a
sidecar outage spends none: the pass stops, the records keep the error, and
the loop pauses before it tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg

from inference.client import SidecarClient, SidecarUnavailable

from . import image_store, queue
from .image_indexer import ImageIndexer, ImagePlan, has_images
from .indexer import BatchCounts, Indexer, RecordPlan
from .metrics import IngestMetrics
from .models import resolve_model
from .partitions import ensure_partition
from .sections import SectionStore
from .settings import IngestSettings, MediaSettings

__all__ = ["DrainLoop", "DrainReport", "drain_once"]

log = logging.getLogger(__name__)


@dataclass
class DrainReport:
    """What one pass did. ``failed`` counts spent attempts (``parked`` of them reached the
    maximum); ``superseded`` records were written but re-pushed meanwhile, so they stay
    queued for the next pass; ``unavailable`` means the pass stopped on a sidecar outage;
    ``skipped`` that another pass held the lock."""

    processed: int = 0
    indexed: int = 0
    deleted: int = 0
    failed: int = 0
    parked: int = 0
    superseded: int = 0
    chunks_embedded: int = 0
    images_embedded: int = 0
    truncated: int = 0
    rows_written: int = 0
    rows_deleted: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    unavailable: bool = False
    skipped: bool = False
    error: str | None = None
    model: str | None = None
    image_model: str | None = None

    def add(self, counts: BatchCounts) -> None:
        self.chunks_embedded += counts.chunks_embedded
        self.truncated += counts.truncated
        self.rows_written += counts.rows_written
        self.rows_deleted += counts.rows_deleted
        for phase, seconds in counts.seconds.items():
            self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def drain_once(
    pool: asyncpg.Pool,
    client: SidecarClient,
    settings: IngestSettings,
    *,
    text_model: str | None = None,
    image_model: str | None = None,
    media: MediaSettings | None = None,
    stop: asyncio.Event | None = None,
    section_tipos: Sequence[str] | None = None,
) -> DrainReport:
    """Index queued records until none is ready (or ``stop`` is set, between batches).

    ``section_tipos`` limits the pass to those sections' records (others stay queued for the
    gateway's drain); the pass still takes the one drain lock, so writes stay single-flighted.

    ``text_model`` is ``RAG_TEXT_MODEL`` (None: the first text model the sidecar
    lists), ``image_model`` ``RAG_IMAGE_MODEL`` (resolved only when a batch holds
    images). Raises ``ModelNotServed`` for a configured model the sidecar lacks:
    that is a configuration error, not a record's fault.
    """
    report = DrainReport()
    async with pool.acquire() as lock_conn:
        if not await lock_conn.fetchval("SELECT pg_try_advisory_lock($1)", queue.DRAIN_LOCK_KEY):
            report.skipped = True
            return report
        try:
            models = _Models(text_model, image_model, media or MediaSettings())
            try:
                await _drain(pool, client, settings, models, stop, report, section_tipos)
            finally:
                await models.close()
        finally:
            await lock_conn.execute("SELECT pg_advisory_unlock($1)", queue.DRAIN_LOCK_KEY)
    return report


class _Models:
    """The pass's model choices, and the image indexer once a batch needs it."""

    def __init__(self, text_model: str | None, image_model: str | None, media: MediaSettings) -> None:
        self.text_model = text_model
        self.image_model = image_model
        self.media = media
        self.images: ImageIndexer | None = None
        self._session: Any = None

    async def image_indexer(self, pool: asyncpg.Pool, client: SidecarClient) -> ImageIndexer:
        if self.images is None:
            model = await resolve_model(client, "image_text", self.image_model)
            if model.dimension is None:
                raise ValueError(f"image model {model.id!r} reports no dimension")
            partition = await ensure_partition(pool, model.id, model.dimension)
            if self.media.allowed_bases:  # URL images are fetched only from the allow-list
                import aiohttp

                self._session = aiohttp.ClientSession()
            self.images = ImageIndexer(pool, client, model, partition, self.media, self._session)
        return self.images

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


async def _drain(
    pool: asyncpg.Pool,
    client: SidecarClient,
    settings: IngestSettings,
    models: _Models,
    stop: asyncio.Event | None,
    report: DrainReport,
    section_tipos: Sequence[str] | None = None,
) -> None:
    indexer: Indexer | None = None
    while stop is None or not stop.is_set():
        items = await queue.claim_ready(
            pool, settings.batch_records, settings.max_attempts, section_tipos=section_tipos
        )
        if not items:
            return
        image_plans: dict[tuple[str, int], ImagePlan] = {}
        try:
            if indexer is None:
                model = await resolve_model(client, "text", models.text_model)
                if model.dimension is None:
                    raise ValueError(f"text model {model.id!r} reports no dimension")
                partition = await ensure_partition(pool, model.id, model.dimension)
                indexer = Indexer(pool, client, model, partition, embed_batch=settings.embed_batch)
                report.model = model.id
            indexer.counts = BatchCounts()
            plans = await indexer.prepare(items)
            await indexer.fit(plans)
            await indexer.embed(plans)
            if any(has_images(item) for item in items):
                images = await models.image_indexer(pool, client)
                report.image_model = images.model.id
                descriptors = await SectionStore(pool).get_many(sorted({i.section_tipo for i in items}))
                image_plans = await images.prepare(items, descriptors)
                before = images.embedded
                await images.embed(image_plans)
                report.images_embedded += images.embedded - before
        except SidecarUnavailable as exc:
            log.warning("sidecar unavailable; %d records stay queued: %s", len(items), exc)
            await queue.note_outage(pool, items, str(exc))
            report.unavailable = True
            report.error = f"sidecar unavailable: {exc}"
            return
        for plan in plans:
            await _finish(pool, indexer, plan, settings, report, models.images, image_plans.get(plan.key))
        report.add(indexer.counts)


async def _finish(
    pool: asyncpg.Pool,
    indexer: Indexer,
    plan: RecordPlan,
    settings: IngestSettings,
    report: DrainReport,
    images: ImageIndexer | None = None,
    image_plan: ImagePlan | None = None,
) -> None:
    """Write one record (text and images) and complete its queue row in one transaction,
    or spend an attempt."""
    report.processed += 1
    if plan.error is None and image_plan is not None and image_plan.error is not None:
        plan.error = image_plan.error
    if plan.error is None:
        try:
            if not plan.is_delete:
                await indexer.load_moved_vectors(plan)
            if images is not None and image_plan is not None:
                await images.load_vectors(image_plan)
            started = time.perf_counter()
            async with pool.acquire() as conn, conn.transaction():
                written, deleted = await indexer.write(conn, plan)
                if plan.is_delete:  # the rows went with delete_record; Mnemo's thumbnails go too
                    await image_store.delete_thumbnails(conn, plan.key)
                elif images is not None and image_plan is not None:
                    image_written, image_deleted = await images.write(conn, image_plan)
                    written, deleted = written + image_written, deleted + image_deleted
                current = await queue.complete(conn, plan.item)
            indexer.counts.add_time("write", time.perf_counter() - started)
        except (asyncpg.PostgresError, ValueError, KeyError) as exc:
            plan.error = f"{type(exc).__name__}: {exc}"
        else:
            indexer.counts.rows_written += written
            indexer.counts.rows_deleted += deleted
            indexer.counts.truncated += indexer.truncations(plan)
            if not current:
                report.superseded += 1
            elif plan.is_delete:
                report.deleted += 1
            else:
                report.indexed += 1
            return
    log.warning("record %s/%s failed: %s", plan.item.section_tipo, plan.item.section_id, plan.error)
    assert plan.error is not None
    parked = await queue.fail(
        pool, plan.item, plan.error, max_attempts=settings.max_attempts, backoff_cap=settings.backoff_cap
    )
    report.failed += 1
    report.parked += int(parked)


class DrainLoop:
    """The background drain: a pass every ``drain_interval`` seconds (or at once when woken),
    paused for ``outage_pause`` seconds after a sidecar outage. It never dies on an error:
    the error is logged, kept in :meth:`status` and the next pass tries again."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        client: SidecarClient,
        settings: IngestSettings,
        *,
        text_model: str | None = None,
        image_model: str | None = None,
        media: MediaSettings | None = None,
        metrics: IngestMetrics | None = None,
    ) -> None:
        self.pool = pool
        self.client = client
        self.settings = settings
        self.text_model = text_model
        self.image_model = image_model
        self.media = media
        self.metrics = metrics or IngestMetrics()
        self._wake = asyncio.Event()
        self.last_report: DrainReport | None = None
        self.last_error: str | None = None
        self.last_pass_at: datetime | None = None
        self.paused_until: datetime | None = None
        self.passes = 0
        self.crashes = 0
        self.last_crash: str | None = None
        self.restart_at: datetime | None = None  # set while a crashed loop waits to restart

    def wake(self) -> None:
        """Start the next pass now (intake calls this after enqueueing)."""
        self._wake.set()

    def status(self) -> dict[str, Any]:
        """For health and ``/v1/queue/stats``: is the drain paused by an outage, and why."""
        paused = self.paused_until is not None and self.paused_until > datetime.now(UTC)
        state = "crashed" if self.restart_at is not None else "paused" if paused else "running"
        return {
            "state": state,
            "crashes": self.crashes,
            "last_crash": self.last_crash,
            "restart_at": self.restart_at.isoformat() if self.restart_at else None,
            "sidecar_available": not (self.last_report and self.last_report.unavailable),
            "paused_until": self.paused_until.isoformat() if paused and self.paused_until else None,
            "last_error": self.last_error,
            "last_pass_at": self.last_pass_at.isoformat() if self.last_pass_at else None,
            "passes": self.passes,
        }

    async def pass_once(self) -> DrainReport:
        """One drain pass, then refresh the queue gauges."""
        try:
            report = await drain_once(
                self.pool,
                self.client,
                self.settings,
                text_model=self.text_model,
                image_model=self.image_model,
                media=self.media,
            )
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:
            log.exception("drain pass failed")
            report = DrainReport(error=f"{type(exc).__name__}: {exc}")
        self.passes += 1
        self.last_report = report
        self.last_pass_at = datetime.now(UTC)
        self.last_error = report.error
        self.metrics.observe_report(report)
        with contextlib.suppress(Exception):
            self.metrics.observe_stats(await queue.stats(self.pool, self.settings.max_attempts))
        return report

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Drain until cancelled (or ``stop`` is set)."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            self._wake.clear()
            report = await self.pass_once()
            if report.unavailable or (report.error and not report.processed):
                delay = self.settings.outage_pause
                self.paused_until = datetime.fromtimestamp(time.time() + delay, UTC)
                await _sleep_or(stop, delay)  # new records do not end an outage pause
            else:
                self.paused_until = None
                await _sleep_or(stop, self.settings.drain_interval, self._wake)

    async def supervise(self, stop: asyncio.Event | None = None) -> None:
        """:meth:`run`, restarted with exponential backoff when it dies of an unexpected error.

        A pass's own errors never end :meth:`run`; this catches what would (a bug, a failing
        metrics call) so that a dead drain is visible (``status()``, ``/readyz``, the
        ``mnemo_ingest_drain_*`` metrics) and comes back by itself instead of silently
        leaving records queued until the gateway restarts.
        """
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                await self.run(stop)
                return
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:
                self.crashes += 1
                self.last_crash = f"{type(exc).__name__}: {exc}"
                delay = min(DRAIN_RESTART_BASE_S * 2 ** (self.crashes - 1), DRAIN_RESTART_CAP_S)
                log.exception("the drain loop crashed (%d so far); restarting in %.0fs", self.crashes, delay)
                self.restart_at = datetime.fromtimestamp(time.time() + delay, UTC)
                self.metrics.observe_crash()
                try:
                    await _sleep_or(stop, delay)
                finally:
                    self.restart_at = None
                    self.metrics.observe_restart()


DRAIN_RESTART_BASE_S = 1.0
DRAIN_RESTART_CAP_S = 60.0


async def _sleep_or(stop: asyncio.Event, seconds: float, wake: asyncio.Event | None = None) -> None:
    events = [stop] + ([wake] if wake is not None else [])
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
