"""The FAISS vector cache: each model partition's text vectors in an exact in-process index.

Why: pgvector's HNSW loses recall under selective filters and leaves the index
path for a non-admin caller whose ACL filters every row. A flat index with the
caller's scope as a slot bitmap is exact at any selectivity.

How it stays correct (the invariants the tests pin):

- **Exact.** Search is flat inner product over L2-normalized copies
  (= cosine). The cache only *selects* candidates; their rows are re-read from
  the store with the scope/ACL push-down applied in SQL and scored there by
  pgvector (``<=>``), so scores and tie order are the SQL leg's own.
- **Never stale.** Each partition carries a :class:`~index.store.change_feed.Watermark`.
  The re-read adds every key changed after it (deleted ones are simply gone
  from the store), and the FAISS search skips nothing it should not: a key's
  cached state is trusted only when it has not changed since the watermark.
  If pending keys crowd the cache's top candidates, the search widens; when it
  still cannot prove an exact top-k it says so and pgvector serves the query.
- **Scopes.** A scope's bitmap comes from the same SQL push-down the legs use
  (:func:`index.search.scope_sql.scope_where`), is cached per scope (LRU), and is
  updated from the feed for just the changed keys.
- **Small scopes packed.** A scope of few slots is searched over a contiguous copy of its
  vectors (:mod:`index.vectors.packed_scopes`), valid only while no change has been applied since.
- **Bounded.** A partition that would pass ``max_bytes`` is not cached (logged
  and counted); pgvector serves it. Cold partitions (loading) likewise.
- **Shared on CPU.** Mode ``mmap`` maps each partition from a snapshot on disk instead of loading
  the store (:mod:`index.vectors.mapped_cache`); the same invariants hold.

With mode ``off``, or for any partition not ``ready``, :meth:`VectorCache.search`
returns None and the caller runs the SQL leg exactly as without a cache.
"""

from __future__ import annotations

import asyncio
import io
import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import asyncpg
import numpy as np

from index.follow.feed_follower import FeedFollower
from index.lru import Lru
from index.search.read_settings import CUSTOM_PLANS, fetch_with_local_settings
from index.search.scope_sql import scope_where
from index.store.change_feed import (
    KEY_COLUMNS,
    RowKey,
    Watermark,
    candidates_params,
    candidates_sql,
    changes_since,
    current_watermark,
)
from index.store.hits import ChunkHit, Scope, chunk_from_row, hit_columns, identity_order, scope_key
from index.store.partitions import ModelPartition
from index.store.pg_copy import parse_copy
from index.vectors.faiss_backend import FlatIndex, GpuFlatIndex, gpu_available, limit_cpu_threads
from index.vectors.metrics import CacheMetrics
from index.vectors.packed_scopes import PackedScope, PackedScopes
from index.vectors.partition import CacheConfig, PartitionCache, normalized, unfiltered

log = logging.getLogger(__name__)

__all__ = ["CacheUnavailable", "VectorCache"]

MAX_SEARCH_BATCH = 64  # concurrent searches answered by one scan of a partition


class CacheUnavailable(RuntimeError):
    """``cuda`` was asked for and this process has no GPU-enabled FAISS or no GPU."""


# -- the cache ------------------------------------------------------------------------------------


class VectorCache(FeedFollower):
    """Every partition's cache, their loading and sync, and the cache-served dense search."""

    label = "faiss cache"
    serves = "pgvector"
    # missing and foreign: mode mmap, no snapshot of this store on disk (index.follow.folder_state)
    states = ("loading", "ready", "over_budget", "failed", "missing", "foreign")
    partitions: dict[str, PartitionCache]

    def __init__(
        self,
        pool: asyncpg.Pool,
        database_url: str,
        config: CacheConfig,
        metrics: CacheMetrics | None = None,
    ) -> None:
        super().__init__(pool, database_url, config.poll_s)
        self.config = config
        self.metrics = metrics or CacheMetrics()
        self._batchers: set[asyncio.Task[None]] = set()
        self.recent_lags: deque[float] = deque(maxlen=10_000)  # write -> applied, seconds (benchmarks)
        self.applied_log: deque[tuple[float, str, int]] = deque(maxlen=10_000)  # (monotonic, model, seq)
        self.device = self._device()
        self.packed = PackedScopes(config.packed_scope_rows, config.packed_max_bytes)

    @property
    def enabled(self) -> bool:
        return self.config.mode != "off"

    def _device(self) -> str:
        mode = self.config.mode
        if mode == "cuda" and not gpu_available():
            raise CacheUnavailable(
                "RAG_FAISS_CACHE=cuda but FAISS has no GPU support or sees no GPU "
                "(install the [gpu] extra on a CUDA machine, or use auto/cpu)"
            )
        if mode == "cuda" or (
            mode == "auto" and gpu_available()
        ):  # mmap is CPU only: a GPU copy is per process
            return "cuda"
        return "cpu"

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self, *, listen: bool = True) -> None:
        """Start loading every partition in the background and following the feed (returns at once)."""
        if self.enabled and self.config.threads:
            limit_cpu_threads(self.config.threads)
        await super().start(listen=listen)

    # -- loading -----------------------------------------------------------------------------------

    def _new_index(self, partition: ModelPartition, rows: int) -> FlatIndex:
        if self.device == "cuda":
            return GpuFlatIndex(partition.dimension, fp16=rows >= self.config.fp16_min_vectors)
        return FlatIndex(partition.dimension)

    def _bytes_per_vector(self, partition: ModelPartition, rows: int) -> int:
        gpu = 0
        if self.device == "cuda":
            gpu = partition.dimension * (2 if rows >= self.config.fp16_min_vectors else 4)
        return partition.dimension * 4 + gpu

    def used_bytes(self, exclude: str | None = None) -> int:
        return sum(pc.index.nbytes for name, pc in self.partitions.items() if name != exclude)

    async def load(self, partition: ModelPartition) -> PartitionCache:
        return await self.load_store(partition)

    async def load_store(self, partition: ModelPartition) -> PartitionCache:
        """Load a partition's text vectors with binary COPY in keyset batches (a progress line per batch)."""
        name = partition.partition
        start = time.perf_counter()
        async with self.pool.acquire() as conn:
            rows = int(await conn.fetchval(f"SELECT count(*) FROM {partition.table} WHERE modality = 'text'"))
            need = rows * self._bytes_per_vector(partition, rows)
            pc = PartitionCache(
                partition, self._new_index(partition, rows), scopes=Lru(self.config.scope_cache_size)
            )
            self.partitions[name] = pc
            if self.used_bytes(exclude=name) + need > self.config.max_bytes:
                self._over_budget(pc, need)
                return pc
            self._set_state(pc, "loading")
            # The watermark is read before any row: whatever commits during the load is re-applied after.
            watermark = await current_watermark(conn, partition)
            log.info("faiss cache: loading %d vectors of %s (%s)", rows, name, self.device)
            after: RowKey | None = None
            loaded = 0
            while True:
                keys, vectors = await self._copy_batch(conn, partition, after)
                if not keys:
                    break
                await self._apply_loaded(pc, keys, vectors)
                loaded += len(keys)
                after = keys[-1]
                log.info(
                    "faiss cache: %s loaded %d/%d vectors (%.0f%%) in %.1fs",
                    name,
                    loaded,
                    rows,
                    100.0 * loaded / max(rows, loaded, 1),
                    time.perf_counter() - start,
                )
                if len(keys) < self.config.load_batch:
                    break
        await asyncio.to_thread(pc.index.refresh)
        self._ready(pc, watermark, start)
        log.info(
            "faiss cache: %s ready, %d vectors, %.1f MiB, loaded in %.2fs",
            name,
            pc.live,
            pc.index.nbytes / 2**20,
            pc.load_seconds,
        )
        # What was written during the load is applied by the follower (answers are exact meanwhile:
        # the search adds every key changed after the watermark).
        self.notify(partition.model)
        return pc

    def _ready(self, pc: PartitionCache, watermark: Watermark, start: float) -> None:
        """A partition loaded (or mapped) up to ``watermark`` since ``start``: searchable from now on."""
        pc.publish([], watermark, applied=True)
        pc.load_seconds = time.perf_counter() - start
        self._set_state(pc, "ready")
        self._observe(pc)
        self.metrics.load_seconds.labels(pc.partition.partition).set(pc.load_seconds)

    async def _copy_batch(
        self, conn: asyncpg.Connection, partition: ModelPartition, after: RowKey | None
    ) -> tuple[list[RowKey], np.ndarray]:
        cols = ", ".join(KEY_COLUMNS)
        where = "e.modality = 'text'"
        args: list[object] = []
        if after is not None:
            marks = ", ".join(f"${i + 2}" for i in range(len(after)))
            where += f" AND (e.model, {', '.join('e.' + c for c in KEY_COLUMNS)}) > ($1, {marks})"
            args = [partition.model, *after]
        buffer = io.BytesIO()
        await conn.copy_from_query(
            f"""SELECT {cols}, embedding FROM {partition.table} e WHERE {where}
                ORDER BY e.model, {", ".join("e." + c for c in KEY_COLUMNS)} LIMIT {int(self.config.load_batch)}""",
            *args,
            output=buffer,
            format="binary",
        )
        return parse_copy(buffer.getvalue(), partition.dimension)

    async def _apply_loaded(self, pc: PartitionCache, keys: list[RowKey], vectors: np.ndarray) -> None:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
        first = len(pc.key_of)
        pc._grow(first + len(keys))
        for i, key in enumerate(keys):
            slot = first + i
            pc.slot_of[key] = slot
            pc.key_of[slot] = key
            pc.record_slots.setdefault(key[:2], set()).add(slot)
        await asyncio.to_thread(pc.index.append, vectors)
        pc.alive[first : first + len(keys)] = True

    def _over_budget(self, pc: PartitionCache, need: int) -> None:
        log.warning(
            "faiss cache: %s needs %.1f MiB, over RAG_FAISS_MAX_BYTES (%.1f MiB, %.1f MiB in use); "
            "pgvector serves it",
            pc.partition.partition,
            need / 2**20,
            self.config.max_bytes / 2**20,
            self.used_bytes(exclude=pc.partition.partition) / 2**20,
        )
        pc.index = FlatIndex(pc.partition.dimension)  # release the vectors
        pc.slot_of, pc.key_of, pc.record_slots = {}, [], {}
        pc.alive = np.zeros(0, dtype=bool)
        pc.scopes.clear()
        self.metrics.over_budget.inc()
        self._set_state(pc, "over_budget")
        self._observe(pc)

    def _observe(self, pc: PartitionCache) -> None:
        self.metrics.bytes.labels(pc.partition.partition).set(pc.index.nbytes)
        self.metrics.vectors.labels(pc.partition.partition).set(pc.live)

    # -- the feed ----------------------------------------------------------------------------------

    async def sync(self, models: Iterable[str] | None = None) -> int:
        """Apply every change after each ready partition's watermark; returns the keys applied.

        A model that is not cached yet (first seen after start) is loaded.
        """
        applied = 0
        wanted = None if models is None else set(models)
        if wanted is not None:
            await self._load_new(wanted)
        for pc in list(self.partitions.values()):
            if wanted is not None and pc.partition.model not in wanted:
                continue
            if pc.state == "ready":
                applied += await self._sync_partition(pc)
        if not self._dirty:
            self._lag_since = None
            self.metrics.sync_lag.set(0.0)
        return applied

    async def _sync_partition(self, pc: PartitionCache) -> int:
        async with pc.lock:
            async with self.pool.acquire() as conn:
                batch = await changes_since(conn, pc.partition, pc.watermark)
            if not batch.changes:
                pc.publish([], batch.watermark, applied=False)
                return 0
            pc.applying = True
            try:
                rewrite, rewrite_vecs, append, fresh = pc.plan(batch.changes)
                rows = len(pc.key_of)
                if (
                    self.used_bytes(exclude=pc.partition.partition)
                    + rows * self._bytes_per_vector(pc.partition, rows)
                    > self.config.max_bytes
                ):
                    self._over_budget(pc, rows * self._bytes_per_vector(pc.partition, rows))
                    return 0

                def write() -> None:
                    pc.index.write(rewrite, rewrite_vecs)
                    if len(append):
                        pc.index.append(append)
                    pc.index.refresh()

                await asyncio.to_thread(write)
                await self._update_scopes(pc, [c.key for c in batch.changes])
                pc.publish(fresh, batch.watermark, applied=True)
                self.applied_log.append((time.monotonic(), pc.partition.model, batch.watermark.seq))
            finally:
                pc.applying = False
            for lag in batch.lags:
                self.metrics.apply_lag.observe(lag)
                self.recent_lags.append(lag)
            deletes = sum(c.vector is None for c in batch.changes)
            self.metrics.changes.labels("delete").inc(deletes)
            self.metrics.changes.labels("upsert").inc(len(batch.changes) - deletes)
            self._observe(pc)
            return len(batch.changes)

    async def _update_scopes(self, pc: PartitionCache, keys: list[RowKey]) -> None:
        """Re-evaluate the cached scope bitmaps for just the changed keys (the same SQL push-down)."""
        if not pc.scopes:
            return
        slots = np.asarray([pc.slot_of[k] for k in keys if k in pc.slot_of], dtype=np.int64)
        for key, (scope, mask) in pc.scopes.items():
            if len(mask) < len(pc.key_of):
                mask = np.concatenate([mask, np.zeros(len(pc.key_of) - len(mask), dtype=bool)])
            mask[slots] = False
            async with self.pool.acquire() as conn:
                members = await self._scope_keys(conn, pc.partition, scope, keys)
            mask[[pc.slot_of[k] for k in members if k in pc.slot_of]] = True
            pc.scopes.replace(key, (scope, mask))

    def lag_seconds(self) -> float:
        """How far behind the store the cache may be now (seconds since the oldest unapplied news)."""
        lag = 0.0
        if self._lag_since is not None:
            lag = time.monotonic() - self._lag_since
        if self.listener is not None and self.listener.disconnected_since is not None:
            lag = max(lag, time.monotonic() - self.listener.disconnected_since)
        self.metrics.sync_lag.set(lag)
        return lag

    def status(self) -> dict[str, object]:
        """The /readyz detail: mode, device, per-partition state and size, feed connection, lag."""
        return {
            "mode": self.config.mode,
            "running": self.enabled,
            "device": self.device if self.enabled else None,
            "listening": bool(self.listener and self.listener.connected),
            "lag_s": round(self.lag_seconds(), 3),
            "partitions": {
                name: {"state": pc.state, "vectors": pc.live, "bytes": pc.index.nbytes}
                for name, pc in self.partitions.items()
            },
            "packed_scopes": {"count": len(self.packed), "bytes": self.packed.nbytes},
        }

    # -- scopes ------------------------------------------------------------------------------------

    async def _scope_keys(
        self,
        conn: asyncpg.Connection,
        partition: ModelPartition,
        scope: Scope,
        among: Sequence[RowKey] | None = None,
    ) -> list[RowKey]:
        where, params = scope_where(scope)
        keys = ", ".join("e." + c for c in KEY_COLUMNS)
        join = ""
        if among is not None:
            n = len(params)
            join = (
                f" JOIN unnest(${n + 1}::text[], ${n + 2}::bigint[], ${n + 3}::text[], ${n + 4}::text[],"
                f" ${n + 5}::text[], ${n + 6}::int[]) AS k({', '.join(KEY_COLUMNS)})"
                f" ON e.model = ${n + 7} AND "  # the model leads the primary key: the join uses it
                + " AND ".join(f"e.{c} = k.{c}" for c in KEY_COLUMNS)
            )
            params = [*params, *([k[i] for k in among] for i in range(len(KEY_COLUMNS))), partition.model]
        rows = await conn.fetch(f"SELECT {keys} FROM {partition.table} e{join} WHERE {where}", *params)
        return [tuple(r) for r in rows]  # type: ignore[misc]

    async def _mask(self, conn: asyncpg.Connection, pc: PartitionCache, scope: Scope) -> np.ndarray:
        """The slots the scope (without its excluded record) permits, from cache or built once."""
        if unfiltered(scope):
            return pc.alive
        key = scope_key(scope)
        hit = pc.scopes.get(key)
        if hit is not None:
            return hit[1]
        version = pc.version
        # On the caller's connection: taking a second one from the pool while the caller holds one
        # deadlocks once every pooled connection belongs to a waiting search.
        members = await self._scope_keys(conn, pc.partition, scope)
        mask = np.zeros(len(pc.key_of), dtype=bool)
        mask[[pc.slot_of[k] for k in members if k in pc.slot_of]] = True
        # Kept only when no change was published meanwhile (else it may disagree with the watermark
        # the next search uses; this search still may use it: it captured the older watermark).
        if pc.version == version and not pc.applying:
            pc.scopes.put(key, (scope, mask))
        return mask

    # -- search ------------------------------------------------------------------------------------

    def ready(self, partition: ModelPartition) -> PartitionCache | None:
        pc = self.partitions.get(partition.partition)
        return pc if pc is not None and pc.state == "ready" else None

    def _broad_on_cpu(self, pc: PartitionCache, scope: Scope) -> bool:
        """An unfiltered scope over a partition HNSW serves better on CPU (see ``cpu_broad_scan_max``)."""
        limit = self.config.cpu_broad_scan_max
        return self.device == "cpu" and limit > 0 and unfiltered(scope) and pc.index.ntotal > limit

    async def search(
        self,
        conn: asyncpg.Connection,
        partition: ModelPartition,
        vector: np.ndarray,
        scope: Scope,
        limit: int,
    ) -> list[ChunkHit] | None:
        """The exact dense top-``limit`` for ``scope`` (scores as the SQL leg's), or None: use pgvector."""
        if not self.enabled:
            return None
        pc = self.partitions.get(partition.partition)
        if pc is None or pc.state != "ready":
            state = pc.state if pc is not None else None
            self.metrics.searches.labels(
                state if state in ("over_budget", "missing", "foreign") else "cold"
            ).inc()
            return None
        if self._broad_on_cpu(pc, scope):
            self.metrics.searches.labels("broad").inc()
            return None
        watermark = pc.watermark  # captured before the bitmap: what the bitmap may rely on
        unexcluded = replace(scope, exclude_record=None)
        mask = await self._mask(conn, pc, unexcluded)
        query = normalized(np.asarray(vector, dtype=np.float32))
        excluded = np.zeros(0, dtype=np.int64)
        if scope.exclude_record is not None:
            excluded = np.fromiter(pc.record_slots.get(tuple(scope.exclude_record), ()), dtype=np.int64)
        packed = None if unfiltered(unexcluded) else await self._packed(pc, unexcluded, mask)
        if packed is not None:
            permitted = packed.permitted(excluded)

            async def find(k: int) -> np.ndarray:
                return await asyncio.to_thread(packed.top, query, k, excluded)

        else:
            n = pc.index.ntotal
            bits = np.zeros(n, dtype=bool)
            m = min(n, len(mask))
            bits[:m] = mask[:m] & pc.alive[:m]
            bits[excluded[excluded < n]] = False
            permitted = int(bits.sum())

            async def find(k: int) -> np.ndarray:
                return await self._slots(pc, query, k, bits)

        fetch = min(permitted, 2 * limit + 8)
        while True:
            slots = await find(fetch)
            keys = [k for k in (pc.key_of[s] for s in slots) if k is not None]
            rows, trusted = await self._reread(conn, pc.partition, vector, scope, keys, watermark)
            # Exact when the trusted (unchanged since the watermark) cache candidates cover the top-k,
            # or when the cache had no more permitted candidates to give.
            if trusted >= limit or len(slots) < fetch or fetch >= permitted:
                self.metrics.searches.labels("hit").inc()
                return [chunk_from_row(r, 1.0 - float(r["distance"])) for r in rows[:limit]]
            if fetch >= 16 * limit + 64:
                self.metrics.searches.labels("fallback").inc()
                log.info("faiss cache: too many pending changes among the candidates; pgvector serves")
                return None
            fetch = min(permitted, fetch * 4)

    async def _packed(self, pc: PartitionCache, scope: Scope, mask: np.ndarray) -> PackedScope | None:
        """The packed copy of a small scope's vectors (kept, or taken now), or None: a large scope."""
        key = (pc.partition.partition, scope_key(scope))
        content = pc.content
        packed = self.packed.get(key, content)  # drops a stale copy
        if packed is not None or not self.packed.small(mask):
            self.metrics.packed_bytes.set(self.packed.nbytes)
            return packed
        m = min(len(mask), len(pc.alive))
        slots = np.flatnonzero(mask[:m] & pc.alive[:m]).astype(np.int64)
        packed = PackedScope(slots, await asyncio.to_thread(pc.index.vectors, slots), content)
        # Kept only when no change began or ended meanwhile; this search may use it either way (its
        # vectors are at least as new as the watermark it captured, like the bitmap's).
        if pc.content == content and not pc.applying:
            self.packed.put(key, packed)
        self.metrics.packed_bytes.set(self.packed.nbytes)
        return packed

    async def _slots(self, pc: PartitionCache, query: np.ndarray, k: int, bits: np.ndarray) -> np.ndarray:
        """The top-``k`` permitted slots for ``query``, through the partition's batcher."""
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        pc.waiting.append((query, k, bits, future))
        if not pc.batching:
            pc.batching = True
            task = asyncio.create_task(self._run_batches(pc))
            self._batchers.add(task)
            task.add_done_callback(self._batchers.discard)
        return await future

    async def _run_batches(self, pc: PartitionCache) -> None:
        """Serve waiting searches: alone with a bitmap selector, or many with one shared scan.

        Whatever arrives while a batch runs forms the next one (TEI-style continuous batching);
        every waiter gets its slots or the exception.
        """
        try:
            while pc.waiting:
                batch, pc.waiting = pc.waiting[:MAX_SEARCH_BATCH], pc.waiting[MAX_SEARCH_BATCH:]
                try:
                    if len(batch) == 1:
                        query, k, bits, _ = batch[0]
                        packed = np.packbits(bits, bitorder="little")
                        results = [await asyncio.to_thread(pc.index.search, query, k, packed)]
                    else:
                        results = await asyncio.to_thread(
                            pc.index.search_batch,
                            np.stack([b[0] for b in batch]),
                            max(b[1] for b in batch),
                            [b[2] for b in batch],
                        )
                except Exception as exc:  # handed to every waiter, who decides
                    for *_, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, k, _, future), (_, slots) in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(slots[:k])
        finally:
            pc.batching = False

    async def _reread(
        self,
        conn: asyncpg.Connection,
        partition: ModelPartition,
        vector: np.ndarray,
        scope: Scope,
        keys: Sequence[RowKey],
        watermark: Watermark,
    ) -> tuple[list[asyncpg.Record], int]:
        """The candidates plus every key changed after the watermark, re-read through the scope's SQL
        filter and scored by pgvector; with the number of cache candidates that had not changed."""
        where, params = scope_where(scope, [np.asarray(vector, dtype=np.float32)])
        ctes, source = candidates_sql(len(params) + 1, partition.table)
        cast = partition.cast
        query = f"""
            WITH {ctes}
            SELECT {hit_columns()}, e.embedding::{cast} <=> $1::{cast} AS distance,
                   k.cached AND NOT k.pending AS trusted
            FROM {source}
            WHERE {where}
            ORDER BY distance, {identity_order()}"""
        # Planned with its values every time: a generic plan of an earlier join (after five runs)
        # could not see how few keys it joins, and it cost 5.6 ms a search against 2.4 on 10k rows.
        # The keys' lookups (candidates_sql) now leave that join no other plan; a generic plan of
        # the rest is not measured, so custom plans stay.
        rows = await fetch_with_local_settings(
            conn,
            CUSTOM_PLANS,
            query,
            [*params, *candidates_params(keys, partition.model, watermark)],
        )
        return rows, sum(1 for r in rows if r["trusted"])

    def similarities(
        self, partition: ModelPartition, vector: np.ndarray, keys: Sequence[RowKey]
    ) -> Mapping[RowKey, float]:
        """Cosine similarity of cached keys to ``vector`` (keys not cached are left out)."""
        pc = self.ready(partition)
        if pc is None:
            return {}
        present = [(k, pc.slot_of[k]) for k in keys if k in pc.slot_of and pc.alive[pc.slot_of[k]]]
        if not present:
            return {}
        vectors = pc.index.vectors(np.asarray([s for _, s in present], dtype=np.int64))
        scores = vectors @ normalized(np.asarray(vector, dtype=np.float32))
        return {k: float(s) for (k, _), s in zip(present, scores, strict=True)}
