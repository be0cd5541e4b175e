"""A bounded mapping that forgets its least recently used entries first.

One definition for the small caches on Mnemo's request paths (query vectors, verified tokens, query
terms, scope bitmaps and decisions), each of which had its own ``OrderedDict`` bookkeeping.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["Lru"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    """At most ``capacity`` entries; a read or a write makes an entry the most recently used, and a
    write past ``capacity`` drops the least recently used. A capacity of 0 keeps nothing."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"an LRU's capacity is 0 or more, not {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        """The entry under ``key`` (now the most recently used), or None."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` under ``key`` as the most recently used entry."""
        if self.capacity == 0:
            return
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def replace(self, key: K, value: V) -> None:
        """Change an entry's value in place (its recency unchanged); a missing key is not added."""
        if key in self._entries:
            self._entries[key] = value

    def pop(self, key: K) -> V | None:
        return self._entries.pop(key, None)

    def items(self) -> list[tuple[K, V]]:
        """A snapshot of the entries, least recently used first."""
        return list(self._entries.items())

    def clear(self) -> None:
        self._entries.clear()
