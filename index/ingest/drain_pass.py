"""One drain pass: :func:`drain_once` (a worker claims, embeds and writes batches until none is
ready) and :func:`drain_parallel` (every worker's pass at once, their reports
merged). :mod:`index.ingest.drain` says how passes share the queue; :class:`index.ingest.drain.DrainLoop` runs
them forever."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import asyncpg

from index.ingest import queue
from index.ingest.drain_worker import DrainWorker
from index.ingest.image_indexer import ImageIndexer, ImagePlan, has_images
from index.ingest.indexer import BatchCounts, Indexer, RecordPlan
from index.models import resolve_model
from index.settings import IngestSettings, MediaSettings
from index.store import image_store
from index.store.partitions import ensure_partition, serving_model
from index.store.sections import SectionStore
from inference.client import SidecarClient, SidecarUnavailable

__all__ = ["DrainReport", "drain_once", "drain_parallel"]

log = logging.getLogger(__name__)


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
                # Retried by the loop, which logs the outage once a pass (index.ingest.drain).
                log.info("sidecar unavailable; %d records stay queued: %s", len(items), exc)
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
