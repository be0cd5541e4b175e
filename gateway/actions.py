"""The dd_rag_api actions: each reads its options, calls retrieval, and shapes ``(msg, data)``.

Handlers never authorize results themselves: the retrieval's ACL gate has
already removed what the caller may not see. Domain errors from retrieval are
translated to coded API errors here, at the edge.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg

from index.search import ChunkHit, Scope

from . import objects as _objects
from . import options as opt
from .auth import Principal
from .errors import ApiError
from .locator import chunk_id
from .retrieval import EmbeddingUnavailable, QueryRejected, Ranked, Retriever, SeedNotFound

if TYPE_CHECKING:
    from .ask import AskServices
    from .expand import Expanded

SNIPPET_CHARS = 240


@dataclass(frozen=True)
class ActionContext:
    principal: Principal
    retriever: Retriever
    pool: asyncpg.Pool
    services: AskServices | None = None  # reranker, generator, egress inputs (ask, rerank, expand)


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


def _rerank_flags(item: dict[str, Any], r: Ranked, reranked: bool | None) -> dict[str, Any]:
    """With ``rerank: true``, each item says whether the cross-encoder ordered it (and its score)."""
    if reranked is not None:
        item["reranked"] = reranked
        item["rerank_score"] = None if r.rerank_score is None else round(r.rerank_score, 6)
    return item


def _explained(item: dict[str, Any], r: Ranked, explain: bool) -> dict[str, Any]:
    """With ``explain: true``, each item carries ``legs``: its 1-based rank in each leg that found it
    (what fusion combined), so a person sees why it ranks where it does."""
    if explain:
        item["legs"] = dict(sorted(r.ranks.items()))
    return item


async def _reranked(
    ctx: ActionContext, query: str, ranked: list[Ranked], limit: int, rerank: bool
) -> tuple[list[Ranked], bool | None]:
    """``ranked`` cut to ``limit``, after the cross-encoder reordered it when asked."""
    if not rerank:
        return ranked[:limit], None
    services = services_of(ctx)
    outcome = await services.reranker.rerank(query, ranked, max(limit, services.settings.rerank_depth))
    return outcome.ranked[:limit], outcome.reranked


def _depth(ctx: ActionContext, limit: int, rerank: bool) -> int:
    """Candidates to retrieve: ``limit``, or the rerank depth when reranking (it reorders a deeper pool)."""
    return max(limit, services_of(ctx).settings.rerank_depth) if rerank else limit


async def semantic_search(ctx: ActionContext, options: Mapping[str, Any]) -> tuple[str, Any]:
    query, scope, limit = _text_scope(options)
    rerank = opt.flag(options, "rerank", False)
    try:
        ranked = await ctx.retriever.records(ctx.principal, query, scope, _depth(ctx, limit, rerank))
    except (EmbeddingUnavailable, QueryRejected) as exc:
        raise query_error(exc) from exc
    ranked, reranked = await _reranked(ctx, query, ranked, limit, rerank)
    explain = opt.flag(options, "explain")
    return "ok", [_explained(_rerank_flags(hit(r), r, reranked), r, explain) for r in ranked]


async def _passages(ctx: ActionContext, options: Mapping[str, Any]) -> list[dict[str, Any]]:
    from .ask import provenance

    query, scope, limit = _text_scope(options)
    rerank = opt.flag(options, "rerank", False)
    explain = opt.flag(options, "explain")
    expand = opt.expand(options)
    try:
        ranked = await ctx.retriever.passages(ctx.principal, query, scope, _depth(ctx, limit, rerank))
    except (EmbeddingUnavailable, QueryRejected) as exc:
        raise query_error(exc) from exc
    ranked, reranked = await _reranked(ctx, query, ranked, limit, rerank)
    if expand is None:
        return [_explained(_rerank_flags(passage(r), r, reranked), r, explain) for r in ranked]
    expanded = await expand_as_configured(ctx, ranked, expand)
    return [_explained(_rerank_flags(provenance(p), p.ranked, reranked), p.ranked, explain) for p in expanded]


async def retrieve(ctx: ActionContext, options: Mapping[str, Any]) -> tuple[str, Any]:
    return "ok", await _passages(ctx, options)


async def get_agent_context(ctx: ActionContext, options: Mapping[str, Any]) -> tuple[str, Any]:
    return "agent_context", await _passages(ctx, options)


MAX_AROUND = 10


async def read_chunk(ctx: ActionContext, options: Mapping[str, Any]) -> tuple[str, Any]:
    """A stored chunk by its ``chunk_id`` with ``before``/``after`` readable chunks of its document.

    A chunk that does not exist and one the caller may not read get the same
    ``rag.chunk_not_found``; unreadable neighbours are left out.
    """
    from index.neighbours import document_window

    from .acl import chunk_readable
    from .locator import parse_chunk_id

    raw = options.get("chunk_id")
    if raw is None:
        raise ApiError.invalid_options("Missing chunk_id")
    key = parse_chunk_id(raw) if isinstance(raw, str) else None
    if key is None:
        raise ApiError.invalid_options("chunk_id is not a chunk id (section-id/component/lang/index)")
    before = opt.bounded_int(options, "before", 1, 0, MAX_AROUND)
    after = opt.bounded_int(options, "after", 1, 0, MAX_AROUND)
    try:
        model = await ctx.retriever.text_model()
    except EmbeddingUnavailable as exc:
        raise ApiError.embedding_unavailable() from exc
    partition = await ctx.retriever.partition(model.id)  # type: ignore[attr-defined]
    window = [] if partition is None else await document_window(ctx.pool, partition, key, before, after)
    window = [c for c in window if chunk_readable(ctx.principal, c)]
    target = next((c for c in window if c.key == key), None)
    if target is None:
        raise ApiError("rag.chunk_not_found")
    return "ok", {
        "chunk": chunk_view(target),
        "before": [chunk_view(c) for c in window if c.chunk_index < target.chunk_index],
        "after": [chunk_view(c) for c in window if c.chunk_index > target.chunk_index],
    }


async def ask(ctx: ActionContext, options: Mapping[str, Any]) -> tuple[str, Any]:
    from .ask import run_ask

    return await run_ask(ctx, options)


def services_of(ctx: ActionContext) -> AskServices:
    if ctx.services is None:  # an app built without them: a wiring bug, not the caller's error
        raise RuntimeError("the ask services (reranker, generator) are not configured")
    return ctx.services


async def expand_as_configured(ctx: ActionContext, ranked: list[Ranked], mode: str) -> list[Expanded]:
    """Small-to-big expansion of ``ranked`` (``mode``: neighbours or parent) with the configured widths."""
    from .expand import expand_passages

    s = services_of(ctx).settings
    return await expand_passages(
        ctx.retriever,
        ctx.principal,
        ranked,
        mode,
        neighbours=s.expand_neighbours,
        parent_limit=s.expand_parent_chunks,
    )


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
    "read_chunk": ActionSpec(read_chunk, summary="A stored passage by its chunk id, with chunks around it."),
    "ask": ActionSpec(ask, summary="Grounded answer with citations, or a refusal."),
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
