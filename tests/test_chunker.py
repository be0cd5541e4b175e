"""Example-based tests for index.chunking.chunker: one per rule, plus semantic boundaries.

Invariants over generated documents live in test_chunker_properties.py.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest

import index
import index.chunking.chunker as chunker_module
from index import CHUNKER_VERSION, Chunk, chunk, detect_mode
from index.chunking.chunker import estimate_tokens, source_hash
from index.chunking.semantic_breaks import cosine_distances, percentile
from index.chunking.sentences import paragraph_spans, sentence_spans


def words(text: str) -> int:
    """A transparent token counter for exact arithmetic in tests: one token per word."""
    return len(text.split())


def sentence(topic: str, n: int) -> str:
    """A sentence of exactly ``n`` words (``topic`` first), ending in a period."""
    return " ".join([topic] + [f"w{i}" for i in range(1, n)]) + "."


_WORD_RE = re.compile(r"\w+")


def bag_of_words(sentences: list[str]) -> list[list[float]]:
    """A deterministic test embedder: word counts over the batch's vocabulary."""
    tokens = [Counter(w.lower() for w in _WORD_RE.findall(s)) for s in sentences]
    vocabulary = sorted(set().union(*tokens))
    return [[float(t[w]) for w in vocabulary] for t in tokens]


# --- public surface ---------------------------------------------------------------------


def test_public_surface_is_exported() -> None:
    for name in ("chunk", "Chunk", "CHUNKER_VERSION", "detect_mode"):
        assert name in index.__all__
    assert index.chunk is chunker_module.chunk


def test_chunk_is_frozen() -> None:
    (only,) = chunk("One sentence.")
    with pytest.raises(AttributeError):
        only.text = "changed"  # type: ignore[misc]


def test_empty_and_marker_only_documents_give_no_chunks() -> None:
    assert chunk("") == []
    assert chunk("  \n\n \t ") == []
    assert chunk("[h1] Title\n[page-n-3]\n[TC_00:00:01_TC]  [TC_00:00:02_TC]\n") == []


# --- hard boundaries --------------------------------------------------------------------


def test_heading_path_truncates_to_the_heading_level() -> None:
    doc = "[h1] A\nx one.\n[h2] B\ny two.\n[h3] C\nz three.\n[h2] D\nw four.\n[h1] E\nv five."
    chunks = chunk(doc, title="Doc", min_tokens=100)
    assert [c.heading_path for c in chunks] == [("A",), ("A", "B"), ("A", "B", "C"), ("A", "D"), ("E",)]
    assert [c.text for c in chunks] == ["x one.", "y two.", "z three.", "w four.", "v five."]
    assert chunks[3].embed_text == "Doc › A › D\nw four."
    assert all("[h" not in c.text for c in chunks)


def test_skipped_levels_and_untitled_headings() -> None:
    doc = "[h1] A\n[h3] C\nunder c.\n[h2] B\nunder b.\n[h2]\nunder a again."
    assert [c.heading_path for c in chunk(doc)] == [("A", "C"), ("A", "B"), ("A",)]


def test_a_heading_only_counts_at_the_start_of_a_line() -> None:
    (only,) = chunk("see the [h2] tag in prose.")
    assert only.text == "see the [h2] tag in prose."
    assert only.heading_path == ()


def test_page_markers_set_the_page_and_cut_even_mid_sentence() -> None:
    doc = "Before pages. A sentence runs [page-n-3] onto page three.\n[page-n-4]\nPage four."
    chunks = chunk(doc, min_tokens=120)  # the floor must not pull text across a page
    assert [(c.text, c.page) for c in chunks] == [
        ("Before pages. A sentence runs", None),
        ("onto page three.", 3),
        ("Page four.", 4),
    ]


def test_transcription_turns_carry_their_timecodes() -> None:
    doc = (
        "[TC_00:00:01.000_TC] Hola, soy Ana. "
        "[TC_00:00:04.250_TC]   "  # an empty turn: skipped, but it still ends the previous one
        "[TC_00:00:07_TC] Nací en Huesca. [TC_00:01:02.5_TC] Adiós."
    )
    chunks = chunk(doc, min_tokens=100)
    assert [(c.text, c.tc_in, c.tc_out) for c in chunks] == [
        ("Hola, soy Ana.", "00:00:01.000", "00:00:04.250"),
        ("Nací en Huesca.", "00:00:07", "00:01:02.5"),
        ("Adiós.", "00:01:02.5", None),
    ]
    assert [c.parent_key for c in chunks] == ["av:00:00:01.000", "av:00:00:07", "av:00:01:02.5"]


def test_text_before_the_first_turn_ends_where_the_first_turn_starts() -> None:
    first, second = chunk("Interview with Ana.\n[TC_00:00:03_TC] Hola.")
    assert (first.tc_in, first.tc_out) == (None, "00:00:03")
    assert (second.tc_in, second.tc_out) == ("00:00:03", None)
    assert first.parent_key is not None and first.parent_key.startswith("sec:")


def test_a_heading_inside_a_turn_keeps_the_turn_timecodes() -> None:
    doc = "[TC_00:00:01_TC] Part of the turn.\n[h2] Chapter\nStill the same turn. [TC_00:00:09_TC] Next."
    chunks = chunk(doc)
    assert [(c.heading_path, c.tc_in, c.tc_out) for c in chunks] == [
        ((), "00:00:01", "00:00:09"),
        (("Chapter",), "00:00:01", "00:00:09"),
        (("Chapter",), "00:00:09", None),
    ]


def test_orphans_never_merge_across_hard_boundaries() -> None:
    doc = "[h1] A\n" + sentence("alpha", 20) + "\n[h1] B\nTiny.\n[page-n-2]\nAlso tiny."
    chunks = chunk(doc, max_tokens=40, min_tokens=30, count_tokens=words)
    assert [c.text for c in chunks] == [sentence("alpha", 20), "Tiny.", "Also tiny."]


# --- packing ----------------------------------------------------------------------------


def test_whole_paragraphs_are_packed_together() -> None:
    paragraphs = [sentence(f"p{i}", 10) for i in range(5)]
    chunks = chunk("\n\n".join(paragraphs), max_tokens=25, min_tokens=0, count_tokens=words)
    assert [c.text for c in chunks] == [
        f"{paragraphs[0]}\n\n{paragraphs[1]}",
        f"{paragraphs[2]}\n\n{paragraphs[3]}",
        paragraphs[4],
    ]


def test_a_paragraph_that_fits_is_never_cut() -> None:
    # Sentence packing would fill the first chunk to 24 words; paragraphs must stay whole.
    first = " ".join(sentence("a", 8) for _ in range(2))
    second = " ".join(sentence("b", 8) for _ in range(3))
    chunks = chunk(f"{first}\n\n{second}", max_tokens=25, min_tokens=0, count_tokens=words)
    assert [c.text for c in chunks] == [first, second]


def test_a_paragraph_too_long_alone_is_cut_at_sentences() -> None:
    sentences = [sentence(f"s{i}", 10) for i in range(5)]
    chunks = chunk(" ".join(sentences), max_tokens=25, min_tokens=0, count_tokens=words)
    assert [c.text for c in chunks] == [" ".join(sentences[0:2]), " ".join(sentences[2:4]), sentences[4]]


def test_a_trailing_orphan_that_fits_merges_into_its_predecessor() -> None:
    sentences = [sentence(f"s{i}", 10) for i in range(6)] + [sentence("tail", 3)]
    chunks = chunk(" ".join(sentences), max_tokens=35, min_tokens=12, count_tokens=words)
    assert [c.token_count for c in chunks] == [30, 33]
    assert chunks[-1].text.endswith(sentences[-1])


def test_a_trailing_orphan_is_rebalanced_when_merging_would_overflow() -> None:
    sentences = [sentence(f"s{i}", 10) for i in range(6)] + [sentence("tail", 8)]
    chunks = chunk(" ".join(sentences), max_tokens=35, min_tokens=12, count_tokens=words)
    # Greedy packing gives 30 + 30 + 8; merging would give 38 > 35; so one sentence moves.
    assert [c.token_count for c in chunks] == [30, 20, 18]
    assert chunks[2].text == " ".join(sentences[5:])
    assert all(c.token_count <= 35 for c in chunks)


def test_a_unit_smaller_than_the_floor_stays_as_it_is() -> None:
    (only,) = chunk("[h1] Note\nTiny.", min_tokens=120)
    assert (only.text, only.token_count) == ("Tiny.", estimate_tokens("Tiny."))


def test_an_overlong_sentence_is_split_at_word_boundaries() -> None:
    long_sentence = " ".join(f"word{i}" for i in range(100)) + "."
    chunks = chunk(long_sentence, max_tokens=30, min_tokens=0, count_tokens=words)
    assert [c.token_count for c in chunks] == [30, 30, 30, 10]
    assert " ".join(c.text for c in chunks) == long_sentence


def test_text_without_spaces_is_split_at_characters() -> None:
    text = "東京国立博物館の記録" * 20  # 200 code points, no spaces, no terminators
    chunks = chunk(text, max_tokens=10, min_tokens=0)  # estimate: 4 code points a token
    assert [len(c.text) for c in chunks] == [40] * 5
    assert "".join(c.text for c in chunks) == text


def test_character_cuts_never_separate_combining_marks() -> None:
    decomposed = unicodedata.normalize("NFD", "é") * 50  # e + COMBINING ACUTE, 100 code points
    chunks = chunk(decomposed, max_tokens=7, min_tokens=0, count_tokens=len)
    assert "".join(c.text for c in chunks) == decomposed
    assert all(len(c.text) <= 7 and not unicodedata.combining(c.text[0]) for c in chunks)


def test_a_budget_below_one_character_is_an_error() -> None:
    with pytest.raises(ValueError, match="single character"):
        chunk("abcdef", max_tokens=2, min_tokens=0, count_tokens=lambda t: 3)


def test_custom_token_counter_is_used_for_counts() -> None:
    (only,) = chunk("uno dos tres.", count_tokens=lambda t: len(t) + 2)
    assert only.token_count == len("uno dos tres.") + 2


# --- sentences --------------------------------------------------------------------------


def spans_text(text: str, spans: Sequence[tuple[int, int]]) -> list[str]:
    return [text[s:e] for s, e in spans]


def test_sentences_end_after_terminators_followed_by_whitespace() -> None:
    text = 'He said "Stop!" and left. Why? Version 2.5 ships... today! v1.0'
    assert spans_text(text, sentence_spans(text, 0, len(text))) == [
        'He said "Stop!"',
        "and left.",
        "Why?",
        "Version 2.5 ships...",
        "today!",
        "v1.0",
    ]


def test_cjk_terminators_end_sentences_without_whitespace() -> None:
    text = "東京は大きい。大阪も大きい！「本当？」と聞いた。"
    assert spans_text(text, sentence_spans(text, 0, len(text))) == [
        "東京は大きい。",
        "大阪も大きい！",
        "「本当？」",
        "と聞いた。",
    ]
    chunks = chunk("東京は大きい。大阪も大きい。", max_tokens=8, min_tokens=0, count_tokens=len)
    assert [c.text for c in chunks] == ["東京は大きい。", "大阪も大きい。"]


def test_paragraphs_are_separated_by_blank_lines() -> None:
    text = "First line\nsame paragraph.\n \t\nSecond.\n\n\n\nThird."
    assert spans_text(text, paragraph_spans(text, 0, len(text))) == [
        "First line\nsame paragraph.",
        "Second.",
        "Third.",
    ]


def test_line_endings_are_normalized() -> None:
    (only,) = chunk("[h1] Title\r\nLine one\r\nline two.\r\n\r\nNext.\rEnd.")
    assert only.heading_path == ("Title",)
    assert only.text == "Line one\nline two.\n\nNext.\nEnd."


# --- embedded text, hashes, indexes, parents ----------------------------------------------


def test_embed_text_drops_empty_header_parts() -> None:
    assert chunk("Raw text.")[0].embed_text == "Raw text."
    assert chunk("Raw text.", title="  Carta  de\nAna ")[0].embed_text == "Carta de Ana\nRaw text."
    assert chunk("[h1] A\n[h2] B\nRaw text.")[0].embed_text == "A › B\nRaw text."


def test_source_hash_is_sha256_of_version_and_embed_text() -> None:
    (only,) = chunk("[h1] A\nRaw text.", title="T")
    expected = hashlib.sha256(f"{CHUNKER_VERSION}|T › A\nRaw text.".encode()).hexdigest()
    assert only.source_hash == expected == source_hash(only.embed_text)


def test_bumping_the_version_changes_every_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = "[h1] A\nOne.\n[h1] B\nTwo."
    before = chunk(doc)
    monkeypatch.setattr(chunker_module, "CHUNKER_VERSION", "next")
    after = chunk(doc)
    assert [c.embed_text for c in before] == [c.embed_text for c in after]
    assert all(b.source_hash != a.source_hash for b, a in zip(before, after, strict=True))


def test_indexes_run_across_the_whole_document() -> None:
    doc = "[h1] A\nOne.\n[h1] B\nTwo.\n\nThree.\n[page-n-2]\nFour."
    assert [c.index for c in chunk(doc, max_tokens=2, min_tokens=0)] == [0, 1, 2, 3]


def test_parent_keys_follow_the_heading_path() -> None:
    doc = "[h1] A\nOne.\n[page-n-2]\nTwo.\n[h1] B\nThree.\n[h1] A\nFour."
    keys = [c.parent_key for c in chunk(doc)]
    assert keys[0] == keys[1] == keys[3] != keys[2]
    assert all(k is not None and re.fullmatch(r"sec:[0-9a-f]{16}", k) for k in keys)


def test_chunking_is_deterministic() -> None:
    doc = "[h1] A\n" + " ".join(sentence(f"s{i}", 9) for i in range(30))
    assert chunk(doc, max_tokens=40, min_tokens=10) == chunk(doc, max_tokens=40, min_tokens=10)


# --- modes and the token estimate -----------------------------------------------------------


def test_estimate_tokens_is_the_archive_formula() -> None:
    assert estimate_tokens("") == 1
    assert estimate_tokens("a b c d e f g h i j") == 13  # ceil(10 * 1.3), in exact arithmetic
    assert estimate_tokens("x" * 100) == 25  # ceil(code points / 4)
    assert estimate_tokens("東京" * 50) == 25


def test_detect_mode() -> None:
    assert detect_mode("Some words [TC_00:00:01_TC] spoken.", 450) == "transcription"
    assert detect_mode("[h1] Short\nA short record.", 450) == "short"
    assert detect_mode("word " * 400, 450) == "long_document"
    assert detect_mode("word " * 400, 450, count_tokens=lambda t: 1) == "short"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"max_tokens": 10, "min_tokens": 11}, "min_tokens"),
        ({"mode": "poem"}, "mode"),
        ({"breakpoint_percentile": 92}, "breakpoint_percentile"),
        ({"count_tokens": lambda t: -1}, "count_tokens"),
        ({"count_tokens": lambda t: 1.5}, "count_tokens"),
    ],
)
def test_bad_settings_are_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        chunk("Some text.", **kwargs)


def test_non_text_input_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="text must be str"):
        chunk(b"bytes")  # type: ignore[arg-type]


# --- semantic soft boundaries ---------------------------------------------------------------

CATS = [
    "The cat purrs and the cat naps.",
    "A cat naps while a cat purrs.",
    "Every cat purrs, every cat naps.",
    "This cat naps; that cat purrs.",
]
SHIPS = [
    "The ship sails and the ship docks.",
    "A ship docks while a ship sails.",
    "Every ship sails, every ship docks.",
    "This ship docks; that ship sails.",
]
TOPICS = " ".join(CATS + SHIPS)  # one paragraph that fits in one chunk


def test_without_an_embedder_a_fitting_paragraph_is_one_chunk() -> None:
    (only,) = chunk(TOPICS, mode="long_document", min_tokens=0)
    assert only.text == TOPICS


def test_an_embedder_splits_at_the_topic_change() -> None:
    chunks = chunk(TOPICS, mode="long_document", min_tokens=0, sentence_embedder=bag_of_words)
    assert [c.text for c in chunks] == [" ".join(CATS), " ".join(SHIPS)]


def test_the_threshold_is_strictly_greater_than_the_percentile() -> None:
    # At the 100th percentile the cut is the largest distance itself: nothing is greater.
    chunks = chunk(
        TOPICS,
        mode="long_document",
        min_tokens=0,
        sentence_embedder=bag_of_words,
        breakpoint_percentile=1.0,
    )
    assert [c.text for c in chunks] == [TOPICS]


def test_semantic_pieces_below_the_floor_merge_back() -> None:
    chunks = chunk(TOPICS, mode="long_document", min_tokens=120, sentence_embedder=bag_of_words)
    assert [c.text for c in chunks] == [TOPICS]


def test_semantic_boundaries_do_not_replace_hard_ones() -> None:
    doc = "[h1] Cats\n" + " ".join(CATS) + "\n[h1] Ships\n" + " ".join(SHIPS)
    chunks = chunk(doc, mode="long_document", min_tokens=0, sentence_embedder=bag_of_words)
    assert [c.heading_path for c in chunks] == [("Cats",), ("Ships",)]


def test_short_mode_never_calls_the_embedder() -> None:
    calls: list[list[str]] = []

    def recording(sentences: list[str]) -> list[list[float]]:
        calls.append(sentences)
        return bag_of_words(sentences)

    chunks = chunk(TOPICS, min_tokens=0, sentence_embedder=recording)  # detected: short
    assert [c.text for c in chunks] == [TOPICS]
    assert calls == []


def test_the_embedder_is_called_once_per_document() -> None:
    calls: list[list[str]] = []

    def recording(sentences: list[str]) -> list[list[float]]:
        calls.append(sentences)
        return bag_of_words(sentences)

    doc = "[h1] Cats\n" + " ".join(CATS) + "\n[h1] Ships\n" + " ".join(SHIPS) + "\n[h1] One\nAlone."
    chunk(doc, mode="long_document", sentence_embedder=recording)
    assert calls == [CATS + SHIPS]  # the lone sentence has no neighbour to compare


@pytest.mark.parametrize(
    "bad",
    [
        lambda sentences: [[1.0, 0.0]] * (len(sentences) - 1),
        lambda sentences: [[1.0, 0.0], [1.0]] + [[1.0, 0.0]] * (len(sentences) - 2),
        lambda sentences: [[float("nan"), 1.0]] * len(sentences),
    ],
)
def test_a_bad_embedder_result_is_a_loud_error(bad) -> None:
    with pytest.raises(ValueError, match="sentence_embedder"):
        chunk(TOPICS, mode="long_document", sentence_embedder=bad)


def test_percentile_interpolates_linearly() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert percentile([0.0, 10.0], 0.92) == pytest.approx(9.2)
    assert percentile([7.0], 0.92) == 7.0
    assert percentile([1.0, 2.0, 3.0], 1.0) == 3.0


def test_zero_vectors_count_as_unrelated() -> None:
    # A sentence without words embeds to a zero vector: distance 1, never NaN.
    vectors = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    assert cosine_distances(vectors) == [1.0, 1.0, 0.0]


def test_chunk_fields() -> None:
    (only,) = chunk("[page-n-7]\nText.", title="T")
    assert only == Chunk(
        index=0,
        text="Text.",
        embed_text="T\nText.",
        heading_path=(),
        parent_key=only.parent_key,
        page=7,
        tc_in=None,
        tc_out=None,
        token_count=2,
        source_hash=source_hash("T\nText."),
    )
