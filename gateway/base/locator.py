"""Stable names for what a citation or an agent points at.

- a record locator, the archive's ``"oh1-412"`` (section tipo, section id);
- a chunk id, ``"oh1-412/rag:transcript/lg-spa/3"`` (record, component, language,
  chunk index): the identity of one stored passage, what ``read_chunk`` takes.
"""

from __future__ import annotations

import re

from index.store.hits import ChunkHit, ChunkKey
from index.store.validation import GROUP_ID_PATTERN, LANG_PATTERN, TIPO_PATTERN

__all__ = ["CHUNK_ID_PATTERN", "chunk_id", "parse_chunk_id", "record_locator"]


def _inner(pattern: str) -> str:
    """A whole-string grammar (``^...\\Z``) as a fragment to embed in a larger one."""
    return pattern.removeprefix("^").removesuffix("\\Z")


_TIPO, _GROUP, _LANG = _inner(TIPO_PATTERN), _inner(GROUP_ID_PATTERN), _inner(LANG_PATTERN)
_CHUNK_ID = (
    rf"(?P<tipo>{_TIPO})-(?P<id>\d{{1,18}})/(?P<component>rag:{_GROUP}|{_TIPO})"
    rf"/(?P<lang>{_LANG})/(?P<index>\d{{1,9}})"
)
_CHUNK_ID_RE = re.compile(_CHUNK_ID)
# The same grammar, whole-string and without group names, for JSON Schema (clients' regex dialects).
CHUNK_ID_PATTERN = "^" + re.sub(r"\(\?P<\w+>", "(", _CHUNK_ID) + "\\Z"


def record_locator(section_tipo: str, section_id: int) -> str:
    return f"{section_tipo}-{section_id}"


def chunk_id(chunk: ChunkHit) -> str:
    return f"{record_locator(chunk.section_tipo, chunk.section_id)}/{chunk.component_tipo}/{chunk.lang}/{chunk.chunk_index}"


def parse_chunk_id(value: str) -> ChunkKey | None:
    """The chunk key a chunk id names, or None when it is not one."""
    m = _CHUNK_ID_RE.fullmatch(value)
    if m is None:
        return None
    return (m["tipo"], int(m["id"]), m["component"], m["lang"], int(m["index"]))
