"""A vector snapshot written from batches of rows in bounded memory (the vector writer's builds).

A snapshot holds its rows in the order of their encoded keys (:mod:`index.vectors.slot_keys`: JSON
bytes, where section 12 sorts before section 2), while the store is read in its own key order, so
the rows are sorted on the way, as an external sort does: each batch read is sorted and written as
a *run* (its encoded keys and its unit vectors, in a ``runs`` folder inside the snapshot's folder),
then :meth:`SnapshotBuilder.finish` merges the runs into the snapshot's two files, holding at most
:data:`MERGE_ROWS` rows of all the runs at a time, and writes the state file last.

The writer's memory is then one batch and the merge's window, whatever the partition's size (it
held every vector and a Python key per row before: 1.0 GiB at 300k x 384); the price is writing the
vectors twice. Files are read and written with plain reads and writes, never mapped, so the pages
they pass through stay the page cache's, not the writer's.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from index.follow.swap_folders import fsync_path
from index.store.change_feed import RowKey, Watermark
from index.store.partitions import ModelPartition
from index.vectors.files import KEYS_FILE, VECTORS_FILE, SnapshotState, write_state
from index.vectors.slot_keys import encode_keys

__all__ = ["MERGE_ROWS", "SnapshotBuilder"]

MERGE_ROWS = 32_768  # rows of all the runs held while merging (at 384 dimensions: about 50 MiB)
RUNS = "runs"


@dataclass
class _Run:
    """One sorted batch on disk: ``rows`` keys of ``width`` bytes, and their vectors."""

    keys: Path
    vectors: Path
    rows: int
    width: int


class _RunReader:
    """A run's rows in order, a window at a time, read from its files (not mapped)."""

    def __init__(self, run: _Run, dimension: int, width: int) -> None:
        self.run, self.dimension, self.width = run, dimension, width
        self.next = 0  # the first row not read yet
        self.keys = np.zeros(0, dtype=f"S{width}")
        self.vectors = np.zeros((0, dimension), dtype=np.float32)

    @property
    def exhausted(self) -> bool:
        """Every row of the run is in the window (none left on disk)."""
        return self.next >= self.run.rows

    def fill(self, rows: int) -> None:
        """Read until the window holds ``rows`` rows (or the run's rest)."""
        take = min(rows - len(self.keys), self.run.rows - self.next)
        if take <= 0:
            return
        keys = _read(self.run.keys, self.next * self.run.width, take * self.run.width)
        vectors = _read(self.run.vectors, self.next * self.dimension * 4, take * self.dimension * 4)
        self.keys = np.concatenate(
            [self.keys, np.frombuffer(keys, dtype=f"S{self.run.width}").astype(f"S{self.width}")]
        )
        self.vectors = np.concatenate(
            [self.vectors, np.frombuffer(vectors, dtype=np.float32).reshape(take, self.dimension)]
        )
        self.next += take

    def take(self, bound: bytes | None) -> tuple[np.ndarray, np.ndarray]:
        """The window's rows whose key is at most ``bound`` (None: all of them), removed from it."""
        cut = len(self.keys) if bound is None else int(np.searchsorted(self.keys, bound, side="right"))
        keys, vectors = self.keys[:cut], self.vectors[:cut]
        self.keys, self.vectors = self.keys[cut:], self.vectors[cut:]
        return keys, vectors


def _read(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(size)
    if len(data) != size:
        raise OSError(f"{path}: {len(data)} bytes at {offset}, {size} expected")
    return data


class SnapshotBuilder:
    """Writes one snapshot into ``folder`` (empty, not swapped in) from batches in any order."""

    def __init__(self, folder: Path, partition: ModelPartition, merge_rows: int = MERGE_ROWS) -> None:
        self.folder, self.partition, self.merge_rows = folder, partition, merge_rows
        self.runs: list[_Run] = []
        (folder / RUNS).mkdir()

    def add(self, keys: Sequence[RowKey], vectors: np.ndarray) -> None:
        """One batch: its vectors at unit length, sorted by encoded key, written as a run."""
        if not keys:
            return
        vectors = np.asarray(vectors, dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
        encoded = encode_keys(keys)
        order = np.argsort(encoded, kind="stable")
        number = len(self.runs)
        run = _Run(
            self.folder / RUNS / f"{number}.keys",
            self.folder / RUNS / f"{number}.f32",
            len(keys),
            encoded.dtype.itemsize,
        )
        run.keys.write_bytes(encoded[order].tobytes())
        run.vectors.write_bytes(np.ascontiguousarray(vectors[order]).tobytes())
        self.runs.append(run)

    def finish(self, watermark: Watermark, store: str) -> SnapshotState:
        """Merge the runs into the snapshot's files (fsynced), remove them, write the state file last."""
        rows = sum(r.rows for r in self.runs)
        width = max((r.width for r in self.runs), default=1)
        with open(self.folder / VECTORS_FILE, "wb") as vectors, open(self.folder / KEYS_FILE, "wb") as keys:
            header = {"descr": np.dtype(f"S{width}").str, "fortran_order": False, "shape": (rows,)}
            np.lib.format.write_array_header_1_0(keys, header)
            self._merge(vectors, keys, width)
        for name in (VECTORS_FILE, KEYS_FILE):
            fsync_path(self.folder / name)
        shutil.rmtree(self.folder / RUNS)
        state = SnapshotState(self.partition.model, self.partition.dimension, rows, watermark, store)
        write_state(self.folder, state)
        return state

    def _merge(self, vectors_out: BinaryIO, keys_out: BinaryIO, width: int) -> None:
        """The runs' rows in key order: every round takes, from each run's window, the rows up to the
        smallest last key among the windows that do not hold their run's end (no row of any run
        can come before those), sorts them together and writes them."""
        readers = [_RunReader(r, self.partition.dimension, width) for r in self.runs]
        window = max(1, self.merge_rows // max(1, len(readers)))
        while readers:
            for reader in readers:
                reader.fill(window)
            open_ends = [r.keys[-1] for r in readers if not r.exhausted]
            bound = min(open_ends) if open_ends else None
            taken = [r.take(bound) for r in readers]
            keys = np.concatenate([k for k, _ in taken])
            order = np.argsort(keys, kind="stable")
            keys_out.write(keys[order].tobytes())
            vectors_out.write(np.concatenate([v for _, v in taken])[order].tobytes())
            readers = [r for r in readers if len(r.keys) or not r.exhausted]
