"""``mnemo mcp``: the read actions as Model Context Protocol tools (official ``mcp`` SDK, low-level server).

A transport shell with no logic of its own: each tool is a dd_rag_api action,
called through the same handler with the same ACL, so an agent gets exactly
what the HTTP API gives the same principal. The principal is fixed at start
from a bearer token verified like the gateway's (``RAG_MCP_TOKEN``); a missing
or invalid token refuses to start, never a privileged fallback. Tools return
``{"msg", "data"}`` as structured content (and as JSON text); a coded failure
is a tool error carrying the same ``{"error": {...}}`` as the HTTP envelope,
so the model can read it and adapt.

Transports: stdio (an MCP client starts ``mnemo mcp``) and streamable HTTP
(``--transport http``, ``/mcp`` on ``RAG_MCP_HOST:RAG_MCP_PORT``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import mcp_types as types
from aiohttp import web
from mcp.server import Server

from .actions import ACTIONS, ActionContext
from .auth import ANONYMOUS_ADMIN, Principal, TokenVerifier
from .errors import ApiError
from .resources import ASK_KEY, POOL_KEY, RETRIEVER_KEY, SETTINGS_KEY
from .settings import GatewaySettings

log = logging.getLogger(__name__)

__all__ = ["READ_TOOLS", "McpStartupError", "build_mcp_server", "principal_from_token", "tool_schemas"]


class McpStartupError(Exception):
    """The MCP server cannot start (no usable token): fail closed, loudly."""


_QUERY = {"type": "string", "minLength": 1, "maxLength": 4000, "description": "What to look for, in words."}
_SCOPE = {
    "description": "Sections to search (a tipo or a list of tipos); all readable sections when absent.",
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 64},
    ],
}
_LIMIT = {"type": "integer", "minimum": 1, "maximum": 50, "default": 10}
_GROUP = {"type": "string", "description": "An embed-group facet id (e.g. card, transcription)."}
_RERANK = {"type": "boolean", "description": "Reorder with the cross-encoder (reports reranked)."}
_EXPAND = {"enum": ["neighbours", "parent"], "description": "Widen each passage (small-to-big)."}
_SEED = {
    "section_tipo": {"type": "string", "description": "The seed record's section."},
    "section_id": {"type": "integer", "minimum": 0, "description": "The seed record."},
}
_TEXT = {"query": _QUERY, "section_tipo": _SCOPE, "limit": _LIMIT, "group": _GROUP}


def _schema(properties: Mapping[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": required,
        "additionalProperties": False,
    }


# Tool name -> (description, input schema). The names are the dd_rag_api actions.
READ_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "semantic_search": (
        "Records of the archive whose meaning best matches a query (best passage of each).",
        _schema({**_TEXT, "rerank": _RERANK}, ["query"]),
    ),
    "retrieve": (
        "Passages (chunks) best matching a query, with locators (chunk_id) for read_chunk.",
        _schema({**_TEXT, "rerank": _RERANK, "expand": _EXPAND}, ["query"]),
    ),
    "get_agent_context": (
        "Permission-filtered passages to ground an agent's reasoning (same retrieval as retrieve).",
        _schema({**_TEXT, "rerank": _RERANK, "expand": _EXPAND}, ["query"]),
    ),
    "read_chunk": (
        "One stored passage by its chunk_id, with up to 10 chunks before and after it in its document.",
        _schema(
            {
                "chunk_id": {"type": "string", "description": "e.g. oh1-412/rag:transcription/lg-spa/3"},
                "before": {"type": "integer", "minimum": 0, "maximum": 10, "default": 1},
                "after": {"type": "integer", "minimum": 0, "maximum": 10, "default": 1},
            },
            ["chunk_id"],
        ),
    ),
    "similar_to": (
        "Records similar to a seed record (its stored vectors).",
        _schema({**_SEED, "limit": _LIMIT, "group": _GROUP}, ["section_tipo", "section_id"]),
    ),
    "ask": (
        "A grounded answer with [n] citations to the archive's passages, or a refusal when nothing grounds it.",
        _schema({**_TEXT, "rerank": _RERANK, "expand": _EXPAND}, ["query"]),
    ),
}

MEDIA_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "similar_objects": (
        "Objects visually similar to a seed record's images.",
        _schema(
            {
                **_SEED,
                "similarity_mode": {"enum": ["visual", "hybrid"]},
                "view": {"type": "string"},
                "near_duplicate": {"type": "boolean"},
                "limit": _LIMIT,
            },
            ["section_tipo", "section_id"],
        ),
    ),
    "search_by_text_image": (
        "Object images matching a textual description.",
        _schema({"query": _QUERY, "section_tipo": _SCOPE, "limit": _LIMIT}, ["query"]),
    ),
    "characterize_object": (
        "Typology/period proposals for an object from its visual neighbours, with evidence.",
        _schema(_SEED, ["section_tipo", "section_id"]),
    ),
}


def tool_schemas(settings: GatewaySettings) -> dict[str, tuple[str, dict[str, Any]]]:
    """The tools this server offers: the read actions, and the image actions when media is on."""
    tools = dict(READ_TOOLS)
    if settings.media_enabled:
        tools.update(MEDIA_TOOLS)
    return {name: spec for name, spec in tools.items() if name in ACTIONS}


def principal_from_token(settings: GatewaySettings, token: str | None) -> Principal:
    """The fixed principal of this server: the token's, verified like the gateway verifies bearers."""
    if settings.auth == "off":
        log.warning("RAG_AUTH=off: the MCP server acts as an admin; local demos only")
        return ANONYMOUS_ADMIN
    if not token:
        raise McpStartupError("RAG_MCP_TOKEN is not set: the MCP server needs a principal (mnemo token ...)")
    try:
        return TokenVerifier(settings).verify(token.strip())
    except ApiError as exc:
        raise McpStartupError(f"RAG_MCP_TOKEN is not a valid token: {exc.message}") from exc


def _result(payload: dict[str, Any], *, error: bool = False) -> types.CallToolResult:
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=payload, is_error=error
    )


def build_mcp_server(app: web.Application, principal: Principal) -> Server:
    """An MCP server over a started gateway app's engine (pool, retriever, ask services), as ``principal``."""
    settings: GatewaySettings = app[SETTINGS_KEY]
    tools = tool_schemas(settings)

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(name=name, description=description, input_schema=schema)
                for name, (description, schema) in tools.items()
            ]
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            if params.name not in tools:
                raise ApiError("request.unknown_action", f"Unknown tool {params.name!r}")
            if not settings.enabled:
                raise ApiError.rag_disabled()
            action = ActionContext(principal, app[RETRIEVER_KEY], app[POOL_KEY], app.get(ASK_KEY))
            msg, data = await ACTIONS[params.name].handler(action, params.arguments or {})
        except ApiError as exc:
            return _result({"error": exc.body("mcp")["error"]}, error=True)
        except Exception:  # never a stack trace to the model; the log keeps it
            log.exception("MCP tool %s failed", params.name)
            return _result({"error": ApiError.internal().body("mcp")["error"]}, error=True)
        return _result({"msg": msg, "data": data})

    return Server(
        "mnemo",
        version="0.1.0",
        instructions=(
            "Mnemo searches a heritage archive by meaning. Use retrieve or get_agent_context for passages, "
            "read_chunk to read around a passage, ask for a cited answer. Cite chunk ids or locators."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_mcp(
    settings: GatewaySettings, token: str | None, transport: str, host: str, port: int
) -> None:
    """Verify the token, start the engine, serve MCP over ``stdio`` or streamable ``http`` until closed."""
    from .app import create_engine

    principal = principal_from_token(settings, token)  # before anything starts: fail fast, fail closed
    engine = create_engine(settings)
    runner = web.AppRunner(engine)
    await runner.setup()  # runs the engine's cleanup contexts: pool, migrations, clients
    try:
        server = build_mcp_server(engine, principal)
        log.info("MCP server (%s) acting as %s", transport, principal.sub)
        if transport == "stdio":
            from mcp.server.stdio import stdio_server

            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
        else:
            import uvicorn

            asgi = server.streamable_http_app(host=host)
            config = uvicorn.Config(asgi, host=host, port=port, log_level="warning", lifespan="on")
            await uvicorn.Server(config).serve()
    finally:
        await runner.cleanup()
