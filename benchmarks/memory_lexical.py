"""The in-memory lexical index: the reference baseline of the lexical benchmarks, no product engine.

The gateway's lexical leg is the SQL leg (:mod:`index.search.lexical_leg`) or the on-disk Tantivy engine
(:mod:`index.lexical.engine`, written by ``mnemo lexical follow``); ``RAG_LEXICAL_INDEX=memory``,
which ran this index in every gateway worker, was retired (one lexical engine beside the SQL leg,
not two). What stays is the yardstick: Tantivy's latency bar is a ratio to this index's
(:mod:`benchmarks.tantivy_scale`, :mod:`benchmarks.lexical`, :mod:`benchmarks.tantivy_recall`,
``mnemo eval --lexical-engines memory``), so it must stay exact: its answer is the SQL leg's
(``tests/test_lexical_index.py``, ``tests/test_lexical_top.py``).

Each model partition's BM25 postings live in this process: each term's postings are three numpy
arrays (chunk slot, term frequency, the chunk's length), and a query is a vectorized gather and sum
over its terms, with MaxScore skipping what cannot reach the top k (:mod:`benchmarks.memory_lexicon`).

How it stays correct (the invariants the tests pin):

- **Same scores.** Corpus statistics (chunk count, mean ``lexical_length``, document frequency per
  term, over the query's section scope) are counted exactly from the live postings, and the query
  plan is the SQL leg's (:func:`index.search.bm25.bm25_plan`). The index only *selects* candidates: their
  rows are re-read from the store and scored there by the SQL leg's own expression
  (:func:`index.search.lexical_reread.reread_candidates`, the Tantivy engine's re-read too), so scores and
  tie order are the SQL leg's.
- **Exact ACL push-down.** The scope and ACL filter is the legs' own SQL (:func:`index.search.scope_sql.scope_where`),
  evaluated once per distinct *access class* of chunks (:mod:`index.search.access_classes`) and cached per
  scope. A candidate is selected only when its class passes, so ``limit`` is never starved by a
  post-filter.
- **Never stale.** Each partition follows the change feed (:mod:`index.store.change_feed`,
  :class:`index.follow.feed_follower.FeedFollower`) from a watermark. The re-read adds every key changed
  after it, scored in SQL, and trusts an index candidate only when its key has not changed since:
  the answer is exact while the index lags. When pending keys crowd the candidates the search
  widens; past a bound it says so (``fallback``: None, the SQL leg's turn).
- **Rebuildable.** Everything comes from the stored ``lexical`` tsvectors and ``lexical_length``.

A search it cannot answer (a partition not loaded, ``cold``; one whose load failed; image rows; a
``fallback``) returns None, counted in its :class:`index.lexical.metrics.LexicalMetrics`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

import asyncpg
import numpy as np

from index.follow.feed_follower import FeedFollower
from index.lexical.metrics import LexicalMetrics
from index.lru import Lru
from index.search.access_classes import LEXICAL_ROW_COLUMNS, permitted_classes
from index.search.bm25 import Bm25Plan, bm25_plan_of_counts, query_terms, scored_terms
from index.search.lexical_reread import reread_candidates
from index.store.change_feed import (
    KEY_COLUMNS,
    RowKey,
    changed_rows,
    current_watermark,
    row_key,
)
from index.store.hits import ChunkHit, Scope, chunk_from_row, scope_key
from index.store.partitions import ModelPartition

from .memory_lexicon import SCOPE_CACHE_SIZE, PartitionLexicon

log = logging.getLogger(__name__)

__all__ = ["MODE", "LexicalConfig", "LexicalIndex", "PartitionLexicon"]

MODE = "memory"  # its name among the lexical legs a benchmark compares (``--lexical-engines memory``)


@dataclass(frozen=True)
class LexicalConfig:
    """How the index runs (a benchmark's choice; the defaults are the retired gateway setting's)."""

    load_batch: int = 20_000
    poll_s: float = 5.0  # safety net: catch up this often even without a notification
    scope_cache_size: int = SCOPE_CACHE_SIZE
    # A search widens while pending changes crowd its candidates, up to this many times `limit`.
    max_fetch_factor: int = 64


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
        return True

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
        """The engine's status (the Protocol's): mode, feed connection, per-partition state and size."""
        return {
            "mode": MODE,
            "running": True,
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
