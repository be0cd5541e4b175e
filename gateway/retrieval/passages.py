"""How a retrieved chunk is shown to a caller: a record hit, a passage, its provenance.

One definition of each shape, read by the passage actions, ``ask`` and the
MCP tools alike (they all answer with the same dicts).
"""

from __future__ import annotations

from typing import Any

from gateway.base.locator import chunk_id
from gateway.retrieval.expand import Expanded
from gateway.retrieval.ranking import Ranked
from index.store.hits import ChunkHit

__all__ = ["SNIPPET_CHARS", "chunk_view", "hit", "passage", "provenance", "rerank_flags", "snippet"]

SNIPPET_CHARS = 240


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    """The passage's opening, cut at a word boundary with an ellipsis when longer than ``limit``."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > limit // 2 else limit].rstrip(" ,;:.") + "…"


def hit(r: Ranked) -> dict[str, Any]:
    """A record-level hit, as the archive's RagSearchHit."""
    c = r.chunk
    return {
        "section_tipo": c.section_tipo,
        "section_id": c.section_id,
        "component_tipo": c.component_tipo,
        "lang": c.lang,
        "snippet": snippet(c.text),
        "score": round(r.score, 6),
    }


def chunk_view(c: ChunkHit) -> dict[str, Any]:
    """A stored chunk's text and where it sits in its document (for citations and deep links)."""
    meta = c.meta
    return {
        "section_tipo": c.section_tipo,
        "section_id": c.section_id,
        "component_tipo": c.component_tipo,
        "lang": c.lang,
        "chunk_index": c.chunk_index,
        "chunk_id": chunk_id(c),
        "text": c.text,
        "title": meta.get("title"),
        "heading_path": list(meta.get("heading_path") or []),
        "page": meta.get("page"),
        "tc_in": meta.get("tc_in"),
        "tc_out": meta.get("tc_out"),
        "group": c.component_tipo[4:] if c.component_tipo.startswith("rag:") else None,
        "parent_key": c.parent_key,
    }


def passage(r: Ranked) -> dict[str, Any]:
    """A passage: the hit plus the chunk's full text and where it sits in its document."""
    return {**hit(r), **chunk_view(r.chunk)}


def provenance(p: Expanded, n: int | None = None) -> dict[str, Any]:
    """A passage as supplied (``n``: its citation number) with its expansion, when widened."""
    out = passage(p.ranked)
    if n is not None:
        out = {"n": n, **out}
    if p.mode is not None:
        out["expansion"] = {"mode": p.mode, "chunk_indexes": p.chunk_indexes, "text": p.text}
    return out


def rerank_flags(item: dict[str, Any], r: Ranked, reranked: bool | None) -> dict[str, Any]:
    """With ``rerank: true``, each item says whether the cross-encoder ordered it (and its score)."""
    if reranked is not None:
        item["reranked"] = reranked
        item["rerank_score"] = None if r.rerank_score is None else round(r.rerank_score, 6)
    return item
