"""Packing one hard-bounded unit into chunks between ``min_tokens`` and ``max_tokens``.

A unit arrives as *segments* (split at semantic soft boundaries, or one segment
without an embedder), each a list of paragraphs, each a list of sentence spans.
The packer turns them into *pieces* (a whole paragraph when it fits, else its
sentences, else word or character cuts of a sentence that is too long alone),
then:

1. packs pieces greedily, segment by segment, up to ``max_tokens``;
2. merges any chunk below ``min_tokens`` into a neighbour when the result fits
   (predecessor first, as the archive does; this crosses soft boundaries only);
3. rebalances a trailing orphan still below the floor with its predecessor:
   whole pieces move from the predecessor's end until the smaller of the two is
   as large as it can be, both within ``max_tokens``. The archive instead merges
   the orphan outright, which (after greedy packing) always overshoots
   ``max_tokens``; Mnemo never exceeds it.

Invariants, for any token counter that grows with the text: every chunk fits
``max_tokens``; a chunk below ``min_tokens`` is alone in its unit or would exceed
``max_tokens`` merged with either neighbour; a paragraph that fits is never cut
(except at a semantic boundary).
"""

from __future__ import annotations

from collections.abc import Callable

from index.chunking.sentences import Span, split_to_fit

__all__ = ["Packer", "Paragraph", "Segment"]

Paragraph = list[Span]  # its sentence spans, in order
Segment = list[Paragraph]
Pieces = list[Span]  # one chunk: contiguous pieces of the unit


class Packer:
    """Packs units of one document; caches token counts by span."""

    def __init__(self, text: str, count_tokens: Callable[[str], int], max_tokens: int, min_tokens: int):
        self._text = text
        self._count_tokens = count_tokens
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self._counts: dict[Span, int] = {}

    def tokens(self, start: int, end: int) -> int:
        """The token count of ``text[start:end]`` (counted once per span)."""
        key = (start, end)
        count = self._counts.get(key)
        if count is None:
            count = self._count_tokens(self._text[start:end])
            if not isinstance(count, int) or count < 0:
                raise ValueError(f"count_tokens must return a non-negative int, got {count!r}")
            self._counts[key] = count
        return count

    def fits(self, start: int, end: int) -> bool:
        return self.tokens(start, end) <= self.max_tokens

    def pack(self, segments: list[Segment]) -> list[Span]:
        """The chunk spans of one unit, in order."""
        chunks: list[Pieces] = []
        for segment in segments:
            chunks.extend(self._pack_greedy(self._pieces(segment)))
        self._merge_small(chunks)
        self._rebalance_tail(chunks)
        # A predecessor shrunk by rebalancing may now fit with the chunk before it.
        self._merge_small(chunks)
        return [(pieces[0][0], pieces[-1][1]) for pieces in chunks]

    def _pieces(self, segment: Segment) -> Pieces:
        pieces: Pieces = []
        for sentences in segment:
            if self.fits(sentences[0][0], sentences[-1][1]):
                pieces.append((sentences[0][0], sentences[-1][1]))
                continue
            for start, end in sentences:
                if self.fits(start, end):
                    pieces.append((start, end))
                else:
                    pieces.extend(split_to_fit(self._text, start, end, self.fits))
        return pieces

    def _pack_greedy(self, pieces: Pieces) -> list[Pieces]:
        chunks: list[Pieces] = []
        current: Pieces = []
        for piece in pieces:
            if current and self.fits(current[0][0], piece[1]):
                current.append(piece)
                continue
            if current:
                chunks.append(current)
            current = [piece]
        if current:
            chunks.append(current)
        return chunks

    def _size(self, pieces: Pieces) -> int:
        return self.tokens(pieces[0][0], pieces[-1][1])

    def _merge_small(self, chunks: list[Pieces]) -> None:
        """Merge chunks below the floor into a neighbour wherever the result fits."""
        i = 0
        while i < len(chunks):
            if self._size(chunks[i]) < self.min_tokens:
                if i > 0 and self.fits(chunks[i - 1][0][0], chunks[i][-1][1]):
                    chunks[i - 1 : i + 1] = [chunks[i - 1] + chunks[i]]
                    i -= 1  # the merged chunk may still be below the floor
                    continue
                if i + 1 < len(chunks) and self.fits(chunks[i][0][0], chunks[i + 1][-1][1]):
                    chunks[i : i + 2] = [chunks[i] + chunks[i + 1]]
                    continue
            i += 1

    def _rebalance_tail(self, chunks: list[Pieces]) -> None:
        """Move pieces from the predecessor into a trailing orphan below the floor."""
        if len(chunks) < 2 or self._size(chunks[-1]) >= self.min_tokens:
            return
        combined = chunks[-2] + chunks[-1]
        start, end = combined[0][0], combined[-1][1]
        best_cut = len(chunks[-2])
        best_score = min(self._size(chunks[-2]), self._size(chunks[-1]))
        # Cut k: pieces [0, k) stay, [k, n) form the tail. The predecessor keeps at
        # least its first piece, so the chunk before it still could not absorb it.
        for cut in range(best_cut - 1, 0, -1):
            head = self.tokens(start, combined[cut - 1][1])
            tail = self.tokens(combined[cut][0], end)
            if tail > self.max_tokens:
                break
            score = min(head, tail)
            if score <= best_score:
                break  # the smaller side only shrinks from here on
            best_cut, best_score = cut, score
        chunks[-2:] = [combined[:best_cut], combined[best_cut:]]
