"""Bulk backfill (``mnemo backfill``): rebuild a model's partition from a whole section's queued
records, a JSONL export, or another model's partition (a model change), without touching the live
partition until one atomic swap.

The run, in order (each step durable in ``rag_backfills`` / ``rag_backfill_records``, so a
killed run resumes where it stopped when the same command runs again):

1. **Scope.** The records the backfill replaces, one ``pending`` row each:
   - ``queue``: the sections' ready ``index`` records in ``rag_index_queue`` (records with images
     stay for the drain, whose image step they need). They are leased to the backfill
     (``backfill:<id>``) and the lease is renewed while it runs, so drains skip them;
   - ``jsonl``: the file's records, validated like ``mnemo ingest records`` (a bad line goes to
     the rejects report);
   - ``model``: every record with text rows in the source model's partition.
2. **Shadow.** :mod:`index.shadow` creates the target partition's shadow (no index) and copies
   the live rows outside the scope into it.
3. **Embed and COPY.** Batches of pending records are chunked and embedded exactly as the drain
   does (:class:`index.indexer.Indexer`; a model change re-embeds each stored chunk's text,
   rebuilt from the row and checked against its ``source_hash``) and written with binary COPY
   (:func:`index.store.copy_rows`). A batch's rows and its records' ``copied`` state commit
   together: never a record twice, never a record lost. A record that fails is ``rejected`` with
   its reason (the rejects report) and the run goes on; its live rows are kept at the swap.
4. **Build** the indexes (:func:`index.shadow.build_indexes`, with the memory check).
5. **Swap** (:func:`index.shadow.swap`). A model change first embeds again the records the
   source partition changed meanwhile, and the swap makes the new model the one that serves
   text queries (``rag_serving_models``). The queue source then completes the records it
   indexed (a record pushed again meanwhile stays queued for the drain) and gives back its leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import asyncpg

from inference.client import ModelInfo, SidecarClient, SidecarError, SidecarUnavailable
from inference.strict_json import JsonRejected, loads_strict

from . import queue, shadow, store
from .change_feed import KEY_COLUMNS, Watermark, current_watermark, pending_sql
from .chunker import embed_text_for, source_hash
from .indexer import Indexer
from .intake import IntakeError, validate_record
from .models import resolve_model
from .partitions import ModelPartition, ensure_partition, get_partition
from .queue import QueueItem
from .sections import SectionStore
from .store import EmbeddingRow, RecordKey

__all__ = [
    "BackfillConflict",
    "BackfillOptions",
    "BackfillReport",
    "EmbedStep",
    "JsonlSource",
    "ModelSource",
    "QueueSource",
    "abandon",
    "embed_and_copy",
    "records_done",
    "run_backfill",
]

log = logging.getLogger(__name__)

# A model change whose source keeps changing gives up after this many catch-up rounds.
MAX_SWAP_ROUNDS = 5


class BackfillConflict(RuntimeError):
    """Another unfinished backfill holds the target model (rerun that one, or abandon it)."""


@dataclass(frozen=True)
class BackfillOptions:
    batch_records: int = 64  # records per embed + COPY transaction
    embed_batch: int = 64  # texts per /embed call
    lease_seconds: float = 60.0  # the queue source's lease, renewed every third of it
    max_attempts: int = 5  # queue source: a record that fails spends an attempt, as in the drain
    backoff_cap: float = 1800.0
    build_workers: int | None = None  # max_parallel_maintenance_workers for the index build
    maintenance_work_mem: str | None = None  # for the index build session
    allow_spill: bool = False
    rejects: Path | None = None  # default backfill-<id>.rejects.jsonl


@dataclass
class BackfillReport:
    backfill_id: str
    model: str
    source: str
    resumed: bool = False
    records: int = 0
    copied: int = 0
    rejected: int = 0
    rows_written: int = 0
    rows_kept: int = 0  # live rows outside the scope, copied into the shadow
    completed_in_queue: int = 0
    left_in_queue: int = 0
    records_caught_up: int = 0
    keys_stamped: int = 0
    build: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    rejects_path: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Embedded:
    """A batch's outcome: rows per record (an empty list is a record with no text), rejects with
    their reasons, and the queue version each record was embedded at (queue source)."""

    rows: dict[RecordKey, list[EmbeddingRow]] = field(default_factory=dict)
    rejects: dict[RecordKey, str] = field(default_factory=dict)
    versions: dict[RecordKey, int] = field(default_factory=dict)


class Source(Protocol):
    kind: str

    def detail(self) -> dict[str, Any]: ...

    async def target(self, pool: asyncpg.Pool, client: SidecarClient) -> ModelInfo: ...

    async def scope(self, conn: asyncpg.Connection, backfill_id: str) -> list[dict[str, Any]]:
        """Register the scope's records as pending; returns line rejects (no record key)."""
        ...

    async def embed(self, pool: asyncpg.Pool, indexer: Indexer, keys: Sequence[RecordKey]) -> Embedded: ...


# -- sources ------------------------------------------------------------------------------


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

        task = asyncio.create_task(beat(), name=f"mnemo-backfill-leases-{lease.owner}")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

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


# -- the run --------------------------------------------------------------------------------

Progress = Callable[[int, int], None]  # (records done, records in scope)


async def _open_run(
    conn: asyncpg.Connection,
    source: Source,
    model: ModelInfo,
    partition: ModelPartition,
    report: BackfillReport,
) -> asyncpg.Record:
    """Resume the target's unfinished run when it is this source's, or start one: the run, its
    shadow and its scope in one transaction."""
    row = await conn.fetchrow(
        "SELECT * FROM rag_backfills WHERE target_model = $1 AND state IN ('embedding', 'building')", model.id
    )
    if row is not None:
        if row["source"] != source.kind or json.loads(row["source_detail"]) != source.detail():
            raise BackfillConflict(
                f"backfill {row['backfill_id']} of model {model.id} from {row['source']} "
                f"{row['source_detail']} is unfinished: run that command again to resume it, or "
                f"`mnemo backfill --abandon {model.id}` to drop it"
            )
        report.resumed = True
    else:
        backfill_id = f"bf-{secrets.token_hex(4)}"
        async with conn.transaction():
            await shadow.drop_shadow(conn, partition)  # left by an abandoned run killed mid-drop
            await shadow.create_shadow(conn, partition)
            await conn.execute(
                """INSERT INTO rag_backfills (backfill_id, target_model, source, source_detail, shadow_table,
                                              state)
                   VALUES ($1, $2, $3, $4, $5, 'embedding')""",
                backfill_id,
                model.id,
                source.kind,
                json.dumps(source.detail()),
                shadow.shadow_of(partition).partition,
            )
            line_rejects = await source.scope(conn, backfill_id)
            row = await conn.fetchrow(
                "UPDATE rag_backfills SET report = $2 WHERE backfill_id = $1 RETURNING *",
                backfill_id,
                json.dumps({"line_rejects": line_rejects}),
            )
    assert row is not None
    return row


async def _counts(db: asyncpg.Pool, backfill_id: str) -> dict[str, int]:
    rows = await db.fetch(
        "SELECT state, count(*) AS n, sum(rows_written) AS r FROM rag_backfill_records WHERE backfill_id = $1 GROUP BY state",
        backfill_id,
    )
    out = {r["state"]: int(r["n"]) for r in rows}
    out["rows"] = sum(int(r["r"] or 0) for r in rows)
    return out


async def records_done(db: asyncpg.Pool, backfill_id: str) -> tuple[int, int]:
    """(records done, records in the run's scope): where an embed step starts its progress."""
    counts = await _counts(db, backfill_id)
    total = sum(v for k, v in counts.items() if k != "rows")
    return total - counts.get("pending", 0), total


async def _write_batch(
    pool: asyncpg.Pool,
    shadow_partition: ModelPartition,
    backfill_id: str,
    keys: list[RecordKey],
    embedded: Embedded,
) -> None:
    """COPY a batch's rows into the shadow and mark its records, in one transaction."""
    written = [row for key in keys for row in embedded.rows.get(key, [])]
    async with pool.acquire() as conn, conn.transaction():
        await store.copy_rows(conn, shadow_partition, written)
        await conn.execute(
            """UPDATE rag_backfill_records r
               SET state = k.state, rows_written = k.n, version = k.version, reason = k.reason
               FROM unnest($2::text[], $3::bigint[], $4::text[], $5::int[], $6::bigint[], $7::text[])
                    AS k(section_tipo, section_id, state, n, version, reason)
               WHERE r.backfill_id = $1 AND r.section_tipo = k.section_tipo AND r.section_id = k.section_id""",
            backfill_id,
            [k[0] for k in keys],
            [k[1] for k in keys],
            ["rejected" if k in embedded.rejects else "copied" for k in keys],
            [len(embedded.rows.get(k, ())) for k in keys],
            [embedded.versions.get(k) for k in keys],
            [embedded.rejects.get(k) for k in keys],
        )


async def embed_and_copy(
    pool: asyncpg.Pool, source: Source, indexer: Indexer, backfill_id: str, keys: list[RecordKey]
) -> int:
    """Embed one batch of pending records and COPY it into the shadow, with their states, in one
    transaction (what each of ``--ray``'s writers does per batch). Returns the rows written."""
    embedded = await source.embed(pool, indexer, keys)
    await _write_batch(pool, indexer.partition, backfill_id, keys, embedded)
    return sum(len(embedded.rows.get(key, ())) for key in keys)


class EmbedStep(Protocol):
    """Step 3, embed and COPY every pending record: in this process (the default) or elsewhere
    (:class:`index.backfill_ray.RayEmbedStep`). Each batch commits its rows and its records'
    states together, so a step killed anywhere resumes from the committed batches."""

    async def __call__(
        self,
        pool: asyncpg.Pool,
        source: Source,
        indexer: Indexer,
        backfill_id: str,
        options: BackfillOptions,
        progress: Progress,
    ) -> None: ...


async def _embed_pending(
    pool: asyncpg.Pool,
    source: Source,
    indexer: Indexer,
    backfill_id: str,
    options: BackfillOptions,
    progress: Progress,
) -> None:
    """Embed and COPY the pending records, a batch per transaction, until none is left. Batch n+1
    is embedded while batch n is written (one write at a time); batches follow the records' key
    order, so the next one is read past the last key rather than waiting for the write."""
    done, total = await records_done(pool, backfill_id)
    progress(done, total)
    after: RecordKey = ("", -1)
    writing: asyncio.Task[None] | None = None
    in_flight = 0
    try:
        while True:
            rows = await pool.fetch(
                """SELECT section_tipo, section_id FROM rag_backfill_records
                   WHERE backfill_id = $1 AND state = 'pending' AND (section_tipo, section_id) > ($2, $3)
                   ORDER BY section_tipo, section_id LIMIT $4""",
                backfill_id,
                after[0],
                after[1],
                options.batch_records,
            )
            if not rows:
                break
            keys = [(r["section_tipo"], r["section_id"]) for r in rows]
            after = keys[-1]
            embedded = await source.embed(pool, indexer, keys)
            if writing is not None:
                await writing
                done += in_flight
                progress(done, total)
            writing = asyncio.create_task(_write_batch(pool, indexer.partition, backfill_id, keys, embedded))
            in_flight = len(keys)
    finally:
        if writing is not None:  # a write under way finishes (its transaction commits or rolls back)
            await asyncio.gather(writing, return_exceptions=True)
    if writing is not None:
        await writing  # its error, if it failed
        progress(done + in_flight, total)


async def _set_state(
    db: asyncpg.Pool, backfill_id: str, state: str, report: BackfillReport | None = None
) -> None:
    await db.execute(
        """UPDATE rag_backfills SET state = $2, updated_at = now(),
                  finished_at = CASE WHEN $2 IN ('swapped', 'abandoned') THEN now() END,
                  report = report || coalesce($3::jsonb, '{}'::jsonb)
           WHERE backfill_id = $1""",
        backfill_id,
        state,
        None if report is None else json.dumps({"result": report.as_dict()}),
    )


def _timed(report: BackfillReport, phase: str, started: float) -> None:
    report.seconds[phase] = round(report.seconds.get(phase, 0.0) + time.perf_counter() - started, 3)


async def run_backfill(
    pool: asyncpg.Pool,
    client: SidecarClient,
    source: Source,
    options: BackfillOptions | None = None,
    *,
    progress: Progress | None = None,
    embed_step: EmbedStep | None = None,
) -> BackfillReport:
    """Run (or resume) a backfill of ``source`` into its target model's partition, up to the swap.
    ``embed_step`` embeds and copies the pending records (default: here, one batch embedding
    while the previous one is written)."""
    options = options or BackfillOptions()
    progress = progress or (lambda done, total: None)
    if options.maintenance_work_mem is not None:
        shadow.parse_memory(options.maintenance_work_mem)  # a bad size fails now, not after the embedding
    model = await source.target(pool, client)
    assert model.dimension is not None
    partition = await ensure_partition(pool, model.id, model.dimension)
    report = BackfillReport(backfill_id="", model=model.id, source=source.kind)
    async with _run_lock(pool, partition):
        return await _run(
            pool, client, source, options, progress, embed_step or _embed_pending, model, partition, report
        )


@contextlib.asynccontextmanager
async def _run_lock(pool: asyncpg.Pool, partition: ModelPartition) -> AsyncIterator[None]:
    """One run per target partition at a time (a session advisory lock, released when the run's
    process dies); taking it also ends the sessions a killed run left building."""
    async with pool.acquire() as conn:
        key = f"mnemo.backfill:{partition.model}"
        if not await conn.fetchval("SELECT pg_try_advisory_lock(hashtext($1))", key):
            raise BackfillConflict(f"a backfill of model {partition.model} is running now")
        try:
            ended = await shadow.end_orphans(conn, partition)
            if ended:
                log.warning("ended %d database sessions a killed backfill left behind", ended)
            yield
        finally:
            await conn.execute("SELECT pg_advisory_unlock(hashtext($1))", key)


async def _run(
    pool: asyncpg.Pool,
    client: SidecarClient,
    source: Source,
    options: BackfillOptions,
    progress: Progress,
    embed_step: EmbedStep,
    model: ModelInfo,
    partition: ModelPartition,
    report: BackfillReport,
) -> BackfillReport:
    started = time.perf_counter()
    async with pool.acquire() as conn:
        run = await _open_run(conn, source, model, partition, report)
    report.backfill_id = backfill_id = run["backfill_id"]
    _timed(report, "scope", started)
    if not report.resumed and not (await records_done(pool, backfill_id))[1]:
        # Nothing to replace: no index build, no swap, the partition stays as it is.
        async with pool.acquire() as conn:
            await shadow.drop_shadow(conn, partition)
        report.rejects_path = await _write_rejects(pool, backfill_id, options.rejects)
        await _set_state(pool, backfill_id, "abandoned", report)
        return report
    if isinstance(source, QueueSource):
        source.use(backfill_id)
    holding = source.holding(pool) if isinstance(source, QueueSource) else contextlib.nullcontext()
    indexer = Indexer(pool, client, model, shadow.shadow_of(partition), embed_batch=options.embed_batch)
    source_feed = isinstance(source, ModelSource)
    async with holding:
        if run["target_seq"] is None:  # the live rows it keeps: redone by a rerun until committed
            started = time.perf_counter()
            async with pool.acquire() as conn:
                report.rows_kept = await shadow.copy_out_of_scope(conn, partition, backfill_id)
            run = await pool.fetchrow("SELECT * FROM rag_backfills WHERE backfill_id = $1", backfill_id)
            _timed(report, "copy_kept", started)
        state = run["state"]
        for round_ in range(MAX_SWAP_ROUNDS + 1):
            if state == "embedding":
                started = time.perf_counter()
                await embed_step(pool, source, indexer, backfill_id, options, progress)
                _timed(report, "embed_copy", started)
                await _set_state(pool, backfill_id, "building")
                state = "building"
            started = time.perf_counter()
            async with pool.acquire() as conn:
                report.build = await shadow.build_indexes(
                    conn,
                    partition,
                    workers=options.build_workers,
                    memory=options.maintenance_work_mem,
                    allow_spill=options.allow_spill,
                )
            _timed(report, "build", started)
            started = time.perf_counter()
            try:
                async with pool.acquire() as conn:
                    if isinstance(source, ModelSource) and await source.catch_up(
                        conn, backfill_id, partition
                    ):
                        raise shadow.SwapBlocked("the source changed while the backfill ran")
                    fresh = await conn.fetchrow(
                        "SELECT * FROM rag_backfills WHERE backfill_id = $1", backfill_id
                    )
                    src = None
                    if source_feed:
                        assert isinstance(source, ModelSource) and source.partition is not None
                        src = (
                            source.partition,
                            Watermark(int(fresh["source_seq"]), int(fresh["source_xmin"])),
                        )
                    swapped = await shadow.swap(
                        conn,
                        partition,
                        backfill_id,
                        Watermark(int(fresh["target_seq"]), int(fresh["target_xmin"])),
                        source=src,
                        serve_kind="text" if source_feed else None,
                    )
            except shadow.SwapBlocked as exc:
                log.info(
                    "backfill %s: %s; embedding those records first (round %d)", backfill_id, exc, round_ + 1
                )
                await _set_state(pool, backfill_id, "embedding")
                state = "embedding"
                continue
            finally:
                _timed(report, "swap", started)
            report.records_caught_up, report.keys_stamped = swapped.records_caught_up, swapped.keys_stamped
            break
        else:
            raise RuntimeError(
                f"backfill {backfill_id}: the source kept changing through {MAX_SWAP_ROUNDS} rounds"
            )
        if isinstance(source, QueueSource):
            await source.finish(pool, backfill_id, report)
    counts = await _counts(pool, backfill_id)
    report.copied, report.rejected, report.rows_written = (
        counts.get("copied", 0),
        counts.get("rejected", 0),
        counts["rows"],
    )
    report.records = report.copied + report.rejected
    report.rejects_path = await _write_rejects(pool, backfill_id, options.rejects)
    await _set_state(pool, backfill_id, "swapped", report)  # its report (the swap set the state)
    return report


async def _write_rejects(pool: asyncpg.Pool, backfill_id: str, path: Path | None) -> str | None:
    """The rejects report (JSONL): every rejected record with its reason, then the file's lines
    that were no record. None when there is nothing to report."""
    rows = await pool.fetch(
        """SELECT section_tipo, section_id, reason FROM rag_backfill_records
           WHERE backfill_id = $1 AND state = 'rejected' ORDER BY section_tipo, section_id""",
        backfill_id,
    )
    lines = json.loads(
        await pool.fetchval("SELECT report FROM rag_backfills WHERE backfill_id = $1", backfill_id)
    )
    entries = [dict(r) for r in rows] + list(lines.get("line_rejects", []))
    if not entries:
        return None
    path = path or Path(f"backfill-{backfill_id}.rejects.jsonl")
    with path.open("w", encoding="utf-8") as fh:
        for entry in entries:
            fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
    return str(path)


async def abandon(pool: asyncpg.Pool, model: str) -> str | None:
    """Drop the model's unfinished backfill: its shadow, its leases, its state. Returns its id."""
    row = await pool.fetchrow(
        "SELECT backfill_id FROM rag_backfills WHERE target_model = $1 AND state IN ('embedding', 'building')",
        model,
    )
    partition = await get_partition(pool, model)
    if row is None or partition is None:
        return None
    async with pool.acquire() as conn, conn.transaction():
        await shadow.drop_shadow(conn, partition)
        await queue.release_all(conn, f"backfill:{row['backfill_id']}")
        await conn.execute(
            "UPDATE rag_backfills SET state = 'abandoned', finished_at = now() WHERE backfill_id = $1",
            row["backfill_id"],
        )
    return row["backfill_id"]
