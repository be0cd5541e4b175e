"""The indexer: turns queued records into stored chunks, re-embedding only what changed.

For a batch of queued records (:meth:`Indexer.prepare` -> :meth:`fit` ->
:meth:`embed` -> :meth:`write`):

1. **Chunk** every embed group and language with the group's settings, sized
   for the model's ``max_input_tokens`` (leaving room for the title header).
2. **Diff** each chunk's ``source_hash`` against the record's stored rows.
3. **Fit**: count the tokens of new chunks with the sidecar's ``/tokenize``; a
   document with a chunk over the model's limit is re-chunked smaller (twice at
   most), and what is still over is embedded with ``truncate: true`` and
   counted, so the indexer never earns a 422 for length.
4. **Embed** only the chunks whose text the record does not already hold (a
   chunk that merely moved reuses its stored vector), deduplicated across the
   batch, in sidecar calls of ``embed_batch``. Sparse weights are kept when the
   model returns them.
5. **Write** (the caller's transaction, one per record): upsert the rows that
   differ from what is stored and delete the stale tail, including groups and
   languages the record no longer has.

Embedding happens before and outside the write transaction. A per-record
problem (a missing descriptor, an input the sidecar rejects) is recorded on
that record's plan; a sidecar outage raises ``SidecarUnavailable`` for the
caller to pause on.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import numpy as np

from index.chunking.chunker import Chunk, chunk, estimate_tokens
from index.ingest.queue import QueueItem
from index.store import store
from index.store.partitions import ModelPartition
from index.store.sections import SectionStore
from index.store.store import EmbeddingRow, RecordKey, SlotKey, StoredRow
from index.text import fold
from inference.client import ModelInfo, SidecarClient, SidecarError, SidecarUnavailable

__all__ = ["DocPlan", "Indexer", "RecordPlan", "component_tipo_for", "title_for"]

log = logging.getLogger(__name__)

# Tokens kept free below the model's input limit for special tokens and the
# header ("{title} › {heading path}") that the chunker does not count.
_SPECIAL_TOKENS = 2
_HEADER_SLACK = 16
_MIN_CHUNK_TOKENS = 8
_REFIT_ROUNDS = 2

ChunkFn = Callable[..., list[Chunk]]


def component_tipo_for(group_id: str) -> str:
    """Group documents are stored under ``rag:<group>``."""
    return f"rag:{group_id}"


def title_for(title: Any, lang: str) -> str:
    """A record's title in ``lang``: a plain string, or a per-language map (first entry as fallback)."""
    if isinstance(title, str):
        return title
    if isinstance(title, Mapping) and title:
        return str(title.get(lang) or next(iter(title.values())))
    return ""


@dataclass
class DocPlan:
    """One (group, language) document of a record and its chunks."""

    group: str
    lang: str
    text: str
    title: str
    contributors: list[str]
    mode: str | None
    max_tokens: int
    min_tokens: int
    chunks: list[Chunk] = field(default_factory=list)
    token_counts: dict[str, int] = field(default_factory=dict)  # by source hash (new chunks)
    truncated: set[str] = field(default_factory=set)  # source hashes embedded truncated

    @property
    def component_tipo(self) -> str:
        return component_tipo_for(self.group)


@dataclass
class RecordPlan:
    """What the drain does for one queued record; ``error`` set means it failed."""

    item: QueueItem
    docs: list[DocPlan] = field(default_factory=list)
    projects: list[int] = field(default_factory=list)
    stored: dict[SlotKey, StoredRow] = field(default_factory=dict)
    vectors: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # hash -> (dense, sparse)
    error: str | None = None

    @property
    def key(self) -> RecordKey:
        return (self.item.section_tipo, self.item.section_id)

    @property
    def is_delete(self) -> bool:
        return self.item.operation == "delete"

    def stored_hashes(self) -> set[str]:
        return {s.source_hash for s in self.stored.values()}

    def new_chunks(self) -> list[tuple[DocPlan, Chunk]]:
        """Chunks whose text this record does not hold yet (they need vectors from the sidecar)."""
        known = self.stored_hashes()
        return [(d, c) for d in self.docs for c in d.chunks if c.source_hash not in known]


@dataclass
class BatchCounts:
    """What one batch cost: embedded texts, truncations, rows written and deleted."""

    chunks_embedded: int = 0
    truncated: int = 0
    rows_written: int = 0
    rows_deleted: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def add_time(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds


class Indexer:
    """Indexes records for one text model into its partition."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        client: SidecarClient,
        model: ModelInfo,
        partition: ModelPartition,
        *,
        embed_batch: int = 64,
        chunk_fn: ChunkFn = chunk,
    ) -> None:
        if model.dimension is None:
            raise ValueError(f"model {model.id!r} reports no dimension; it cannot be stored")
        self.pool = pool
        self.client = client
        self.model = model
        self.partition = partition
        self.embed_batch = embed_batch
        self.chunk_fn = chunk_fn
        self.counts = BatchCounts()

    # -- 1. chunk and diff -------------------------------------------------

    async def prepare(self, items: Sequence[QueueItem]) -> list[RecordPlan]:
        """Chunk every record of the batch and load what the store holds for them."""
        started = time.perf_counter()
        plans = [RecordPlan(item) for item in items]
        index_plans = [p for p in plans if not p.is_delete]
        sections = sorted({p.item.section_tipo for p in index_plans})
        descriptors = await SectionStore(self.pool).get_many(sections)
        for plan in index_plans:
            try:
                self._plan_docs(plan, descriptors.get(plan.item.section_tipo))
            except Exception as exc:  # a record that cannot be chunked fails alone
                plan.error = _describe(exc)
        stored = await store.stored_rows(self.pool, self.partition, [p.key for p in index_plans], "text")
        for plan in index_plans:
            plan.stored = stored[plan.key]
        self.counts.add_time("chunk", time.perf_counter() - started)
        return plans

    def _plan_docs(self, plan: RecordPlan, descriptor: Mapping[str, Any] | None) -> None:
        payload = plan.item.payload or {}
        if descriptor is None:
            raise LookupError(f"section {plan.item.section_tipo!r} has no descriptor")
        plan.projects = sorted(set(payload.get("projects", [])))
        overrides = payload.get("contributors", {})
        texts = payload.get("groups", {})
        for group in descriptor["embed"]:
            by_lang = texts.get(group["id"]) or {}
            for lang in sorted(by_lang):
                text = by_lang[lang]
                if not text.strip():
                    continue
                title = title_for(payload.get("title"), lang)
                max_tokens, min_tokens = self._budget(group["chunk"], title)
                doc = DocPlan(
                    group=group["id"],
                    lang=lang,
                    text=text,
                    title=title,
                    contributors=list(overrides.get(group["id"]) or group["contributors"]),
                    mode=group.get("mode"),
                    max_tokens=max_tokens,
                    min_tokens=min_tokens,
                )
                self._chunk(doc)
                plan.docs.append(doc)

    def _budget(self, chunk_settings: Mapping[str, int], title: str) -> tuple[int, int]:
        """The group's chunk bounds, shrunk to fit the model's input limit with the header."""
        max_tokens = int(chunk_settings["max_tokens"])
        limit = self.model.max_input_tokens
        if limit:
            room = limit - _SPECIAL_TOKENS - _HEADER_SLACK - estimate_tokens(title)
            max_tokens = max(_MIN_CHUNK_TOKENS, min(max_tokens, room))
        return max_tokens, min(int(chunk_settings["min_tokens"]), max_tokens // 2)

    def _chunk(self, doc: DocPlan) -> None:
        doc.chunks = self.chunk_fn(
            doc.text,
            title=doc.title,
            max_tokens=doc.max_tokens,
            min_tokens=doc.min_tokens,
            mode=doc.mode,
        )

    # -- 2. fit the model's input limit ----------------------------------------

    async def fit(self, plans: Sequence[RecordPlan]) -> None:
        """Count new chunks' tokens; re-chunk documents over the limit, then mark truncations.

        An input the sidecar refuses fails only its record; an outage raises.
        """
        if not self.model.max_input_tokens:  # no stated limit: the chunker's counts stand
            return
        started = time.perf_counter()
        active = [p for p in plans if p.error is None and not p.is_delete]
        try:
            await self._fit(active, self.model.max_input_tokens)
        except SidecarUnavailable:
            raise
        except SidecarError:
            for plan in active:  # find the record at fault
                try:
                    await self._fit([plan], self.model.max_input_tokens)
                except SidecarUnavailable:
                    raise
                except SidecarError as exc:
                    plan.error = _describe(exc)
        self.counts.add_time("tokenize", time.perf_counter() - started)

    async def _fit(self, plans: Sequence[RecordPlan], limit: int) -> None:
        for round_ in range(_REFIT_ROUNDS + 1):
            pending = [
                (d, c) for p in plans for d, c in p.new_chunks() if c.source_hash not in d.token_counts
            ]
            if not pending:
                break
            texts = list(dict.fromkeys(c.embed_text for _, c in pending))
            counts = dict(zip(texts, await self._tokenize(texts), strict=True))
            worst: dict[int, tuple[DocPlan, int]] = {}
            for doc, c in pending:
                n = doc.token_counts[c.source_hash] = counts[c.embed_text]
                if n > limit and n > worst.get(id(doc), (doc, 0))[1]:
                    worst[id(doc)] = (doc, n)
            if not worst:
                break
            for doc, n in worst.values():
                if round_ < _REFIT_ROUNDS and doc.max_tokens > _MIN_CHUNK_TOKENS:
                    doc.max_tokens = max(_MIN_CHUNK_TOKENS, int(doc.max_tokens * limit / n * 0.9))
                    doc.min_tokens = min(doc.min_tokens, doc.max_tokens // 2)
                    self._chunk(doc)
        for plan in plans:
            for doc, c in plan.new_chunks():
                if doc.token_counts.get(c.source_hash, 0) > limit:
                    doc.truncated.add(c.source_hash)

    async def _tokenize(self, texts: Sequence[str]) -> list[int]:
        counts: list[int] = []
        for start in range(0, len(texts), self.embed_batch):
            counts.extend(await self.client.tokenize(self.model.id, texts[start : start + self.embed_batch]))
        return counts

    # -- 3. embed what changed ---------------------------------------------------

    async def embed(self, plans: Sequence[RecordPlan]) -> None:
        """Vectors for every new chunk of the batch. A rejected input fails only its record."""
        started = time.perf_counter()
        active = [p for p in plans if p.error is None and not p.is_delete]
        texts = list(dict.fromkeys(c.embed_text for p in active for _, c in p.new_chunks()))
        try:
            vectors = await self.embed_texts(texts)
        except SidecarUnavailable:
            raise
        except SidecarError:
            vectors = {}
            for plan in active:  # find the record at fault
                own = list(dict.fromkeys(c.embed_text for _, c in plan.new_chunks()))
                try:
                    vectors.update(await self.embed_texts(own))
                except SidecarUnavailable:
                    raise
                except SidecarError as exc:
                    plan.error = _describe(exc)
        for plan in active:
            if plan.error is None:
                for _, c in plan.new_chunks():
                    plan.vectors[c.source_hash] = vectors[c.embed_text]
        self.counts.chunks_embedded += len(texts)
        self.counts.add_time("embed", time.perf_counter() - started)

    async def embed_texts(self, texts: Sequence[str]) -> dict[str, tuple[Any, Any]]:
        """(dense, sparse) vectors per distinct text, in calls of ``embed_batch`` (a backfill onto
        another model embeds stored chunk texts through this too)."""
        out: dict[str, tuple[Any, Any]] = {}
        for start in range(0, len(texts), self.embed_batch):
            part = list(texts[start : start + self.embed_batch])
            result = await self._embed_call(part)
            sparse = result.sparse or [None] * len(part)
            for text, dense, weights in zip(part, result.embeddings, sparse, strict=True):
                out[text] = (np.asarray(dense, dtype=np.float32), weights)
        return out

    async def _embed_call(self, texts: list[str]) -> Any:
        """One embed call, with sparse weights when ``/models`` says the model has a sparse head."""
        return await self.client.embed(self.model.id, texts, truncate=True, return_sparse=self.model.sparse)

    # -- 4. write ------------------------------------------------------------------

    async def load_moved_vectors(self, plan: RecordPlan) -> None:
        """Stored vectors for rows that must be rewritten without re-embedding (moved chunks,
        metadata or project changes). Read before the write transaction opens."""
        wanted = {row.source_hash for row in self.rows_to_write(plan, need_vectors=False)}
        missing = sorted(wanted - set(plan.vectors))
        plan.vectors.update(
            await store.stored_vectors(self.pool, self.partition, [plan.key], "text", missing)
        )

    def rows_to_write(self, plan: RecordPlan, *, need_vectors: bool = True) -> list[EmbeddingRow]:
        """Rows that differ from what is stored (text, position, metadata or projects)."""
        rows = []
        for doc in plan.docs:
            for c in doc.chunks:
                row = self._row(plan, doc, c)
                stored = plan.stored.get(row.slot)
                if stored is not None and stored.matches(row):
                    continue
                if need_vectors:
                    row.embedding, row.sparse = plan.vectors[c.source_hash]
                rows.append(row)
        return rows

    def _row(self, plan: RecordPlan, doc: DocPlan, c: Chunk) -> EmbeddingRow:
        """The row for a chunk, without its vectors."""
        stored = plan.stored.get((doc.component_tipo, doc.lang, "", c.index))
        meta: dict[str, Any] = {
            "group": doc.group,
            "contributors": doc.contributors,
            "title": doc.title,
            "heading_path": list(c.heading_path),
            "page": c.page,
            "tc_in": c.tc_in,
            "tc_out": c.tc_out,
        }
        if c.source_hash in doc.truncated:
            meta["truncated"] = True
        if c.source_hash in doc.token_counts:
            token_count = min(doc.token_counts[c.source_hash], self.model.max_input_tokens or 1 << 30)
        elif stored is not None and stored.source_hash == c.source_hash:
            token_count = stored.token_count
        else:
            token_count = c.token_count
        return EmbeddingRow(
            modality="text",
            section_tipo=plan.key[0],
            section_id=plan.key[1],
            component_tipo=doc.component_tipo,
            lang=doc.lang,
            chunk_index=c.index,
            parent_key=c.parent_key,
            source_hash=c.source_hash,
            source_text=c.text,
            lexical_text=fold(" ".join(p for p in (doc.title, *c.heading_path, c.text) if p)),
            embedding=None,
            token_count=token_count,
            projects=tuple(plan.projects),
            chunk_meta=json.loads(json.dumps(meta)),
        )

    async def write(self, conn: asyncpg.Connection, plan: RecordPlan) -> tuple[int, int]:
        """Apply a record inside the caller's transaction: (rows written, rows deleted)."""
        if plan.is_delete:
            return 0, await store.delete_record(conn, plan.key)
        rows = self.rows_to_write(plan)
        written = await store.upsert_rows(conn, self.partition, rows)
        keep = [(d.component_tipo, d.lang, "", c.index) for d in plan.docs for c in d.chunks]
        deleted = await store.prune_rows(conn, self.partition, plan.key, "text", keep)
        return written, deleted

    def truncations(self, plan: RecordPlan) -> int:
        return sum(len(d.truncated) for d in plan.docs)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
