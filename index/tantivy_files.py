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
and stemming stay PostgreSQL's (per record language).

The watermark file is written (temporary file, fsync, rename) only after the commit it describes,
so it is never ahead of the committed index: a writer killed between the two replays the changes
since the older watermark, and a replay deletes each key before adding its row (idempotent).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import tantivy

from .access_classes import AccessClass, access_class
from .change_feed import RowKey, Watermark, row_key
from .swap_folders import (
    CURRENT,
    WriterLocked,
    current_folder,
    new_folder,
    partition_folder,
    swap_in,
    write_json_atomically,
    writer_lock,
)

__all__ = [
    "CURRENT",
    "STATE_FILE",
    "IndexState",
    "WriterLocked",
    "class_id",
    "current_folder",
    "document",
    "key_text",
    "lexical_schema",
    "new_folder",
    "partition_folder",
    "read_state",
    "record_text",
    "store_identity",
    "swap_in",
    "write_state",
    "writer_lock",
]

STATE_FILE = "watermark.json"


def lexical_schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("key", stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_text_field("record", tokenizer_name="raw", index_option="basic")
    builder.add_text_field("section", tokenizer_name="raw", index_option="basic")
    builder.add_unsigned_field("klass", indexed=True, fast=True)
    # Frequencies, no positions: BM25 needs tf and the field length, never a phrase.
    builder.add_text_field("lex", tokenizer_name="whitespace", index_option="freq")
    return builder.build()


def key_text(key: RowKey) -> str:
    """A row key as the one term that names it (JSON: unambiguous whatever its texts hold)."""
    return json.dumps(list(key), ensure_ascii=False, separators=(",", ":"))


def record_text(section_tipo: str, section_id: int) -> str:
    return json.dumps([section_tipo, section_id], ensure_ascii=False, separators=(",", ":"))


def class_id(access: AccessClass) -> int:
    """A stable u64 of an access class: the same in every writer run, so a replay after a crash
    never gives a committed document's id another meaning."""
    digest = hashlib.blake2b(json.dumps(access).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def document(row: asyncpg.Record) -> tuple[tantivy.Document, int, AccessClass]:
    """The document of a present row read with :data:`index.access_classes.LEXICAL_ROW_COLUMNS`
    after its key, with its class id and class."""
    key = row_key(row)
    access = access_class(key, row)
    klass = class_id(access)
    doc = tantivy.Document()
    doc.add_text("key", key_text(key))
    doc.add_text("record", record_text(key[0], key[1]))
    doc.add_text("section", key[0])
    doc.add_unsigned("klass", klass)
    words = [w for w, tf in zip(row["lexemes"] or (), row["tfs"] or (), strict=True) for _ in range(tf)]
    doc.add_text("lex", " ".join(words))
    return doc, klass, access


async def store_identity(conn: asyncpg.Connection) -> str:
    """Which database an index was built from: its oid and when its first migration was applied.

    A watermark only means something against the store that numbered its changes: an index left
    from a database that was reset, or built against another one (the demo's under ``.mnemo`` while
    tests point a default gateway at theirs), would otherwise pass for caught up and hide rows.
    Readable by any role (no superuser-only ``pg_control_system``); a database copied from a
    template gets its own oid."""
    return str(
        await conn.fetchval(
            """SELECT d.oid::text || '/' || coalesce(
                          (SELECT extract(epoch FROM min(applied_at))::text FROM schema_migrations), '')
               FROM pg_database d WHERE d.datname = current_database()"""
        )
    )


@dataclass(frozen=True)
class IndexState:
    """What a committed index holds: every change up to ``watermark`` of the store named ``store``
    (:func:`store_identity`), and the access classes its documents carry (id -> class), so a reader
    evaluates a scope over them without PostgreSQL."""

    watermark: Watermark
    classes: Mapping[int, AccessClass] = field(default_factory=dict)
    documents: int = 0
    store: str = ""  # empty: an index written before the identity was recorded (rebuilt on load)

    def as_json(self) -> dict[str, Any]:
        return {
            "seq": self.watermark.seq,
            "xmin": self.watermark.xmin,
            "store": self.store,
            "documents": self.documents,
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
