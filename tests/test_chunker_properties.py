"""Property tests for index.chunking.chunker over generated archive documents.

Documents mix headings (any level, some untitled), page markers (inline or on
their own line), timecodes (some turns empty), blank-line paragraphs, long
sentences, CJK runs without spaces and accented (also decomposed) text. The
generator records where each stretch of text between markers lies and which
heading path, page and turn it belongs to; each chunk must sit inside one such
stretch and carry its metadata.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from index.chunking.chunker import CHUNKER_VERSION, Chunk, chunk, estimate_tokens, source_hash


# Sized to finish in well under 20 s on a busy 2-core machine; raise max_examples
# locally (or with a hypothesis profile) when changing the chunker.
def property_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


LATIN = ["archivo", "memoria", "river", "museum", "letter", "guerra", "casa", "kitchen", "vase", "1936"]
ACCENTED = ["pantáno", "Ñandú", "café", "naïve", "Straße", "e\u0301cole", "Œuvre", "façade", "Zürich"]
CJK = ["東京", "博物館", "記憶", "戦争", "手紙", "アーカイブ", "한국어"]

word = st.sampled_from(LATIN + ACCENTED)
latin_sentence = st.builds(
    lambda ws, end: " ".join(ws) + end,
    st.lists(word, min_size=1, max_size=14),
    st.sampled_from([".", "!", "?", "", '."', "…"]),
)
cjk_sentence = st.builds(
    lambda ws, end: "".join(ws) + end,
    st.lists(st.sampled_from(CJK), min_size=1, max_size=10),
    st.sampled_from(["。", "！", "？", ""]),
)
long_sentence = st.builds(lambda ws: " ".join(ws) + ".", st.lists(word, min_size=40, max_size=120))
long_cjk_run = st.builds("".join, st.lists(st.sampled_from(CJK), min_size=30, max_size=90))
short_sentence = st.one_of(latin_sentence, latin_sentence, cjk_sentence)
any_sentence = st.one_of(short_sentence, long_sentence, long_cjk_run)


def paragraphs_of(sentences: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.builds(
        lambda ss, joiner: joiner.join(ss),
        st.lists(sentences, min_size=1, max_size=4),
        st.sampled_from([" ", "\n", ""]),
    ).filter(str.strip)


# Mostly paragraphs of short sentences (which must stay whole when they fit), some
# with sentences or CJK runs too long for any chunk.
paragraph = st.one_of(
    paragraphs_of(short_sentence), paragraphs_of(short_sentence), paragraphs_of(any_sentence)
)
timecode = st.builds(
    lambda h, m, s, ms: f"{h:02d}:{m:02d}:{s:02d}" + ("" if ms is None else f".{ms:03d}"),
    st.integers(0, 9),
    st.integers(0, 59),
    st.integers(0, 59),
    st.none() | st.integers(0, 999),
)
item = st.one_of(
    st.tuples(st.just("heading"), st.integers(1, 6), st.lists(word, max_size=3).map(" ".join)),
    st.tuples(st.just("page"), st.integers(1, 400), st.booleans()),
    st.tuples(st.just("tc"), timecode),
    st.tuples(st.just("text"), st.lists(paragraph, min_size=1, max_size=3)),
    st.tuples(st.just("text"), st.lists(paragraph, min_size=1, max_size=3)),
)


@dataclass
class Stretch:
    """Text between two markers: where it lies and the structure it belongs to."""

    start: int
    end: int
    paragraphs: list[tuple[int, int]]
    heading_path: tuple[str, ...]
    page: int | None
    tc_in: str | None
    tc_out: str | None = None


@dataclass
class Document:
    text: str
    stretches: list[Stretch] = field(default_factory=list)


def render(items: list[tuple]) -> Document:
    """Write the items as archive text, recording each stretch's span and metadata."""
    parts: list[str] = []
    length = 0
    headings: list[tuple[int, str]] = []
    page: int | None = None
    tc: str | None = None
    doc = Document("")
    open_turn: list[Stretch] = []
    previous_kind = None

    def emit(piece: str) -> None:
        nonlocal length
        parts.append(piece)
        length += len(piece)

    for kind, *args in items:
        if kind == "text" and previous_kind == "text":
            emit("\n[page-n-1]\n")  # keep generated stretches apart with a real boundary
            page = 1
        previous_kind = kind
        if kind == "heading":
            level, title = args
            emit(f"\n[h{level}] {title}\n")
            headings = [(lvl, t) for lvl, t in headings if lvl < level] + ([(level, title)] if title else [])
        elif kind == "page":
            number, own_line = args
            emit(f"\n[page-n-{number}]\n" if own_line else f" [page-n-{number}] ")
            page = number
        elif kind == "tc":
            emit(f" [TC_{args[0]}_TC] ")
            tc = args[0]
            for stretch in open_turn:
                stretch.tc_out = tc
            open_turn.clear()
        else:
            start = length
            spans = []
            for i, text in enumerate(args[0]):
                if i:
                    emit("\n\n")
                spans.append((length, length + len(text)))
                emit(text)
            stretch = Stretch(start, length, spans, tuple(t for _, t in headings), page, tc)
            doc.stretches.append(stretch)
            open_turn.append(stretch)
    doc.text = "".join(parts)
    return doc


documents = st.lists(item, min_size=1, max_size=10).map(render)


def words_plus_specials(text: str) -> int:
    """A tokenizer-like counter: words plus two special tokens, never additive."""
    return len(text.split()) + 2


counters = st.sampled_from([estimate_tokens, words_plus_specials])


def locate(doc: Document, chunks: list[Chunk]) -> list[tuple[int, Stretch]]:
    """Each chunk's offset in the document and the stretch that holds it (asserted to exist)."""
    located = []
    position = 0
    for c in chunks:
        offset = doc.text.find(c.text, position)
        while offset >= 0 and not any(
            s.start <= offset and offset + len(c.text) <= s.end for s in doc.stretches
        ):
            offset = doc.text.find(c.text, offset + 1)
        assert offset >= 0, f"chunk {c.index} is not inside one stretch between markers: {c.text!r}"
        stretch = next(s for s in doc.stretches if s.start <= offset and offset + len(c.text) <= s.end)
        located.append((offset, stretch))
        position = offset + len(c.text)
    return located


def without_whitespace(text: str) -> str:
    return re.sub(r"\s+", "", text)


def check_token_bounds(
    doc: Document,
    chunks: list[Chunk],
    located: list[tuple[int, Stretch]],
    count: Callable[[str], int],
    max_tokens: int,
    min_tokens: int,
) -> None:
    for c in chunks:
        assert c.token_count == count(c.text)
        assert c.token_count <= max_tokens, (c.token_count, c.text)
    for i, c in enumerate(chunks):
        if c.token_count >= min_tokens:
            continue
        # Below the floor: alone in its unit, or too big to join either neighbour.
        _, stretch = located[i]
        for j in (i - 1, i + 1):
            if 0 <= j < len(chunks) and located[j][1] is stretch:
                first, last = sorted((i, j))
                joined = doc.text[located[first][0] : located[last][0] + len(chunks[last].text)]
                assert count(joined) > max_tokens, f"chunk {i} ({c.token_count}) could join chunk {j}"


@property_settings(60)
@given(doc=documents, max_tokens=st.integers(6, 90), floor=st.floats(0, 1), count=counters)
def test_structural_invariants(doc: Document, max_tokens: int, floor: float, count) -> None:
    min_tokens = int(max_tokens * floor)
    chunks = chunk(doc.text, title="Fondo", max_tokens=max_tokens, min_tokens=min_tokens, count_tokens=count)

    assert [c.index for c in chunks] == list(range(len(chunks)))
    # Lossless: the raw texts in order are the document's content without markers.
    expected = "".join(doc.text[s.start : s.end] for s in doc.stretches)
    assert without_whitespace("".join(c.text for c in chunks)) == without_whitespace(expected)
    # No chunk crosses a hard boundary, and each carries its stretch's structure.
    located = locate(doc, chunks)
    for c, (_, stretch) in zip(chunks, located, strict=True):
        assert c.text == c.text.strip() and c.text
        assert (c.heading_path, c.page, c.tc_in, c.tc_out) == (
            stretch.heading_path,
            stretch.page,
            stretch.tc_in,
            stretch.tc_out,
        )
        header = " › ".join(("Fondo", *c.heading_path))
        assert c.embed_text == f"{header}\n{c.text}"
        assert c.source_hash == hashlib.sha256(f"{CHUNKER_VERSION}|{c.embed_text}".encode()).hexdigest()
    check_token_bounds(doc, chunks, located, count, max_tokens, min_tokens)
    # A paragraph that fits is never cut (without an embedder there are no soft boundaries).
    cuts: set[int] = set()
    for c, (offset, _) in zip(chunks, located, strict=True):
        cuts.update((offset, offset + len(c.text)))
    for stretch in doc.stretches:
        for start, end in stretch.paragraphs:
            if count(doc.text[start:end]) <= max_tokens:
                assert not any(start < cut < end for cut in cuts), "a fitting paragraph was cut"


def hashed_bag_of_words(sentences: list[str]) -> list[list[float]]:
    """A deterministic 32-d test embedder: word counts hashed into buckets."""
    vectors = []
    for sentence in sentences:
        vector = [0.0] * 32
        for token in re.findall(r"\w+", sentence.lower()):
            vector[zlib.crc32(token.encode()) % 32] += 1.0
        vectors.append(vector)
    return vectors


@property_settings(35)
@given(
    doc=documents,
    max_tokens=st.integers(6, 90),
    floor=st.floats(0, 1),
    percentile=st.floats(0.5, 1.0),
)
def test_invariants_hold_with_semantic_boundaries(
    doc: Document, max_tokens: int, floor: float, percentile: float
) -> None:
    min_tokens = int(max_tokens * floor)
    kwargs = {
        "max_tokens": max_tokens,
        "min_tokens": min_tokens,
        "mode": "long_document",
        "sentence_embedder": hashed_bag_of_words,
        "breakpoint_percentile": percentile,
    }
    chunks = chunk(doc.text, **kwargs)
    expected = "".join(doc.text[s.start : s.end] for s in doc.stretches)
    assert without_whitespace("".join(c.text for c in chunks)) == without_whitespace(expected)
    located = locate(doc, chunks)
    for c, (_, stretch) in zip(chunks, located, strict=True):
        assert (c.heading_path, c.page, c.tc_in, c.tc_out) == (
            stretch.heading_path,
            stretch.page,
            stretch.tc_in,
            stretch.tc_out,
        )
    check_token_bounds(doc, chunks, located, estimate_tokens, max_tokens, min_tokens)
    assert chunk(doc.text, **kwargs) == chunks  # deterministic, embedder included


@property_settings(20)
@given(doc=documents, max_tokens=st.integers(6, 90), title=st.sampled_from(["", "Fondo", "Carta de Ana"]))
def test_deterministic(doc: Document, max_tokens: int, title: str) -> None:
    first = chunk(doc.text, title=title, max_tokens=max_tokens, min_tokens=max_tokens // 3)
    again = chunk(doc.text, title=title, max_tokens=max_tokens, min_tokens=max_tokens // 3)
    assert first == again


@property_settings(20)
@given(doc=documents, edited=documents, title=st.sampled_from(["", "Fondo"]), version=st.text(max_size=8))
def test_source_hash_changes_exactly_with_embed_text_or_version(
    doc: Document, edited: Document, title: str, version: str
) -> None:
    chunks = chunk(doc.text, title=title, max_tokens=40, min_tokens=10)
    chunks += chunk(edited.text, title="Fondo", max_tokens=40, min_tokens=10)
    by_hash: dict[str, set[str]] = {}
    by_text: dict[str, set[str]] = {}
    for c in chunks:
        assert c.source_hash == source_hash(c.embed_text)
        assert (source_hash(c.embed_text, version) == c.source_hash) == (version == CHUNKER_VERSION)
        by_hash.setdefault(c.source_hash, set()).add(c.embed_text)
        by_text.setdefault(c.embed_text, set()).add(c.source_hash)
    # One hash per embedded text and one embedded text per hash.
    assert all(len(texts) == 1 for texts in by_hash.values())
    assert all(len(hashes) == 1 for hashes in by_text.values())
