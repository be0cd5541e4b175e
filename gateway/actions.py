"""The dd_rag_api actions: each reads its options, calls retrieval, and shapes ``(msg, data)``.

Handlers never authorize results themselves: the retrieval's ACL gate has
already removed what the caller may not see. Domain errors from retrieval are
translated to coded API errors here, at the edge.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

from index.search import Scope

from . import objects as _objects
from . import options as opt
from .auth import Principal
from .errors import ApiError
from .retrieval import EmbeddingUnavailable, QueryRejected, Ranked, Retriever, SeedNotFound

SNIPPET_CHARS = 240


@dataclass(frozen=True)
class ActionContext:
    principal: Principal
    retriever: Retriever
    pool: asyncpg.Pool


Handler = Callable[[ActionContext, Mapping[str, Any]], Awaitable[tuple[str, Any]]]


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


def passage(r: Ranked) -> dict[str, Any]:
    """A passage: the hit plus the chunk's full text and where it sits in its document."""
    c = r.chunk
    meta = c.meta
    return {
        **hit(r),
        "chunk_index": c.chunk_index,
        "text": c.text,
        "title": meta.get("title"),
        "heading_path": list(meta.get("heading_path") or []),
        "page": meta.get("page"),
        "tc_in": meta.get("tc_in"),
        "tc_out": meta.get("tc_out"),
        "group": c.component_tipo[4:] if c.component_tipo.startswith("rag:") else None,
        "parent_key": c.parent_key,
    }


def _text_scope(options: Mapping[str, Any]) -> tuple[str, Scope, int]:
    return (
        opt.query(options),
        Scope(section_tipos=opt.scope(options), group=opt.group(options)),
        opt.limit(options),
    )


def query_error(exc: EmbeddingUnavailable | QueryRejected) -> ApiError:
    """A failed query embedding, at the edge: bad input is the caller's 400, anything else a 503."""
    if isinstance(exc, QueryRejected):
        return ApiError.invalid_options(f"query: the embedding model refused it ({exc.code}: {exc.message})")
    return ApiError.embedding_unavailable()


async def semantic_search(ctx: ActionContext, options: Mapping[str, Any]) -> tuple[str, Any]:
    query, scope, limit = _text_scope(options)
    try:
        ranked = await ctx.retriever.records(ctx.principal, query, scope, limit)
    except (EmbeddingUnavailable, QueryRejected) as exc:
        raise query_error(exc) from exc
    return "ok", [hit(r) for r in ranked]


async def _passages(ctx: ActionContext, options: Mapping[str, Any]) -> list[dict[str, Any]]:
    query, scope, limit = _text_scope(options)
    try:
        ranked = await ctx.retriever.passages(ctx.principal, query, scope, limit)
    except (EmbeddingUnavailable, QueryRejected) as exc:
        raise query_error(exc) from exc
    return [passage(r) for r in ranked]


async def retrieve(ctx: ActionContext, options: Mapping[str, Any]) -> tuple[str, Any]:
    return "ok", await _passages(ctx, options)


async def get_agent_context(ctx: ActionContext, options: Mapping[str, Any]) -> tuple[str, Any]:
    return "agent_context", await _passages(ctx, options)


async def similar_to(ctx: ActionContext, options: Mapping[str, Any]) -> tuple[str, Any]:
    section_tipo, section_id = opt.seed(options)
    limit, group = opt.limit(options), opt.group(options)
    try:
        ranked = await ctx.retriever.similar(ctx.principal, section_tipo, section_id, limit, group=group)
    except SeedNotFound as exc:
        # The same answer for a missing seed and one the caller may not read.
        raise ApiError.invalid_options("Unknown seed record") from exc
    except EmbeddingUnavailable as exc:  # the sidecar could not even name the text model
        raise ApiError.embedding_unavailable() from exc
    out = []
    for r in ranked:
        h = hit(r)
        h["similarity"] = None if r.similarity is None else round(r.similarity, 6)
        out.append(h)
    return "ok", out


NO_GROUPS: dict[str, list[str]] = {"groups": []}


async def embed_groups(ctx: ActionContext, options: Mapping[str, Any]) -> tuple[str, Any]:
    """The section's embed-group ids; ``{groups: []}`` alike for malformed, unreadable and not opted in."""
    from index.sections import SectionStore

    tipo = options.get("section_tipo")
    if not opt.is_tipo(tipo) or ctx.principal.section_level(tipo) < 1:
        return "ok", NO_GROUPS
    groups = await SectionStore(ctx.pool).group_ids(tipo)
    return "ok", {"groups": list(groups)}


def not_implemented(action: str) -> Handler:
    async def handler(ctx: ActionContext, options: Mapping[str, Any]) -> tuple[str, Any]:
        raise ApiError.not_implemented(action)

    return handler


@dataclass(frozen=True)
class ActionSpec:
    handler: Handler
    media: bool = False  # additionally gated by RAG_MEDIA_ENABLED
    summary: str = ""


ACTIONS: dict[str, ActionSpec] = {
    "semantic_search": ActionSpec(
        semantic_search, summary="Records best matching a query (best chunk each)."
    ),
    "retrieve": ActionSpec(retrieve, summary="Passages (chunks) best matching a query."),
    "get_agent_context": ActionSpec(get_agent_context, summary="Passages shaped as LLM context."),
    "similar_to": ActionSpec(similar_to, summary="Records similar to a seed record (its stored vectors)."),
    "embed_groups": ActionSpec(embed_groups, summary="A section's embed-group ids."),
    "ask": ActionSpec(
        not_implemented("ask"), summary="Grounded answer with citations (not implemented yet)."
    ),
    "similar_objects": ActionSpec(
        _objects.similar_objects,
        media=True,
        summary="Objects visually (and by context) close to a seed object's stored images.",
    ),
    "search_by_text_image": ActionSpec(
        _objects.search_by_text_image,
        media=True,
        summary="A text query into the image space (the image-text model's text tower).",
    ),
    "characterize_object": ActionSpec(
        _objects.characterize_object,
        media=True,
        summary="Neighbour-aggregated role proposals (vote, date range) with evidence; no LLM.",
    ),
}
