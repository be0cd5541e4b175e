"""One partition's slice of the FAISS vector cache: its slots, keys, liveness and scope bitmaps.

:class:`PartitionCache` is the bookkeeping that keeps a flat index's slots in step with the store
(:meth:`PartitionCache.plan` assigns slots to a batch of changes, :meth:`PartitionCache.publish`
makes them searchable and moves the watermark); :class:`CacheConfig` is how the whole cache runs.
The cache that loads, syncs and searches these is :class:`index.vectors.cache.VectorCache`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Hashable, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from index.lru import Lru
from index.store.change_feed import Change, RowKey, Watermark
from index.store.hits import Scope
from index.store.partitions import ModelPartition

if TYPE_CHECKING:  # FAISS loads with the cache itself, not with its configuration
    from index.vectors.faiss_backend import FlatIndex
    from index.vectors.slot_keys import KeyOf, RecordSlots

__all__ = ["MODES", "CacheConfig", "PartitionCache", "ScopeKey", "normalized", "unfiltered"]

MODES = ("off", "auto", "cpu", "cuda", "mmap")
ScopeKey = Hashable
# Content versions come from one counter, so a partition cached anew never repeats an old one's.
_CONTENT_VERSIONS = itertools.count()


@dataclass(frozen=True)
class CacheConfig:
    """How the cache runs (built by the gateway from its settings)."""

    mode: str = "auto"
    # mode mmap: where the writer (index.vectors.writer) keeps each partition's snapshot to map.
    snapshot_root: Path | None = None
    max_bytes: int = 2 * 1024**3
    load_batch: int = 50_000
    fp16_min_vectors: int = 1_000_000  # on GPU, store fp16 from this many vectors on
    scope_cache_size: int = 32
    # Scopes of at most this many permitted vectors are searched over a packed copy of their vectors
    # (index.vectors.packed_scopes), all copies together within packed_max_bytes. 0 turns packing off.
    packed_scope_rows: int = 20_000
    packed_max_bytes: int = 256 * 1024**2
    # On CPU an unfiltered scope (an admin, no section or group) over more vectors than this goes to
    # pgvector's HNSW: a flat scan reads every vector per query (~150 MB per 100k x 384) and loses
    # to HNSW under concurrency (0.27x at 100k, 32 callers), while HNSW keeps full recall when
    # nothing is filtered. Filtered scopes stay on the cache at any size: that is where HNSW's
    # recall and plans fall apart. 0: the cache serves every scope.
    cpu_broad_scan_max: int = 50_000
    poll_s: float = 5.0  # safety net: catch up this often even without a notification
    threads: int = (
        1  # CPU threads per search (FAISS OpenMP and the BLAS of batched scans); 0 = library default
    )

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"cache mode {self.mode!r}: use one of {MODES}")
        if self.mode == "mmap" and self.snapshot_root is None:
            raise ValueError("cache mode mmap needs the snapshots' folder (snapshot_root)")
        if self.threads < 0:
            raise ValueError("threads must be >= 0")


@dataclass
class PartitionCache:
    """One partition's cached vectors: slots, keys, liveness, scope bitmaps, watermark."""

    partition: ModelPartition
    index: FlatIndex
    state: str = "loading"  # loading | ready | over_budget | failed | missing (mmap: no snapshot)
    watermark: Watermark = field(default_factory=lambda: Watermark(0, 0))
    version: int = 0  # bumped whenever the watermark moves (scope bitmaps built before are suspect)
    # Changed when applying changes starts and when it ends: a packed scope copy taken at another
    # content version may disagree with the index (index.vectors.packed_scopes).
    content: int = field(default_factory=lambda: next(_CONTENT_VERSIONS))
    # Plain containers when loaded from the store; index.vectors.slot_keys's stand-ins over a mapped snapshot.
    slot_of: MutableMapping[RowKey, int] = field(default_factory=dict)
    key_of: list[RowKey | None] | KeyOf = field(default_factory=list)
    record_slots: dict[tuple[str, int], set[int]] | RecordSlots = field(default_factory=dict)
    alive: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    free: list[int] = field(default_factory=list)
    scopes: Lru[ScopeKey, tuple[Scope, np.ndarray]] = field(
        default_factory=lambda: Lru(CacheConfig.scope_cache_size)
    )
    applying: bool = False
    load_seconds: float | None = None
    folder: Path | None = None  # mode mmap: the snapshot folder mapped (None: none was there)
    # Searches waiting for the batcher: (query, k, permitted slots, the caller's future).
    waiting: list[tuple[np.ndarray, int, np.ndarray, asyncio.Future[np.ndarray]]] = field(
        default_factory=list
    )
    batching: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def live(self) -> int:
        return int(self.alive.sum())

    def _grow(self, n: int) -> None:
        if n > len(self.alive):
            self.alive = np.concatenate([self.alive, np.zeros(n - len(self.alive), dtype=bool)])
            self.key_of.extend([None] * (n - len(self.key_of)))

    def _forget(self, key: RowKey) -> int | None:
        slot = self.slot_of.pop(key, None)
        if slot is not None:
            self.alive[slot] = False
            self.key_of[slot] = None
            self.free.append(slot)
            slots = self.record_slots.get(key[:2])
            if slots is not None:
                slots.discard(slot)
                if not slots:
                    del self.record_slots[key[:2]]
        return slot

    def plan(self, changes: Sequence[Change]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
        """Slot assignments for a batch: (rewrite slots, their vectors, appended vectors, new slots).

        Deletes take effect at once (a dead slot is never searched); new slots
        stay dead until :meth:`publish`, after their vectors are in the index.
        """
        self.content = next(_CONTENT_VERSIONS)
        rewrite: list[int] = []
        rewrite_vecs: list[np.ndarray] = []
        append: list[np.ndarray] = []
        fresh: list[int] = []
        for change in changes:
            if change.vector is None:
                self._forget(change.key)
                continue
            vec = normalized(change.vector)
            slot = self.slot_of.get(change.key)
            if slot is None:
                if self.free:
                    slot = self.free.pop()
                    rewrite.append(slot)
                    rewrite_vecs.append(vec)
                else:
                    slot = len(self.key_of)
                    self._grow(slot + 1)
                    append.append(vec)
                self.slot_of[change.key] = slot
                self.key_of[slot] = change.key
                self.record_slots.setdefault(change.key[:2], set()).add(slot)
                fresh.append(slot)
            else:
                rewrite.append(slot)
                rewrite_vecs.append(vec)
        d = self.partition.dimension
        return (
            np.asarray(rewrite, dtype=np.int64),
            np.asarray(rewrite_vecs, dtype=np.float32).reshape(-1, d),
            np.asarray(append, dtype=np.float32).reshape(-1, d),
            fresh,
        )

    def publish(self, fresh: list[int], watermark: Watermark, *, applied: bool) -> None:
        """Make ``fresh`` slots searchable and move the watermark (``applied``: changes were applied)."""
        self.alive[fresh] = True
        self.watermark = watermark
        self.version += 1
        if applied:
            self.content = next(_CONTENT_VERSIONS)


def unfiltered(scope: Scope) -> bool:
    """No ACL, section or group filter: every live slot is permitted (an excluded record aside)."""
    return scope.acl is None and scope.section_tipos is None and scope.group is None


def normalized(vector: np.ndarray) -> np.ndarray:
    """``vector`` at unit length (a zero vector as it is): inner product over these is cosine."""
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector
