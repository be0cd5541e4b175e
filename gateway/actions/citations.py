"""Citation markers in a generated answer: validated against the supplied passages, then described.

A marker is ``[n]`` or ``[n, m, ...]`` with passage numbers from 1. A number
outside the supplied passages names nothing the answer was grounded on: it is
removed from the answer (the whole marker when none of its numbers is valid)
and counted. Each cited passage becomes one citation carrying what a reader
needs to open it: the record locator, the chunk id, the cited text and the
deep-link fields (timecodes, page, heading path). Citation keys follow the
archive's camelCase (``sectionTipo``, ``citedText``); provenance stays snake_case.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.base.locator import chunk_id, record_locator
from index.store.hits import ChunkHit

__all__ = ["Validated", "citation", "validate_markers"]

_MARKER_RE = re.compile(r"\s*\[(\d{1,4}(?:\s*,\s*\d{1,4})*)\]")


@dataclass(frozen=True)
class Validated:
    answer: str
    cited: list[int]  # valid passage numbers, in order of first citation
    removed: int  # numbers that named no supplied passage


def validate_markers(answer: str, passages: int) -> Validated:
    """Drop the marker numbers outside ``1..passages``; list the valid ones in citation order."""
    cited: list[int] = []
    removed = 0

    def keep(match: re.Match[str]) -> str:
        nonlocal removed
        numbers = [int(x) for x in match.group(1).split(",")]
        valid = [n for n in numbers if 1 <= n <= passages]
        removed += len(numbers) - len(valid)
        for n in valid:
            if n not in cited:
                cited.append(n)
        if not valid:
            return ""
        lead = match.group(0)[: len(match.group(0)) - len(match.group(0).lstrip())]
        return f"{lead}[{', '.join(str(n) for n in dict.fromkeys(valid))}]"

    return Validated(_MARKER_RE.sub(keep, answer).strip(), cited, removed)


def citation(n: int, chunk: ChunkHit) -> dict[str, Any]:
    """Citation ``n``: where passage ``n`` lives and how to open it at the right place."""
    meta = chunk.meta
    return {
        "n": n,
        "locator": record_locator(chunk.section_tipo, chunk.section_id),
        "chunkId": chunk_id(chunk),
        "sectionTipo": chunk.section_tipo,
        "sectionId": chunk.section_id,
        "componentTipo": chunk.component_tipo,
        "lang": chunk.lang,
        "chunkIndex": chunk.chunk_index,
        "citedText": chunk.text,
        "title": meta.get("title"),
        "headingPath": list(meta.get("heading_path") or []),
        "page": meta.get("page"),
        "tcIn": meta.get("tc_in"),
        "tcOut": meta.get("tc_out"),
    }


def citations(cited: Sequence[int], chunks: Sequence[ChunkHit]) -> list[dict[str, Any]]:
    """One citation per cited passage number (``chunks[n - 1]`` is passage ``n``)."""
    return [citation(n, chunks[n - 1]) for n in cited]
