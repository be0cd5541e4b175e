"""A partition's key <-> slot maps over a mapped snapshot, without a Python object per row.

A snapshot (:mod:`index.vectors.files`) holds its keys as one sorted array of encoded keys, slot
``i`` holding the ``i``-th: a lookup is a binary search, a record's slots one range of it (every
key of a record shares the encoded record as a prefix). A dict of a million row keys would cost
each gateway worker ~150+ MiB of heap; the mapped array is shared by every worker instead.

What the change feed does after the snapshot lives in small overlays, so :class:`SlotOf`,
:class:`KeyOf` and :class:`RecordSlots` stand in for the dict, list and dict of sets that
:class:`index.vectors.partition.PartitionCache` keeps for a cache loaded from the store:

- :class:`SlotOf`: key -> slot; keys set since the snapshot, and the snapshot's keys since forgotten;
- :class:`KeyOf`: slot -> key; slots rewritten or appended since the snapshot;
- :class:`RecordSlots`: a record's slots, taken from the snapshot the first time the cache touches
  the record (every change of a record's slots goes through ``get``/``setdefault`` first, so a
  record untouched since the snapshot has exactly the snapshot's slots).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, MutableMapping, Sequence

import numpy as np

from index.store.change_feed import RowKey

__all__ = ["KeyOf", "RecordSlots", "SlotOf", "SnapshotKeys", "encode_keys"]

Record = tuple[str, int]


def _encoded(key: Sequence[object]) -> bytes:
    # ASCII JSON: unambiguous whatever the texts hold, ordered bytewise, and never a 0xff byte (the
    # upper bound of a prefix range below).
    return json.dumps(list(key), separators=(",", ":")).encode("ascii")


def encode_keys(keys: Sequence[RowKey]) -> np.ndarray:
    """Keys as a fixed-width bytes array (numpy ``S``), comparable bytewise as the snapshot sorts them."""
    return np.asarray([_encoded(k) for k in keys], dtype=bytes) if keys else np.zeros(0, dtype="S1")


class SnapshotKeys:
    """The sorted encoded keys of a snapshot (mapped): slot ``i`` holds ``keys[i]``."""

    def __init__(self, keys: np.ndarray) -> None:
        self.keys = keys

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, key: RowKey) -> int | None:
        encoded = _encoded(key)
        if len(encoded) > self.keys.dtype.itemsize:  # longer than any key stored: absent
            return None
        needle = np.asarray(encoded, dtype=self.keys.dtype)
        i = int(np.searchsorted(self.keys, needle))
        return i if i < len(self.keys) and self.keys[i] == needle else None

    def key(self, slot: int) -> RowKey:
        raw = json.loads(bytes(self.keys[slot]))
        return (raw[0], raw[1], raw[2], raw[3], raw[4], raw[5])

    def record(self, record: Record) -> range:
        """The slots of every key of ``record`` (a contiguous range: its keys sort together)."""
        prefix = _encoded(record)[:-1] + b","
        lo = int(np.searchsorted(self.keys, np.asarray(prefix, dtype=f"S{len(prefix)}")))
        hi = int(np.searchsorted(self.keys, np.asarray(prefix + b"\xff", dtype=f"S{len(prefix) + 1}")))
        return range(lo, hi)

    def __iter__(self) -> Iterator[RowKey]:
        return (self.key(i) for i in range(len(self.keys)))


class SlotOf(MutableMapping[RowKey, int]):
    """key -> slot: the snapshot's, less what was forgotten, plus what was set since."""

    def __init__(self, base: SnapshotKeys) -> None:
        self.base = base
        self.overlay: dict[RowKey, int] = {}
        self.gone: set[RowKey] = set()  # snapshot keys forgotten (or set anew, in the overlay)

    def __getitem__(self, key: RowKey) -> int:
        slot = self.overlay.get(key)
        if slot is None and key not in self.gone:
            slot = self.base.find(key)
        if slot is None:
            raise KeyError(key)
        return slot

    def __setitem__(self, key: RowKey, slot: int) -> None:
        self.overlay[key] = slot

    def __delitem__(self, key: RowKey) -> None:
        self[key]  # a KeyError when absent, as a dict's
        self.overlay.pop(key, None)
        self.gone.add(key)

    def __iter__(self) -> Iterator[RowKey]:
        yield from self.overlay
        for key in self.base:
            if key not in self.gone and key not in self.overlay:
                yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def slots(self, keys: Iterable[RowKey]) -> list[int]:
        """The slots of those ``keys`` that have one."""
        out = []
        for key in keys:
            slot = self.get(key)
            if slot is not None:
                out.append(slot)
        return out


class KeyOf:
    """slot -> key (None: a dead slot): the snapshot's slots, then what was written or appended."""

    def __init__(self, base: SnapshotKeys) -> None:
        self.base = base
        self.overlay: dict[int, RowKey | None] = {}
        self.size = len(base)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, slot: int) -> RowKey | None:
        if slot in self.overlay:
            return self.overlay[slot]
        if 0 <= slot < len(self.base):
            return self.base.key(slot)
        if slot < self.size:
            return None
        raise IndexError(slot)

    def __setitem__(self, slot: int, key: RowKey | None) -> None:
        if not 0 <= slot < self.size:
            raise IndexError(slot)
        self.overlay[slot] = key

    def extend(self, keys: Iterable[RowKey | None]) -> None:
        for key in keys:
            self.size += 1
            if key is not None:
                self.overlay[self.size - 1] = key


class RecordSlots:
    """record -> its slots (a set the cache mutates), taken from the snapshot on first touch."""

    def __init__(self, base: SnapshotKeys) -> None:
        self.base = base
        self.overlay: dict[Record, set[int]] = {}
        self.gone: set[Record] = set()  # records whose every key was forgotten

    def get(self, record: Record, default: Iterable[int] | None = None) -> set[int] | Iterable[int] | None:
        found = self.overlay.get(record)
        if found is None and record not in self.gone:
            slots = self.base.record(record)
            if len(slots):
                found = self.overlay[record] = set(slots)
        return default if found is None else found

    def setdefault(self, record: Record, default: set[int]) -> set[int]:
        found = self.get(record)
        if isinstance(found, set):
            return found
        self.gone.discard(record)
        self.overlay[record] = default
        return default

    def __delitem__(self, record: Record) -> None:
        self.overlay.pop(record, None)
        self.gone.add(record)
