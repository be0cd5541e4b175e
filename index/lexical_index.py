"""The in-memory lexical index: each model partition's BM25 postings in the gateway's process.

Why (issue 24): the SQL lexical leg scores BM25 over the GIN index with OR semantics, so a common
query term walks a long posting list in PostgreSQL on every search; at 100k chunks it was the leg
that grew, 24x behind a search engine at the median. Here each term's postings are three numpy
arrays (chunk slot, term frequency, the chunk's length), and a query is a vectorized gather and sum
over its terms, with MaxScore skipping what cannot reach the top k (:mod:`index.partition_lexicon`).

How it stays correct (the invariants the tests pin):

- **Same scores.** Corpus statistics (chunk count, mean ``lexical_length``, document frequency per
  term, over the query's section scope) are counted exactly from the live postings, and the query
  plan is the SQL leg's (:func:`index.bm25.bm25_plan`). The index only *selects* candidates: their
  rows are re-read from the store and scored there by the SQL leg's own expression
  (:func:`index.bm25.bm25_score_sql`), so scores and tie order are the SQL leg's.
- **Exact ACL push-down.** The scope and ACL filter is the legs' own SQL (:func:`index.scope_sql.scope_where`),
  evaluated once per distinct *access class* of chunks (section, component, view, projects and the
  ACL arrays of migration 0013: a handful of rows, however many chunks) and cached per scope. A
  candidate is selected only when its class passes, so ``limit`` is never starved by a post-filter.
- **Never stale.** Each partition follows the change feed (:mod:`index.change_feed`) from a
  watermark. The re-read adds every key changed after it, scored in SQL, and trusts an index
  candidate only when its key has not changed since: the answer is exact while the index lags.
  When pending keys crowd the candidates the search widens; past a bound it says so (``fallback``)
  and the SQL leg serves.
- **Rebuildable.** Everything comes from the stored ``lexical`` tsvectors and ``lexical_length``.

Modes (``RAG_LEXICAL_INDEX``): ``off`` (the SQL leg, as before) or ``memory``. A partition still
loading (``cold``), one whose load failed, image rows and a ``fallback`` are served by the SQL leg
and counted in ``mnemo_lexical_searches``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

import asyncpg
import numpy as np

from .access_classes import LEXICAL_ROW_COLUMNS, permitted_classes
from .bm25 import Bm25Plan, bm25_plan_of_counts, query_terms, scored_terms
from .change_feed import (
    KEY_COLUMNS,
    RowKey,
    changed_rows,
    current_watermark,
    row_key,
)
from .feed_follower import FeedFollower
from .hits import ChunkHit, Scope, chunk_from_row, scope_key
from .lexical_metrics import LexicalMetrics
from .lexical_reread import reread_candidates
from .lru import Lru
from .partition_lexicon import SCOPE_CACHE_SIZE, PartitionLexicon
from .partitions import ModelPartition

log = logging.getLogger(__name__)

__all__ = ["MODES", "LexicalConfig", "LexicalIndex", "PartitionLexicon"]

MODES = ("off", "memory")


@dataclass(frozen=True)
class LexicalConfig:
    """How the index runs (built by the gateway from its settings)."""

    mode: str = "memory"
    load_batch: int = 20_000
    poll_s: float = 5.0  # safety net: catch up this often even without a notification
    scope_cache_size: int = SCOPE_CACHE_SIZE
    # A search widens while pending changes crowd its candidates, up to this many times `limit`.
    max_fetch_factor: int = 64

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"lexical index mode {self.mode!r}: use one of {MODES}")


class LexicalIndex(FeedFollower):
    """Every partition's lexicon, their loading and sync, and the index-served lexical leg."""

    label = "lexical index"
    partitions: dict[str, PartitionLexicon]

    def __init__(
        self,
        pool: asyncpg.Pool,
        database_url: str,
        config: LexicalConfig,
        metrics: LexicalMetrics | None = None,
    ) -> None:
        super().__init__(pool, database_url, config.poll_s)
        self.config = config
        self.metrics = metrics or LexicalMetrics()

    @property
    def enabled(self) -> bool:
        return self.config.mode != "off"

    def _observe(self, lexicon: PartitionLexicon) -> None:
        name = lexicon.partition.partition
        self.metrics.bytes.labels(name).set(lexicon.nbytes)
        self.metrics.chunks.labels(name).set(lexicon.live)

    async def load(self, partition: ModelPartition) -> PartitionLexicon:
        """Build a partition's lexicon from the store (keyset batches), from scratch: also the rebuild."""
        name = partition.partition
        start = time.perf_counter()
        lexicon = PartitionLexicon(partition, scopes=Lru(self.config.scope_cache_size))
        self.partitions[name] = lexicon
        self._set_state(lexicon, "loading")
        async with self.pool.acquire() as conn:
            # The watermark is read before any row: whatever commits during the load is re-applied after.
            watermark = await current_watermark(conn, partition)
            after: RowKey | None = None
            while True:
                rows = await self._batch(conn, partition, after)
                if not rows:
                    break
                # Nothing searches a loading lexicon: its build may leave the event loop.
                await asyncio.to_thread(lexicon.apply, rows)
                after = row_key(rows[-1])
                if len(rows) < self.config.load_batch:
                    break
        await asyncio.to_thread(lexicon.measure_bounds)
        lexicon.watermark = watermark
        lexicon.load_seconds = time.perf_counter() - start
        self._set_state(lexicon, "ready")
        self._observe(lexicon)
        self.metrics.load_seconds.labels(name).set(lexicon.load_seconds)
        log.info(
            "lexical index: %s ready, %d chunks, %d postings, %.1f MiB, loaded in %.2fs",
            name,
            lexicon.live,
            lexicon.posting_count,
            lexicon.nbytes / 2**20,
            lexicon.load_seconds,
        )
        self.notify(partition.model)  # what was written during the load is applied by the follower
        return lexicon

    async def _batch(
        self, conn: asyncpg.Connection, partition: ModelPartition, after: RowKey | None
    ) -> list[asyncpg.Record]:
        cols = ", ".join("e." + c for c in KEY_COLUMNS)
        where = "e.modality = 'text'"
        args: list[object] = []
        if after is not None:
            marks = ", ".join(f"${i + 2}" for i in range(len(after)))
            where += f" AND (e.model, {cols}) > ($1, {marks})"
            args = [partition.model, *after]
        return await conn.fetch(
            f"""SELECT {cols}, {LEXICAL_ROW_COLUMNS} FROM {partition.table} e WHERE {where}
                ORDER BY e.model, {cols} LIMIT {int(self.config.load_batch)}""",
            *args,
        )

    async def sync(self, models: Iterable[str] | None = None) -> int:
        """Apply every change after each ready partition's watermark; returns the keys applied.

        A model first seen after start is loaded.
        """
        wanted = None if models is None else set(models)
        if wanted is not None:
            await self._load_new(wanted)
        applied = 0
        for lexicon in list(self.partitions.values()):
            if lexicon.state == "ready" and (wanted is None or lexicon.partition.model in wanted):
                applied += await self._sync_partition(lexicon)
        if not self._dirty:
            self._lag_since = None
        return applied

    async def _sync_partition(self, lexicon: PartitionLexicon) -> int:
        async with lexicon.lock:
            async with self.pool.acquire() as conn:
                rows, watermark, lags = await changed_rows(
                    conn, lexicon.partition, lexicon.watermark, LEXICAL_ROW_COLUMNS
                )
            upserts, deletes = lexicon.apply(rows)
            lexicon.watermark = watermark
        for lag in lags:
            self.metrics.apply_lag.observe(lag)
        self.metrics.changes.labels("upsert").inc(upserts)
        self.metrics.changes.labels("delete").inc(deletes)
        self._observe(lexicon)
        return len(rows)

    def status(self) -> dict[str, object]:
        """The /readyz detail: mode, feed connection, per-partition state and size."""
        return {
            "mode": self.config.mode,
            "running": self.enabled,
            "listening": bool(self.listener and self.listener.connected),
            "partitions": {
                name: {"state": lx.state, "chunks": lx.live, "postings": lx.posting_count, "bytes": lx.nbytes}
                for name, lx in self.partitions.items()
            },
        }

    # -- scopes ------------------------------------------------------------------------------------

    async def _allowed(
        self, conn: asyncpg.Connection, lexicon: PartitionLexicon, scope: Scope
    ) -> np.ndarray | None:
        """Which access classes the scope (without its excluded record) permits; None: all.

        The legs' own WHERE clause, run over the classes instead of the chunks; a class's attributes
        never change, so a scope's answers are kept and only classes new since are evaluated.
        """
        scope = replace(scope, exclude_record=None)
        if scope == Scope():
            return None
        key = scope_key(scope)
        known = lexicon.scopes.get(key)
        have = 0 if known is None else len(known)
        upto = len(lexicon.classes)
        if known is None or have < upto:
            ids = await permitted_classes(conn, lexicon.classes[have:upto], scope, have)
            grown = np.zeros(upto, dtype=bool)
            if known is not None:
                grown[:have] = known
            grown[ids] = True
            known = grown
        lexicon.scopes.put(key, known)
        return known

    # -- search ------------------------------------------------------------------------------------

    def ready(self, partition: ModelPartition) -> PartitionLexicon | None:
        lexicon = self.partitions.get(partition.partition)
        return lexicon if lexicon is not None and lexicon.state == "ready" else None

    async def plan(
        self,
        conn: asyncpg.Connection,
        lexicon: PartitionLexicon,
        query: str,
        sections: tuple[str, ...] | None,
    ) -> Bm25Plan | None:
        """The query's BM25 plan under the lexicon's exact statistics for the section scope."""
        terms = scored_terms(await query_terms(conn, query))
        if not terms:
            return None
        n, avgdl, mask = lexicon.corpus(None if sections is None else tuple(sorted(set(sections))))
        return bm25_plan_of_counts(terms, {t: lexicon.df(t, mask) for t in terms}, n, avgdl)

    async def search(
        self,
        conn: asyncpg.Connection,
        partition: ModelPartition,
        query: str,
        scope: Scope,
        limit: int,
        *,
        modality: str = "text",
    ) -> list[ChunkHit] | None:
        """The lexical top-``limit`` for ``scope`` (scores as the SQL leg's), or None: use the SQL leg."""
        if not self.enabled:
            return None
        if modality != "text":
            self.metrics.searches.labels("image").inc()
            return None
        lexicon = self.partitions.get(partition.partition)
        if lexicon is None or lexicon.state != "ready":
            self.metrics.searches.labels("failed" if lexicon and lexicon.state == "failed" else "cold").inc()
            return None
        watermark = lexicon.watermark  # captured first: every key changed after it is re-read
        plan = await self.plan(conn, lexicon, query, scope.section_tipos)
        if plan is None:
            self.metrics.searches.labels("hit").inc()
            return []
        allowed = await self._allowed(conn, lexicon, scope)
        excluded = list(lexicon.record_slots.get(scope.exclude_record, ())) if scope.exclude_record else []
        fetch = limit + 8
        while True:
            slots, scores, whole = lexicon.top(plan, allowed, excluded, fetch)
            keys = [lexicon.key_of[s] for s in slots]  # live slots: no await since top()
            rows, trusted = await reread_candidates(
                conn, partition, plan, scope, keys, scores.tolist(), watermark
            )
            # Exact when the trusted (unchanged since the watermark) candidates cover the top-k, or
            # when the index gave its whole match set.
            if trusted >= limit or whole:
                self.metrics.searches.labels("hit").inc()
                return [chunk_from_row(r, float(r["score"])) for r in rows[:limit]]
            if fetch >= self.config.max_fetch_factor * limit:
                self.metrics.searches.labels("fallback").inc()
                log.info("lexical index: too many pending changes among the candidates; the SQL leg serves")
                return None
            fetch *= 4
