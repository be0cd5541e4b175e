"""``ask``: a grounded answer with citations, or a plain refusal. Never a fabricated answer.

The pipeline, in this order (each step narrows what the next one sees):

1. retrieve: hybrid retrieval with the ACL gate inside (only readable passages exist here);
2. grounding gate: passages whose dense similarity to the query is below
   ``RAG_GROUNDING_MIN_SIMILARITY`` are dropped; when no passage reaches it, refuse
   (``no_grounded_context``) without calling any model;
3. rerank (on by default here): the cross-encoder reorders, never drops; down or slow -> fused order;
4. expand (``expand: neighbours | parent``): readable surrounding chunks, within the budget;
5. token budget (``RAG_CONTEXT_TOKEN_BUDGET``), keeping at least one passage;
6. egress, per record: for an external generator, passages whose sections may not
   leave the host are withheld; all withheld -> ``external_generation_restricted``
   (no model call, provenance kept so the caller sees what was suppressed);
7. generate (extractive or an OpenAI-compatible server); a failure -> ``rag.generation_failed``;
8. validate citations: markers naming no supplied passage are removed and counted.

The four outcomes: ``ok``, ``no_grounded_context``, ``external_generation_restricted``
and the coded error ``rag.generation_failed`` (503).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gateway.access.egress import passage_sections, restricted_sections
from gateway.actions.citations import citations, validate_markers
from gateway.actions.context import ActionContext, Args, AskServices, query_error
from gateway.actions.providers import DEFAULT_SYSTEM_PROMPT, Generation, GenerationFailed, GenerationRequest
from gateway.base.errors import ApiError, request_id
from gateway.budgets.ledger import hold_generation, settle_generation
from gateway.retrieval.expand import Expanded, unexpanded
from gateway.retrieval.passages import provenance
from gateway.retrieval.query_embedding import EmbeddingUnavailable, QueryRejected
from gateway.retrieval.ranking import Ranked
from index.chunking.chunker import estimate_tokens
from index.store.hits import Scope
from inference.json_out import dumps

log = logging.getLogger(__name__)

__all__ = ["fit_budget", "grounded_passages", "run_ask", "stream_ask"]

OK, NO_CONTEXT, RESTRICTED = "ok", "no_grounded_context", "external_generation_restricted"
CITATION_RULE = (
    "Use only the numbered passages. Mark every claim with its passage number in square brackets, "
    "like [2]. If the passages do not answer the question, say so."
)


@dataclass
class Prepared:
    """Everything decided before generation."""

    msg: str
    supplied: list[Expanded] = field(default_factory=list)
    withheld: list[Expanded] = field(default_factory=list)
    reranked: bool = False
    expand: str | None = None
    request: GenerationRequest | None = None


# -- the pure steps ------------------------------------------------------------------------------------


def grounded_passages(ranked: Sequence[Ranked], min_similarity: float) -> list[Ranked]:
    """The passages that may ground an answer; [] when none reaches ``min_similarity``.

    A passage only the lexical leg found (no dense similarity) rides along with
    grounded ones, but cannot ground an answer alone.
    """
    kept = [r for r in ranked if r.similarity is None or r.similarity >= min_similarity]
    return kept if any(r.similarity is not None for r in kept) else []


def fit_budget(passages: Sequence[Expanded], budget: int) -> list[Expanded]:
    """Passages in order while their tokens fit ``budget``; an expansion that does not fit falls back
    to its hit alone; the first passage is always kept (alone over budget, if need be)."""
    kept: list[Expanded] = []
    used = 0
    for p in passages:
        for candidate in (p, Expanded(p.ranked, (p.ranked.chunk,))):
            cost = estimate_tokens(candidate.text)
            if used + cost <= budget or not kept:
                kept.append(candidate)
                used += cost
                break
    return kept


def system_prompt(
    first_section: str, descriptors: Mapping[str, Mapping[str, Any]], fallback: str | None
) -> str:
    """The section descriptor's prompt, else the setting's, else the built-in one; the citation rule always."""
    custom = (descriptors.get(first_section) or {}).get("system_prompt") or fallback
    return f"{custom.strip()}\n\n{CITATION_RULE}" if custom else DEFAULT_SYSTEM_PROMPT


def _answer(
    prepared: Prepared,
    *,
    answer: str = "",
    cited: list[dict[str, Any]] | None = None,
    provider: str = "",
    model: str = "",
    removed: int = 0,
    usage: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    restricted = prepared.msg == RESTRICTED
    supplied = [] if restricted else prepared.supplied
    return {
        "answer": answer,
        "citations": cited or [],
        "provenance": [provenance(p) for p in prepared.withheld]
        if restricted
        else [provenance(p, n) for n, p in enumerate(supplied, 1)],
        "grounded": bool(cited),
        "restricted": restricted,
        "withheld": [] if restricted else [provenance(p) for p in prepared.withheld],
        "used_provider": provider,
        "model": model,
        "reranked": prepared.reranked,
        "expand": prepared.expand,
        "removed_citations": removed,
        "usage": dict(usage or {}),
    }


# -- the pipeline --------------------------------------------------------------------------------------


async def prepare(ctx: ActionContext, args: Args) -> Prepared:
    """Steps 1-6: retrieval to the egress decision; ``request`` is set when a model is to be called."""
    services, steps = ctx.ask_services(), ctx.passage_services()
    s = services.settings
    query, limit, expand = args["query"], args["limit"], args["expand"]
    scope = Scope(section_tipos=args["section_tipo"], group=args["group"])
    rerank = s.rerank_default if args["rerank"] is None else args["rerank"]
    depth = steps.depth(limit, rerank)
    try:
        ranked = await ctx.retriever.ranked(ctx.principal, query, scope, depth, per_record=False)
    except (EmbeddingUnavailable, QueryRejected) as exc:
        raise query_error(exc) from exc
    ranked = grounded_passages(ranked, s.grounding_min_similarity)
    if not ranked:
        return Prepared(NO_CONTEXT, expand=expand)
    reranked = False
    if rerank:
        ranked, reranked = await steps.rerank(query, ranked, limit)
    ranked = ranked[:limit]
    if expand is None:
        passages = unexpanded(ranked)
    else:
        passages = await steps.expand(ctx.windows, ctx.principal, ranked, expand)
    passages = fit_budget(passages, s.context_token_budget)
    sections = set().union(*(passage_sections(p.chunks) for p in passages))
    descriptors = await services.sections.get_many(sorted(sections))
    supplied, withheld = passages, []
    if not services.provider.local:
        closed = restricted_sections(
            sections, descriptors, allow_default=s.allow_external_default, forbidden=s.forbidden_sections
        )
        supplied = [p for p in passages if not passage_sections(p.chunks) & closed]
        withheld = [p for p in passages if passage_sections(p.chunks) & closed]
    prepared = Prepared(OK, supplied, withheld, reranked, expand)
    if not supplied:
        prepared.msg = RESTRICTED
        return prepared
    prepared.request = GenerationRequest(
        query=query,
        system_prompt=system_prompt(supplied[0].ranked.chunk.section_tipo, descriptors, s.llm_system_prompt),
        passages=[p.text for p in supplied],
        titles=[str(p.ranked.chunk.meta.get("title") or "") for p in supplied],
        similarities=[p.ranked.similarity for p in supplied],
    )
    return prepared


def finish(services: AskServices, prepared: Prepared, generation: Generation) -> tuple[str, dict[str, Any]]:
    """Step 8: validate the markers, describe the citations, shape the answer."""
    checked = validate_markers(generation.text, len(prepared.supplied))
    if checked.removed:
        services.metrics.citations_removed.inc(checked.removed)
        log.warning("removed %d citation markers naming no supplied passage", checked.removed)
    cited = citations(checked.cited, [p.ranked.chunk for p in prepared.supplied])
    data = _answer(
        prepared,
        answer=checked.answer,
        cited=cited,
        provider=services.provider.name,
        model=generation.model,
        removed=checked.removed,
        usage=generation.usage,
    )
    return OK, data


def prompt_tokens(request: GenerationRequest) -> int:
    """The prompt's token estimate (what the budget reserves before the model reports its count)."""
    texts = (request.system_prompt, request.query, *request.passages)
    return sum(estimate_tokens(t) for t in texts)


async def run_ask(ctx: ActionContext, args: Args) -> tuple[str, Any]:
    services = ctx.ask_services()
    prepared = await prepare(ctx, args)
    if prepared.request is None:
        services.metrics.ask_outcomes.labels(prepared.msg).inc()
        return prepared.msg, _answer(prepared)
    hold = await hold_generation(
        ctx.metering, prompt_tokens(prepared.request), services.settings.llm_max_output_tokens
    )
    try:
        generation = await services.provider.generate(prepared.request)
    except GenerationFailed as exc:
        services.metrics.ask_outcomes.labels("generation_failed").inc()
        log.warning("generation failed: %s", exc)
        raise ApiError("rag.generation_failed") from exc  # the metered call refunds what it held
    await settle_generation(ctx.metering, hold, generation.usage, estimate_tokens(generation.text))
    services.metrics.ask_outcomes.labels(OK).inc()
    return finish(services, prepared, generation)


# -- streaming (stream: true) --------------------------------------------------------------------------


def sse_event(name: str, data: Any) -> bytes:
    """One server-sent event: ``data`` as one line of JSON (the gateway's one encoder, so the frames
    are strict JSON like its answers: a non-finite number is ``null``, a newline is escaped)."""
    return b"event: " + name.encode() + b"\ndata: " + dumps(data) + b"\n\n"


async def stream_ask(request: web.Request, ctx: ActionContext, args: Args) -> web.StreamResponse:
    """``ask`` as server-sent events: ``delta`` events carry text as it is generated, then one ``done``
    event carries the whole v2 envelope (validated citations included), or one ``error`` event its
    failure envelope. Errors before generation starts are ordinary JSON error responses."""
    services = ctx.ask_services()
    rid = request_id(request)
    prepared = await prepare(ctx, args)
    hold = None
    if prepared.request is not None:  # a spent token budget is still a plain JSON 429, before the stream
        hold = await hold_generation(
            ctx.metering, prompt_tokens(prepared.request), services.settings.llm_max_output_tokens
        )
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    response.headers["X-Request-Id"] = rid
    if ctx.metering is not None:
        response.headers.update(ctx.metering.headers())
    await response.prepare(request)
    if prepared.request is None or hold is None:
        services.metrics.ask_outcomes.labels(prepared.msg).inc()
        envelope = {"ok": True, "request_id": rid, "msg": prepared.msg, "data": _answer(prepared)}
        await response.write(sse_event("done", envelope))
        await response.write_eof()
        return response
    parts: list[str] = []
    try:
        async for delta in services.provider.stream(prepared.request):
            parts.append(delta)
            await response.write(sse_event("delta", {"text": delta}))
    except GenerationFailed as exc:
        services.metrics.ask_outcomes.labels("generation_failed").inc()
        log.warning("streamed generation failed: %s", exc)
        if ctx.metering is not None:  # the call returns normally (its error is an event): refund here
            await ctx.metering.refund_all()
        await response.write(sse_event("error", ApiError("rag.generation_failed").body(rid)))
        await response.write_eof()
        return response
    text = "".join(parts)
    await settle_generation(ctx.metering, hold, {}, estimate_tokens(text))  # streams report no usage
    services.metrics.ask_outcomes.labels(OK).inc()
    msg, data = finish(services, prepared, Generation(text, services.provider.model))
    await response.write(sse_event("done", {"ok": True, "request_id": rid, "msg": msg, "data": data}))
    await response.write_eof()
    return response
