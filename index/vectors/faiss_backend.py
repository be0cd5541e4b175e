"""Exact inner-product indexes over numbered slots: FAISS flat on CPU, mirrored to a GPU when asked.

The cache (:mod:`index.vectors.cache`) gives every stored vector a slot number
and never moves it: an update rewrites the slot in place, a delete leaves the
slot dead (the cache's alive bitmap excludes it) until an insert reuses it.
Keeping slots stable is what lets a scope's bitmap stay valid across writes.

Searches are exact (flat) and take an optional bitmap of the slots they may
return (``faiss.IDSelectorBitmap``, little-endian bit order), so a narrow ACL
scope costs one dot product per permitted vector, not a full scan.

On CUDA the CPU index stays the master (writes, narrow scopes) and a GPU copy
(fp16 storage when ``fp16``) answers broad searches; the copy is rebuilt from
the master after writes, before the cache publishes them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

import faiss
import numpy as np

log = logging.getLogger(__name__)

__all__ = [
    "FlatIndex",
    "GpuFlatIndex",
    "ReadWriteLock",
    "gpu_available",
    "limit_cpu_threads",
    "top_permitted",
]

# A GPU flat search returns at most this many neighbours per query (FAISS's GPU k limit).
GPU_MAX_K = 2048
# Below this share of permitted slots, a scoped search runs on the CPU master with a selector:
# scanning the permitted vectors alone beats a full GPU scan followed by filtering.
GPU_MIN_DENSITY = 0.25


def limit_cpu_threads(threads: int) -> None:
    """Cap the threads FAISS (OpenMP) and the BLAS under numpy use per call, process-wide.

    Searches come from concurrent requests, each a small scan (one query, or a batch of them):
    parallelizing each one buys nothing, and on a small machine the libraries' idle workers spin
    against the database and the event loop for the same cores. On 2 cores under 8 callers a
    cache-on gateway served 44-75 requests/s with the defaults and 92 with one thread (issue 15).
    """
    from threadpoolctl import threadpool_limits

    faiss.omp_set_num_threads(threads)
    threadpool_limits(limits=threads, user_api="blas")


def top_permitted(scores: np.ndarray, permitted: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top-``k`` (scores, slots) among the ``permitted`` slots of one query's ``scores``, best first."""
    kk = min(k, int(permitted.sum()))
    if kk <= 0:
        return np.empty(0, np.float32), np.empty(0, np.int64)
    column = np.where(permitted, scores, -np.inf)
    top = np.argpartition(-column, kk - 1)[:kk]
    top = top[np.argsort(-column[top], kind="stable")]
    return column[top].astype(np.float32), top.astype(np.int64)


class ReadWriteLock:
    """Many readers (searches, which FAISS runs without the GIL, so they overlap) or one writer
    (an append may move the index's storage; a search must never read it meanwhile)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writing:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            while self._writing or self._readers:
                self._cond.wait()
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


def gpu_available() -> bool:
    """True when this FAISS build has GPU support and sees at least one device."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


class FlatIndex:
    """A CPU ``IndexFlatIP`` addressed by slot; searches share the lock, writes hold it alone."""

    device = "cpu"

    def __init__(self, dimension: int) -> None:
        self.dimension = dimension
        self._index = faiss.IndexFlatIP(dimension)
        self.lock = ReadWriteLock()

    @property
    def ntotal(self) -> int:
        return int(self._index.ntotal)

    @property
    def nbytes(self) -> int:
        return self.ntotal * self.dimension * 4

    def _view(self) -> np.ndarray:
        """The index's own float storage as a writable (ntotal, d) array (no copy)."""
        flat = faiss.rev_swig_ptr(self._index.get_xb(), self.ntotal * self.dimension)
        return flat.reshape(self.ntotal, self.dimension)

    def append(self, vectors: np.ndarray) -> None:
        """Add vectors at the end (slots ``ntotal .. ntotal + len - 1``)."""
        with self.lock.write():
            self._index.add(np.ascontiguousarray(vectors, dtype=np.float32))

    def write(self, slots: np.ndarray, vectors: np.ndarray) -> None:
        """Overwrite existing slots in place (an update, or a dead slot reused)."""
        if len(slots):
            with self.lock.write():
                self._view()[slots] = vectors

    def vectors(self, slots: np.ndarray) -> np.ndarray:
        with self.lock.read():
            return self._view()[slots].copy()

    def search(self, query: np.ndarray, k: int, bitmap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` slots by inner product among the slots set in ``bitmap`` (packed, little-endian)."""
        with self.lock.read():
            return self._search_cpu(query, k, bitmap)

    def _search_cpu(self, query: np.ndarray, k: int, bitmap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = self.ntotal
        k = min(k, n)
        if k <= 0:
            return np.empty(0, np.float32), np.empty(0, np.int64)
        bits = np.ascontiguousarray(bitmap[: (n + 7) // 8], dtype=np.uint8)
        selector = faiss.IDSelectorBitmap(n, faiss.swig_ptr(bits))
        scores, slots = self._index.search(
            query.reshape(1, -1).astype(np.float32), k, params=faiss.SearchParameters(sel=selector)
        )
        keep = slots[0] >= 0
        return scores[0][keep], slots[0][keep]

    def search_batch(
        self, queries: np.ndarray, k: int, masks: list[np.ndarray]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Exact top-``k`` per query among its own permitted slots (``masks``: bool per slot).

        One matrix product reads the stored vectors once for the whole batch: a flat scan is
        bound by memory bandwidth, so concurrent callers share that cost instead of paying it each.
        """
        with self.lock.read():
            n = self.ntotal
            scores = self._scores(np.ascontiguousarray(queries, dtype=np.float32)) if n else None
        out = []
        for j, mask in enumerate(masks):
            permitted = np.zeros(n, dtype=bool)
            permitted[: min(n, len(mask))] = mask[:n]
            if scores is None:
                out.append((np.empty(0, np.float32), np.empty(0, np.int64)))
                continue
            out.append(top_permitted(scores[:, j], permitted, k))
        return out

    def _scores(self, queries: np.ndarray) -> np.ndarray:
        """Every slot's inner product with each query: (ntotal, len(queries)); under the read lock."""
        return self._view() @ queries.T

    def refresh(self) -> None:
        """Bring derived copies up to date with the master (nothing to do on CPU)."""


class GpuFlatIndex(FlatIndex):
    """The CPU master plus a GPU ``GpuIndexFlatIP`` copy for broad searches."""

    device = "cuda"

    def __init__(self, dimension: int, *, fp16: bool) -> None:
        super().__init__(dimension)
        self.fp16 = fp16
        self._resources = faiss.StandardGpuResources()
        config = faiss.GpuIndexFlatConfig()
        config.useFloat16 = fp16
        self._gpu = faiss.GpuIndexFlatIP(self._resources, dimension, config)
        self._gpu_mutex = threading.Lock()  # GPU indexes (and their resources) are not thread-safe
        self._dirty = False

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.ntotal * self.dimension * (2 if self.fp16 else 4)

    def append(self, vectors: np.ndarray) -> None:
        super().append(vectors)
        self._dirty = True

    def write(self, slots: np.ndarray, vectors: np.ndarray) -> None:
        super().write(slots, vectors)
        self._dirty = self._dirty or bool(len(slots))

    def search_batch(
        self, queries: np.ndarray, k: int, masks: list[np.ndarray]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """One GPU search per query (each with its own bitmap): the GPU scan is already cheap."""
        return [
            self.search(q, k, np.packbits(m[: self.ntotal], bitorder="little"))
            for q, m in zip(queries, masks, strict=True)
        ]

    def refresh(self) -> None:
        """Rebuild the GPU copy from the master (a GPU flat index cannot rewrite a row in place)."""
        with self.lock.write():
            if not self._dirty:
                return
            self._gpu.reset()
            if self.ntotal:
                self._gpu.add(self._view())
            self._dirty = False

    def search(self, query: np.ndarray, k: int, bitmap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with self.lock.read():
            n = self.ntotal
            permitted = (
                int(np.unpackbits(bitmap[: (n + 7) // 8], bitorder="little", count=n).sum()) if n else 0
            )
            if self._dirty or permitted < GPU_MIN_DENSITY * n:
                return self._search_cpu(query, k, bitmap)
            # Broad scope: a full GPU scan, then the bitmap; widen k until enough permitted slots survive.
            fetch = min(GPU_MAX_K, n, max(k, int(np.ceil(k * n / max(permitted, 1) * 2))))
            while True:
                with self._gpu_mutex:
                    scores, slots = self._gpu.search(query.reshape(1, -1).astype(np.float32), fetch)
                scores, slots = scores[0], slots[0]
                valid = slots >= 0
                scores, slots = scores[valid], slots[valid]
                member = (bitmap[slots >> 3] >> (slots & 7).astype(np.uint8)) & 1 == 1
                if member.sum() >= min(k, permitted) or fetch >= min(GPU_MAX_K, n):
                    break
                fetch = min(GPU_MAX_K, n, fetch * 4)
            if member.sum() < min(k, permitted):  # the GPU's k limit was not enough: exact on the master
                return self._search_cpu(query, k, bitmap)
            return scores[member][:k], slots[member][:k]
