"""Every dd_rag_api action, declared once: its handler, its options, its description, its switches.

From this table come the request validation (:meth:`ActionSpec.read`, what
handlers receive), the ``/openapi.json`` request schemas and the MCP tool
schemas (:meth:`ActionSpec.json_schema`), and the dispatch shared by HTTP and
MCP (:func:`admit`, :func:`run_action`). Adding an action is one entry here and
its handler; ``tests/test_action_specs.py`` proves the three views agree.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.actions import handlers as actions
from gateway.actions import options as opt
from gateway.actions.ask import run_ask, stream_ask
from gateway.actions.context import ActionContext, Args, Handler
from gateway.base.errors import ApiError
from gateway.base.settings import GatewaySettings
from gateway.budgets.ledger import metered
from schema.read_pool import replica_lost

__all__ = ["ACTIONS", "ActionSpec", "admit", "handle", "run_action"]

StreamHandler = Callable[[web.Request, ActionContext, Args], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ActionSpec:
    handler: Handler
    options: tuple[opt.Option, ...]  # in the order they are validated: the first bad one is reported
    summary: str
    media: bool = False  # additionally gated by RAG_MEDIA_ENABLED
    mcp: bool = True  # offered as an MCP tool
    stream: StreamHandler | None = None  # the server-sent-events variant (``stream: true``)
    off_answer: tuple[str, Any] | None = None  # the answer while RAG_ENABLED is off (else rag.disabled)
    # Budget meters one call reserves a unit of (gateway.budgets.ledger); metered actions also pass the
    # per-principal fairness limiter, as they are the ones that call the sidecar or the model.
    meters: tuple[str, ...] = ()

    def read(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options as the handler takes them; the first invalid one is a coded 400."""
        return {o.name: o.read(options) for o in self.options}

    def json_schema(self, *, mcp: bool = False) -> dict[str, Any]:
        """The options as a JSON Schema object; for MCP, closed and without the HTTP-only options."""
        offered = [o for o in self.options if o.mcp or not mcp]
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {o.name: o.json_schema for o in offered},
            "required": [o.name for o in offered if o.required],
        }
        if mcp:
            schema["additionalProperties"] = False
        return schema


_QUERY = ("query_embeddings",)  # a query counts whether or not its vector came from the cache
_TEXT = (opt.QUERY, opt.SCOPE, opt.GROUP, opt.LIMIT, opt.RERANK)
_PASSAGES = (*_TEXT, opt.EXPAND)
# explain (each result's rank per leg) where results are listed; ask answers in prose instead
_LISTED = (*_TEXT, opt.EXPLAIN)
_LISTED_PASSAGES = (*_PASSAGES, opt.EXPLAIN)

ACTIONS: dict[str, ActionSpec] = {
    "semantic_search": ActionSpec(
        actions.semantic_search,
        _LISTED,
        "Records of the archive whose meaning best matches a query (best passage of each).",
        meters=_QUERY,
    ),
    "retrieve": ActionSpec(
        actions.retrieve,
        _LISTED_PASSAGES,
        "Passages (chunks) best matching a query, with locators (chunk_id) for read_chunk.",
        meters=_QUERY,
    ),
    "get_agent_context": ActionSpec(
        actions.get_agent_context,
        _LISTED_PASSAGES,
        "Permission-filtered passages to ground an agent's reasoning (same retrieval as retrieve).",
        meters=_QUERY,
    ),
    "similar_to": ActionSpec(
        actions.similar_to,
        (opt.SEED_TIPO, opt.SEED_ID, opt.LIMIT, opt.GROUP),
        "Records similar to a seed record (its stored vectors).",
    ),
    "embed_groups": ActionSpec(
        actions.embed_groups,
        (opt.PROBED_SECTION,),
        "A section's embed-group ids (the archive's capability probe).",
        mcp=False,
        off_answer=("ok", actions.NO_GROUPS),  # the probe stays silent: no alert, no oracle
    ),
    "read_chunk": ActionSpec(
        actions.read_chunk,
        (opt.CHUNK_ID, opt.BEFORE, opt.AFTER),
        f"One stored passage by its chunk_id, with up to {opt.MAX_AROUND} chunks before and after it "
        "in its document.",
    ),
    "ask": ActionSpec(
        run_ask,
        # stream first: the dispatcher has always read it before the question
        (opt.STREAM, *_PASSAGES),
        "A grounded answer with [n] citations to the archive's passages, or a refusal when nothing "
        "grounds it.",
        stream=stream_ask,
        meters=("ask", *_QUERY),
    ),
    "similar_objects": ActionSpec(
        actions.similar_objects,
        (
            opt.SEED_TIPO,
            opt.SEED_ID,
            opt.LIMIT,
            opt.SIMILARITY_MODE,
            opt.VIEW,
            opt.NEAR_DUPLICATE,
            opt.COMPARE_SCOPE,
        ),
        "Objects visually (and by context) close to a seed object's stored images.",
        media=True,
    ),
    "search_by_text_image": ActionSpec(
        actions.search_by_text_image,
        (opt.QUERY, opt.SCOPE, opt.LIMIT),
        "Object images matching a textual description (the image-text model's text tower).",
        meters=_QUERY,
        media=True,
    ),
    "characterize_object": ActionSpec(
        actions.characterize_object,
        (opt.SEED_TIPO, opt.SEED_ID, opt.SIMILARITY_MODE),
        "Typology and period proposals for an object from its visual neighbours, with evidence; no LLM.",
        media=True,
    ),
}


def admit(settings: GatewaySettings, name: str) -> tuple[str, Any] | None:
    """The kill switches: None when ``name`` may run, else its switched-off answer (or a coded 503)."""
    spec = ACTIONS[name]
    if not settings.enabled:
        if spec.off_answer is not None:
            return spec.off_answer
        raise ApiError.rag_disabled()
    if spec.media and not settings.media_enabled:
        raise ApiError.media_disabled()
    return None


async def run_action(
    ctx: ActionContext, settings: GatewaySettings, name: str, options: Mapping[str, Any]
) -> tuple[str, Any]:
    """``(msg, data)`` of a registered action: switches, then its options, then its handler."""
    off = admit(settings, name)
    if off is not None:
        return off
    spec = ACTIONS[name]
    args = spec.read(options)
    async with metered(ctx.metering, spec.meters):
        return await handle(spec, ctx, args)


async def handle(spec: ActionSpec, ctx: ActionContext, args: Mapping[str, Any]) -> tuple[str, Any]:
    """``(msg, data)`` of the handler. A read replica lost mid-read (its legs run in a task group, so
    the loss may come wrapped) is marked unusable by the read pool; every action only reads, so it
    runs once more, on the primary, instead of failing the caller."""
    try:
        return await spec.handler(ctx, args)
    except Exception as exc:
        if not replica_lost(exc):
            raise
    return await spec.handler(ctx, args)
