"""A small LRU cache of query vectors, keyed by caller, model and normalized query text.

Researchers and UIs repeat queries (paging, facet changes, retries); a cached
vector skips the sidecar round trip. Normalization is conservative (Unicode
NFC, whitespace collapsed) so two strings share a vector only when the model
would see the same input.

The caller is part of the key: a shared cache would let one researcher learn,
from a fast answer (a hit), that someone else asked the same question. With
the caller in the key a hit only ever reveals the caller's own past queries.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np

from index.lru import Lru


@dataclass(frozen=True)
class QueryVector:
    dense: np.ndarray  # float32, L2-normalized, shape (dimension,)
    sparse: dict[int, float] | None  # learned-sparse weights, when the model gives them


def normalize_query(text: str) -> str:
    return " ".join(unicodedata.normalize("NFC", text).split())


class QueryVectorCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: Lru[tuple[str, str, str], QueryVector] = Lru(max(0, capacity))

    def __len__(self) -> int:
        return len(self._items)

    def get(self, model: str, query: str, *, owner: str) -> QueryVector | None:
        """The cached vector of ``owner``'s ``query`` (``owner``: the caller's subject)."""
        return self._items.get((owner, model, normalize_query(query)))

    def put(self, model: str, query: str, vector: QueryVector, *, owner: str) -> None:
        self._items.put((owner, model, normalize_query(query)), vector)
