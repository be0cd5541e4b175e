"""The one writer of the CPU vector cache's snapshots: maps or builds them, follows the feed, rewrites.

``mnemo vectors follow`` runs it (a process beside the gateways, as ``mnemo lexical follow`` is for
the lexical indexes; the gateways with ``RAG_FAISS_CACHE=mmap`` only read). It is the cache itself
(:class:`index.vectors.mapped_cache.MappedVectorCache`): per partition it maps the current
snapshot, or writes a first one from the store, then follows the change feed like every reader;
once ``snapshot_changes`` keys were applied since the last snapshot it writes a new one from the
store into a new folder, swaps it in, and maps that one itself (its own private pages go back).
Readers pick the new one up at their next sync, and until then serve exactly from the older one plus
the feed, so the threshold trades the writer's rewrites (a full write of the partition) against how
much each reader applies privately on top of the shared file.

A snapshot is written from the store in bounded memory (:mod:`index.vectors.snapshot_build`): the
watermark read first, then the rows in keyset batches of :data:`WRITE_BATCH`, sorted on the way;
what commits meanwhile is after the watermark and applied by every reader, as after a load. Neither
the store's vectors nor a Python key per row are ever held whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path

import asyncpg

from index.follow.swap_folders import current_folder, new_folder, partition_folder, swap_in, writer_lock
from index.store.change_feed import RowKey, current_watermark
from index.store.partitions import ModelPartition
from index.vectors.files import SnapshotState, read_state
from index.vectors.mapped_cache import MappedVectorCache
from index.vectors.metrics import CacheMetrics
from index.vectors.partition import CacheConfig, PartitionCache
from index.vectors.snapshot_build import SnapshotBuilder

log = logging.getLogger(__name__)

__all__ = ["WRITER", "WRITE_BATCH", "VectorWriter"]

WRITER = "`mnemo vectors follow` or rebuild"
# Rows read from the store at a time while writing a snapshot (at 384 dimensions, about 25 MiB of
# vectors and as much of the COPY stream): with the merge's window, the writer's memory.
WRITE_BATCH = 16_384


class VectorWriter(MappedVectorCache):
    """Keeps every partition's vector snapshot under ``root`` current with the store."""

    label = "vector writer"
    serves = "nothing (readers fall back to pgvector)"

    def __init__(
        self,
        pool: asyncpg.Pool,
        database_url: str,
        root: Path,
        *,
        snapshot_changes: int = 10_000,
        config: CacheConfig | None = None,
        metrics: CacheMetrics | None = None,
    ) -> None:
        if snapshot_changes < 1:
            raise ValueError("snapshot_changes must be at least 1")
        # No memory bound and no unfiltered-scope limit: the writer maps every partition, searches none;
        # it reads the store WRITE_BATCH rows at a time.
        base = config or CacheConfig(max_bytes=2**62, cpu_broad_scan_max=0, load_batch=WRITE_BATCH)
        super().__init__(pool, database_url, replace(base, mode="mmap", snapshot_root=root), metrics)
        self.root = root
        self.snapshot_changes = snapshot_changes
        self.changed: dict[str, int] = {}  # keys applied per partition since its snapshot
        self._locks = contextlib.ExitStack()
        self._locked: set[str] = set()

    def _lock(self, partition: ModelPartition) -> None:
        """Take the partition's writer lock once per writer (held until :meth:`stop`)."""
        if partition.partition not in self._locked:
            self._locks.enter_context(writer_lock(partition_folder(self.root, partition), WRITER))
            self._locked.add(partition.partition)

    async def start(self, *, listen: bool = True) -> None:
        """Take the vector folder's follower lock (a second follower fails here, loudly), then map or
        build every partition in the background and follow the feed."""
        self._locks.enter_context(writer_lock(self.root, WRITER))
        await super().start(listen=listen)

    async def load(self, partition: ModelPartition) -> PartitionCache:
        """Map the partition's snapshot; without one of this store, write one from the store."""
        self._lock(partition)
        folder = current_folder(self.root, partition)
        state = None if folder is None else await asyncio.to_thread(read_state, folder)
        if state is None or state.store != await self.store():
            return await self.rebuild(partition)
        pc = await self.map_snapshot(partition)
        self.changed[partition.partition] = 0
        return pc

    async def rebuild(self, partition: ModelPartition) -> PartitionCache:
        """Write the partition's snapshot from the store, swap it in and map it."""
        self._lock(partition)
        return await self.snapshot(partition)

    async def snapshot(self, partition: ModelPartition) -> PartitionCache:
        """Write a new snapshot of the partition from the store, swap it in, and map it in place of
        the one held."""
        start = time.perf_counter()
        folder = new_folder(self.root, partition)
        try:
            state = await self._write(partition, folder)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, folder, True)  # the current snapshot stays as it was
            raise
        previous = swap_in(self.root, partition, folder)
        mapped = await self.map_snapshot(partition)
        if mapped.state != "ready":
            raise RuntimeError(
                f"vector writer: mapping {partition.partition}'s new snapshot left it {mapped.state}"
            )
        self.changed[partition.partition] = 0
        if previous is not None and previous != folder:
            # Readers that mapped it keep its pages (unlinked, not gone) until they map the new one.
            await asyncio.to_thread(shutil.rmtree, previous, True)
        log.info(
            "vector writer: %s snapshot of %d vectors at seq %d written in %.1fs, swapped in (%s)",
            partition.partition,
            state.rows,
            state.watermark.seq,
            time.perf_counter() - start,
            folder.name,
        )
        return mapped

    async def _write(self, partition: ModelPartition, folder: Path) -> SnapshotState:
        """The store's text rows of the partition as a snapshot in ``folder`` (not swapped in)."""
        store = await self.store()
        builder = await asyncio.to_thread(SnapshotBuilder, folder, partition)
        adding: asyncio.Future[None] | None = None  # the last batch, sorted and written meanwhile
        async with self.pool.acquire() as conn:
            # Read before any row: whatever commits during the write is after it, applied by readers.
            watermark = await current_watermark(conn, partition)
            after: RowKey | None = None
            try:
                while True:
                    keys, vectors = await self._copy_batch(conn, partition, after)
                    if adding is not None:
                        await adding
                    if not keys:
                        break
                    adding = asyncio.ensure_future(asyncio.to_thread(builder.add, keys, vectors))
                    after = keys[-1]
                    if len(keys) < self.config.load_batch:
                        break
            finally:
                if adding is not None:
                    await adding
        return await asyncio.to_thread(builder.finish, watermark, store)

    async def _sync_partition(self, pc: PartitionCache) -> int:
        applied = await super()._sync_partition(pc)
        name = pc.partition.partition
        self.changed[name] = self.changed.get(name, 0) + applied
        if self.changed[name] >= self.snapshot_changes:
            await self.snapshot(pc.partition)
        return applied

    async def stop(self) -> None:
        await super().stop()
        self._locks.close()
        self._locked.clear()
