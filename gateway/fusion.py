"""Fusion of the retrieval legs and collapsing to records: pure functions, no I/O.

:func:`score_fusion` (the default, ``dbsf``, or ``minmax``) fuses normalized scores, so
how far a hit stands above the rest of its leg counts; :func:`rrf` fuses ranks only.

Weighted Reciprocal Rank Fusion:
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

Properties (tests/test_fusion_properties.py), for both: invariant to list order;
an item first in every list is first; for RRF and min-max, monotone (raising an
item in one list never lowers its fused position); for score fusion, each leg's
scale does not matter.
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


@dataclass(frozen=True, slots=True)  # no __dict__: a search builds one per candidate
class Fused(Generic[K]):
    key: K
    score: float
    ranks: Mapping[str, int]  # 1-based rank in each list that holds the item

    @property
    def best_rank(self) -> int:
        return min(self.ranks.values())


def _fused_order(f: Fused[K]) -> tuple[float, int, K]:
    """Best first: fused score, then best single rank, then the key itself."""
    return (-f.score, f.best_rank, f.key)


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
            per_list = ranks.get(key)
            if per_list is None:
                ranks[key] = {name: position}
            elif name not in per_list:
                per_list[name] = position
    fused = []
    for key, per_list in ranks.items():
        terms = [
            (1.0 if weights is None else float(weights.get(n, 1.0))) / (k + r) for n, r in per_list.items()
        ]
        fused.append(Fused(key, math.fsum(terms), per_list))
    fused.sort(key=_fused_order)
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


NORMALIZATIONS = ("dbsf", "minmax")
DBSF_SIGMAS = 3.0


def score_fusion(
    lists: Mapping[str, Sequence[tuple[K, float]]],
    *,
    weights: Mapping[str, float] | None = None,
    normalize: str = "dbsf",
) -> list[Fused[K]]:
    """Fuse scored lists by normalized scores, summed with ``weights``, best first.

    Unlike RRF, how far an item stands above the rest of its list counts: a leg
    that is sure of its best hit (a BM25 score far above the others) outweighs a
    leg whose scores are all alike (a dense model that does not know the
    language). That is the per-query evidence the fusion adapts to; nothing is
    learned per collection.

    - ``dbsf`` (distribution-based score fusion): each list's scores are placed
      on its own mean +/- 3 standard deviations, mapped onto [0, 1] and clipped.
      A hit 3 sigma above its list's bulk counts fully; the bulk counts about
      half; an item a list did not return gets 0 from it. The mean and spread of
      a few hundred candidates are stable, unlike a min-max range whose floor is
      whatever the last over-fetched candidate scored.
    - ``minmax``: each list's minimum -> 0, maximum -> 1.

    A list whose scores are all equal (or a single item) maps them to 1. The scale
    of each leg (cosine, BM25 sums) does not matter: the ranking is unchanged by
    any positive affine change of one list's scores. Ties as in :func:`rrf`: best
    single rank, then key.
    """
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {NORMALIZATIONS}, not {normalize!r}")
    normalized: dict[K, dict[str, float]] = {}
    ranks: dict[K, dict[str, int]] = {}
    for name in sorted(lists):  # canonical order: the input order must not matter
        weight = _weight(weights, name)
        if weight == 0 or not lists[name]:
            continue
        rows = _first_occurrences(lists[name])
        unit = _unit_scores([score for _, score in rows], normalize)
        for position, ((key, _), value) in enumerate(zip(rows, unit, strict=True), start=1):
            per_list = ranks.get(key)
            if per_list is None:  # (no setdefault: it would build two throw-away dicts per known key)
                ranks[key] = {name: position}
                normalized[key] = {name: weight * value}
            else:
                per_list[name] = position
                normalized[key][name] = weight * value
    fused = [Fused(key, math.fsum(normalized[key].values()), ranks[key]) for key in normalized]
    fused.sort(key=_fused_order)
    return fused


def _first_occurrences(rows: Sequence[tuple[K, float]]) -> list[tuple[K, float]]:
    """A key repeated inside one list counts once, at its first (best) place."""
    seen: set[K] = set()
    out = []
    for key, score in rows:
        if key not in seen:
            seen.add(key)
            out.append((key, float(score)))
    return out


def _unit_scores(scores: Sequence[float], normalize: str) -> list[float]:
    if not all(math.isfinite(x) for x in scores):
        raise ValueError("scores must be finite")
    if normalize == "minmax":
        low, high = min(scores), max(scores)
    else:
        mean = math.fsum(scores) / len(scores)
        sigma = math.sqrt(math.fsum((x - mean) ** 2 for x in scores) / len(scores))
        low, high = mean - DBSF_SIGMAS * sigma, mean + DBSF_SIGMAS * sigma
    # Relative to the spread: a float-rounding spread is no spread (every score the same).
    if not high - low > 1e-9 * max(1.0, abs(high), abs(low)):
        return [1.0] * len(scores)
    return [min(1.0, max(0.0, (x - low) / (high - low))) for x in scores]


def _weight(weights: Mapping[str, float] | None, name: str) -> float:
    weight = 1.0 if weights is None else float(weights.get(name, 1.0))
    if weight < 0 or math.isnan(weight) or math.isinf(weight):
        raise ValueError(f"weight of {name!r} must be finite and >= 0")
    return weight
