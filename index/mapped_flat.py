"""An exact inner-product index over a snapshot's mapped vectors, shared by every process that maps it.

The snapshot's vectors (:mod:`index.vector_files`) are mapped copy-on-write: their pages stay the
page cache's, shared by every gateway worker, until this process writes one (an update of a slot
from the change feed: one private page). Vectors appended after the snapshot live in a private
array behind the mapped ones. Searches are numpy matrix products over both parts (FAISS's flat
index owns its storage and cannot search memory it did not allocate), with the slot-bitmap
semantics of :class:`index.faiss_backend.FlatIndex`, which this stands in for.
"""

from __future__ import annotations

import numpy as np

from .faiss_backend import FlatIndex, top_permitted

__all__ = ["MappedFlatIndex"]

# Below this share of permitted slots a search gathers the permitted vectors and scores just
# those; above it, one product over every slot reads less (no gather) for the same answer.
GATHER_MAX_DENSITY = 0.125


class MappedFlatIndex(FlatIndex):
    """Slots ``0 .. len(base) - 1`` in the mapped ``base`` (copy-on-write), then a private tail."""

    def __init__(self, base: np.ndarray) -> None:
        super().__init__(int(base.shape[1]))
        self._base = base
        self._tail = np.zeros((0, self.dimension), dtype=np.float32)
        self._tail_rows = 0

    @property
    def ntotal(self) -> int:
        return len(self._base) + self._tail_rows

    @property
    def private_bytes(self) -> int:
        """Bytes of this process's own (the tail's capacity; rewritten mapped pages not counted)."""
        return int(self._tail.nbytes)

    def _parts(self) -> list[tuple[int, np.ndarray]]:
        return [(0, self._base), (len(self._base), self._tail[: self._tail_rows])]

    def append(self, vectors: np.ndarray) -> None:
        vectors = np.asarray(vectors, dtype=np.float32).reshape(-1, self.dimension)
        with self.lock.write():
            need = self._tail_rows + len(vectors)
            if need > len(self._tail):  # doubling: appends stay amortized O(1) per vector
                grown = np.zeros((max(need, 2 * len(self._tail), 1024), self.dimension), dtype=np.float32)
                grown[: self._tail_rows] = self._tail[: self._tail_rows]
                self._tail = grown
            self._tail[self._tail_rows : need] = vectors
            self._tail_rows = need

    def write(self, slots: np.ndarray, vectors: np.ndarray) -> None:
        if not len(slots):
            return
        slots = np.asarray(slots, dtype=np.int64)
        with self.lock.write():
            for offset, part in self._parts():
                inside = (slots >= offset) & (slots < offset + len(part))
                part[slots[inside] - offset] = vectors[inside]

    def vectors(self, slots: np.ndarray) -> np.ndarray:
        with self.lock.read():
            return self._gather(np.asarray(slots, dtype=np.int64))

    def _gather(self, slots: np.ndarray) -> np.ndarray:
        """Copies of the slots' vectors (the caller holds the lock)."""
        out = np.empty((len(slots), self.dimension), dtype=np.float32)
        for offset, part in self._parts():
            inside = (slots >= offset) & (slots < offset + len(part))
            out[inside] = part[slots[inside] - offset]
        return out

    def _scores(self, queries: np.ndarray) -> np.ndarray:
        return np.concatenate([part @ queries.T for _, part in self._parts()])

    def _search_cpu(self, query: np.ndarray, k: int, bitmap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = self.ntotal
        if n == 0 or k <= 0:
            return np.empty(0, np.float32), np.empty(0, np.int64)
        permitted = np.unpackbits(bitmap[: (n + 7) // 8], bitorder="little", count=n).astype(bool)
        q = np.asarray(query, dtype=np.float32).reshape(1, -1)
        chosen = np.flatnonzero(permitted)
        if len(chosen) <= GATHER_MAX_DENSITY * n:
            scores, top = top_permitted(
                (self._gather(chosen) @ q.T)[:, 0] if len(chosen) else np.empty(0, np.float32),
                np.ones(len(chosen), dtype=bool),
                k,
            )
            return scores, chosen[top]
        return top_permitted(self._scores(q)[:, 0], permitted, k)
