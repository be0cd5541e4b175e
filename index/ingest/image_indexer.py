"""Images on save: the drain's image step for records whose payload carries ``images``.

Per batch (:meth:`ImageIndexer.prepare` -> :meth:`embed` -> per record
:meth:`load_vectors` and :meth:`write` inside the record's transaction):

1. load each image's bytes (base64, a path under ``RAG_MEDIA_ROOT``, or an
   allow-listed URL) and hash them; an image whose hash is what the store
   already holds for that slot is neither decoded nor embedded again;
2. decode and downsize the others (in a worker thread: the gateway's event
   loop keeps serving) and make a thumbnail when the archive gave no
   ``thumb_url``;
3. embed the new images through the sidecar's ``/image`` with the image-text
   model, deduplicated across the batch;
4. write the rows that differ (a metadata or title change rewrites a row with
   its stored vector), delete the record's image rows and thumbnails that are
   no longer in its payload.

A payload without an ``images`` key leaves the record's image rows as they are
(the bulk job may have written them); ``"images": []`` removes them. A record
whose image cannot be loaded or decoded fails alone, with its error, and stays
queued (backoff, then parked): nothing accepted is dropped silently.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import numpy as np

from index.ingest.images import (
    ImageRejected,
    MediaNotAllowed,
    PreparedImage,
    content_hash,
    load_source,
    prepare_image,
)
from index.ingest.indexer import title_for
from index.ingest.queue import QueueItem
from index.settings import MediaSettings
from index.store import image_store, store
from index.store.image_rows import ImageKey, image_row, image_slot, roles_for
from index.store.image_store import Thumbnail
from index.store.partitions import ModelPartition
from index.store.store import EmbeddingRow, RecordKey, StoredRow
from inference.client import ModelInfo, SidecarClient, SidecarError, SidecarUnavailable

__all__ = ["ImageIndexer", "ImagePlan", "SlotPlan", "has_images", "image_slots"]


def has_images(item: QueueItem) -> bool:
    """Whether a queued record manages its image rows (its payload names ``images``)."""
    return item.operation == "index" and "images" in (item.payload or {})


@dataclass
class SlotPlan:
    """One image of a record: where it sits, where its bytes come from, what it became."""

    key: ImageKey
    source: Mapping[str, Any]
    thumb_url: str | None
    content_hash: str = ""
    prepared: PreparedImage | None = None


@dataclass
class ImagePlan:
    """The image work of one queued record; ``error`` set means the record fails."""

    record: RecordKey
    projects: list[int]
    title: str
    roles: dict[str, dict[str, Any]]
    slots: list[SlotPlan] = field(default_factory=list)
    stored: dict[ImageKey, StoredRow] = field(default_factory=dict)
    vectors: dict[str, np.ndarray] = field(default_factory=dict)
    error: str | None = None


def image_slots(images: Sequence[Mapping[str, Any]], context: Mapping[str, Any]) -> list[SlotPlan]:
    """Slots for a record's images: the view defaults to the descriptor's view of the component,
    the index to the image's position among its component's images."""
    views = {i["tipo"]: i.get("view", "") for i in context.get("images", [])}
    seen: dict[str, int] = {}
    slots = []
    for image in images:
        tipo = image["tipo"]
        index = image.get("index", seen.get(tipo, 0))
        seen[tipo] = max(seen.get(tipo, 0), index + 1)
        view = image.get("view") or views.get(tipo, "")
        slots.append(SlotPlan((tipo, view, index), image, image.get("thumb_url")))
    return slots


class ImageIndexer:
    """Indexes record images for one image-text model into its partition."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        client: SidecarClient,
        model: ModelInfo,
        partition: ModelPartition,
        media: MediaSettings,
        session: Any = None,
    ) -> None:
        self.pool = pool
        self.client = client
        self.model = model
        self.partition = partition
        self.media = media
        self.session = session  # aiohttp session for URL images
        self.embedded = 0
        self.seconds: dict[str, float] = {}

    def _time(self, phase: str, started: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - started

    async def prepare(
        self, items: Sequence[QueueItem], descriptors: Mapping[str, Mapping[str, Any]]
    ) -> dict[RecordKey, ImagePlan]:
        """Plans for the records of the batch that carry ``images``; load, hash, decode what changed."""
        started = time.perf_counter()
        plans: dict[RecordKey, ImagePlan] = {}
        for item in items:
            if not has_images(item):
                continue
            payload = item.payload or {}
            context = (descriptors.get(item.section_tipo) or {}).get("context") or {}
            key = (item.section_tipo, item.section_id)
            plans[key] = ImagePlan(
                record=key,
                projects=sorted(set(payload.get("projects", []))),
                title=title_for(payload.get("title"), ""),
                roles=roles_for(context, payload.get("metadata") or {}),
                slots=image_slots(payload.get("images") or [], context),
            )
            if item.section_tipo not in descriptors:
                plans[key].error = f"LookupError: section {item.section_tipo!r} has no descriptor"
        stored = await image_store.stored_images(self.pool, self.partition, list(plans))
        for key, plan in plans.items():
            plan.stored = stored[key]
            if plan.error is None:
                try:
                    await self._load(plan)
                except (ImageRejected, MediaNotAllowed) as exc:
                    plan.error = f"{type(exc).__name__}: {exc}"
        self._time("image_prepare", started)
        return plans

    async def _load(self, plan: ImagePlan) -> None:
        for i, slot in enumerate(plan.slots):
            try:
                raw = await load_source(slot.source, self.media, self.session)
            except (ImageRejected, MediaNotAllowed) as exc:
                raise type(exc)(*_with_index(exc, i)) from exc
            slot.content_hash = content_hash(raw)
            old = plan.stored.get(slot.key)
            if (
                old is not None
                and old.source_hash == slot.content_hash
                and (slot.thumb_url is not None or old.chunk_meta.get("own_thumbnail"))
            ):
                continue  # unchanged bytes: its vector and thumbnail stay
            thumb_px = self.media.thumbnail_px if slot.thumb_url is None else None
            try:
                slot.prepared = await asyncio.to_thread(
                    prepare_image,
                    raw,
                    max_px=self.media.image_max_px,
                    max_pixels=self.media.image_max_pixels,
                    thumbnail_px=thumb_px,
                )
            except ImageRejected as exc:
                raise ImageRejected(exc.reason, f"images[{i}]: {exc.message}") from exc

    async def embed(self, plans: Mapping[RecordKey, ImagePlan]) -> None:
        """Vectors for every new image of the batch; a rejected image fails only its record."""
        started = time.perf_counter()
        active = [p for p in plans.values() if p.error is None]
        todo = _new_images(active)
        try:
            vectors = await self._embed(todo)
        except SidecarUnavailable:
            raise
        except SidecarError:
            vectors = {}
            for plan in active:  # find the record at fault
                try:
                    vectors.update(await self._embed(_new_images([plan])))
                except SidecarUnavailable:
                    raise
                except SidecarError as exc:
                    plan.error = f"{type(exc).__name__}: {exc}"
        for plan in active:
            if plan.error is None:
                for slot in plan.slots:
                    if slot.prepared is not None:
                        plan.vectors[slot.content_hash] = vectors[slot.content_hash]
        self._time("image_embed", started)

    async def _embed(self, todo: Mapping[str, bytes]) -> dict[str, np.ndarray]:
        if not todo:
            return {}
        hashes = list(todo)
        result = await self.client.embed_images(self.model.id, [todo[h] for h in hashes])
        self.embedded += len(hashes)
        return {h: np.asarray(v, dtype=np.float32) for h, v in zip(hashes, result.embeddings, strict=True)}

    def rows(self, plan: ImagePlan) -> list[EmbeddingRow]:
        """The rows that differ from what the store holds (vectors filled from ``plan.vectors``)."""
        out = []
        for slot in plan.slots:
            row = image_row(
                plan.record,
                slot.key,
                content_hash=slot.content_hash,
                title=plan.title,
                roles=plan.roles,
                projects=plan.projects,
                thumb_url=slot.thumb_url,
                embedding=plan.vectors.get(slot.content_hash),
            )
            old = plan.stored.get(slot.key)
            if old is None or not old.matches(row):
                out.append(row)
        return out

    async def load_vectors(self, plan: ImagePlan) -> None:
        """Stored vectors for rows rewritten without re-embedding (metadata, title, project changes)."""
        missing = {r.source_hash for r in self.rows(plan)} - set(plan.vectors)
        plan.vectors.update(
            await image_store.image_vectors(self.pool, self.partition, [plan.record], missing)
        )

    async def write(self, conn: asyncpg.Connection, plan: ImagePlan) -> tuple[int, int]:
        """Apply one record's images inside the caller's transaction: (rows written, rows deleted)."""
        # A row still without a vector is a loud ValueError from the writer: the record fails, queued.
        written = await store.upsert_rows(conn, self.partition, self.rows(plan))
        slots = [image_slot(s.key) for s in plan.slots]
        deleted = await store.prune_rows(conn, self.partition, plan.record, "image", slots)
        thumbs = [
            Thumbnail(
                plan.record[0], plan.record[1], s.key[0], s.key[2], s.content_hash, s.prepared.thumbnail
            )
            for s in plan.slots
            if s.prepared is not None and s.prepared.thumbnail is not None
        ]
        await image_store.upsert_thumbnails(conn, thumbs)
        keep = {(s.key[0], s.key[2]): s.content_hash for s in plan.slots if s.thumb_url is None}
        await image_store.delete_thumbnails(conn, plan.record, keep)
        return written, deleted


def _new_images(plans: Sequence[ImagePlan]) -> dict[str, bytes]:
    return {s.content_hash: s.prepared.jpeg for p in plans for s in p.slots if s.prepared is not None}


def _with_index(exc: Exception, index: int) -> tuple[Any, ...]:
    if isinstance(exc, ImageRejected):
        return (exc.reason, f"images[{index}]: {exc.message}")
    return (f"images[{index}]: {exc}",)
