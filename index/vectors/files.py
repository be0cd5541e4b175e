"""The CPU vector cache's snapshots on disk: one writer writes them, every gateway worker maps them.

Layout under the vector folder (``RAG_VECTOR_DIR``, default ``$RAG_DATA_DIR/vectors``), one folder
per model partition, swapped as the lexical indexes are (:mod:`index.follow.swap_folders`)::

    <root>/<partition>/current -> v-<n>
    <root>/<partition>/v-<n>/vectors.f32    n x d float32, L2-normalized, slot i = the i-th key
    <root>/<partition>/v-<n>/keys.npy       n encoded row keys, sorted (index.vectors.slot_keys)
    <root>/<partition>/v-<n>/snapshot.json  the watermark the rows are consistent with, n, d, and
                                             the store that numbered it (a snapshot of another
                                             store is never mapped: the writer rebuilds it)

Every slot of a snapshot is live (the writer compacts), in key order, so the keys file is both
slot -> key and, by binary search, key -> slot. ``snapshot.json`` is written last, after the two
data files are fsynced, and the folder is swapped in only then: a folder without it is not a
snapshot, and a reader never maps a half-written one. :mod:`index.vectors.snapshot_build` writes
them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from index.follow.swap_folders import current_folder, write_json_atomically
from index.store.change_feed import Watermark
from index.store.partitions import ModelPartition
from index.vectors.slot_keys import SnapshotKeys

__all__ = [
    "STATE_FILE",
    "Snapshot",
    "SnapshotState",
    "describe",
    "open_current",
    "read_state",
    "write_state",
]

VECTORS_FILE = "vectors.f32"
KEYS_FILE = "keys.npy"
STATE_FILE = "snapshot.json"


@dataclass(frozen=True)
class SnapshotState:
    """What a snapshot holds: ``rows`` vectors of ``dimension``, every change up to ``watermark`` of
    the store named ``store`` (:func:`index.store.change_feed.store_identity`; empty: a snapshot written
    before it was recorded, rebuilt)."""

    model: str
    dimension: int
    rows: int
    watermark: Watermark
    store: str = ""


@dataclass(frozen=True)
class Snapshot:
    """A mapped snapshot: its vectors (copy-on-write) and keys (read-only), shared by every mapper."""

    folder: Path
    state: SnapshotState
    vectors: np.ndarray
    keys: SnapshotKeys


def read_state(folder: Path) -> SnapshotState | None:
    """A snapshot folder's state file; None when there is none (never completed)."""
    try:
        raw = json.loads((folder / STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    return SnapshotState(
        raw["model"],
        int(raw["dimension"]),
        int(raw["rows"]),
        Watermark(int(raw["seq"]), int(raw["xmin"])),
        str(raw.get("store", "")),
    )


def write_state(folder: Path, state: SnapshotState) -> None:
    """The state file that makes ``folder`` a snapshot: written last, atomically."""
    write_json_atomically(
        folder / STATE_FILE,
        {
            "model": state.model,
            "dimension": state.dimension,
            "rows": state.rows,
            "seq": state.watermark.seq,
            "xmin": state.watermark.xmin,
            "store": state.store,
        },
    )


def describe(folder: Path, store: str) -> dict[str, Any] | None:
    """What ``folder`` holds, for :func:`index.follow.folder_state.folder_reports`: its watermark,
    vectors and dimension, and whether it is another store's (``foreign``: readers never map it)."""
    state = read_state(folder)
    if state is None:
        return None
    return {
        "seq": state.watermark.seq,
        "vectors": state.rows,
        "dimension": state.dimension,
        "foreign": state.store != store,
    }


def _open(folder: Path) -> Snapshot | None:
    state = read_state(folder)
    if state is None:
        return None
    if state.rows == 0:  # an empty file cannot be mapped
        return Snapshot(
            folder, state, np.zeros((0, state.dimension), np.float32), SnapshotKeys(np.zeros(0, "S1"))
        )
    # Copy-on-write: a write to a slot (an update from the feed) copies that page for this process
    # alone; the file and every other mapper's pages stay as they were.
    vectors = np.memmap(
        folder / VECTORS_FILE, dtype=np.float32, mode="c", shape=(state.rows, state.dimension)
    )
    keys = np.load(folder / KEYS_FILE, mmap_mode="r")
    if len(keys) != state.rows:
        raise ValueError(f"vector snapshot {folder}: {len(keys)} keys for {state.rows} vectors")
    return Snapshot(folder, state, vectors, SnapshotKeys(keys))


def open_current(root: Path, partition: ModelPartition) -> Snapshot | None:
    """Map the partition's current snapshot; None when it has none.

    The writer removes a snapshot's folder once it swapped the next one in: a reader that resolved
    the old link just before then finds its files gone, and resolves the link again.
    """
    for _ in range(5):
        folder = current_folder(root, partition)
        if folder is None:
            return None
        try:
            return _open(folder)
        except FileNotFoundError:
            continue
    raise RuntimeError(f"vector snapshot of {partition.partition}: swapped away under every open")
