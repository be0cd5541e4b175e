"""The embeddings store's change feed: what changed since a watermark, and a listener that says when.

Migration ``0007_change_feed`` stamps every written or deleted row's key in
``rag_embedding_changes`` with a sequence number and its transaction id and
notifies ``rag_embeddings_changed`` on commit. A consumer keeps a
:class:`Watermark`: the highest sequence it has applied and the oldest
transaction that was still running when it read. The next read takes
``seq > watermark.seq OR xid >= watermark.xmin``, because a transaction that
was running may commit a smaller sequence number later; reading it twice is
harmless, since :func:`changes_since` returns each key's *current* row (or
none, for a delete), not the change itself.

:class:`ChangeListener` holds one dedicated connection that LISTENs and calls
``wake`` on each notification, and again after every reconnect so the consumer
catches up on what it missed while disconnected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import numpy as np

from index.retry_log import log_retry
from index.store.partitions import ModelPartition

log = logging.getLogger(__name__)

__all__ = [
    "CHANNEL",
    "Change",
    "ChangeBatch",
    "ChangeListener",
    "Watermark",
    "candidates_params",
    "candidates_sql",
    "changed_rows",
    "changes_since",
    "current_watermark",
    "pending_sql",
    "row_key",
    "store_identity",
]

CHANNEL = "rag_embeddings_changed"
# section_tipo, section_id, component_tipo, lang, view, chunk_index: a row's identity within a model.
RowKey = tuple[str, int, str, str, str, int]
KEY_COLUMNS = ("section_tipo", "section_id", "component_tipo", "lang", "view", "chunk_index")


@dataclass(frozen=True)
class Watermark:
    """Everything up to ``seq`` is applied, except what transactions from ``xmin`` on may still commit."""

    seq: int
    xmin: int


@dataclass(frozen=True)
class Change:
    """One key's current state: its vector, or None when the row is gone (or left the modality)."""

    key: RowKey
    vector: np.ndarray | None


@dataclass(frozen=True)
class ChangeBatch:
    changes: list[Change]
    watermark: Watermark
    lags: list[float]  # seconds from each change's write to this read


_MAX_SEQ = "9223372036854775807"  # bigint's largest: no change's sequence is above it
_MAX_XID = "'18446744073709551615'::xid8"  # xid8's largest
_XMIN = "pg_snapshot_xmin(pg_current_snapshot())::text::bigint"


async def current_watermark(conn: asyncpg.Connection, partition: ModelPartition) -> Watermark:
    """The watermark a full load taken *after* this call starts from (read it first, then load)."""
    row = await conn.fetchrow(
        f"SELECT coalesce(max(seq), 0) AS seq, {_XMIN} AS xmin FROM rag_embedding_changes WHERE model = $1",
        partition.model,
    )
    return Watermark(int(row["seq"]), int(row["xmin"]))


def pending_sql(model: str, watermark: str, xmin: str) -> str:
    """SQL selecting the keys changed after a watermark (parameters named by the caller).

    Two index scans (sequence, then transaction id) rather than one OR, which the planner would
    answer by reading every change row of the model. Each range also has an upper bound that never
    binds: planned without the parameters' values (a generic plan, :data:`index.search.read_settings.
    PLANNED_ONCE`), a one-sided range is taken to hold a third of the feed and read whole (30 ms on
    a 1M-row feed), a two-sided one 0.5% of it and read through its index (0.2 ms).
    """
    keys = ", ".join("c." + c for c in KEY_COLUMNS)
    return f"""SELECT {keys} FROM rag_embedding_changes c
               WHERE c.model = {model} AND c.seq > {watermark} AND c.seq <= {_MAX_SEQ}
               UNION ALL
               SELECT {keys} FROM rag_embedding_changes c
               WHERE c.xid >= {xmin}::text::xid8 AND c.xid <= {_MAX_XID} AND c.model = {model}
                 AND c.seq <= {watermark}"""


def candidates_sql(first: int, table: str, *, scored: bool = False) -> tuple[str, str]:
    """SQL for re-reading an index's candidate keys plus every key changed after its watermark.

    Returns ``(ctes, source)``: ``ctes`` defines ``k`` (one row per key, with ``cached``: among the
    candidates, and ``pending``: changed after the watermark; ``scored``: also ``cand_score``, the
    index's score of a candidate, NULL for the others); ``source``, for a FROM clause, pairs each
    ``k`` with its row of ``table`` (alias ``e``). Parameters, from ``$first`` on: the candidates'
    six key columns as arrays, the model, the watermark's sequence and its xmin, then (``scored``)
    the candidates' scores.

    Each key's row is looked up by itself (a LATERAL subquery the planner may not flatten, through
    ``OFFSET 0``): the only sensible plan for a few keys, whatever the planner would estimate for
    them, and one join order fewer to weigh (planning is about half of a lexical re-read: 0.44 ms
    against 0.51 for the earlier join, same rows, 20k chunks).
    """
    p = [f"${first + i}" for i in range(10)]
    cols = ", ".join(KEY_COLUMNS)
    score, unscored, best = "", "", ""
    if scored:
        score, unscored, best = f", {p[9]}::float8[]", ", NULL::float8", ", max(score) AS cand_score"
    ctes = f"""cand AS (
                SELECT * FROM unnest({p[0]}::text[], {p[1]}::bigint[], {p[2]}::text[], {p[3]}::text[],
                                     {p[4]}::text[], {p[5]}::int[]{score}) AS k({cols}{", score" if scored else ""})),
            pend AS (SELECT *{unscored} FROM ({pending_sql(p[6], p[7], p[8])}) p),
            k AS (SELECT {cols}, bool_or(pending) AS pending, bool_or(NOT pending) AS cached{best}
                  FROM (SELECT *, false AS pending FROM cand UNION ALL SELECT *, true FROM pend) u
                  GROUP BY {cols})"""
    match = " AND ".join(f"e.{c} = k.{c}" for c in KEY_COLUMNS)
    source = f"k CROSS JOIN LATERAL (SELECT * FROM {table} e WHERE e.model = {p[6]} AND {match} OFFSET 0) e"
    return ctes, source


def candidates_params(
    keys: Sequence[RowKey], model: str, watermark: Watermark, scores: Sequence[float] | None = None
) -> list[object]:
    """The parameters of :func:`candidates_sql`, in its order (``scores`` with ``scored``)."""
    params: list[object] = [*([k[i] for k in keys] for i in range(len(KEY_COLUMNS))), model, watermark.seq]
    params.append(str(watermark.xmin))
    if scores is not None:
        params.append(list(scores))
    return params


async def changed_rows(
    conn: asyncpg.Connection,
    partition: ModelPartition,
    watermark: Watermark,
    columns: str,
    modality: str = "text",
) -> tuple[list[asyncpg.Record], Watermark, list[float]]:
    """Every key of the partition changed after ``watermark`` with ``columns`` of its current row
    (alias ``e``; all NULL when the row is gone or left the modality), read in one snapshot.

    Returns the rows (key columns first, then ``columns``), the new watermark, and each new
    change's lag from its write to this read in seconds.
    """
    keys = ", ".join("c." + c for c in KEY_COLUMNS)
    # The model leads the primary key: without it the join cannot use the index.
    join = " AND ".join(f"e.{c} = c.{c}" for c in ("model", *KEY_COLUMNS))
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        xmin = int(await conn.fetchval(f"SELECT {_XMIN}"))
        rows = await conn.fetch(
            f"""SELECT {keys}, {columns}, c.seq AS change_seq,
                       extract(epoch FROM clock_timestamp() - c.changed_at)::float8 AS change_lag
                FROM (SELECT * FROM rag_embedding_changes WHERE model = $1 AND seq > $2
                      UNION ALL
                      SELECT * FROM rag_embedding_changes
                      WHERE xid >= $3::text::xid8 AND model = $1 AND seq <= $2) c
                LEFT JOIN {partition.table} e ON {join} AND e.modality = $4""",
            partition.model,
            watermark.seq,
            str(watermark.xmin),
            modality,
        )
    seq = max([watermark.seq, *(int(r["change_seq"]) for r in rows)])
    # Changes of the previous read's running transactions are re-read; only new ones lag.
    lags = [float(r["change_lag"]) for r in rows if int(r["change_seq"]) > watermark.seq]
    return rows, Watermark(seq, xmin), lags


def row_key(row: asyncpg.Record) -> RowKey:
    """The key of a row whose first columns are :data:`KEY_COLUMNS`."""
    return (row[0], row[1], row[2], row[3], row[4], row[5])


async def changes_since(
    conn: asyncpg.Connection, partition: ModelPartition, watermark: Watermark, modality: str = "text"
) -> ChangeBatch:
    """Every key of the partition changed after ``watermark``, with its current vector (one snapshot)."""
    rows, after, lags = await changed_rows(conn, partition, watermark, "e.embedding", modality)
    changes = [Change(row_key(r), _vector(r["embedding"])) for r in rows]
    return ChangeBatch(changes, after, lags)


def _vector(value: Any) -> np.ndarray | None:
    if value is None:
        return None
    return np.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value, dtype=np.float32)


class ChangeListener:
    """LISTENs on :data:`CHANNEL` over its own connection; calls ``wake(model)`` per notification.

    ``wake(None)`` means "something may have been missed" (after every
    (re)connect): the consumer catches up on all partitions from its watermarks.
    A lost connection is retried with exponential backoff up to ``max_retry_s``.
    """

    def __init__(
        self,
        database_url: str,
        wake: Callable[[str | None], None],
        *,
        retry_s: float = 0.5,
        max_retry_s: float = 10.0,
    ) -> None:
        self.database_url = database_url
        self.wake = wake
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.connected = False
        self.disconnected_since: float | None = time.monotonic()
        self.reconnects = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="faiss-change-listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.connected = False

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self.wake(payload or None)

    async def _run(self) -> None:
        delay = self.retry_s
        failed = 0  # connections in a row that could not listen
        while True:
            conn: asyncpg.Connection | None = None
            lost = asyncio.Event()
            try:
                conn = await asyncpg.connect(self.database_url)
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(CHANNEL, self._notified)
                if self.disconnected_since is not None and self.reconnects:
                    log.info(
                        "change feed reconnected after %.1fs; catching up from the watermark",
                        time.monotonic() - self.disconnected_since,
                    )
                self.connected, self.disconnected_since, delay, failed = True, None, self.retry_s, 0
                self.wake(None)  # catch up on anything committed while we were not listening
                await lost.wait()
                log.warning("change feed: the listening connection was lost; reconnecting")
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                failed += 1
                log_retry(log, "change feed: listening", exc, failed, delay)
            finally:
                if self.connected:
                    self.disconnected_since = time.monotonic()
                self.connected = False
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=1)
            self.reconnects += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_retry_s)


async def store_identity(conn: asyncpg.Connection) -> str:
    """Which database a copy beside it (a Tantivy index, a vector snapshot) was built from: its oid
    and when its first migration was applied.

    A watermark only means something against the store that numbered its changes: a copy left
    from a database that was reset, or built against another one (the demo's under ``.mnemo`` while
    tests point a default gateway at theirs), would otherwise pass for caught up and hide rows.
    Readable by any role (no superuser-only ``pg_control_system``); a database copied from a
    template gets its own oid."""
    return str(
        await conn.fetchval(
            """SELECT d.oid::text || '/' || coalesce(
                          (SELECT extract(epoch FROM min(applied_at))::text FROM schema_migrations), '')
               FROM pg_database d WHERE d.datname = current_database()"""
        )
    )
