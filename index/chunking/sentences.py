"""Paragraph, sentence and word spans: the cut points the chunker packs with.

Everything works on ``(start, end)`` offsets into one string, so a chunk is
always an exact slice of its source (citable, and lossless by construction).

- Paragraphs are separated by blank lines (lines holding only whitespace).
- A sentence ends after ``.``, ``!`` or ``?`` followed by whitespace (closing
  quotes or brackets may sit in between: ``"Stop!" he said``), or after ``。``,
  ``！`` or ``？`` even without whitespace, since CJK text does not put any there.
  (The archive requires whitespace after all six; its CJK paragraphs stay one
  "sentence".)
- A sentence too long for a chunk is split at word boundaries, and a word too
  long (CJK runs, URLs) at character boundaries that never separate a base
  character from its combining marks.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

__all__ = ["Span", "paragraph_spans", "sentence_spans", "split_to_fit", "trim_span"]

Span = tuple[int, int]
Fits = Callable[[int, int], bool]

_PARAGRAPH_BREAK_RE = re.compile(r"\n[ \t\f\v]*\n\s*")
_SENTENCE_END_RE = re.compile(r"[.!?]+[\"'”’»)\]]*(?=\s)|[。！？]+[」』”’）)]*")
_WORD_RE = re.compile(r"\S+")
# Characters that belong to the preceding one: a cut before them breaks a grapheme.
_JOINERS = frozenset("\u200c\u200d\ufe0e\ufe0f")


def paragraph_spans(text: str, start: int, end: int) -> list[Span]:
    """The blank-line-separated paragraphs of ``text[start:end]``, trimmed."""
    spans: list[Span] = []
    position = start
    for match in _PARAGRAPH_BREAK_RE.finditer(text, start, end):
        _append_trimmed(text, position, match.start(), spans)
        position = match.end()
    _append_trimmed(text, position, end, spans)
    return spans


def sentence_spans(text: str, start: int, end: int) -> list[Span]:
    """The sentences of ``text[start:end]``, trimmed, in order."""
    spans: list[Span] = []
    position = start
    for match in _SENTENCE_END_RE.finditer(text, start, end):
        _append_trimmed(text, position, match.end(), spans)
        position = match.end()
    _append_trimmed(text, position, end, spans)
    return spans


def split_to_fit(text: str, start: int, end: int, fits: Fits) -> list[Span]:
    """Cut ``text[start:end]`` into the fewest greedy pieces that each ``fits``.

    Words are packed greedily (a binary search finds the longest run that fits,
    so a long sentence costs O(log n) counts per piece); a word that does not fit
    alone is cut at character boundaries. Raises ``ValueError`` when even one
    character does not fit: the token budget is too small to chunk at all.
    """
    words = [m.span() for m in _WORD_RE.finditer(text, start, end)]
    word_ends = [word_end for _, word_end in words]
    pieces: list[Span] = []
    i = 0
    while i < len(words):
        first_start, first_end = words[i]
        if not fits(first_start, first_end):
            pieces.extend(_split_word(text, first_start, first_end, fits))
            i += 1
            continue
        last = _longest_fitting(fits, first_start, word_ends, i)
        pieces.append((first_start, words[last][1]))
        i = last + 1
    return pieces


def _split_word(text: str, start: int, end: int, fits: Fits) -> list[Span]:
    cuts = [p for p in range(start + 1, end) if _is_cut_point(text, p)] + [end]
    pieces: list[Span] = []
    first = 0  # index into cuts of the shortest possible next piece
    while start < end:
        if not fits(start, cuts[first]):
            raise ValueError(
                f"the token budget is too small for a single character ({text[start : cuts[first]]!r})"
            )
        best = _longest_fitting(fits, start, cuts, first)
        pieces.append((start, cuts[best]))
        start, first = cuts[best], best + 1
    return pieces


def _is_cut_point(text: str, position: int) -> bool:
    char = text[position]
    return not unicodedata.combining(char) and char not in _JOINERS


def _longest_fitting(fits: Fits, start: int, ends: list[int], low: int) -> int:
    """The largest j >= ``low`` with ``fits(start, ends[j])``, given that ``low`` fits.

    Assumes token counts grow with the text (true of the estimate and, in
    practice, of tokenizers); where they do not, the answer still fits.
    """
    high = len(ends) - 1
    while low < high:
        middle = (low + high + 1) // 2
        if fits(start, ends[middle]):
            low = middle
        else:
            high = middle - 1
    return low


def trim_span(text: str, start: int, end: int) -> Span | None:
    """``(start, end)`` without surrounding whitespace, or ``None`` when nothing is left."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None


def _append_trimmed(text: str, start: int, end: int, spans: list[Span]) -> None:
    span = trim_span(text, start, end)
    if span is not None:
        spans.append(span)
