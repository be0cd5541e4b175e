"""The egress decision: which passages may be sent to the generator, recomputed per record per request.

A local generator (the extractive provider, or an OpenAI-compatible server on
loopback or a host listed in ``RAG_LOCAL_PROVIDER_HOSTS``) keeps everything on
the host, so every passage may go to it. For an external one, a passage may
leave only when every section behind its text may: the record's own section
and each section contributing text to its group document (``"dd810/dd812"``).
A section may when it is not in ``RAG_EXTERNAL_PROVIDER_FORBIDDEN_SECTIONS``
and either ``RAG_ALLOW_EXTERNAL_PROVIDER_DEFAULT`` is on or its descriptor
opts in (``egress.allow_external: true``). External generation is therefore
off by default, and a forbidden section's text cannot egress through a host.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from index.store.hits import ChunkHit

__all__ = ["passage_sections", "restricted_sections", "section_allows_external"]


def passage_sections(chunks: Iterable[ChunkHit]) -> set[str]:
    """Every section whose text the chunks hold: their own, and their contributors' for group chunks."""
    out: set[str] = set()
    for c in chunks:
        out.add(c.section_tipo)
        contributors = c.meta.get("contributors") if c.component_tipo.startswith("rag:") else None
        for entry in contributors if isinstance(contributors, list) else ():
            if isinstance(entry, str) and "/" in entry:
                out.add(entry.split("/", 1)[0])
    return out


def section_allows_external(
    section: str,
    descriptors: Mapping[str, Mapping[str, Any]],
    *,
    allow_default: bool,
    forbidden: Iterable[str],
) -> bool:
    if section in set(forbidden):
        return False
    if allow_default:
        return True
    egress = (descriptors.get(section) or {}).get("egress") or {}
    return egress.get("allow_external") is True


def restricted_sections(
    sections: Iterable[str],
    descriptors: Mapping[str, Mapping[str, Any]],
    *,
    allow_default: bool,
    forbidden: Iterable[str],
) -> set[str]:
    """The sections among ``sections`` whose text may not go to an external generator."""
    forbidden = set(forbidden)
    return {
        s
        for s in sections
        if not section_allows_external(s, descriptors, allow_default=allow_default, forbidden=forbidden)
    }
