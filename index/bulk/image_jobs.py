"""The bulk image job: ``mnemo ingest images MANIFEST.jsonl|MANIFEST.csv|DIR --section TIPO``.

For the one-off backfill of a whole collection, straight into the store (no
queue). The pipeline keeps every part busy with bounded memory:

- a **process pool** reads, hashes, decodes, orients, downsizes and
  thumbnails the files (:func:`index.ingest.images.prepare_file`); up to
  ``prefetch`` batches are in the pool while
- the **sidecar** embeds the current batch (``/image``, the image-text
  model), and
- each batch is written in **one transaction** of multi-row statements.

**Resumable**: before a batch is decoded, the store's hashes for its slots are
read; a file whose content hash (and the model, through its partition) is
already stored is neither decoded nor embedded, and its row is rewritten only
when its title, metadata or projects changed. An interrupted job re-run skips
what it already wrote. **Rejects** (unreadable, corrupt, too large, bad
manifest lines) are written to a JSONL report with their reason and never stop
the job.

Manifest lines (JSONL objects or CSV rows): ``path`` (relative to the
manifest; it must resolve, symlinks followed, under ``RAG_MEDIA_ROOT``, or the
manifest's folder when that is unset), optional ``section_id`` (absent: one record per line, numbered
from ``--start-id``), ``tipo`` (the image component; default the section's
first context image), ``view`` (default: the component's view), ``index``,
``title``, ``projects``, ``thumb_url``, ``metadata`` (keyed by component tipo
or role name), and any of the section's role names as top-level keys (the
coins manifest's ``denomination`` and ``material``). A directory is walked for
image files, one record per file.
"""

from __future__ import annotations

import asyncio
import csv
import functools
import json
import multiprocessing
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np

from index.ingest.images import (
    ImageRejected,
    MediaNotAllowed,
    PreparedImage,
    prepare_file,
    resolve_media_path,
)
from index.media_urls import check_client_link
from index.models import resolve_model
from index.settings import MediaSettings
from index.store import image_store, store
from index.store.image_rows import image_row, roles_for
from index.store.image_store import Thumbnail
from index.store.partitions import ModelPartition, ensure_partition, get_partition
from index.store.sections import SectionStore
from index.store.store import EmbeddingRow, StoredRow
from inference.client import SidecarClient

__all__ = [
    "IMAGE_SUFFIXES",
    "ImageJob",
    "ItemKey",
    "JobError",
    "JobOptions",
    "JobReport",
    "ManifestItem",
    "Reject",
    "read_manifest",
    "run_image_job",
]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".tif", ".tiff", ".gif", ".bmp")
_LINE_KEYS = {"path", "file", "section_id", "tipo", "component", "view", "index", "title", "projects"}
_LINE_KEYS |= {"thumb_url", "metadata"}

ItemKey = tuple[int, str, str, int]  # (section_id, component_tipo, view, image index): one manifest image


class JobError(ValueError):
    """The job cannot start (no descriptor, no image component, unreadable manifest)."""


@dataclass(frozen=True)
class JobOptions:
    section_tipo: str
    component: str | None = None
    start_id: int = 1
    projects: tuple[int, ...] = ()
    workers: int = 2
    batch_size: int = 32
    prefetch: int = 2
    image_model: str | None = None
    rejects: Path | None = None
    media: MediaSettings = field(default_factory=MediaSettings)


@dataclass(frozen=True)
class ManifestItem:
    line: int
    path: str
    section_id: int
    component_tipo: str
    view: str
    image_index: int
    title: str
    metadata: Mapping[str, Any]  # by component tipo
    projects: tuple[int, ...]
    thumb_url: str | None = None

    @property
    def record(self) -> ItemKey:
        return (self.section_id, self.component_tipo, self.view, self.image_index)


@dataclass(frozen=True)
class Reject:
    line: int
    path: str
    reason: str
    message: str


@dataclass
class JobReport:
    model: str = ""
    total: int = 0
    embedded: int = 0
    unchanged: int = 0
    rewritten: int = 0
    rejected: int = 0
    rows_written: int = 0
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    rejects_path: str | None = None

    @property
    def images_per_s(self) -> float:
        done = self.embedded + self.unchanged + self.rewritten
        return done / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "images_per_s": round(self.images_per_s, 2)}


# -- the manifest ------------------------------------------------------------------------------------


def _lines(source: Path) -> Iterator[tuple[int, Any]]:
    if source.is_dir():
        files = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        for number, path in enumerate(files, 1):
            yield number, {"path": str(path.relative_to(source)), "title": str(path.relative_to(source))}
    elif source.suffix.lower() == ".csv":
        with source.open(encoding="utf-8", newline="") as fh:
            for number, row in enumerate(csv.DictReader(fh), 2):
                yield number, {k: v for k, v in row.items() if k and v not in (None, "")}
    else:
        with source.open(encoding="utf-8") as fh:
            for number, text in enumerate(fh, 1):
                if text.strip():
                    try:
                        yield number, json.loads(text)
                    except json.JSONDecodeError as exc:
                        yield number, exc


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer")
    number = int(value)  # CSV gives strings
    if number < 0:
        raise ValueError(f"{name} must be non-negative")
    return number


def read_manifest(
    source: Path, descriptor: Mapping[str, Any], options: JobOptions
) -> tuple[list[ManifestItem], list[Reject]]:
    """Manifest lines as items (paths made absolute), and the lines that cannot be used."""
    context = descriptor.get("context") or {}
    views = {i["tipo"]: i.get("view", "") for i in context.get("images", [])}
    roles = {role: spec["tipo"] for role, spec in context.get("metadata", {}).items()}
    role_tipos = set(roles.values())
    default_component = options.component or next(iter(views), None)
    if default_component is None:
        raise JobError(f"section {options.section_tipo!r} declares no image component in its context")
    base = source if source.is_dir() else source.parent
    # A line's file resolves (symlinks followed) under RAG_MEDIA_ROOT, or the manifest's own
    # folder when that is unset: an exported manifest cannot make the job read /etc/shadow.
    root = options.media.media_root or base
    root_name = "RAG_MEDIA_ROOT" if options.media.media_root else f"the manifest's folder ({base})"
    items: list[ManifestItem] = []
    rejects: list[Reject] = []
    next_index: dict[tuple[int, str], int] = {}
    for position, (number, line) in enumerate(_lines(source)):
        path = line.get("path") or line.get("file") if isinstance(line, dict) else None
        try:
            if isinstance(line, Exception):
                raise ValueError(f"invalid JSON: {line}")
            if not isinstance(line, dict):
                raise ValueError("a manifest line must be an object")
            if not isinstance(path, str) or not path:
                raise ValueError("path is required")
            unknown = sorted(set(line) - _LINE_KEYS - set(roles))
            if unknown:
                raise ValueError(f"unknown field {unknown[0]!r} (not a role of the section)")
            component = line.get("tipo") or line.get("component") or default_component
            if component not in views:
                raise ValueError(f"component {component!r} is not an image of the section's context")
            metadata: dict[str, Any] = {}
            for key, value in (line.get("metadata") or {}).items():
                tipo = roles.get(key, key)
                if tipo not in role_tipos:
                    raise ValueError(f"metadata {key!r} is neither a role nor a role's component")
                metadata[tipo] = value
            for role, tipo in roles.items():
                if role in line:
                    metadata[tipo] = line[role]
            section_id = (
                _int(line["section_id"], "section_id")
                if "section_id" in line
                else options.start_id + position
            )
            slot = (section_id, component)
            index = _int(line["index"], "index") if "index" in line else next_index.get(slot, 0)
            next_index[slot] = max(next_index.get(slot, 0), index + 1)
            if line.get("thumb_url") is not None:
                check_client_link(line["thumb_url"])
            projects = line.get("projects", list(options.projects))
            if isinstance(projects, str):
                projects = [int(p) for p in projects.split(",") if p.strip()]
            items.append(
                ManifestItem(
                    line=number,
                    path=str(resolve_media_path(root, str(base / path), root_name=root_name)),
                    section_id=section_id,
                    component_tipo=component,
                    view=line.get("view") or views[component],
                    image_index=index,
                    title=str(line.get("title") or ""),
                    metadata=metadata,
                    projects=tuple(sorted({_int(p, "projects") for p in projects})),
                    thumb_url=line.get("thumb_url"),
                )
            )
        except MediaNotAllowed as exc:
            rejects.append(Reject(number, str(path or ""), "media_not_allowed", str(exc)))
        except (ValueError, TypeError) as exc:
            rejects.append(Reject(number, str(path or ""), "bad_line", str(exc)))
    return items, rejects


# -- the job -----------------------------------------------------------------------------------------


def _process_pool(workers: int) -> Executor:
    # spawn: the caller may hold threads (an event loop, HTTP sessions) that fork would copy mid-state.
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


class ImageJob:
    """One run of the bulk job against a database pool and a sidecar client.

    :meth:`run` is the single-machine job. A driver that brings its own vectors
    (the Ray job: its actors embed) passes ``client=None`` and calls the steps
    itself, in order: :meth:`load_descriptor`, :meth:`read`, :meth:`use_model`,
    :meth:`stored`, :meth:`write_batch` per batch with its vectors, :meth:`finish`.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        client: SidecarClient | None,
        options: JobOptions,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.pool = pool
        self.client = client
        self.options = options
        self.progress = progress or (lambda n: None)
        self.report = JobReport()
        self.rejects: list[Reject] = []
        self.descriptor: Mapping[str, Any] = {}
        self.context: Mapping[str, Any] = {}
        self.partition: ModelPartition | None = None

    def _time(self, phase: str, started: float) -> None:
        self.report.phases[phase] = self.report.phases.get(phase, 0.0) + time.perf_counter() - started

    def _sidecar(self) -> SidecarClient:
        if self.client is None:
            raise JobError("this job has no sidecar client: its vectors must come with each batch")
        return self.client

    async def load_descriptor(self) -> Mapping[str, Any]:
        """The section's descriptor (its context names the image components and roles)."""
        descriptor = await SectionStore(self.pool).get(self.options.section_tipo)
        if descriptor is None:
            raise JobError(
                f"section {self.options.section_tipo!r} has no descriptor "
                f"(mnemo sections put {self.options.section_tipo} FILE.json)"
            )
        self.descriptor = descriptor
        self.context = descriptor.get("context") or {}
        return descriptor

    def read(self, source: Path) -> list[ManifestItem]:
        """The manifest's usable items; its unusable lines become rejects (and count as done)."""
        items, rejects = read_manifest(source, self.descriptor, self.options)
        self.rejects.extend(rejects)
        self.report.total = len(items) + len(rejects)
        self.progress(len(rejects))
        return items

    async def use_model(self, model: str, dimension: int | None = None) -> ModelPartition | None:
        """Write ``model``'s vectors. Without ``dimension`` the partition is the one already stored,
        if any; otherwise the first batch's vectors create it with the dimension the model gives
        (never a configured number)."""
        self.report.model = model
        if dimension is None:
            self.partition = await get_partition(self.pool, model)
        else:
            self.partition = await ensure_partition(self.pool, model, dimension)
        return self.partition

    async def setup(self) -> ModelPartition:
        """The descriptor and the image-text model (resolved through the sidecar) with its partition."""
        await self.load_descriptor()
        model = await resolve_model(self._sidecar(), "image_text", self.options.image_model)
        if model.dimension is None:
            raise JobError(f"image model {model.id!r} reports no dimension")
        partition = await self.use_model(model.id, model.dimension)
        assert partition is not None
        return partition

    async def run(self, source: Path, executor: Executor | None = None) -> JobReport:
        """Ingest ``source``; returns the report (rejects written to ``options.rejects``)."""
        started = time.perf_counter()
        await self.setup()
        items = self.read(source)
        own = executor is None
        executor = executor or _process_pool(self.options.workers)
        try:
            await self._pipeline(items, executor)
        finally:
            if own:
                executor.shutdown(wait=True, cancel_futures=True)
        return self.finish(started)

    def finish(self, started: float) -> JobReport:
        """The report of the run begun at ``started`` (``perf_counter``); rejects written out."""
        self.report.rejected = len(self.rejects)
        self.report.seconds = time.perf_counter() - started
        self._write_rejects()
        return self.report

    async def _pipeline(self, items: Sequence[ManifestItem], executor: Executor) -> None:
        size = max(1, self.options.batch_size)
        batches = [items[i : i + size] for i in range(0, len(items), size)]
        inflight: deque[tuple[Sequence[ManifestItem], Any, asyncio.Future[list[Any]]]] = deque()
        upcoming = iter(batches)

        async def submit() -> bool:
            batch = next(upcoming, None)
            if batch is None:
                return False
            stored = await self.stored(batch)
            loop = asyncio.get_running_loop()
            media = self.options.media
            work = functools.partial(
                prepare_file,
                max_bytes=media.image_max_bytes,
                max_px=media.image_max_px,
                max_pixels=media.image_max_pixels,
            )
            futures = []
            for item in batch:
                old = stored.get(item.record)
                # A file whose bytes are stored is not decoded; its own thumbnail needs no remake.
                known = old.source_hash if old is not None else None
                thumb = media.thumbnail_px if item.thumb_url is None else 0
                futures.append(
                    loop.run_in_executor(
                        executor, functools.partial(work, item.path, known, thumbnail_px=thumb)
                    )
                )
            inflight.append((batch, stored, asyncio.gather(*futures)))
            return True

        for _ in range(max(1, self.options.prefetch)):
            if not await submit():
                break
        writing: asyncio.Task[None] | None = None
        try:
            while inflight:
                batch, stored, future = inflight.popleft()
                waited = time.perf_counter()
                results = await future
                self._time("decode_wait", waited)
                await submit()  # keep the pool busy while this batch is embedded and written
                rows, thumbs = await self._rows(batch, stored, results)
                if writing is not None:  # batches land in order: the previous write first
                    await writing
                # The write runs while the next batch is embedded.
                writing = asyncio.create_task(self._write(rows, thumbs, len(batch)))
            if writing is not None:
                await writing
        finally:
            if writing is not None and not writing.done():
                writing.cancel()

    async def stored(self, items: Sequence[ManifestItem]) -> dict[ItemKey, StoredRow]:
        """What the store holds for these items' records, by :attr:`ManifestItem.record` (nothing
        while the model has no partition); read 1000 records a query."""
        out: dict[ItemKey, StoredRow] = {}
        if self.partition is None:
            return out
        tipo = self.options.section_tipo
        records = sorted({(tipo, item.section_id) for item in items})
        for start in range(0, len(records), 1000):
            found = await image_store.stored_images(self.pool, self.partition, records[start : start + 1000])
            out.update({(sid, *key): row for (_, sid), rows in found.items() for key, row in rows.items()})
        return out

    async def write_batch(
        self,
        batch: Sequence[ManifestItem],
        stored: Mapping[ItemKey, StoredRow],
        results: Sequence[PreparedImage | str | ImageRejected],
        vectors: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """Write one batch: ``results`` are :func:`index.ingest.images.prepare_file`'s per item, ``vectors``
        the new images' by content hash when they came from elsewhere (else the sidecar embeds).
        With no partition yet, the first vectors create it; a batch with none only notes rejects."""
        if self.partition is None:
            if not vectors:
                self.rejects += [
                    Reject(i.line, i.path, r.reason, r.message)
                    for i, r in zip(batch, results, strict=True)
                    if isinstance(r, ImageRejected)
                ]
                return
            dimension = len(next(iter(vectors.values())))
            self.partition = await ensure_partition(self.pool, self.report.model, dimension)
        rows, thumbs = await self._rows(batch, stored, results, vectors)
        await self._write(rows, thumbs, len(batch))

    async def _rows(
        self,
        batch: Sequence[ManifestItem],
        stored: Mapping[ItemKey, StoredRow],
        results: Sequence[PreparedImage | str | ImageRejected],
        vectors: Mapping[str, np.ndarray] | None = None,
    ) -> tuple[list[EmbeddingRow], list[Thumbnail]]:
        """One batch's rows with their vectors (new images embedded here) and thumbnails."""
        assert self.partition is not None
        tipo = self.options.section_tipo
        fresh: dict[str, bytes] = {}
        rows: list[tuple[ManifestItem, EmbeddingRow, PreparedImage | None]] = []
        for item, result in zip(batch, results, strict=True):
            if isinstance(result, ImageRejected):
                self.rejects.append(Reject(item.line, item.path, result.reason, result.message))
                continue
            prepared = result if isinstance(result, PreparedImage) else None
            row = image_row(
                (tipo, item.section_id),
                (item.component_tipo, item.view, item.image_index),
                content_hash=prepared.content_hash if prepared is not None else str(result),
                title=item.title,
                roles=roles_for(self.context, item.metadata),
                projects=item.projects,
                thumb_url=item.thumb_url,
            )
            old = stored.get(item.record)
            if prepared is None and old is not None:
                if old.matches(row):
                    self.report.unchanged += 1
                    continue
                self.report.rewritten += 1
            elif prepared is not None:
                fresh[row.source_hash] = prepared.jpeg
            rows.append((item, row, prepared))
        if vectors is None:
            vectors = await self._embed(fresh)
        else:
            vectors = dict(vectors)
            self.report.embedded += len(fresh)
        reuse = {r.source_hash for _, r, p in rows if p is None}
        if reuse:
            records = sorted({(tipo, item.section_id) for item, _, p in rows if p is None})
            vectors.update(await image_store.image_vectors(self.pool, self.partition, records, reuse))
        for _, row, _ in rows:
            row.embedding = vectors[row.source_hash]
        thumbs = [
            Thumbnail(
                tipo, item.section_id, item.component_tipo, item.image_index, p.content_hash, p.thumbnail
            )
            for item, _, p in rows
            if p is not None and p.thumbnail is not None
        ]
        return [r for _, r, _ in rows], thumbs

    async def _write(self, rows: Sequence[EmbeddingRow], thumbs: Sequence[Thumbnail], done: int) -> None:
        """One transaction of multi-row statements for a batch."""
        assert self.partition is not None
        started = time.perf_counter()
        async with self.pool.acquire() as conn, conn.transaction():
            self.report.rows_written += await store.upsert_rows(conn, self.partition, rows)
            await image_store.upsert_thumbnails(conn, thumbs)
        self._time("write", started)
        self.progress(done)

    async def _embed(self, images: Mapping[str, bytes]) -> dict[str, np.ndarray]:
        if not images:
            return {}
        started = time.perf_counter()
        hashes = list(images)
        result = await self._sidecar().embed_images(self.report.model, [images[h] for h in hashes])
        self.report.embedded += len(hashes)
        self._time("embed", started)
        return dict(zip(hashes, np.asarray(result.embeddings, dtype=np.float32), strict=True))

    def _write_rejects(self) -> None:
        if not self.rejects:
            return
        path = self.options.rejects or Path(f"{self.options.section_tipo}.rejects.jsonl")
        with path.open("w", encoding="utf-8") as fh:
            for reject in sorted(self.rejects, key=lambda r: r.line):
                fh.write(json.dumps(asdict(reject), ensure_ascii=False) + "\n")
        self.report.rejects_path = str(path)


async def run_image_job(
    pool: asyncpg.Pool,
    client: SidecarClient,
    source: Path,
    options: JobOptions,
    *,
    progress: Callable[[int], None] | None = None,
    executor: Executor | None = None,
) -> JobReport:
    """Run the bulk job on one machine (``executor``: a shared process pool, e.g. a benchmark's)."""
    return await ImageJob(pool, client, options, progress=progress).run(source, executor)
