"""Folders on disk that one writer replaces atomically while many processes read them.

The lexical leg's Tantivy indexes (:mod:`index.lexical.files`) and the CPU vector snapshots
(:mod:`index.vectors.files`) share this layout, one folder per model partition::

    <root>/<partition>/current -> v-<n>   a symlink, replaced atomically by a swap
    <root>/<partition>/v-<n>/              one complete version (written, fsynced, then swapped in)
    <root>/<partition>/writer.lock         held (flock) by the one writer of the partition
    <root>/writer.lock                     held by a running follower (one per root)

A reader resolves ``current`` once and keeps what it opened (mapped files stay readable after the
writer unlinks the old version) until it sees the link name another folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from index.store.partitions import ModelPartition

__all__ = [
    "WriterLocked",
    "current_folder",
    "fsync_path",
    "new_folder",
    "partition_folder",
    "swap_in",
    "write_json_atomically",
    "writer_lock",
]

CURRENT = "current"
LOCK_FILE = "writer.lock"


class WriterLocked(RuntimeError):
    """Another process holds a partition's writer lock (one writer per index)."""


def fsync_path(path: Path) -> None:
    """Flush a file's data, or a folder's entries (a rename or a new link in it), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomically(path: Path, content: Mapping[str, Any]) -> None:
    """Replace ``path`` with ``content`` (temporary file, fsync, rename, fsync the folder): a reader
    sees the old file or the new one, never a torn one, and a crash keeps one of the two."""
    tmp = path.parent / f".{path.name}.tmp"
    with open(tmp, "w") as out:
        json.dump(content, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def partition_folder(root: Path, partition: ModelPartition) -> Path:
    return root / partition.partition


def current_folder(root: Path, partition: ModelPartition) -> Path | None:
    """The folder the partition's ``current`` link names; None before the first swap."""
    link = partition_folder(root, partition) / CURRENT
    try:
        target = os.readlink(link)
    except FileNotFoundError:
        return None
    return link.parent / target


def new_folder(root: Path, partition: ModelPartition) -> Path:
    """A fresh, empty version folder beside the current one (a rebuild's target)."""
    base = partition_folder(root, partition)
    base.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name[2:]) for p in base.glob("v-*") if p.name[2:].isdigit()]
    folder = base / f"v-{max(taken, default=0) + 1}"
    folder.mkdir()
    return folder


def swap_in(root: Path, partition: ModelPartition, folder: Path) -> Path | None:
    """Point ``current`` at ``folder`` atomically (a new link renamed over the old); returns the
    folder it named before. Readers holding the old one keep reading its files until they reopen."""
    base = partition_folder(root, partition)
    old = current_folder(root, partition)
    tmp = base / f".{CURRENT}.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(folder.name, tmp)
    os.replace(tmp, base / CURRENT)
    fsync_path(base)
    return old


@contextlib.contextmanager
def writer_lock(folder: Path, writer: str = "`mnemo lexical follow` or rebuild") -> Iterator[None]:
    """Hold the writer lock of ``folder`` (a partition's, or a whole root's for a follower);
    released when the process dies, however it dies. ``writer`` names the command in the error."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WriterLocked(
                f"another writer holds {folder / LOCK_FILE} (a running {writer}): one writer per index"
            ) from None
        yield
    finally:
        os.close(fd)
