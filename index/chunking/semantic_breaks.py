"""Semantic soft boundaries: where adjacent sentences drift apart in meaning.

Given the sentences of each unit and an embedder, every pair of adjacent
sentences inside a unit gets a cosine distance; a boundary falls before each
sentence whose distance from its predecessor is strictly greater than the
``percentile`` of all those distances (linear interpolation between the two
nearest ranks, as the archive does: default 0.92).

The percentile is taken over the whole document, not per unit, and the
embedder is called once with every sentence that has a neighbour, so a
document with many short sections still gets a meaningful threshold.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy loads on first use: `import index` stays light for the CLI
    import numpy as np

__all__ = ["SentenceEmbedder", "break_after", "cosine_distances", "percentile"]

SentenceEmbedder = Callable[[list[str]], Sequence[Sequence[float]]]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, interpolated linearly between ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def cosine_distances(vectors: np.ndarray) -> list[float]:
    """``1 - cos`` between each row and the next; a zero vector is at distance 1."""
    import numpy as np

    norms = np.linalg.norm(vectors, axis=1)
    dots = np.einsum("ij,ij->i", vectors[:-1], vectors[1:])
    denominators = norms[:-1] * norms[1:]
    similarities = np.divide(dots, denominators, out=np.zeros_like(dots), where=denominators > 0)
    return [float(1.0 - s) for s in similarities]


def break_after(units: list[list[str]], embedder: SentenceEmbedder, q: float) -> list[set[int]]:
    """For each unit (its sentence texts), the sentence indexes a boundary follows."""
    batch = [sentence for sentences in units if len(sentences) > 1 for sentence in sentences]
    if not batch:
        return [set() for _ in units]
    vectors = _as_matrix(embedder(batch), len(batch))
    distances: list[list[float]] = []
    offset = 0
    for sentences in units:
        if len(sentences) > 1:
            distances.append(cosine_distances(vectors[offset : offset + len(sentences)]))
            offset += len(sentences)
        else:
            distances.append([])
    threshold = percentile([d for unit in distances for d in unit], q)
    return [{i for i, d in enumerate(unit) if d > threshold} for unit in distances]


def _as_matrix(vectors: Sequence[Sequence[float]], expected: int) -> np.ndarray:
    import numpy as np

    try:
        matrix = np.asarray(vectors, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"sentence_embedder must return numeric vectors of one length: {error}") from None
    if matrix.ndim != 2 or matrix.shape[0] != expected or matrix.shape[1] == 0:
        raise ValueError(
            f"sentence_embedder returned shape {matrix.shape} for {expected} sentences; "
            f"expected ({expected}, dimension)"
        )
    if not np.isfinite(matrix).all():
        raise ValueError("sentence_embedder returned non-finite values")
    return matrix
