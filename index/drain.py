"""Draining the ingestion queue with workers: :func:`drain_once` (one worker's pass),
:func:`drain_parallel` (several at once) and :class:`DrainLoop` (forever).

A :class:`DrainWorker` is one claimant of the queue: it leases ready records
(``FOR UPDATE SKIP LOCKED``, see :mod:`index.queue`), indexes them and renews
its leases with a heartbeat. Any number of workers, in one process (``mnemo
drain --workers N``), in several, on several hosts, and the gateway's own drain,
share the queue: no lock serializes them, and a record is leased to one worker
at a time. A worker killed with ``kill -9`` stops renewing; once its leases
expire, the next claim of any worker takes its records. A live worker whose pass
was interrupted (the database restarted under it) gives its own stale leases
back at the start of its next pass, so an outage of seconds delays its records
by seconds, not by ``lease_seconds``.

A pass claims batches until none is ready. Inside a worker, batches are
pipelined: while batch *n*'s records are written, batch *n+1* is claimed,
chunked and embedded, so the sidecar and the store work at the same time. Per
record, the store write and the queue completion share one transaction that
first checks the lease is still this worker's: a killed pass leaves the
record's rows as they were and the record queued, and a worker whose lease was
taken over writes nothing. A record that fails spends an attempt (backoff,
then parked); a sidecar outage spends none: the pass stops, the records keep
the error, and the loop pauses before it tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import asyncpg

from inference.client import SidecarClient, SidecarUnavailable

from . import image_store, queue, workers
from .image_indexer import ImageIndexer, ImagePlan, has_images
from .indexer import BatchCounts, Indexer, RecordPlan
from .metrics import IngestMetrics
from .models import resolve_model
from .partitions import ensure_partition, serving_model
from .sections import SectionStore
from .settings import IngestSettings, MediaSettings

__all__ = ["DrainLoop", "DrainReport", "DrainWorker", "drain_once", "drain_parallel"]

log = logging.getLogger(__name__)

# records/s of a worker is measured over this trailing window of heartbeats.
RATE_WINDOW_S = 60.0


@dataclass
class DrainReport:
    """What one pass did (of one worker, or merged over several). ``failed`` counts spent
    attempts (``parked`` of them reached the maximum); ``superseded`` records were written
    but re-pushed meanwhile, so they stay queued for the next pass; ``lost_leases`` records
    were taken over by another worker after this one's lease expired (it wrote nothing);
    ``unavailable`` means the pass stopped on a sidecar outage; ``claims_given_back`` records
    were still leased by an interrupted earlier pass of the same worker (the database went away
    under it) and were released for this pass to claim."""

    processed: int = 0
    indexed: int = 0
    deleted: int = 0
    failed: int = 0
    parked: int = 0
    superseded: int = 0
    lost_leases: int = 0
    claims_given_back: int = 0
    chunks_embedded: int = 0
    images_embedded: int = 0
    truncated: int = 0
    rows_written: int = 0
    rows_deleted: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    unavailable: bool = False
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

    def merge(self, other: DrainReport) -> None:
        """Fold another worker's report of the same pass into this one (seconds add up:
        they are worker-seconds per phase)."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, bool):
                setattr(self, f.name, mine or theirs)
            elif isinstance(mine, int):
                setattr(self, f.name, mine + theirs)
            elif f.name == "seconds":
                for phase, seconds in theirs.items():
                    mine[phase] = mine.get(phase, 0.0) + seconds
            elif mine is None:
                setattr(self, f.name, theirs)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def sidecar_seen(self) -> bool | None:
        """What this pass learned of the sidecar: False when it stopped on an outage, True when it
        processed records, None when it claimed nothing (it never asked, so it says nothing)."""
        if self.unavailable:
            return False
        return True if self.processed else None


class DrainWorker:
    """One claimant of the queue: its lease identity, its heartbeat and its counters.

    ``async with`` registers it (``rag_drain_workers``) and starts the heartbeat, which
    renews the leases of the records it is processing (:attr:`holding`) every third of
    ``lease_seconds`` and publishes its throughput; on exit it gives its leases back (the
    records are claimable at once) and unregisters.
    The id names the role, host and process, plus a random tag (a pid is not unique
    across containers)."""

    def __init__(self, pool: asyncpg.Pool, settings: IngestSettings, *, role: str = "drain", index: int = 0):
        self.pool = pool
        self.role = role
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.id = f"{role}@{self.host}:{self.pid}#{index}-{secrets.token_hex(3)}"
        self.lease = queue.Lease(self.id, settings.lease_seconds)
        self.records_done = 0
        self.records_failed = 0
        self.chunks_embedded = 0
        # The records this worker is processing: only their leases are renewed.
        self.holding: set[tuple[str, int]] = set()
        # A pass ended (an error, the database gone) still holding claims: the next pass gives
        # them back first, so this live worker takes its records again at once instead of
        # leaving them to expire (lease_seconds) after an outage of a second.
        self.left_claims = False
        self._samples: deque[tuple[float, int]] = deque()
        self._beating: asyncio.Task[None] | None = None

    async def __aenter__(self) -> DrainWorker:
        await workers.register(self.pool, self.id, role=self.role, host=self.host, pid=self.pid)
        self._beating = asyncio.create_task(self._beat(), name=f"mnemo-drain-heartbeat-{self.id}")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._beating is not None:
            self._beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beating
        try:
            released = await queue.release_all(self.pool, self.id)
            await workers.unregister(self.pool, self.id)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            # Not fatal: the leases expire by themselves after lease_seconds.
            log.warning("drain worker %s could not give its leases back: %s", self.id, error)
        else:
            if released:
                log.info("drain worker %s gave back %d leases", self.id, released)

    def sample(self) -> workers.WorkerSample:
        """The counters now, with records/s over the last :data:`RATE_WINDOW_S` seconds."""
        now = time.monotonic()
        self._samples.append((now, self.records_done))
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW_S:
            self._samples.popleft()
        first_t, first_n = self._samples[0]
        rate = (self.records_done - first_n) / (now - first_t) if now > first_t else 0.0
        return workers.WorkerSample(self.records_done, self.records_failed, self.chunks_embedded, rate)

    async def give_back_left_claims(self) -> int:
        """Release the leases an earlier pass of this worker left (between passes it works on
        nothing, so every lease under its id is stale); returns how many. Raises, and tries again
        at the next pass, while the database is away."""
        if not self.left_claims:
            return 0
        released = await queue.release_all(self.pool, self.id)
        self.left_claims = False
        if released:
            log.info(
                "drain worker %s gave back %d records its interrupted pass had claimed", self.id, released
            )
        return released

    async def heartbeat(self) -> None:
        """Renew the leases of the records this worker is processing and publish its counters."""
        await queue.renew_leases(self.pool, self.lease, sorted(self.holding))
        await workers.heartbeat(self.pool, self.id, self.sample())

    async def _beat(self) -> None:
        interval = self.lease.seconds / 3
        while True:
            await asyncio.sleep(interval)
            try:
                await self.heartbeat()
            except asyncio.CancelledError:
                raise
            except Exception:  # never die: a worker without a heartbeat loses its leases
                # The next beat tries again; a lease lost meanwhile is caught by queue.hold.
                log.exception("drain worker %s heartbeat failed", self.id)


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
    worker: DrainWorker | None = None,
) -> DrainReport:
    """One worker indexes queued records until none is ready (or ``stop`` is set, between
    batches). Without ``worker``, a worker is registered for this pass alone.

    ``section_tipos`` limits the pass to those sections' records (others stay queued for the
    gateway's drain).

    ``text_model`` is ``RAG_TEXT_MODEL`` (None: the first text model the sidecar
    lists), ``image_model`` ``RAG_IMAGE_MODEL`` (resolved only when a batch holds
    images). Raises ``ModelNotServed`` for a configured model the sidecar lacks:
    that is a configuration error, not a record's fault.
    """
    if worker is None:
        async with DrainWorker(pool, settings) as own:
            return await drain_once(
                pool,
                client,
                settings,
                text_model=text_model,
                image_model=image_model,
                media=media,
                stop=stop,
                section_tipos=section_tipos,
                worker=own,
            )
    report = DrainReport()
    models = _Models(text_model, image_model, media or MediaSettings())
    try:
        report.claims_given_back = await worker.give_back_left_claims()
        await _drain(pool, client, settings, models, stop, report, section_tipos, worker)
    finally:
        await models.close()
        # A pass ends holding nothing. One that died between a claim and the writes (an error,
        # a cancel) leaves leases that are no longer renewed: this worker's next pass gives them
        # back; if it never comes (the process killed), they expire and are taken over.
        worker.left_claims = worker.left_claims or bool(worker.holding)
        worker.holding.clear()
    return report


async def drain_parallel(
    pool: asyncpg.Pool,
    client: SidecarClient,
    settings: IngestSettings,
    drain_workers: Sequence[DrainWorker],
    **options: Any,
) -> DrainReport:
    """A pass of every worker at once (``options`` as for :func:`drain_once`); their reports
    merged. A worker's error is the merged report's error once the others have finished."""
    results = await asyncio.gather(
        *(drain_once(pool, client, settings, worker=w, **options) for w in drain_workers),
        return_exceptions=True,
    )
    merged = DrainReport()
    for result in results:
        if isinstance(result, BaseException):
            raise result  # the first worker's error; the others have finished (or failed alike)
        merged.merge(result)
    return merged


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
    section_tipos: Sequence[str] | None,
    worker: DrainWorker,
) -> None:
    """Claim, embed and write batches until none is ready; batch n+1 is claimed and embedded
    while batch n is written (one write task at a time, so a worker's writes stay ordered)."""
    indexer: Indexer | None = None
    writing: asyncio.Task[None] | None = None
    try:
        while stop is None or not stop.is_set():
            items = await queue.claim_ready(
                pool,
                settings.batch_records,
                settings.max_attempts,
                lease=worker.lease,
                section_tipos=section_tipos,
            )
            if not items:
                break
            worker.holding.update((i.section_tipo, i.section_id) for i in items)
            try:
                if indexer is None:
                    indexer = await _text_indexer(pool, client, settings, models)
                    report.model = indexer.model.id
                batch = await _embed_batch(pool, client, indexer, models, items, report, worker)
            except SidecarUnavailable as exc:
                log.warning("sidecar unavailable; %d records stay queued: %s", len(items), exc)
                await queue.note_outage(pool, items, str(exc))
                worker.holding.difference_update((i.section_tipo, i.section_id) for i in items)
                report.unavailable = True
                report.error = f"sidecar unavailable: {exc}"
                break
            if writing is not None:
                done, writing = writing, None
                await done
            writing = asyncio.create_task(
                _write_batch(pool, indexer, batch, settings, report, models, worker)
            )
        if writing is not None:
            done, writing = writing, None
            await done
    finally:
        if writing is not None:
            # Reached with the write unfinished or unawaited only when something else ended the pass
            # (a stop, the database gone): an unfinished write is cancelled (its open transaction rolls
            # back and its records stay queued), and a failed one is logged rather than dropped.
            writing.cancel()
            (outcome,) = await asyncio.gather(writing, return_exceptions=True)
            if isinstance(outcome, Exception):
                log.warning("a batch write failed as the pass ended: %r", outcome)
        if indexer is not None:
            report.add(indexer.counts)


async def _text_indexer(
    pool: asyncpg.Pool, client: SidecarClient, settings: IngestSettings, models: _Models
) -> Indexer:
    # Unconfigured, a pass follows the model a model-change backfill made serve (its swap).
    configured = models.text_model or await serving_model(pool)
    model = await resolve_model(client, "text", configured)
    if model.dimension is None:
        raise ValueError(f"text model {model.id!r} reports no dimension")
    partition = await ensure_partition(pool, model.id, model.dimension)
    return Indexer(pool, client, model, partition, embed_batch=settings.embed_batch)


@dataclass
class _Batch:
    """A claimed batch, chunked and embedded, ready to write."""

    plans: list[RecordPlan]
    image_plans: dict[tuple[str, int], ImagePlan]


async def _embed_batch(
    pool: asyncpg.Pool,
    client: SidecarClient,
    indexer: Indexer,
    models: _Models,
    items: Sequence[queue.QueueItem],
    report: DrainReport,
    worker: DrainWorker,
) -> _Batch:
    """Chunk, fit and embed a batch's texts and images (raises ``SidecarUnavailable``)."""
    embedded_before = indexer.counts.chunks_embedded
    plans = await indexer.prepare(items)
    await indexer.fit(plans)
    await indexer.embed(plans)
    image_plans: dict[tuple[str, int], ImagePlan] = {}
    if any(has_images(item) for item in items):
        images = await models.image_indexer(pool, client)
        report.image_model = images.model.id
        descriptors = await SectionStore(pool).get_many(sorted({i.section_tipo for i in items}))
        image_plans = await images.prepare(items, descriptors)
        before = images.embedded
        await images.embed(image_plans)
        report.images_embedded += images.embedded - before
    worker.chunks_embedded += indexer.counts.chunks_embedded - embedded_before
    return _Batch(plans, image_plans)


async def _write_batch(
    pool: asyncpg.Pool,
    indexer: Indexer,
    batch: _Batch,
    settings: IngestSettings,
    report: DrainReport,
    models: _Models,
    worker: DrainWorker,
) -> None:
    for plan in batch.plans:
        failed_before = report.failed
        await _finish(pool, indexer, plan, settings, report, models.images, batch.image_plans.get(plan.key))
        worker.holding.discard(plan.key)
        if report.failed > failed_before:
            worker.records_failed += 1
        else:
            worker.records_done += 1


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
    or spend an attempt. Nothing is written when the lease was taken over."""
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
            written = deleted = 0
            async with pool.acquire() as conn, conn.transaction():
                held = await queue.hold(conn, plan.item)
                if held:
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
            if not held:
                log.warning(
                    "record %s/%s: the lease of %s expired and another worker took it over; not written",
                    plan.item.section_tipo,
                    plan.item.section_id,
                    plan.item.lease_owner,
                )
                report.lost_leases += 1
                return
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
    """The background drain: a pass of its ``workers`` (default ``RAG_INGEST_DRAIN_WORKERS``)
    every ``drain_interval`` seconds (or at once when woken), paused for ``outage_pause``
    seconds after a sidecar outage. Its workers stay registered, heartbeating, for as long as
    :meth:`run` runs. It never dies on an error: the error is logged, kept in :meth:`status`
    and the next pass tries again."""

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
        workers: int | None = None,
        role: str = "drain",
    ) -> None:
        self.pool = pool
        self.workers = settings.drain_workers if workers is None else workers
        if self.workers < 1:
            raise ValueError(f"a drain loop needs at least one worker, not {self.workers}")
        self.role = role
        self._workers: list[DrainWorker] | None = None  # while run() holds them
        self.client = client
        self.settings = settings
        self.text_model = text_model
        self.image_model = image_model
        self.media = media
        self.metrics = metrics or IngestMetrics()
        self._wake = asyncio.Event()
        self.last_report: DrainReport | None = None
        self.last_error: str | None = None
        # As the last pass that asked the sidecar found it: a pass that claimed nothing (records
        # waiting out an outage pause) must not report it back (the metric follows the same rule).
        self.sidecar_available = True
        self.last_pass_at: datetime | None = None
        self.paused_until: datetime | None = None
        self.passes = 0
        self.claims_given_back = 0  # over every pass (DrainReport.claims_given_back)
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
            "sidecar_available": self.sidecar_available,
            "paused_until": self.paused_until.isoformat() if paused and self.paused_until else None,
            "last_error": self.last_error,
            "last_pass_at": self.last_pass_at.isoformat() if self.last_pass_at else None,
            "passes": self.passes,
            "workers": [w.id for w in self._workers or ()],
        }

    async def pass_once(self) -> DrainReport:
        """One drain pass of every worker (:meth:`drain`), its error kept instead of raised,
        then refresh the queue and worker gauges."""
        try:
            report = await self.drain()
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:
            log.exception("drain pass failed")
            report = DrainReport(error=f"{type(exc).__name__}: {exc}")
        self.passes += 1
        self.claims_given_back += report.claims_given_back
        self.last_report = report
        self.last_pass_at = datetime.now(UTC)
        if report.sidecar_seen is not None:
            self.sidecar_available = report.sidecar_seen
        if report.error or report.processed:  # an empty pass keeps the last pass's error on show
            self.last_error = report.error
        self.metrics.observe_report(report)
        with contextlib.suppress(Exception):
            self.metrics.observe_stats(await queue.stats(self.pool, self.settings.max_attempts))
            self.metrics.observe_workers(
                await workers.list_workers(self.pool, stale_after_s=stale_after_s(self.settings))
            )
        return report

    async def drain(self) -> DrainReport:
        """One pass of every worker until no record is ready (errors raise, as for
        :func:`drain_parallel`). Outside :meth:`run`, the workers are registered for this
        pass alone (``mnemo drain --once``)."""
        async with contextlib.AsyncExitStack() as stack:
            return await drain_parallel(
                self.pool,
                self.client,
                self.settings,
                self._workers or await self._start_workers(stack),
                text_model=self.text_model,
                image_model=self.image_model,
                media=self.media,
            )

    async def _start_workers(self, stack: contextlib.AsyncExitStack) -> list[DrainWorker]:
        return [
            await stack.enter_async_context(DrainWorker(self.pool, self.settings, role=self.role, index=i))
            for i in range(self.workers)
        ]

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Drain until cancelled (or ``stop`` is set)."""
        stop = stop or asyncio.Event()
        async with contextlib.AsyncExitStack() as stack:
            self._workers = await self._start_workers(stack)
            try:
                await self._run(stop)
            finally:
                self._workers = None

    async def _run(self, stop: asyncio.Event) -> None:
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


def stale_after_s(settings: IngestSettings) -> float:
    """A worker whose heartbeat is older than this is shown as not alive: it missed the
    renewals of a whole lease (it beats every third of one)."""
    return settings.lease_seconds


DRAIN_RESTART_CAP_S = 60.0


async def _sleep_or(stop: asyncio.Event, seconds: float, wake: asyncio.Event | None = None) -> None:
    events = [stop] + ([wake] if wake is not None else [])
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
