"""Structure-aware semantic chunking of one resolved archive document.

:func:`chunk` cuts a document into passages to embed and cite:

1. **Hard boundaries** (never crossed, not even by orphan merging): heading
   lines ``[h1]``..``[h6]`` (they set the heading path and go into the embedded
   header, not into any chunk's text), page markers ``[page-n-N]`` (they set
   ``page``) and transcription turns ``[TC_HH:MM:SS(.mmm)_TC]`` (one unit per
   turn, ``tc_in``/``tc_out`` from the markers; empty turns are skipped). See
   :mod:`index.chunking.markers`.
2. **Semantic soft boundaries** with a ``sentence_embedder`` (not in ``short``
   mode): :mod:`index.chunking.semantic_breaks`.
3. **Packing** toward ``max_tokens`` with a ``min_tokens`` floor, keeping
   blank-line paragraphs whole unless one alone is too long:
   :mod:`index.chunking.packing`, :mod:`index.chunking.sentences`.

Every chunk's ``text`` is an exact slice of the input (line endings normalized
to ``\\n``), so the chunks in order reproduce the document's content. Chunk
indexes run across the whole document. The result is deterministic.

Modes (:func:`detect_mode` when not given): ``transcription`` when a timecode
marker is present, ``short`` when the whole text fits ``max_tokens``, else
``long_document``. Markers are hard boundaries in every mode; the mode decides
the parent key (``av:`` turns in transcriptions) and whether the semantic pass
runs (never on ``short`` texts: one coherent passage needs no topic cuts).

``parent_key`` (the small-to-big parent): ``av:<tc_in>`` for a transcription
turn (all chunks of one turn share it; the archive keys the whole medium as
``av:<media tipo>``, which the chunker cannot know), otherwise
``sec:<16 hex>``, a hash of the heading path, stable across edits elsewhere.

Token counts use ``count_tokens`` (the embedding model's tokenizer when the
caller has it), else :func:`estimate_tokens`. Bounds apply to the raw ``text``;
the header in ``embed_text`` is not counted (callers near a model's input limit
leave room for it).

Differences from the archive's own chunker, each
deliberate: blank-line paragraphs are preferred cut points, not hard boundaries
(the issue's rule); a trailing orphan is rebalanced instead of overshooting
``max_tokens``; chunks below the floor at semantic boundaries merge with a
neighbour when they fit; CJK terminators end sentences without whitespace; the
estimate is computed in integers; the semantic percentile is taken over the
whole document; parent keys are per turn or per heading path (above); and the
version string ``mnemo-1`` keeps Mnemo's hashes apart from the archive's ``v1``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from index.chunking.markers import TIMECODE_RE, Unit, clean_title, split_units, strip_markers
from index.chunking.packing import Packer, Segment
from index.chunking.semantic_breaks import SentenceEmbedder, break_after
from index.chunking.sentences import paragraph_spans, sentence_spans

__all__ = [
    "CHUNKER_VERSION",
    "Chunk",
    "ChunkMode",
    "TokenCounter",
    "chunk",
    "detect_mode",
    "embed_text_for",
    "estimate_tokens",
    "source_hash",
]

# Part of every source_hash: bump it when chunk boundaries or embed_text change
# for the same input, and every stored chunk re-embeds on its next index.
CHUNKER_VERSION = "mnemo-1"

ChunkMode = Literal["short", "transcription", "long_document"]
TokenCounter = Callable[[str], int]

_MODES: tuple[str, ...] = get_args(ChunkMode)
_HEADER_SEPARATOR = " › "
_LINE_BREAK_RE = re.compile(r"\r\n?")


@dataclass(frozen=True, slots=True)
class Chunk:
    """One passage: ``text`` is stored and cited, ``embed_text`` is embedded."""

    index: int
    text: str
    embed_text: str
    heading_path: tuple[str, ...]
    parent_key: str | None
    page: int | None
    tc_in: str | None
    tc_out: str | None
    token_count: int
    source_hash: str


def estimate_tokens(text: str) -> int:
    """The archive's estimate: ``max(1, ceil(words * 1.3), ceil(code points / 4))``.

    Computed in integers (``10`` words give ``13``, not the ``14`` that the float
    ``10 * 1.3`` rounds up to). It undercounts CJK text about fourfold against
    real tokenizers: pass ``count_tokens`` where that matters.
    """
    words = len(text.split())
    return max(1, -(-words * 13 // 10), -(-len(text) // 4))


def detect_mode(text: str, max_tokens: int, count_tokens: TokenCounter | None = None) -> ChunkMode:
    """``transcription`` with a timecode marker, ``short`` when it all fits, else ``long_document``."""
    if TIMECODE_RE.search(text):
        return "transcription"
    count = count_tokens or estimate_tokens
    return "short" if count(strip_markers(text).strip()) <= max_tokens else "long_document"


def source_hash(embed_text: str, version: str | None = None) -> str:
    """``sha256(version + "|" + embed_text)`` as hex; the version defaults to the current one."""
    payload = f"{CHUNKER_VERSION if version is None else version}|{embed_text}"
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def embed_text_for(raw: str, title: str, heading_path: Sequence[str]) -> str:
    """The text a chunk embeds: ``"{title} › {heading path}\n{raw}"`` (no header line when both
    are empty). A stored row keeps ``raw``, the title and the heading path, so a backfill onto
    another model rebuilds this exactly (and checks it against the row's ``source_hash``)."""
    header = _HEADER_SEPARATOR.join(part for part in (clean_title(title), *heading_path) if part)
    return f"{header}\n{raw}" if header else raw


def chunk(
    text: str,
    *,
    title: str = "",
    max_tokens: int = 450,
    min_tokens: int = 120,
    mode: ChunkMode | None = None,
    sentence_embedder: SentenceEmbedder | None = None,
    count_tokens: TokenCounter | None = None,
    breakpoint_percentile: float = 0.92,
) -> list[Chunk]:
    """Cut ``text`` into chunks; see the module docstring for the rules.

    Raises ``ValueError`` for bad settings, an unknown mode, an embedder that
    returns the wrong number of vectors, or a budget too small for one character.
    """
    _validate(text, max_tokens, min_tokens, mode, breakpoint_percentile)
    text = _LINE_BREAK_RE.sub("\n", text)
    count = count_tokens or estimate_tokens
    if mode is None:
        mode = detect_mode(text, max_tokens, count)
    units = split_units(text)
    structure = [_paragraphs(text, unit) for unit in units]
    breaks: list[set[int]] = [set() for _ in units]
    if sentence_embedder is not None and mode != "short":
        sentences = [[text[s:e] for paragraph in unit for s, e in paragraph] for unit in structure]
        breaks = break_after(sentences, sentence_embedder, breakpoint_percentile)

    packer = Packer(text, count, max_tokens, min_tokens)
    chunks: list[Chunk] = []
    for unit, paragraphs, unit_breaks in zip(units, structure, breaks, strict=True):
        parent_key = _parent_key(unit, mode)
        for start, end in packer.pack(_segments(paragraphs, unit_breaks)):
            raw = text[start:end]
            embed_text = embed_text_for(raw, title, unit.heading_path)
            chunks.append(
                Chunk(
                    index=len(chunks),
                    text=raw,
                    embed_text=embed_text,
                    heading_path=unit.heading_path,
                    parent_key=parent_key,
                    page=unit.page,
                    tc_in=unit.tc_in,
                    tc_out=unit.tc_out,
                    token_count=packer.tokens(start, end),
                    source_hash=source_hash(embed_text),
                )
            )
    return chunks


def _validate(
    text: str, max_tokens: int, min_tokens: int, mode: str | None, breakpoint_percentile: float
) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text must be str, not {type(text).__name__}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if not 0 <= min_tokens <= max_tokens:
        raise ValueError(f"min_tokens must be within [0, max_tokens={max_tokens}], got {min_tokens}")
    if mode is not None and mode not in _MODES:
        raise ValueError(f"mode must be one of {', '.join(_MODES)}, got {mode!r}")
    if not (isinstance(breakpoint_percentile, int | float) and 0 <= breakpoint_percentile <= 1):
        raise ValueError(f"breakpoint_percentile must be within [0, 1], got {breakpoint_percentile!r}")


def _paragraphs(text: str, unit: Unit) -> list[list[tuple[int, int]]]:
    """The unit's paragraphs, each as its sentence spans."""
    return [sentence_spans(text, s, e) for s, e in paragraph_spans(text, unit.start, unit.end)]


def _segments(paragraphs: Sequence[list[tuple[int, int]]], breaks_after: set[int]) -> list[Segment]:
    """Split the paragraphs at the semantic boundaries (sentence indexes within the unit)."""
    segments: list[Segment] = [[]]
    sentence_index = 0
    for sentences in paragraphs:
        current: list[tuple[int, int]] = []
        for sentence in sentences:
            current.append(sentence)
            if sentence_index in breaks_after:
                segments[-1].append(current)
                segments.append([])
                current = []
            sentence_index += 1
        if current:
            segments[-1].append(current)
    return [segment for segment in segments if segment]


def _parent_key(unit: Unit, mode: str) -> str:
    if mode == "transcription" and unit.tc_in is not None:
        return f"av:{unit.tc_in}"
    digest = hashlib.sha256("\x1f".join(unit.heading_path).encode("utf-8")).hexdigest()
    return f"sec:{digest[:16]}"
