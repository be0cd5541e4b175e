"""A model partition's shadow table: created bare, indexed like the live partition, swapped in.

A backfill (:mod:`index.bulk.backfill`) never writes the live partition. It writes a shadow:

1. :func:`create_shadow`: a plain table shaped like the partition (columns, defaults, generated
   columns, check constraints, ``LIKE``) with no index at all, so binary ``COPY`` pays no HNSW
   insert; :func:`copy_out_of_scope` fills it with the live rows the backfill does not replace.
2. :func:`build_indexes`: every index and index-backed constraint the live partition has, read
   from the catalog (``pg_get_indexdef`` / ``pg_get_constraintdef``, never hand-copied DDL), built
   with parallel maintenance workers, after :func:`check_memory` has refused a
   ``maintenance_work_mem`` too small to hold the HNSW graph.
3. :func:`swap`: one transaction that blocks writers (readers go on), copies again the records
   the live partition changed since the shadow's copy (so a drain running meanwhile loses
   nothing), stamps the change feed with every key the swap changes (the FAISS cache re-reads
   them) and replaces the partition: detach and drop the old table, rename the shadow and its
   indexes to the old names, attach it. Readers of the partition wait for the commit and then
   read the new table under the same name; none sees a half-built state.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import asyncpg

from index.store.change_feed import KEY_COLUMNS, Watermark, current_watermark, pending_sql
from index.store.partitions import ModelPartition

__all__ = [
    "IndexSpec",
    "MemoryTooSmall",
    "SwapBlocked",
    "build_indexes",
    "check_memory",
    "copy_out_of_scope",
    "create_shadow",
    "drop_shadow",
    "end_orphans",
    "hnsw_build_bytes",
    "index_specs",
    "parse_memory",
    "shadow_of",
    "swap",
]

# pgvector's default HNSW graph degree, for an index whose reloptions do not say.
DEFAULT_M = 16
_MODEL_CHECK = "rag_partition_model_chk"


class MemoryTooSmall(RuntimeError):
    """``maintenance_work_mem`` cannot hold the HNSW graph: the build would spill to disk."""


class SwapBlocked(RuntimeError):
    """The swap found source changes that must be embedded first (a model change's catch-up)."""


def shadow_of(partition: ModelPartition) -> ModelPartition:
    """The shadow of a partition: the same model and vector type under ``<partition>_shadow``."""
    return ModelPartition(
        partition.model, partition.dimension, partition.vector_type, f"{partition.partition}_shadow"
    )


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


async def _exists(conn: asyncpg.Connection, name: str) -> bool:
    return bool(await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", _quote(name)))


async def create_shadow(conn: asyncpg.Connection, partition: ModelPartition) -> ModelPartition:
    """Create the partition's shadow if missing (no index; a check that every row is this model's,
    so the swap's ``ATTACH`` needs no validation scan). Returns the shadow."""
    shadow = shadow_of(partition)
    if await _exists(conn, shadow.partition):
        return shadow
    await conn.execute(
        f"CREATE TABLE {shadow.table} (LIKE {partition.table} INCLUDING DEFAULTS INCLUDING GENERATED "
        "INCLUDING CONSTRAINTS INCLUDING STORAGE)"
    )
    await _copy_storage_parameters(conn, partition.table, shadow.table)
    has_check = await conn.fetchval(
        "SELECT 1 FROM pg_constraint WHERE conrelid = $1::regclass AND conname = $2",
        shadow.table,
        _MODEL_CHECK,
    )
    if not has_check:
        await conn.execute(
            f"ALTER TABLE {shadow.table} ADD CONSTRAINT {_MODEL_CHECK} CHECK (model = {_literal(partition.model)})"
        )
    return shadow


async def _copy_storage_parameters(conn: asyncpg.Connection, source: str, target: str) -> None:
    """Give ``target`` the storage parameters ``source`` holds (``toast_tuple_target`` among them,
    schema/migrations/0018_row_layout.sql), which ``LIKE`` does not copy: the shadow that replaces
    a partition lays its rows out as the partition would."""
    options = await conn.fetchval("SELECT reloptions FROM pg_class WHERE oid = $1::regclass", source)
    if not options:
        return
    pairs = [option.split("=", 1) for option in options]
    await conn.execute(
        f"ALTER TABLE {target} SET ({', '.join(f'{_quote(name)} = {_literal(value)}' for name, value in pairs)})"
    )


async def drop_shadow(conn: asyncpg.Connection, partition: ModelPartition) -> None:
    await conn.execute(f"DROP TABLE IF EXISTS {shadow_of(partition).table}")


def session_name(partition: ModelPartition) -> str:
    """The ``application_name`` of a backfill's build and swap sessions for this partition: a
    rerun finds the sessions a killed run left behind by it (:func:`end_orphans`)."""
    return f"mnemo-backfill {partition.partition}"[:63]


async def end_orphans(conn: asyncpg.Connection, partition: ModelPartition) -> int:
    """Terminate the build or swap sessions of a killed run of this partition's backfill, and wait
    until they are gone. A client killed mid-``CREATE INDEX`` leaves its server session building
    (it notices the client only when the statement ends, and then commits it), which would race
    the rerun's own build. Call only while holding the backfill's run lock. Returns how many."""
    name = session_name(partition)
    ended = await conn.fetchval(
        """SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
           WHERE application_name = $1 AND pid <> pg_backend_pid()""",
        name,
    )
    left = f"SELECT count(*) FROM pg_stat_activity WHERE application_name = {_literal(name)} AND pid <> pg_backend_pid()"
    for _ in range(1200):  # a terminated session exits at its next interrupt check: soon
        if not await conn.fetchval(left):
            break
        await conn.execute("SELECT pg_sleep(0.05)")
    else:
        raise RuntimeError(f"sessions of a killed backfill ({name}) did not end; see pg_stat_activity")
    return int(ended)


async def _written_columns(conn: asyncpg.Connection, table: str) -> list[str]:
    """The table's stored, non-generated columns (what ``INSERT ... SELECT`` may name)."""
    rows = await conn.fetch(
        """SELECT attname FROM pg_attribute
           WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = ''
           ORDER BY attnum""",
        table,
    )
    return [_quote(r["attname"]) for r in rows]


# The text rows of a record in the backfill's scope ($1: the backfill id).
_IN_SCOPE = """e.modality = 'text' AND EXISTS (
    SELECT 1 FROM rag_backfill_records r
    WHERE r.backfill_id = $1 AND r.section_tipo = e.section_tipo AND r.section_id = e.section_id)"""


async def copy_out_of_scope(conn: asyncpg.Connection, partition: ModelPartition, backfill_id: str) -> int:
    """Copy the live rows the backfill keeps (every row but its scope's text rows) into the shadow,
    and record in the run the change feed's watermark read just before: everything committed after
    it is copied again at the swap (a change that lands in between is copied twice, harmlessly).
    One transaction, so a run killed during it copies again on its rerun. Returns rows copied."""
    shadow = shadow_of(partition)
    async with conn.transaction():
        watermark = await current_watermark(conn, partition)
        # Nothing of the run is in it yet (a run's rows follow this commit): a guard, as a DELETE and not
        # a TRUNCATE, whose ACCESS EXCLUSIVE lock would queue behind any reader of the shadow.
        await conn.execute(f"DELETE FROM {shadow.table}")
        copied = await _copy_records(conn, partition.table, shadow.table, f"NOT ({_IN_SCOPE})", backfill_id)
        await conn.execute(
            """UPDATE rag_backfills SET target_seq = $2, target_xmin = $3, updated_at = now()
               WHERE backfill_id = $1""",
            backfill_id,
            watermark.seq,
            watermark.xmin,
        )
    return copied


async def _copy_records(conn: asyncpg.Connection, source: str, target: str, where: str, *args: object) -> int:
    columns = ", ".join(await _written_columns(conn, target))
    status = await conn.execute(
        f"INSERT INTO {target} ({columns}) SELECT {columns} FROM {source} e WHERE {where}", *args
    )
    return int(status.rsplit(" ", 1)[-1])


@dataclass(frozen=True)
class IndexSpec:
    """One index of the live partition, as the shadow gets it: its live name, the shadow's name,
    and the DDL that builds it on the shadow (a constraint when the live index backs one)."""

    live_name: str
    shadow_name: str
    ddl: str
    constraint: bool
    method: str
    m: int | None  # HNSW graph degree

    @property
    def hnsw(self) -> bool:
        return self.method == "hnsw"


async def index_specs(conn: asyncpg.Connection, partition: ModelPartition) -> list[IndexSpec]:
    """The live partition's indexes mirrored onto its shadow, from the catalog, in name order."""
    shadow = shadow_of(partition)
    rows = await conn.fetch(
        """
        SELECT i.relname AS name, am.amname AS method, i.reloptions AS options,
               pg_get_indexdef(x.indexrelid) AS indexdef,
               c.conname, pg_get_constraintdef(c.oid) AS condef
        FROM pg_index x
        JOIN pg_class i ON i.oid = x.indexrelid
        JOIN pg_am am ON am.oid = i.relam
        LEFT JOIN pg_constraint c ON c.conindid = x.indexrelid AND c.conrelid = x.indrelid
        WHERE x.indrelid = $1::regclass
        ORDER BY i.relname
        """,
        partition.table,
    )
    specs = []
    for n, r in enumerate(rows):
        name = f"{shadow.partition}_i{n}"
        if r["conname"] is not None:
            ddl = f"ALTER TABLE {shadow.table} ADD CONSTRAINT {_quote(name)} {r['condef']}"
            live = r["conname"]
        else:
            unique = "UNIQUE " if r["indexdef"].startswith("CREATE UNIQUE") else ""
            ddl = (
                f"CREATE {unique}INDEX {_quote(name)} ON {shadow.table} USING "
                + r["indexdef"].split(" USING ", 1)[1]
            )
            live = r["name"]
        options = dict(o.split("=", 1) for o in r["options"] or ())
        m = int(options.get("m", DEFAULT_M)) if r["method"] == "hnsw" else None
        specs.append(IndexSpec(live, name, ddl, r["conname"] is not None, r["method"], m))
    return specs


def hnsw_build_bytes(rows: int, dimension: int, vector_type: str, m: int = DEFAULT_M) -> int:
    """The memory pgvector's HNSW build needs to keep the whole graph in ``maintenance_work_mem``.

    Per row: the vector (4 bytes a dimension, 2 for ``halfvec``, plus an 8-byte header), and the
    graph: the element (about 96 bytes with its allocation slack) and its neighbour lists, 2m
    candidates of 16 bytes on level 0 and m on each upper level (a row reaches level 1 with
    probability 1/m, so upper levels add about 16·m/(m-1) bytes), so about 32·m + 16 bytes.
    For 384 dimensions and m = 16: 1,544 + 624 = about 2.1 KiB a row, 210 MiB per 100k rows.
    """
    vector = dimension * (2 if vector_type == "halfvec" else 4) + 8
    graph = 96 + 32 * m + math.ceil(16 * m / max(m - 1, 1))
    return rows * (vector + graph)


_UNITS = {"": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3, "tb": 1024**4}


def parse_memory(value: str) -> int:
    """``'2GB'`` / ``'512MB'`` / ``'65536kB'`` (PostgreSQL's units, base 1024) as bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT][bB])?\s*", value)
    if not match:
        raise ValueError(f"not a memory size: {value!r} (say e.g. 512MB or 2GB)")
    return int(match.group(1)) * _UNITS[(match.group(2) or "").lower()]


async def maintenance_work_mem(conn: asyncpg.Connection) -> int:
    """The session's ``maintenance_work_mem`` in bytes."""
    return int(await conn.fetchval("SELECT pg_size_bytes(current_setting('maintenance_work_mem'))"))


async def check_memory(
    conn: asyncpg.Connection, partition: ModelPartition, specs: list[IndexSpec], rows: int
) -> int:
    """Refuse a ``maintenance_work_mem`` (this session's) smaller than the HNSW graph of ``rows``
    rows: pgvector would then finish the build on disk, many times slower. Returns the estimate."""
    need = max(
        (
            hnsw_build_bytes(rows, partition.dimension, partition.vector_type, s.m or DEFAULT_M)
            for s in specs
            if s.hnsw
        ),
        default=0,
    )
    have = await maintenance_work_mem(conn)
    if need > have:
        mib = math.ceil(need / 2**20)
        raise MemoryTooSmall(
            f"the HNSW index of {rows} rows x {partition.dimension} dimensions needs about {mib} MiB "
            f"in maintenance_work_mem, which is {have // 2**20} MiB: the build would spill to disk. "
            f"Pass --maintenance-work-mem {mib}MB (or more; the server needs that much free memory), "
            "or --allow-spill to build anyway"
        )
    return need


async def build_indexes(
    conn: asyncpg.Connection,
    partition: ModelPartition,
    *,
    workers: int | None = None,
    memory: str | None = None,
    allow_spill: bool = False,
) -> dict[str, float | int]:
    """Build on the shadow every index the live partition has (those already built are kept: a
    resumed build starts at the first missing one). ``workers`` sets
    ``max_parallel_maintenance_workers``, ``memory`` ``maintenance_work_mem`` (this session's).
    Raises :class:`MemoryTooSmall` unless ``allow_spill``. Returns rows and the estimate."""
    shadow = shadow_of(partition)
    await conn.execute(f"SET application_name = {_literal(session_name(partition))}")
    if memory is not None:
        await conn.execute(f"SET maintenance_work_mem = {_literal(memory)}")
    if workers is not None:
        await conn.execute(f"SET max_parallel_maintenance_workers = {int(workers)}")
    specs = await index_specs(conn, partition)
    rows = int(await conn.fetchval(f"SELECT count(*) FROM {shadow.table}"))
    try:
        estimate = await check_memory(conn, partition, specs, rows)
    except MemoryTooSmall:
        if not allow_spill:
            raise
        estimate = -1
    for spec in specs:
        if not await _exists(conn, spec.shadow_name):
            await conn.execute(spec.ddl)
    await conn.execute(f"ANALYZE {shadow.table}")
    return {"rows": rows, "hnsw_bytes_estimate": estimate, "indexes": len(specs)}


# The records whose rows the swap copies from the live partition again: those it changed after the
# watermark ($2 seq, $3 xmin), and the scope's rejected records (the backfill wrote none for them,
# so their live rows stay as they are).
_CATCH_UP = """
    SELECT DISTINCT p.section_tipo, p.section_id FROM ({pending}) p
    UNION
    SELECT section_tipo, section_id FROM rag_backfill_records WHERE backfill_id = $1 AND state = 'rejected'
"""

_KEYS = ", ".join(KEY_COLUMNS)


@dataclass(frozen=True)
class SwapReport:
    records_caught_up: int
    keys_stamped: int


async def swap(
    conn: asyncpg.Connection,
    partition: ModelPartition,
    backfill_id: str,
    watermark: Watermark,
    *,
    source: tuple[ModelPartition, Watermark] | None = None,
    serve_kind: str | None = None,
) -> SwapReport:
    """Replace the live partition by its indexed shadow in one transaction (see the module doc).

    ``source``: a model change's source partition and the watermark its scope was read at; a
    change there since means records to embed again first: :class:`SwapBlocked`, nothing done.
    ``serve_kind``: also make the partition's model the one that serves that kind of query
    (``rag_serving_models``), at the same commit, which also marks the backfill ``swapped``.
    """
    shadow = shadow_of(partition)
    specs = await index_specs(conn, partition)
    model = _literal(partition.model)
    await conn.execute(f"SET application_name = {_literal(session_name(partition))}")
    async with conn.transaction():
        # Every partition's writers wait from here to the commit; readers go on until the detach.
        await conn.execute("LOCK TABLE rag_embeddings IN SHARE ROW EXCLUSIVE MODE")
        if source is not None:
            pending = pending_sql(_literal(source[0].model), "$1", "$2")
            changed = await conn.fetchval(
                f"SELECT count(*) FROM ({pending}) p", source[1].seq, str(source[1].xmin)
            )
            if changed:
                raise SwapBlocked(f"{changed} rows of {source[0].model} changed since the scope was read")
        catch_up = _CATCH_UP.format(pending=pending_sql(model, "$2", "$3"))
        records = await conn.fetch(catch_up, backfill_id, watermark.seq, str(watermark.xmin))
        tipos, ids = [r["section_tipo"] for r in records], [r["section_id"] for r in records]
        of_records = "(e.section_tipo, e.section_id) IN (SELECT * FROM unnest($1::text[], $2::bigint[]))"
        await conn.execute(f"DELETE FROM {shadow.table} e WHERE {of_records}", tipos, ids)
        await _copy_records(conn, partition.table, shadow.table, of_records, tipos, ids)
        stamped = await _stamp(conn, partition, backfill_id)
        await conn.execute("SELECT pg_notify('rag_embeddings_changed', $1)", partition.model)
        await conn.execute(f"ALTER TABLE rag_embeddings DETACH PARTITION {partition.table}")
        await conn.execute(f"DROP TABLE {partition.table}")
        await conn.execute(f"ALTER TABLE {shadow.table} RENAME TO {partition.table}")
        for spec in specs:
            if spec.constraint:
                await conn.execute(
                    f"ALTER TABLE {partition.table} RENAME CONSTRAINT {_quote(spec.shadow_name)} "
                    f"TO {_quote(spec.live_name)}"
                )
            else:
                await conn.execute(
                    f"ALTER INDEX {_quote(spec.shadow_name)} RENAME TO {_quote(spec.live_name)}"
                )
        await conn.execute(
            f"ALTER TABLE rag_embeddings ATTACH PARTITION {partition.table} FOR VALUES IN ({model})"
        )
        await conn.execute(
            "UPDATE rag_backfills SET state = 'swapped', updated_at = now() WHERE backfill_id = $1",
            backfill_id,
        )
        if serve_kind is not None:
            await conn.execute(
                """INSERT INTO rag_serving_models (kind, model) VALUES ($1, $2)
                   ON CONFLICT (kind) DO UPDATE SET model = EXCLUDED.model, changed_at = now()""",
                serve_kind,
                partition.model,
            )
    return SwapReport(len(records), stamped)


async def _stamp(conn: asyncpg.Connection, partition: ModelPartition, backfill_id: str) -> int:
    """Stamp the change feed (as the trigger does for a row write) with every text key of the
    scope, old or new: the FAISS cache then re-reads each one after the swap (its current row, or
    none). Rows outside the scope are the same in both tables and stay as they were."""
    shadow = shadow_of(partition)
    status = await conn.execute(
        f"""
        INSERT INTO rag_embedding_changes AS c
        SELECT $2, k.modality, {", ".join("k." + c for c in KEY_COLUMNS)}, nextval('rag_change_seq'),
               pg_current_xact_id(), clock_timestamp()
        FROM (SELECT e.modality, {", ".join("e." + c for c in KEY_COLUMNS)} FROM {partition.table} e WHERE {_IN_SCOPE}
              UNION
              SELECT e.modality, {", ".join("e." + c for c in KEY_COLUMNS)} FROM {shadow.table} e WHERE {_IN_SCOPE}) k
        ON CONFLICT (model, {_KEYS})
        DO UPDATE SET modality = EXCLUDED.modality, seq = EXCLUDED.seq, xid = EXCLUDED.xid,
                      changed_at = EXCLUDED.changed_at
        """,
        backfill_id,
        partition.model,
    )
    return int(status.rsplit(" ", 1)[-1])
