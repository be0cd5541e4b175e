"""The lexical leg's Tantivy index on disk: its folders, schema, documents and watermark file.

Layout under the lexical folder (``RAG_LEXICAL_DIR``, default ``$RAG_DATA_DIR/lexical``), one
folder per model partition::

    <root>/<partition>/current -> v-<n>      a symlink, replaced atomically by a rebuild's swap
    <root>/<partition>/v-<n>/                 a Tantivy index (meta.json + segment files)
    <root>/<partition>/v-<n>/watermark.json  what that index holds: the feed watermark, the classes
    <root>/<partition>/writer.lock            held (flock) by the one writer of the partition
    <root>/writer.lock                        held by a running follower (one per lexical folder)

A document is one stored row: its key (stored, raw), its record (raw: a search may exclude it), its
section (raw: the scope's section filter), its access class (an indexed fast u64: the principal's
classes filter the query) and its lexemes: PostgreSQL's tsvector terms, each repeated as often as
the row holds it, under Tantivy's whitespace tokenizer, so each lexeme is one term and tokenizing
and stemming stay PostgreSQL's (per record language). The same lexemes again under ``klex``, each
prefixed by its row's class (:func:`class_term`): a scope that permits a few classes asks their
postings alone instead of filtering every match of a term by class. Beside the key, what the SQL
leg's BM25 reads of the row: its ``lexical_length`` (``dl``, a fast field) and each lexeme's count
(``tfs``, stored, :func:`term_counts_bytes`), so a reader scores a candidate exactly without
PostgreSQL.

The watermark file names the index's :data:`FORMAT`: a reader searches only an index of its own
format (the SQL leg serves another), a writer rebuilds any other.

The watermark file is written (temporary file, fsync, rename) only after the commit it describes,
so it is never ahead of the committed index: a writer killed between the two replays the changes
since the older watermark, and a replay deletes each key before adding its row (idempotent).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import tantivy

from index.follow.swap_folders import (
    CURRENT,
    WriterLocked,
    current_folder,
    new_folder,
    partition_folder,
    swap_in,
    write_json_atomically,
    writer_lock,
)
from index.search.access_classes import AccessClass, access_class
from index.store.change_feed import RowKey, Watermark, row_key

__all__ = [
    "COUNT_BITS",
    "COUNT_ENTRY",
    "CURRENT",
    "FORMAT",
    "MAX_COUNT",
    "STATE_FILE",
    "IndexState",
    "WriterLocked",
    "any_term",
    "class_id",
    "class_term",
    "create_index",
    "current_folder",
    "describe",
    "document",
    "key_of",
    "key_text",
    "lexeme_hash",
    "lexical_schema",
    "new_folder",
    "partition_folder",
    "read_state",
    "record_text",
    "swap_in",
    "term_counts_bytes",
    "term_counts_of",
    "write_state",
    "writer_lock",
]

STATE_FILE = "watermark.json"
# The documents' layout: 1 had no stored BM25 inputs (dl, tfs), 2 stored the counts as text
# (" lexeme\0count ..."), 3 as 12-byte records with the key as JSON, 4 as one 8-byte word a lexeme,
# the key as its columns joined by NUL, ``dl`` a fast field only, and the class-scoped ``klex`` terms
# (at 1M chunks: 398 MiB in format 3, 309 in format 4 without klex, 370 with it); another format
# is rebuilt.
FORMAT = 4
# One lexeme's count in a document's ``tfs``: one little-endian u64, the lexeme's 56-bit hash above
# its count (COUNT_BITS), so a reader finds a query term's entries by comparing integers. A row
# that holds a lexeme more than MAX_COUNT times, or two lexemes that share a hash, stores no counts
# (term_counts_bytes) and is scored by PostgreSQL; a query term that shares a hash with a lexeme of
# a candidate that does not hold it would be scored as holding it: at 2**-56 a pair, about 1e-13 a
# search.
COUNT_ENTRY = np.dtype("<u8")
COUNT_BITS = 8
MAX_COUNT = (1 << COUNT_BITS) - 1
DOCSTORE_SETTINGS = {"docstore_compression": "lz4", "docstore_blocksize": 2048}  # see create_index


def lexical_schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("key", stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_unsigned_field("dl", fast=True)  # fast: a candidate's length, the statistics' mean
    builder.add_bytes_field("tfs", stored=True, indexed=False)
    builder.add_text_field("record", tokenizer_name="raw", index_option="basic")
    builder.add_text_field("section", tokenizer_name="raw", index_option="basic")
    builder.add_unsigned_field("klass", indexed=True, fast=True)
    # Frequencies, no positions: BM25 needs tf and the field length, never a phrase.
    builder.add_text_field("lex", tokenizer_name="whitespace", index_option="freq")
    # The lexemes again, each behind its row's class (class_term): a narrow scope's postings.
    builder.add_text_field("klex", tokenizer_name="whitespace", index_option="freq")
    return builder.build()


def any_term(schema: tantivy.Schema, field_name: str, values: Sequence[str | int]) -> tantivy.Query:
    """Documents whose ``field_name`` holds any of ``values``. One value is a term query: at 1M
    chunks a search filtered by one access class took 0.52 ms with it, 0.81 with a term set."""
    if len(values) == 1:
        return tantivy.Query.term_query(schema, field_name, values[0])
    return tantivy.Query.term_set_query(schema, field_name, list(values))


def key_of(text: str) -> RowKey:
    """The row key a :func:`key_text` names."""
    section, record, component, lang, view, chunk = text.split("\0")
    return (section, int(record), component, lang, view, int(chunk))


def create_index(folder: Path) -> None:
    """Create an empty index in ``folder`` whose document store suits a search's reads.

    A search reads a few hundred random documents (each candidate's key, length and counts); with
    Tantivy's default store (LZ4 blocks of 16 KiB, about 40 of these documents each) every read
    decompresses a block of its own: 160 reads took 0.97 ms at 100k chunks, against 0.35 ms in
    blocks of 2 KiB (the store 12% larger). Tantivy takes its store's settings from the index's
    ``meta.json`` (``index_settings``, written at creation and kept by every commit and merge);
    the Python binding has no argument for them, so they are set there before a writer opens it.
    """
    tantivy.Index(lexical_schema(), path=str(folder), reuse=False)
    meta_path = folder / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["index_settings"].update(DOCSTORE_SETTINGS)
    meta_path.write_text(json.dumps(meta))


def key_text(key: RowKey) -> str:
    """A row key as the one term that names it: its columns joined by NUL, which no PostgreSQL text
    holds (unambiguous, and split back without a JSON parse: a search reads a hundred of them)."""
    return "\0".join(map(str, key))


def class_term(klass: int, lexeme: str) -> str:
    """A lexeme as a ``klex`` term of one access class (:func:`class_id`, 16 hex digits ahead)."""
    return f"{klass:016x}{lexeme}"


def lexeme_hash(lexeme: str) -> int:
    """A lexeme's stable 64-bit name in :func:`term_counts_bytes` (the same in every process and run)."""
    return int.from_bytes(hashlib.blake2b(lexeme.encode(), digest_size=8).digest(), "little")


def term_counts_bytes(lexemes: Sequence[str], tfs: Sequence[int]) -> bytes | None:
    """The row's lexemes with their counts as packed :data:`COUNT_ENTRY` words (the lexeme's
    :func:`lexeme_hash` shortened to 56 bits, its count below), or None when a count passes
    :data:`MAX_COUNT` or two of its lexemes share a hash (its score is then PostgreSQL's, never a
    guess)."""
    if any(tf > MAX_COUNT for tf in tfs):
        return None
    hashes = [_short_hash(lexeme) for lexeme in lexemes]
    if len(set(hashes)) < len(hashes):
        return None
    words = (np.asarray(hashes, dtype=np.uint64) << np.uint64(COUNT_BITS)) | np.asarray(tfs, dtype=np.uint64)
    return words.astype(COUNT_ENTRY).tobytes()


def _short_hash(lexeme: str) -> int:
    return lexeme_hash(lexeme) >> COUNT_BITS


@functools.lru_cache(maxsize=4096)
def _query_term_hash(term: str) -> int:
    """A query term's hash as its entries hold it, held: a search hashes its ten-odd terms again otherwise."""
    return _short_hash(term)


def term_counts_of(counts: Sequence[bytes | None], terms: Sequence[str]) -> np.ndarray:
    """How often each row (its :func:`term_counts_bytes`; None: none, counted 0) holds each term,
    as a ``len(terms) x len(counts)`` array: all the rows' entries in one array, each entry's term
    found among the sorted query hashes at once (a search scores about a hundred rows on about ten
    terms: 66 us where a regular expression over the lexemes' text took 181, at 1M chunks)."""
    out = np.zeros((len(terms), len(counts)), dtype=np.int64)
    held = [i for i, c in enumerate(counts) if c]
    if not held or not terms:
        return out
    entries = np.frombuffer(b"".join(counts[i] for i in held), dtype=COUNT_ENTRY)  # type: ignore[misc]
    ends = np.cumsum([len(counts[i]) for i in held]) // COUNT_ENTRY.itemsize  # type: ignore[arg-type]
    wanted = np.fromiter(map(_query_term_hash, terms), dtype=np.uint64, count=len(terms))
    order = np.argsort(wanted)
    ranked = wanted[order]
    hashes = entries >> np.uint64(COUNT_BITS)
    at = np.searchsorted(ranked, hashes)
    at[at == len(ranked)] = 0  # past the largest: compared with the first, which it is not
    hit = np.flatnonzero(ranked[at] == hashes)
    tfs = (entries[hit] & np.uint64(MAX_COUNT)).astype(np.int64)
    out[order[at[hit]], np.asarray(held)[np.searchsorted(ends, hit, side="right")]] = tfs
    return out


def record_text(section_tipo: str, section_id: int) -> str:
    return json.dumps([section_tipo, section_id], ensure_ascii=False, separators=(",", ":"))


def class_id(access: AccessClass) -> int:
    """A stable u64 of an access class: the same in every writer run, so a replay after a crash
    never gives a committed document's id another meaning."""
    digest = hashlib.blake2b(json.dumps(access).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def document(row: asyncpg.Record) -> tuple[tantivy.Document, int, AccessClass]:
    """The document of a present row read with :data:`index.search.access_classes.LEXICAL_ROW_COLUMNS`
    after its key, with its class id and class."""
    key = row_key(row)
    access = access_class(key, row)
    klass = class_id(access)
    doc = tantivy.Document()
    doc.add_text("key", key_text(key))
    doc.add_text("record", record_text(key[0], key[1]))
    doc.add_text("section", key[0])
    doc.add_unsigned("klass", klass)
    lexemes, tfs = row["lexemes"] or (), row["tfs"] or ()
    doc.add_unsigned("dl", int(row["lexical_length"]))
    counts = term_counts_bytes(lexemes, tfs)
    if counts is not None:
        doc.add_bytes("tfs", counts)
    words = [w for w, tf in zip(lexemes, tfs, strict=True) for _ in range(tf)]
    doc.add_text("lex", " ".join(words))
    doc.add_text("klex", " ".join(class_term(klass, w) for w in words))
    return doc, klass, access


@dataclass(frozen=True)
class IndexState:
    """What a committed index holds: every change up to ``watermark`` of the store named ``store``
    (:func:`index.store.change_feed.store_identity`), and the access classes its documents carry (id -> class), so a reader
    evaluates a scope over them without PostgreSQL."""

    watermark: Watermark
    classes: Mapping[int, AccessClass] = field(default_factory=dict)
    documents: int = 0
    store: str = ""  # empty: an index written before the identity was recorded (rebuilt on load)
    format: int = FORMAT  # the documents' layout (1: a file written before formats were recorded)

    def searchable_in(self, store: str) -> bool:
        """A reader of ``store`` searches this index: built from it, in this reader's :data:`FORMAT`."""
        return self.store == store and self.format == FORMAT

    def as_json(self) -> dict[str, Any]:
        return {
            "seq": self.watermark.seq,
            "xmin": self.watermark.xmin,
            "store": self.store,
            "documents": self.documents,
            "format": self.format,
            "classes": [[str(i), list(c[:3]), list(c[3]), c[4], c[5]] for i, c in self.classes.items()],
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> IndexState:
        classes: dict[int, AccessClass] = {}
        for i, head, projects, pairs, sections in raw["classes"]:
            classes[int(i)] = (
                head[0],
                head[1],
                head[2],
                tuple(projects),
                None if pairs is None else tuple(pairs),
                None if sections is None else tuple(sections),
            )
        return cls(
            Watermark(int(raw["seq"]), int(raw["xmin"])),
            classes,
            int(raw["documents"]),
            str(raw.get("store", "")),
            int(raw.get("format", 1)),
        )


def read_state(folder: Path) -> IndexState | None:
    """The watermark file of an index folder; None when there is none (never committed)."""
    try:
        raw = (folder / STATE_FILE).read_text()
    except FileNotFoundError:
        return None
    return IndexState.from_json(json.loads(raw))


def write_state(folder: Path, state: IndexState) -> None:
    """Replace the watermark file atomically (temporary file, fsync, rename, fsync the folder)."""
    write_json_atomically(folder / STATE_FILE, state.as_json())


def describe(folder: Path, store: str) -> dict[str, Any] | None:
    """What ``folder`` holds, for :func:`index.follow.folder_state.folder_reports`: its watermark,
    documents, classes and format, and whether a reader of ``store`` leaves it (``foreign``)."""
    state = read_state(folder)
    if state is None:
        return None
    return {
        "seq": state.watermark.seq,
        "documents": state.documents,
        "classes": len(state.classes),
        "format": state.format,
        "foreign": not state.searchable_in(store),
    }
