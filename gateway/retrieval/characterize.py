"""Characterization math: proposals for an object's roles from its weighted neighbours (pure, no I/O).

- :func:`categorical_vote` (typology, material, denomination): each neighbour's
  weight is split evenly over its values and summed per value; the winner is
  the largest sum (ties: the value met first, i.e. from the better-ranked
  neighbour); confidence is the winner's share of the total weight.
- :func:`date_summary` (period): earliest = smallest ``from``, latest =
  largest ``to``; the central estimate is the weighted median of the range
  midpoints (so one outlier cannot drag it); confidence is
  ``max(0, 1 - (max midpoint - min midpoint) / max(1, latest - earliest))``:
  neighbours that agree on a date give a confidence near 1.

Both return the evidence: the supporting neighbours with the largest weights
(at most :data:`EVIDENCE`), best first. Neighbours of weight 0 or less carry
no vote. Nothing here is generative: every proposal is a sum over real
neighbours, so it can be checked by reading its evidence.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EVIDENCE",
    "CategoricalProposal",
    "DateProposal",
    "Vote",
    "categorical_vote",
    "date_range",
    "date_summary",
    "terms",
]

EVIDENCE = 8


@dataclass(frozen=True)
class Vote:
    """One neighbour's say on a role: who (``key``), how much (``weight``), what (``value``)."""

    key: Hashable
    weight: float
    value: Any


@dataclass(frozen=True)
class CategoricalProposal:
    value: str
    confidence: float
    distribution: tuple[tuple[str, float], ...]  # (value, share), largest share first
    evidence: tuple[Vote, ...]


@dataclass(frozen=True)
class DateProposal:
    earliest: float
    latest: float
    central: float
    confidence: float
    evidence: tuple[Vote, ...]


def terms(value: Any) -> list[str]:
    """A categorical value as its distinct non-empty terms (a list votes for each of its terms)."""
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        if isinstance(item, bool) or item is None or isinstance(item, (dict, list)):
            continue
        text = str(item).strip()
        if text and text not in out:
            out.append(text)
    return out


def date_range(value: Any) -> tuple[float, float] | None:
    """A date value as ``(from, to)``: a number (a year), a numeric string, or ``{"from", "to"}``."""

    def number(x: Any) -> float | None:
        if isinstance(x, bool) or x is None:
            return None
        try:
            n = float(x)
        except (TypeError, ValueError):
            return None
        return n if math.isfinite(n) else None

    if isinstance(value, Mapping):
        start, end = number(value.get("from")), number(value.get("to"))
        start = end if start is None else start
        end = start if end is None else end
    else:
        start = end = number(value)
    if start is None or end is None:
        return None
    return (min(start, end), max(start, end))


def _usable(votes: Sequence[Vote]) -> list[Vote]:
    return [v for v in votes if math.isfinite(v.weight) and v.weight > 0]


def _top(votes: Sequence[Vote]) -> tuple[Vote, ...]:
    # A stable sort keeps the neighbours' rank order among equal weights.
    return tuple(sorted(votes, key=lambda v: -v.weight)[:EVIDENCE])


def categorical_vote(votes: Sequence[Vote]) -> CategoricalProposal | None:
    """Similarity-weighted vote over categorical values; None when no neighbour has a value."""
    sums: dict[str, float] = {}
    supporters: dict[str, list[Vote]] = {}
    for vote in _usable(votes):
        values = terms(vote.value)
        for value in values:
            sums[value] = sums.get(value, 0.0) + vote.weight / len(values)
            supporters.setdefault(value, []).append(vote)
    total = sum(sums.values())
    if not sums or total <= 0:
        return None
    order = list(sums)  # first-seen order breaks ties
    ranked = sorted(order, key=lambda v: (-sums[v], order.index(v)))
    winner = ranked[0]
    distribution = tuple((v, min(1.0, sums[v] / total)) for v in ranked)
    return CategoricalProposal(
        value=winner,
        confidence=min(1.0, sums[winner] / total),
        distribution=distribution,
        evidence=_top(supporters[winner]),
    )


def date_summary(votes: Sequence[Vote]) -> DateProposal | None:
    """Earliest…latest range, weighted-median central estimate and agreement-based confidence."""
    dated = [(v, r) for v in _usable(votes) if (r := date_range(v.value)) is not None]
    if not dated:
        return None
    earliest = min(r[0] for _, r in dated)
    latest = max(r[1] for _, r in dated)
    mids = sorted(((r[0] + r[1]) / 2.0, v.weight) for v, r in dated)
    half = sum(w for _, w in mids) / 2.0
    running = 0.0
    central = mids[-1][0]
    for mid, weight in mids:
        running += weight
        if running >= half:
            central = mid
            break
    spread = mids[-1][0] - mids[0][0]
    confidence = max(0.0, min(1.0, 1.0 - spread / max(1.0, latest - earliest)))
    return DateProposal(
        earliest=earliest,
        latest=latest,
        central=min(latest, max(earliest, central)),
        confidence=confidence,
        evidence=_top([v for v, _ in dated]),
    )
