"""``mnemo mcp``: the read actions as Model Context Protocol tools (official ``mcp`` SDK, low-level server).

A transport shell with no logic of its own: each tool is a dd_rag_api action,
its input schema generated from the action's declaration
(:mod:`gateway.actions.specs`) and its call run through the same switches,
option readers and handler with the same ACL, so an agent gets exactly what
the HTTP API gives the same principal. The principal is fixed at start
from a bearer token verified like the gateway's (``RAG_MCP_TOKEN``); a missing
or invalid token refuses to start, never a privileged fallback. Tools return
``{"msg", "data"}`` as structured content (and as JSON text); a coded failure
is a tool error carrying the same ``{"error": {...}}`` as the HTTP envelope,
so the model can read it and adapt.

Transports: stdio (an MCP client starts ``mnemo mcp``) and streamable HTTP
(``--transport http``, ``/mcp`` on ``RAG_MCP_HOST:RAG_MCP_PORT``).
"""

from __future__ import annotations

import logging
from typing import Any

import mcp_types as types
import uvicorn
from aiohttp import web
from mcp.server import Server
from mcp.server.stdio import stdio_server

from gateway.access.auth import ANONYMOUS_ADMIN, Principal, TokenVerifier
from gateway.actions.context import action_context
from gateway.actions.specs import ACTIONS, run_action
from gateway.base.errors import ApiError, unexpected_failure
from gateway.base.resources import SETTINGS_KEY
from gateway.base.settings import GatewaySettings
from gateway.web.app import create_engine
from inference.json_out import dumps

log = logging.getLogger(__name__)

__all__ = ["McpStartupError", "build_mcp_server", "principal_from_token", "tool_schemas"]


class McpStartupError(Exception):
    """The MCP server cannot start (no usable token): fail closed, loudly."""


def tool_schemas(settings: GatewaySettings) -> dict[str, tuple[str, dict[str, Any]]]:
    """Tool name -> (description, input schema): the actions offered to MCP, the image ones when media
    is on. The names are the dd_rag_api actions."""
    return {
        name: (spec.summary, spec.json_schema(mcp=True))
        for name, spec in ACTIONS.items()
        if spec.mcp and (settings.media_enabled or not spec.media)
    }


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


def tool_result(payload: dict[str, Any], *, error: bool = False) -> types.CallToolResult:
    """A tool's answer: ``payload`` as structured content and as its JSON text."""
    text = dumps(payload).decode()  # the gateway's one encoder: strict JSON, as its answers
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
            context = action_context(app, principal)
            msg, data = await run_action(context, settings, params.name, params.arguments or {})
        except ApiError as exc:
            return tool_result({"error": exc.body("mcp")["error"]}, error=True)
        except Exception as exc:  # never a stack trace to the model; the log keeps it
            return tool_result(
                {"error": unexpected_failure(exc, f"MCP tool {params.name}").body("mcp")["error"]}, error=True
            )
        return tool_result({"msg": msg, "data": data})

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
    principal = principal_from_token(settings, token)  # before anything starts: fail fast, fail closed
    engine = create_engine(settings)
    runner = web.AppRunner(engine)
    await runner.setup()  # runs the engine's cleanup contexts: pool, migrations, clients
    try:
        server = build_mcp_server(engine, principal)
        log.info("MCP server (%s) acting as %s", transport, principal.sub)
        if transport == "stdio":
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
        else:
            asgi = server.streamable_http_app(host=host)
            config = uvicorn.Config(asgi, host=host, port=port, log_level="warning", lifespan="on")
            await uvicorn.Server(config).serve()
    finally:
        await runner.cleanup()
