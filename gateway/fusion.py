"""Weighted Reciprocal Rank Fusion and collapsing to records: pure functions, no I/O.

An item's fused score is ``sum over lists of weight / (k + rank)`` (rank
1-based, ``k`` = 60 by default; an item first in two lists of weight 1 scores
``2/61``, as in the archive). Departures from the archive's ``fuse()``, on
purpose:

- Lists are *named* (``dense``, ``lexical``, ``sparse``...) and weighted.
- The result does not depend on the order the lists are given in. The archive
  breaks ties by first-seen order (earlier list, then earlier rank), which
  changes with that order; here ties fall to the best single rank, then to the
  item key itself, and scores are summed exactly rounded (``math.fsum``), so a
  tie is a tie whatever the summation order.

Properties (tests/test_fusion_properties.py): invariant to list order;
monotone (raising an item in one list never lowers its fused position); an item
first in every list is first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)  # keys must also be mutually orderable (tie-break)
T = TypeVar("T")
G = TypeVar("G", bound=Hashable)

DEFAULT_K = 60


@dataclass(frozen=True)
class Fused(Generic[K]):
    key: K
    score: float
    ranks: Mapping[str, int]  # 1-based rank in each list that holds the item

    @property
    def best_rank(self) -> int:
        return min(self.ranks.values())


def rrf(
    lists: Mapping[str, Sequence[K]],
    *,
    k: int = DEFAULT_K,
    weights: Mapping[str, float] | None = None,
) -> list[Fused[K]]:
    """Fuse ranked lists of keys into one ranking, best first.

    A key repeated inside one list counts at its first (best) rank. Lists with
    weight 0 (a leg switched off) contribute nothing, not even tie-breaks.
    """
    if k < 0:
        raise ValueError("k must be >= 0")
    ranks: dict[K, dict[str, int]] = {}
    for name in sorted(lists):  # canonical order: the input order must not matter
        weight = 1.0 if weights is None else float(weights.get(name, 1.0))
        if weight < 0 or math.isnan(weight):
            raise ValueError(f"weight of {name!r} must be >= 0")
        if weight == 0:
            continue
        for position, key in enumerate(lists[name], start=1):
            ranks.setdefault(key, {}).setdefault(name, position)
    fused = []
    for key, per_list in ranks.items():
        terms = [
            (1.0 if weights is None else float(weights.get(n, 1.0))) / (k + r) for n, r in per_list.items()
        ]
        fused.append(Fused(key, math.fsum(terms), per_list))
    fused.sort(key=lambda f: (-f.score, f.best_rank, f.key))
    return fused


def collapse(items: Iterable[T], group_of: Callable[[T], G]) -> list[T]:
    """Keep the first (best) item of each group, in order: chunks -> best chunk per record."""
    seen: set[G] = set()
    out = []
    for item in items:
        group = group_of(item)
        if group not in seen:
            seen.add(group)
            out.append(item)
    return out


def score_fusion(
    lists: Mapping[str, Sequence[tuple[K, float]]],
    *,
    weights: Mapping[str, float] | None = None,
) -> list[Fused[K]]:
    """Fuse scored lists by their min-max normalized scores, summed with ``weights``, best first.

    Each list's scores are mapped onto [0, 1] by its own minimum and maximum (a list
    whose scores are all equal maps them to 1); an item a list did not return gets 0
    from it. Unlike RRF, how far an item stands above the rest of its list counts, so
    a leg that is sure of its best hit (a BM25 score far above the next) outweighs a
    leg whose scores are all alike (a dense leg that does not know the language).
    The scale of each leg (cosine, BM25 sums) does not matter: the ranking is
    unchanged by any positive affine change of one list's scores. Ties as in
    :func:`rrf`: best single rank, then key.
    """
    normalized: dict[K, dict[str, float]] = {}
    ranks: dict[K, dict[str, int]] = {}
    for name in sorted(lists):
        weight = _weight(weights, name)
        if weight == 0 or not lists[name]:
            continue
        scores = [float(score) for _, score in lists[name]]
        if not all(math.isfinite(x) for x in scores):
            raise ValueError(f"list {name!r} has a score that is not finite")
        high, low = max(scores), min(scores)
        for position, (key, score) in enumerate(lists[name], start=1):
            if name in ranks.setdefault(key, {}):
                continue  # a key repeated inside one list counts at its first (best) rank
            ranks[key][name] = position
            unit = (float(score) - low) / (high - low) if high > low else 1.0
            normalized.setdefault(key, {})[name] = weight * unit
    fused = [Fused(key, math.fsum(normalized[key].values()), ranks[key]) for key in normalized]
    fused.sort(key=lambda f: (-f.score, f.best_rank, f.key))
    return fused


def _weight(weights: Mapping[str, float] | None, name: str) -> float:
    weight = 1.0 if weights is None else float(weights.get(name, 1.0))
    if weight < 0 or math.isnan(weight) or math.isinf(weight):
        raise ValueError(f"weight of {name!r} must be finite and >= 0")
    return weight
