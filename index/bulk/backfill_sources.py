"""Where a backfill's records come from (step 1, the scope, and the embedding of step 3 of
:mod:`index.bulk.backfill`): the queue's ready records of some sections, a JSONL export, or another
model's partition (a model change)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg

from index.beside import running_beside
from index.bulk import shadow
from index.bulk.backfill_types import BackfillOptions, BackfillReport, Embedded
from index.chunking.chunker import embed_text_for, source_hash
from index.ingest import queue
from index.ingest.indexer import Indexer
from index.ingest.intake import IntakeError, validate_record
from index.ingest.queue import QueueItem
from index.models import resolve_model
from index.store.change_feed import KEY_COLUMNS, Watermark, current_watermark, pending_sql
from index.store.partitions import ModelPartition, get_partition
from index.store.sections import SectionStore
from index.store.store import EmbeddingRow, RecordKey
from inference.client import ModelInfo, SidecarClient, SidecarError, SidecarUnavailable
from inference.strict_json import JsonRejected, loads_strict

__all__ = ["JsonlSource", "ModelSource", "QueueSource"]

log = logging.getLogger(__name__)


async def _register(conn: asyncpg.Connection, backfill_id: str, keys: Sequence[RecordKey]) -> None:
    await conn.execute(
        """INSERT INTO rag_backfill_records (backfill_id, section_tipo, section_id)
           SELECT $1, * FROM unnest($2::text[], $3::bigint[]) ON CONFLICT DO NOTHING""",
        backfill_id,
        [k[0] for k in keys],
        [k[1] for k in keys],
    )


async def _embed_records(indexer: Indexer, items: Sequence[QueueItem], out: Embedded) -> None:
    """Chunk and embed records exactly as the drain does, into ``out`` (all their rows are new:
    the indexer reads stored rows from the shadow, which holds none of a pending record)."""
    plans = await indexer.prepare(items)
    await indexer.fit(plans)
    await indexer.embed(plans)
    for plan in plans:
        if plan.error is not None:
            out.rejects[plan.key] = plan.error
        else:
            out.rows[plan.key] = indexer.rows_to_write(plan)


class QueueSource:
    """The sections' ready ``index`` records waiting in the queue (without images)."""

    kind = "queue"

    def __init__(self, sections: Sequence[str], text_model: str | None, options: BackfillOptions) -> None:
        self.sections = sorted(set(sections))
        self.text_model = text_model
        self.options = options
        self.lease: queue.Lease | None = None

    def detail(self) -> dict[str, Any]:
        return {"sections": self.sections}

    async def target(self, pool: asyncpg.Pool, client: SidecarClient) -> ModelInfo:
        return await _resolve(client, self.text_model)

    def use(self, backfill_id: str) -> queue.Lease:
        self.lease = queue.Lease(f"backfill:{backfill_id}", self.options.lease_seconds)
        return self.lease

    async def scope(self, conn: asyncpg.Connection, backfill_id: str) -> list[dict[str, Any]]:
        lease = self.use(backfill_id)
        rows = await conn.fetch(
            """
            WITH claimable AS (
                SELECT section_tipo, section_id FROM rag_index_queue
                WHERE section_tipo = ANY($1::text[]) AND operation = 'index' AND attempts < $2
                  AND NOT (payload ? 'images')
                  AND (lease_until IS NULL OR lease_until <= now())
                FOR UPDATE SKIP LOCKED)
            UPDATE rag_index_queue q
            SET lease_owner = $3, lease_until = clock_timestamp() + make_interval(secs => $4)
            FROM claimable c WHERE q.section_tipo = c.section_tipo AND q.section_id = c.section_id
            RETURNING q.section_tipo, q.section_id
            """,
            self.sections,
            self.options.max_attempts,
            lease.owner,
            lease.seconds,
        )
        await _register(conn, backfill_id, [(r["section_tipo"], r["section_id"]) for r in rows])
        return []

    async def embed(self, pool: asyncpg.Pool, indexer: Indexer, keys: Sequence[RecordKey]) -> Embedded:
        assert self.lease is not None
        rows = await pool.fetch(
            """SELECT q.section_tipo, q.section_id, q.payload, q.version, q.attempts FROM rag_index_queue q
               JOIN unnest($1::text[], $2::bigint[]) AS k(section_tipo, section_id)
                 ON q.section_tipo = k.section_tipo AND q.section_id = k.section_id
               WHERE q.lease_owner = $3""",
            [k[0] for k in keys],
            [k[1] for k in keys],
            self.lease.owner,
        )
        items = [
            QueueItem(
                r["section_tipo"],
                r["section_id"],
                "index",
                json.loads(r["payload"]),
                r["version"],
                r["attempts"],
                self.lease.owner,
            )
            for r in rows
        ]
        out = Embedded(versions={(i.section_tipo, i.section_id): i.version for i in items})
        for key in set(keys) - set(out.versions):
            # Its lease expired while the backfill was down and a drain indexed it: the swap keeps
            # the drain's rows (a rejected record's live rows are copied again).
            out.rejects[key] = "no longer leased to this backfill (a drain took it over)"
        await _embed_records(indexer, items, out)
        for item in items:
            reason = out.rejects.get((item.section_tipo, item.section_id))
            if reason is not None:  # spend an attempt, as the drain would: the error stays visible
                await queue.fail(
                    pool,
                    item,
                    reason,
                    max_attempts=self.options.max_attempts,
                    backoff_cap=self.options.backoff_cap,
                )
        return out

    @contextlib.asynccontextmanager
    async def holding(self, pool: asyncpg.Pool) -> AsyncIterator[None]:
        """Renew the backfill's leases every third of a lease while the body runs."""
        assert self.lease is not None
        lease = self.lease

        async def beat() -> None:
            while True:
                try:
                    await queue.renew_owner(pool, lease)
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                    log.warning("backfill lease renewal failed (retrying): %s", exc)
                await asyncio.sleep(lease.seconds / 3)

        async with running_beside(beat, f"mnemo-backfill-leases-{lease.owner}"):
            yield

    async def finish(self, pool: asyncpg.Pool, backfill_id: str, report: BackfillReport) -> None:
        """After the swap: remove the indexed records from the queue (at the version embedded; a
        newer push stays), then give back every lease."""
        assert self.lease is not None
        status = await pool.execute(
            """DELETE FROM rag_index_queue q USING rag_backfill_records r
               WHERE r.backfill_id = $1 AND r.state = 'copied' AND q.section_tipo = r.section_tipo
                 AND q.section_id = r.section_id AND q.version = r.version AND q.lease_owner = $2""",
            backfill_id,
            self.lease.owner,
        )
        report.completed_in_queue = int(status.rsplit(" ", 1)[-1])
        report.left_in_queue = await queue.release_all(pool, self.lease.owner)


class JsonlSource:
    """Records of a JSONL export (the ``mnemo ingest records`` shape), one per line."""

    kind = "jsonl"

    def __init__(self, path: Path, text_model: str | None) -> None:
        self.path = path
        self.text_model = text_model
        self._offsets: dict[RecordKey, int] | None = None  # the byte offset of each record's last line

    def detail(self) -> dict[str, Any]:
        return {"file": str(self.path.resolve())}

    async def target(self, pool: asyncpg.Pool, client: SidecarClient) -> ModelInfo:
        return await _resolve(client, self.text_model)

    def _read(self) -> tuple[dict[RecordKey, int], list[dict[str, Any]]]:
        """Each record's last line (its byte offset), and the lines that are not a record (JSON
        or its key). Offsets let a batch read its records without scanning the file again."""
        offsets: dict[RecordKey, int] = {}
        rejects: list[dict[str, Any]] = []
        offset = 0
        with self.path.open("rb") as fh:
            for number, line in enumerate(fh, 1):
                start, offset = offset, offset + len(line)
                if not line.strip():
                    continue
                try:
                    obj = loads_strict(line, forbid_nul=True)
                    key = (obj["section_tipo"], obj["section_id"])
                    if not isinstance(key[0], str) or not isinstance(key[1], int) or isinstance(key[1], bool):
                        raise TypeError("section_tipo must be a string and section_id an integer")
                except (JsonRejected, KeyError, TypeError) as exc:
                    rejects.append({"line": number, "reason": f"request.invalid_record: {exc}"})
                    continue
                offsets.pop(key, None)
                offsets[key] = start
        return offsets, rejects

    def offsets(self) -> dict[RecordKey, int]:
        if self._offsets is None:  # a resumed run, or a Ray writer's copy: read once
            self._offsets, _ = self._read()
        return self._offsets

    async def scope(self, conn: asyncpg.Connection, backfill_id: str) -> list[dict[str, Any]]:
        self._offsets, rejects = await asyncio.to_thread(self._read)
        await _register(conn, backfill_id, list(self._offsets))
        return rejects

    def _records(self, keys: Sequence[RecordKey]) -> dict[RecordKey, Any]:
        offsets = self.offsets()
        out: dict[RecordKey, Any] = {}
        with self.path.open("rb") as fh:
            for key in keys:
                if key in offsets:
                    fh.seek(offsets[key])
                    with contextlib.suppress(JsonRejected):
                        obj = loads_strict(fh.readline(), forbid_nul=True)
                        if isinstance(obj, dict) and (obj.get("section_tipo"), obj.get("section_id")) == key:
                            out[key] = obj
        return out

    async def embed(self, pool: asyncpg.Pool, indexer: Indexer, keys: Sequence[RecordKey]) -> Embedded:
        records = await asyncio.to_thread(self._records, keys)
        descriptors = await SectionStore(pool).get_many(sorted({k[0] for k in keys}))
        out = Embedded()
        items = []
        for key in keys:
            if key not in records:
                out.rejects[key] = "the export changed since the backfill read it: run a new backfill"
                continue
            try:
                valid = validate_record(records[key], descriptors)
            except IntakeError as exc:
                out.rejects[key] = f"{exc.code}: {exc}"
                continue
            items.append(QueueItem(key[0], key[1], "index", valid, 0, 0, ""))
        await _embed_records(indexer, items, out)
        return out


class ModelSource:
    """Every text row of another model's partition, re-embedded with the target model (a
    blue/green model change). Chunks keep their boundaries; a chunk over the new model's input
    limit is embedded truncated (queue the records again to re-chunk them for it)."""

    kind = "model"

    def __init__(self, from_model: str, to_model: str) -> None:
        self.from_model = from_model
        self.to_model = to_model
        self.partition: ModelPartition | None = None

    def detail(self) -> dict[str, Any]:
        return {"from_model": self.from_model}

    async def target(self, pool: asyncpg.Pool, client: SidecarClient) -> ModelInfo:
        if self.from_model == self.to_model:
            raise ValueError("a model change needs two different models")
        self.partition = await get_partition(pool, self.from_model)
        if self.partition is None:
            raise LookupError(f"model {self.from_model!r} has no partition: nothing to re-embed")
        return await _resolve(client, self.to_model)

    async def scope(self, conn: asyncpg.Connection, backfill_id: str) -> list[dict[str, Any]]:
        assert self.partition is not None
        # The watermark first, then the read: a change landing in between is embedded twice, never missed.
        watermark = await current_watermark(conn, self.partition)
        await conn.execute(
            f"""INSERT INTO rag_backfill_records (backfill_id, section_tipo, section_id)
                SELECT DISTINCT $1, section_tipo, section_id FROM {self.partition.table}
                WHERE modality = 'text'""",
            backfill_id,
        )
        await _set_source_watermark(conn, backfill_id, watermark)
        return []

    async def catch_up(self, conn: asyncpg.Connection, backfill_id: str, target: ModelPartition) -> int:
        """Make pending again the records the source changed since the scope's watermark (their
        shadow rows go); returns how many."""
        assert self.partition is not None
        row = await conn.fetchrow(
            "SELECT source_seq, source_xmin FROM rag_backfills WHERE backfill_id = $1", backfill_id
        )
        since = Watermark(int(row["source_seq"]), int(row["source_xmin"]))
        async with conn.transaction():
            watermark = await current_watermark(conn, self.partition)  # before the read, as in scope()
            pending = pending_sql("$2", "$3", "$4")
            status = await conn.execute(
                f"""INSERT INTO rag_backfill_records (backfill_id, section_tipo, section_id)
                    SELECT DISTINCT $1, p.section_tipo, p.section_id FROM ({pending}) p
                    ON CONFLICT (backfill_id, section_tipo, section_id)
                    DO UPDATE SET state = 'pending', rows_written = 0, reason = NULL""",
                backfill_id,
                self.partition.model,
                since.seq,
                str(since.xmin),
            )
            await conn.execute(
                f"""DELETE FROM {shadow.shadow_of(target).table} e USING rag_backfill_records r
                    WHERE r.backfill_id = $1 AND r.state = 'pending' AND e.modality = 'text'
                      AND e.section_tipo = r.section_tipo AND e.section_id = r.section_id""",
                backfill_id,
            )
            await _set_source_watermark(conn, backfill_id, watermark)
        return int(status.rsplit(" ", 1)[-1])

    async def embed(self, pool: asyncpg.Pool, indexer: Indexer, keys: Sequence[RecordKey]) -> Embedded:
        assert self.partition is not None
        stored = await pool.fetch(
            f"""SELECT e.section_tipo, e.section_id, e.component_tipo, e.lang, e.view, e.chunk_index,
                       e.parent_key, e.source_hash, e.source_text, e.lexical_text, e.projects, e.chunk_meta
                FROM {self.partition.table} e
                JOIN unnest($1::text[], $2::bigint[]) AS k(section_tipo, section_id)
                  ON e.section_tipo = k.section_tipo AND e.section_id = k.section_id
                WHERE e.modality = 'text'""",
            [k[0] for k in keys],
            [k[1] for k in keys],
        )
        out = Embedded(rows={k: [] for k in keys})  # a record deleted meanwhile leaves no rows
        texts: dict[tuple[RecordKey, tuple[Any, ...]], str] = {}
        for r in stored:
            key = (r["section_tipo"], r["section_id"])
            meta = json.loads(r["chunk_meta"])
            text = embed_text_for(r["source_text"], meta.get("title") or "", meta.get("heading_path") or ())
            if source_hash(text) != r["source_hash"]:
                out.rejects[key] = (
                    f"row {r['component_tipo']}/{r['lang']}/{r['chunk_index']}: its embedded text cannot be "
                    "rebuilt from the stored row (chunker version changed?); queue the record again"
                )
                continue
            texts[(key, tuple(r[c] for c in KEY_COLUMNS))] = text
            out.rows[key].append(
                EmbeddingRow(
                    modality="text",
                    section_tipo=key[0],
                    section_id=key[1],
                    component_tipo=r["component_tipo"],
                    lang=r["lang"],
                    chunk_index=r["chunk_index"],
                    view=r["view"],
                    parent_key=r["parent_key"],
                    source_hash=r["source_hash"],
                    source_text=r["source_text"],
                    lexical_text=r["lexical_text"],
                    embedding=None,
                    projects=tuple(r["projects"]),
                    chunk_meta=meta,
                )
            )
        for key in out.rejects:
            out.rows.pop(key, None)
        try:
            vectors = await indexer.embed_texts(list(dict.fromkeys(texts.values())))
        except SidecarUnavailable:
            raise
        except SidecarError:  # one call failed: find the records at fault
            vectors = {}
            for key in list(out.rows):
                own = [t for (k, _), t in texts.items() if k == key]
                try:
                    vectors.update(await indexer.embed_texts(own))
                except SidecarUnavailable:
                    raise
                except SidecarError as record_exc:
                    out.rejects[key] = f"{type(record_exc).__name__}: {record_exc}"
                    del out.rows[key]
        for key, rows in out.rows.items():
            for row in rows:
                text = texts[
                    (
                        key,
                        (
                            row.section_tipo,
                            row.section_id,
                            row.component_tipo,
                            row.lang,
                            row.view,
                            row.chunk_index,
                        ),
                    )
                ]
                row.embedding, row.sparse = vectors[text]
        return out


async def _resolve(client: SidecarClient, configured: str | None) -> ModelInfo:
    model = await resolve_model(client, "text", configured)
    if model.dimension is None:
        raise ValueError(f"text model {model.id!r} reports no dimension")
    return model


async def _set_source_watermark(conn: asyncpg.Connection, backfill_id: str, watermark: Watermark) -> None:
    await conn.execute(
        "UPDATE rag_backfills SET source_seq = $2, source_xmin = $3, updated_at = now() WHERE backfill_id = $1",
        backfill_id,
        watermark.seq,
        watermark.xmin,
    )
