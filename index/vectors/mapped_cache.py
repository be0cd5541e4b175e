"""The FAISS vector cache on CPU, shared by every gateway worker: partitions mapped from snapshots.

With ``RAG_FAISS_CACHE=mmap`` a partition is not loaded from the store (35 s and 2.2 GiB of heap
per worker at 1M x 384): it is mapped from the snapshot that one writer keeps on disk
(:mod:`index.vectors.writer`, :mod:`index.vectors.files`). Every worker shares the file's pages
(copy-on-write), and the keys stay a sorted mapped array (:mod:`index.vectors.slot_keys`), not a dict per
worker. The snapshot's watermark is the partition's; the change feed then applies what is newer
exactly as after a load (an update writes one private page, an append goes behind the mapped
rows), so :mod:`index.vectors.cache`'s invariants (exact, never stale, ACL re-read in SQL) hold
unchanged. A new snapshot swapped in is mapped at the next sync (a notification or the poll); a
partition without one is ``missing`` and pgvector serves it, counted, until one appears; a
partition whose snapshot another store wrote (a reset database, another deployment's folder: its
watermark numbers other changes) is ``foreign``, served by pgvector until the writer rebuilds it. The GPU
cache stays per process: a device copy cannot be shared through a file.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np

from index.follow.feed_follower import RETRYABLE
from index.follow.folder_state import FOREIGN, MISSING, folder_reports
from index.follow.swap_folders import current_folder
from index.lru import Lru
from index.store.change_feed import store_identity
from index.store.partitions import ModelPartition
from index.vectors.cache import VectorCache
from index.vectors.faiss_backend import FlatIndex
from index.vectors.files import Snapshot, describe, open_current
from index.vectors.mapped_flat import MappedFlatIndex
from index.vectors.partition import PartitionCache
from index.vectors.slot_keys import KeyOf, RecordSlots, SlotOf

log = logging.getLogger(__name__)

__all__ = ["MappedVectorCache"]


class MappedVectorCache(VectorCache):
    """The vector cache with every partition mapped from its snapshot (mode ``mmap``)."""

    _store: str | None = None  # this store's identity, read on first use (store)

    @property
    def snapshot_root(self) -> Path:
        if self.config.mode != "mmap" or self.config.snapshot_root is None:
            raise ValueError("a mapped vector cache runs in mode mmap with a snapshot folder")
        return self.config.snapshot_root

    async def load(self, partition: ModelPartition) -> PartitionCache:
        return await self.map_snapshot(partition)

    async def store(self) -> str:
        """This store's identity (:func:`index.store.change_feed.store_identity`), read once."""
        if self._store is None:
            async with self.pool.acquire() as conn:
                self._store = await store_identity(conn)
        return self._store

    async def snapshots(
        self, conn: asyncpg.Connection, partitions: Sequence[ModelPartition], max_behind: int
    ) -> dict[str, dict[str, Any]]:
        """Each partition's snapshot folder in the one vocabulary (:mod:`index.follow.folder_state`,
        as ``mnemo vectors status`` says it; ``max_behind``: the writer's ``RAG_VECTOR_SNAPSHOT_CHANGES``)."""
        return await folder_reports(conn, self.snapshot_root, partitions, describe, max_behind)

    async def sync(self, models: Iterable[str] | None = None) -> int:
        await self._follow_snapshots()
        return await super().sync(models)

    async def map_snapshot(self, partition: ModelPartition) -> PartitionCache:
        """Map the partition's current snapshot and catch up from its watermark (``missing`` without one)."""
        name = partition.partition
        start = time.perf_counter()
        snapshot = await asyncio.to_thread(open_current, self.snapshot_root, partition)
        if snapshot is None:
            return self._unmapped(partition, None, MISSING, f"has no vector snapshot in {self.snapshot_root}")
        if snapshot.state.store != await self.store():
            # Left unmapped until the writer swaps a snapshot of this store in (the folder is held so
            # that the next sync does not map it again).
            why = f"has a vector snapshot of another store ({snapshot.folder})"
            return self._unmapped(partition, snapshot.folder, FOREIGN, why)
        if snapshot.state.dimension != partition.dimension or snapshot.state.model != partition.model:
            raise ValueError(
                f"vector snapshot {snapshot.folder} holds {snapshot.state.model} at {snapshot.state.dimension} "
                f"dimensions, not {partition.model} at {partition.dimension}"
            )
        pc = self._mapped(partition, snapshot)
        self.partitions[name] = pc
        if self.used_bytes(exclude=name) + pc.index.nbytes > self.config.max_bytes:
            self._over_budget(pc, pc.index.nbytes)
            return pc
        self._ready(pc, snapshot.state.watermark, start)
        log.info(
            "faiss cache: %s mapped from %s, %d vectors at seq %d, in %.3fs",
            name,
            snapshot.folder,
            pc.live,
            snapshot.state.watermark.seq,
            pc.load_seconds,
        )
        self.notify(partition.model)  # what is newer than the snapshot is applied by the follower
        return pc

    def _unmapped(
        self, partition: ModelPartition, folder: Path | None, state: str, why: str
    ) -> PartitionCache:
        """A partition without a snapshot to map (``state``: missing or foreign); pgvector serves it."""
        pc = PartitionCache(partition, FlatIndex(partition.dimension), folder=folder)
        self.partitions[partition.partition] = pc
        log.warning(
            "faiss cache: %s %s (run `mnemo vectors follow`); pgvector serves it", partition.partition, why
        )
        self._set_state(pc, state)
        self._observe(pc)
        return pc

    def _mapped(self, partition: ModelPartition, snapshot: Snapshot) -> PartitionCache:
        pc = PartitionCache(
            partition,
            MappedFlatIndex(snapshot.vectors),
            scopes=Lru(self.config.scope_cache_size),
            folder=snapshot.folder,
        )
        pc.slot_of = SlotOf(snapshot.keys)
        pc.key_of = KeyOf(snapshot.keys)
        pc.record_slots = RecordSlots(snapshot.keys)
        pc.alive = np.ones(snapshot.state.rows, dtype=bool)  # a snapshot holds live rows only
        return pc

    async def _follow_snapshots(self) -> None:
        """Map each partition's snapshot anew when the writer swapped another one in (or made a first)."""
        for pc in list(self.partitions.values()):
            if pc.state not in ("ready", MISSING, FOREIGN, "failed"):  # a failed map is tried again
                continue
            if current_folder(self.snapshot_root, pc.partition) == pc.folder:
                continue
            try:
                await self.map_snapshot(pc.partition)
            except RETRYABLE as exc:  # the mapped one keeps serving; the next sync tries again
                log.warning("faiss cache: mapping %s's new snapshot failed (%s)", pc.partition.partition, exc)
