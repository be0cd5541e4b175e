"""The one vocabulary of a partition's index folder: what ``/readyz``, the console's operations page,
``mnemo lexical status`` and ``mnemo vectors status`` say of a lexical index or a vector snapshot.

- ``ready``: its current folder was written from this store, in the layout its readers read, and is
  at most ``max_behind`` changes behind the store.
- ``building``: no current folder yet, and a build is writing one (a ``v-<n>`` folder without the
  ``current`` link: :mod:`index.follow.swap_folders`). A rebuild beside a current folder leaves the
  partition in that folder's state until it is swapped in.
- ``behind``: as ready, but more than ``max_behind`` changes behind the store: its writer is stopped
  or cannot keep up. The lexical engine leaves such a partition to the SQL leg (every change past
  the watermark is re-read by every search); a mapped vector snapshot still serves, each reader
  applying the changes since it in its own memory.
- ``missing``: no folder and no build: nothing was ever built, or it was removed.
- ``foreign``: its current folder was written from another store (a reset database, another
  deployment's folder: its watermark numbers other changes) or, for a lexical index, in another
  format. Never read; its writer rebuilds it.

What a partition's folder holds is read by its kind's ``describe`` (:func:`index.lexical.files.describe`,
:func:`index.vectors.files.describe`); :func:`folder_reports` joins that with the store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg

from index.follow.swap_folders import current_folder, partition_folder
from index.store.change_feed import current_watermark, store_identity
from index.store.partitions import ModelPartition

__all__ = [
    "BEHIND",
    "BUILDING",
    "FOREIGN",
    "MISSING",
    "READY",
    "STATES",
    "Describe",
    "folder_reports",
    "folder_state",
    "too_far_behind",
]

READY = "ready"
BUILDING = "building"
BEHIND = "behind"
MISSING = "missing"
FOREIGN = "foreign"
STATES = (READY, BUILDING, BEHIND, MISSING, FOREIGN)

# A folder's own account, given this store's identity: None without a finished one, else at least
# its watermark's ``seq`` and whether it is ``foreign``, and what else its kind shows.
Describe = Callable[[Path, str], "dict[str, Any] | None"]


def too_far_behind(behind: int, max_behind: int) -> bool:
    """A folder ``behind`` changes behind the store is ``behind`` (the lexical engine's test too)."""
    return behind > max_behind


def folder_state(*, current: bool, building: bool, foreign: bool, behind: int, max_behind: int) -> str:
    """The state of a partition's folder from what is known of it (see the module's vocabulary)."""
    if not current:
        return BUILDING if building else MISSING
    if foreign:
        return FOREIGN
    return BEHIND if too_far_behind(behind, max_behind) else READY


def _building(root: Path, partition: ModelPartition) -> bool:
    """A version folder exists (a build writes into one before the first swap names it)."""
    try:
        return any(p.name.startswith("v-") for p in partition_folder(root, partition).iterdir())
    except FileNotFoundError:
        return False


async def folder_reports(
    conn: asyncpg.Connection,
    root: Path,
    partitions: Sequence[ModelPartition],
    describe: Describe,
    max_behind: int,
) -> dict[str, dict[str, Any]]:
    """Each partition's folder under ``root``: its ``state``, the store's latest change
    (``store_seq``) and, for a finished folder, where it is, its ``seq``, how many changes it is
    ``behind`` and what ``describe`` read of it."""
    store = await store_identity(conn)
    out: dict[str, dict[str, Any]] = {}
    for partition in partitions:
        folder = current_folder(root, partition)
        found = None if folder is None else describe(folder, store)
        head = (await current_watermark(conn, partition)).seq
        if found is None:
            state = folder_state(
                current=False,
                building=_building(root, partition),
                foreign=False,
                behind=0,
                max_behind=max_behind,
            )
            out[partition.partition] = {"state": state, "store_seq": head}
            continue
        behind = max(0, head - found["seq"])
        foreign = found.pop("foreign")
        state = folder_state(
            current=True, building=False, foreign=foreign, behind=behind, max_behind=max_behind
        )
        out[partition.partition] = {
            "state": state,
            "folder": str(folder),
            **found,
            "store_seq": head,
            "behind": behind,
        }
    return out
