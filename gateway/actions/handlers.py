"""The dd_rag_api handlers: each takes its validated options, calls retrieval, and shapes ``(msg, data)``.

A handler receives the options as :mod:`gateway.actions.specs` read them (its
declared :class:`~gateway.actions.options.Option` readers already raised any coded
400). Handlers never authorize results themselves: the retrieval's ACL gate has
already removed what the caller may not see. Domain errors from retrieval are
translated to coded API errors here, at the edge.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from gateway.actions import options as opt
from gateway.actions.context import ActionContext, Args, query_error
from gateway.base.errors import ApiError
from gateway.retrieval.legs import SeedNotFound
from gateway.retrieval.objects import object_dict
from gateway.retrieval.passages import chunk_view, hit, passage, provenance, rerank_flags
from gateway.retrieval.query_embedding import EmbeddingUnavailable, QueryRejected
from gateway.retrieval.ranking import Ranked
from index.store.hits import Scope
from index.store.sections import SectionStore

__all__ = [
    "NO_GROUPS",
    "characterize_object",
    "embed_groups",
    "get_agent_context",
    "read_chunk",
    "retrieve",
    "search_by_text_image",
    "semantic_search",
    "similar_objects",
    "similar_to",
]


def _scope(args: Args) -> Scope:
    return Scope(section_tipos=args["section_tipo"], group=args["group"])


async def _ranked(ctx: ActionContext, args: Args, *, records: bool) -> tuple[list[Ranked], bool | None]:
    """The text query's records or passages, cut to ``limit`` after a rerank when asked
    (``reranked``: None when not asked)."""
    query, limit, rerank = args["query"], args["limit"], bool(args["rerank"])
    depth = ctx.passage_services().depth(limit, rerank) if rerank else limit
    try:
        ranked = await ctx.retriever.ranked(ctx.principal, query, _scope(args), depth, per_record=records)
    except (EmbeddingUnavailable, QueryRejected) as exc:
        raise query_error(exc) from exc
    if not rerank:
        return ranked[:limit], None
    return await ctx.passage_services().rerank(query, ranked, limit)


@contextlib.contextmanager
def _retrieval_errors() -> Iterator[None]:
    """Retrieval's domain errors, at the edge: a missing seed and one the caller may not read get the
    same 400; no usable model or query vector from the sidecar is a 503."""
    try:
        yield
    except SeedNotFound as exc:
        raise ApiError.invalid_options("Unknown seed record") from exc
    except EmbeddingUnavailable as exc:
        raise ApiError.embedding_unavailable() from exc


def _explained(item: dict[str, Any], r: Ranked, explain: bool) -> dict[str, Any]:
    """With ``explain: true``, each item carries ``legs``: its 1-based rank in each leg that found it
    (what fusion combined), so a person sees why it ranks where it does."""
    if explain:
        item["legs"] = dict(sorted(r.ranks.items()))
    return item


async def semantic_search(ctx: ActionContext, args: Args) -> tuple[str, Any]:
    ranked, reranked = await _ranked(ctx, args, records=True)
    return "ok", [_explained(rerank_flags(hit(r), r, reranked), r, args["explain"]) for r in ranked]


async def _passages(ctx: ActionContext, args: Args) -> list[dict[str, Any]]:
    ranked, reranked = await _ranked(ctx, args, records=False)
    explain = args["explain"]
    if args["expand"] is None:
        return [_explained(rerank_flags(passage(r), r, reranked), r, explain) for r in ranked]
    expanded = await ctx.passage_services().expand(ctx.windows, ctx.principal, ranked, args["expand"])
    return [_explained(rerank_flags(provenance(p), p.ranked, reranked), p.ranked, explain) for p in expanded]


async def retrieve(ctx: ActionContext, args: Args) -> tuple[str, Any]:
    return "ok", await _passages(ctx, args)


async def get_agent_context(ctx: ActionContext, args: Args) -> tuple[str, Any]:
    return "agent_context", await _passages(ctx, args)


async def read_chunk(ctx: ActionContext, args: Args) -> tuple[str, Any]:
    """A stored chunk by its ``chunk_id`` with ``before``/``after`` readable chunks of its document.

    A chunk that does not exist and one the caller may not read get the same
    ``rag.chunk_not_found``; unreadable neighbours are left out.
    """
    key = args["chunk_id"]
    try:
        window = await ctx.windows.around(ctx.principal, key, args["before"], args["after"])
    except EmbeddingUnavailable as exc:
        raise ApiError.embedding_unavailable() from exc
    target = next((c for c in window if c.key == key), None)
    if target is None:
        raise ApiError("rag.chunk_not_found")
    return "ok", {
        "chunk": chunk_view(target),
        "before": [chunk_view(c) for c in window if c.chunk_index < target.chunk_index],
        "after": [chunk_view(c) for c in window if c.chunk_index > target.chunk_index],
    }


async def similar_to(ctx: ActionContext, args: Args) -> tuple[str, Any]:
    with _retrieval_errors():
        ranked = await ctx.retriever.similar(
            ctx.principal, args["section_tipo"], args["section_id"], args["limit"], group=args["group"]
        )
    out = []
    for r in ranked:
        h = hit(r)
        h["similarity"] = None if r.similarity is None else round(r.similarity, 6)
        out.append(h)
    return "ok", out


NO_GROUPS: dict[str, list[str]] = {"groups": []}


async def embed_groups(ctx: ActionContext, args: Args) -> tuple[str, Any]:
    """The section's embed-group ids; ``{groups: []}`` alike for malformed, unreadable and not opted in."""
    tipo = args["section_tipo"]
    if not opt.is_tipo(tipo) or ctx.principal.section_level(tipo) < 1:
        return "ok", NO_GROUPS
    groups = await SectionStore(ctx.pool).group_ids(tipo)
    return "ok", {"groups": list(groups)}


# -- the image layer (gateway.retrieval.objects) -----------------------------------------------------------


async def similar_objects(ctx: ActionContext, args: Args) -> tuple[str, Any]:
    with _retrieval_errors():
        hits = await ctx.object_retriever().similar(
            ctx.principal,
            args["section_tipo"],
            args["section_id"],
            limit=args["limit"],
            mode=args["similarity_mode"],
            view=args["view"],
            near_duplicate=args["near_duplicate"],
            scope=args["scope"],
        )
    return "ok", [object_dict(ctx.principal, h) for h in hits]


async def search_by_text_image(ctx: ActionContext, args: Args) -> tuple[str, Any]:
    with _retrieval_errors():
        hits = await ctx.object_retriever().by_text(
            ctx.principal, args["query"], args["section_tipo"], args["limit"]
        )
    return "ok", [object_dict(ctx.principal, h) for h in hits]


async def characterize_object(ctx: ActionContext, args: Args) -> tuple[str, Any]:
    with _retrieval_errors():
        data = await ctx.object_retriever().characterize(
            ctx.principal,
            args["section_tipo"],
            args["section_id"],
            top_k=ctx.retriever.settings.characterize_top_k,
            mode=args["similarity_mode"],
        )
    return "ok", data
