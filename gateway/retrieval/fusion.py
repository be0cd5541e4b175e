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

import itertools
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Generic, NamedTuple, TypeVar

K = TypeVar("K", bound=Hashable)  # keys must also be mutually orderable (tie-break)
T = TypeVar("T")
G = TypeVar("G", bound=Hashable)

DEFAULT_K = 60


class Fused(NamedTuple, Generic[K]):
    """One fused item. A tuple, not a dataclass: a search builds one per candidate (about 80), and
    the gateway's CPU per request is a goal of its own (issue 27)."""

    key: K
    score: float
    ranks: Mapping[str, int]  # 1-based rank in each list that holds the item
    best_rank: int  # the best (smallest) of ``ranks``


_new_tuple = tuple.__new__


def _exact_sum(terms: list[float]) -> float:
    """``math.fsum(terms)``: one or two terms need no compensation (a single IEEE addition is
    already the correctly rounded sum), so the common case skips the call."""
    n = len(terms)
    if n == 1:
        return terms[0]
    if n == 2:
        return terms[0] + terms[1]
    return math.fsum(terms)


def _ranked_fusion(accumulated: dict[K, list]) -> list[Fused[K]]:
    """``[ranks, terms, best rank]`` per key -> :class:`Fused`, best first: fused score, then best
    single rank, then the key itself (unique, so the ranks are never compared)."""
    order = [(-_exact_sum(terms), best, key, ranks) for key, (ranks, terms, best) in accumulated.items()]
    order.sort()
    return [_new_tuple(Fused, (key, -neg, ranks, best)) for neg, best, key, ranks in order]


def _accumulate(accumulated: dict[K, list], name: str, placed: Iterable[tuple[int, K, float]]) -> None:
    """Add one list's ``(1-based position, key, term)`` entries, each key once per list."""
    for position, key, term in placed:
        entry = accumulated.get(key)
        if entry is None:  # (no setdefault: it would build throw-away objects per known key)
            accumulated[key] = [{name: position}, [term], position]
        else:
            entry[0][name] = position
            entry[1].append(term)
            if position < entry[2]:
                entry[2] = position


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
    accumulated: dict[K, list] = {}
    for name in sorted(lists):  # canonical order: the input order must not matter
        weight = 1.0 if weights is None else float(weights.get(name, 1.0))
        if weight < 0 or math.isnan(weight):
            raise ValueError(f"weight of {name!r} must be >= 0")
        if weight == 0:
            continue
        first: dict[K, int] = {}
        for position, key in enumerate(lists[name], start=1):
            first.setdefault(key, position)  # a repeated key counts at its first (best) rank
        _accumulate(accumulated, name, ((r, key, weight / (k + r)) for key, r in first.items()))
    return _ranked_fusion(accumulated)


def collapse(items: Iterable[T], group_of: Callable[[T], G], limit: int | None = None) -> list[T]:
    """Keep the first (best) item of each group, in order, the first ``limit`` groups at most:
    chunks -> best chunk per record."""
    seen: set[G] = set()
    out: list[T] = []
    if limit is not None and limit <= 0:
        return out
    for item in items:
        group = group_of(item)
        if group not in seen:
            seen.add(group)
            out.append(item)
            if len(out) == limit:
                break
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
    accumulated: dict[K, list] = {}
    for name in sorted(lists):  # canonical order: the input order must not matter
        weight = _weight(weights, name)
        if weight == 0 or not lists[name]:
            continue
        keys, scores = _first_occurrences(lists[name])
        terms = [weight * value for value in _unit_scores(scores, normalize)]
        _accumulate(accumulated, name, zip(itertools.count(1), keys, terms))
    return _ranked_fusion(accumulated)


def _first_occurrences(rows: Sequence[tuple[K, float]]) -> tuple[list[K], list[float]]:
    """A key repeated inside one list counts once, at its first (best) place: its keys and scores."""
    best: dict[K, float] = {}
    for key, score in rows:
        if key not in best:
            best[key] = float(score)
    return list(best), list(best.values())


def _unit_scores(scores: Sequence[float], normalize: str) -> list[float]:
    if not all(map(math.isfinite, scores)):
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
    span = high - low
    return [min(1.0, max(0.0, (x - low) / span)) for x in scores]


def _weight(weights: Mapping[str, float] | None, name: str) -> float:
    weight = 1.0 if weights is None else float(weights.get(name, 1.0))
    if weight < 0 or math.isnan(weight) or math.isinf(weight):
        raise ValueError(f"weight of {name!r} must be finite and >= 0")
    return weight
