"""Honest fusion tuning: choose weights on one half of the queries, report them on the other.

Choosing weights on the very queries they are scored on reports the best of many tries, not what
an operator will see on the next query. :func:`cross_validate` splits the judged queries into two
folds (by a hash of the query id, so file order does not matter), picks the best candidate on each
fold and scores it on the other; every query is scored exactly once, by weights chosen without it.
The candidate picked on *all* queries is what ``mnemo eval --apply`` stores; the cross-validated
figure is what to expect from it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

__all__ = ["cross_validate", "mean_metrics", "two_folds"]

C = TypeVar("C", bound=Hashable)
PerQuery = Mapping[str, Mapping[str, float]]  # query id -> metric -> value


def two_folds(qids: Sequence[str]) -> tuple[list[str], list[str]]:
    """Two halves of the query ids, fixed by a hash of each id (sizes differ by at most one)."""
    ranked = sorted(qids, key=lambda q: (hashlib.sha256(q.encode()).hexdigest(), q))
    return sorted(ranked[0::2]), sorted(ranked[1::2])


def mean_metrics(per_query: PerQuery, qids: Sequence[str]) -> dict[str, float]:
    """The mean of each metric over ``qids`` (all zeros for no query)."""
    names = sorted({m for q in qids for m in per_query[q]})
    if not qids:
        return dict.fromkeys(names, 0.0)
    return {m: round(sum(per_query[q][m] for q in qids) / len(qids), 4) for m in names}


def _best(candidates: Sequence[C], scored: Mapping[C, PerQuery], qids: Sequence[str], key: str) -> C:
    """The candidate with the best mean ``key`` over ``qids``; ties to the earlier candidate."""
    best, best_value = candidates[0], float("-inf")
    for candidate in candidates:
        value = sum(scored[candidate][q][key] for q in qids)
        if value > best_value + 1e-12:
            best, best_value = candidate, value
    return best


def cross_validate(
    candidates: Sequence[C],
    evaluate: Callable[[C], PerQuery],
    qids: Sequence[str],
    *,
    key: str = "ndcg@10",
) -> dict[str, Any]:
    """Two-fold cross-validation of a choice among ``candidates`` (each evaluated once, every query).

    Returns ``cv`` (each query scored by the candidate chosen on the other fold), ``folds`` (the
    choice per fold), ``chosen`` (the choice on all queries) and ``in_sample`` (its score on the
    queries it was chosen on: optimistic, shown for comparison only).
    """
    if not candidates:
        raise ValueError("no candidates to choose from")
    scored = {c: evaluate(c) for c in candidates}
    a, b = two_folds(qids)
    cv_scores: dict[str, Mapping[str, float]] = {}
    folds = []
    for train, test in ((a, b), (b, a)):
        choice = _best(candidates, scored, train, key) if train else candidates[0]
        folds.append({"chosen": choice, "train": len(train), "test": len(test)})
        cv_scores.update({q: scored[choice][q] for q in test})
    chosen = _best(candidates, scored, list(qids), key)
    return {
        "cv": mean_metrics(cv_scores, list(qids)),
        "folds": folds,
        "chosen": chosen,
        "in_sample": mean_metrics(scored[chosen], list(qids)),
    }
