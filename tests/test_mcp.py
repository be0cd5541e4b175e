"""``mnemo mcp``: the read actions as MCP tools, through the SDK's in-memory client.

The same principal gets the same answers over MCP as over the HTTP API.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from mcp import Client

from gateway.access.auth import ANONYMOUS_ADMIN
from gateway.base.resources import SETTINGS_KEY
from gateway.budgets import admin as budget_admin
from gateway.budgets.ledger import BUDGETS_KEY
from gateway.web.mcp import McpStartupError, build_mcp_server, principal_from_token
from tests.fixtures.gateway import Gateway, running_gateway, token

pytestmark = pytest.mark.ray

RESEARCHER = token("researcher", projects=[1], oh1=1, rsc1=1)
DAM = "What happened when the reservoir flooded the valley?"


def _same(mcp_payload: Any) -> Any:
    return json.loads(json.dumps(mcp_payload))


async def _tool(client: Client, name: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    result = await client.call_tool(name, arguments)
    text = json.loads(result.content[0].text)
    assert _same(result.structured_content) == text
    return result.is_error, text


async def test_tools_answer_like_the_http_api(corpus_gateway: Gateway) -> None:
    settings = corpus_gateway.app[SETTINGS_KEY]
    server = build_mcp_server(corpus_gateway.app, principal_from_token(settings, RESEARCHER))
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {
            "semantic_search",
            "retrieve",
            "get_agent_context",
            "read_chunk",
            "similar_to",
            "ask",
        }
        assert all(t.input_schema["type"] == "object" and t.description for t in tools.values())
        assert tools["ask"].input_schema["required"] == ["query"]
        passages = await corpus_gateway.ok("retrieve", {"query": DAM}, bearer=RESEARCHER)
        calls = [
            ("semantic_search", {"query": DAM, "limit": 5}),
            ("retrieve", {"query": DAM, "rerank": True}),
            ("get_agent_context", {"query": "Quintanilla village submerged", "section_tipo": "oh1"}),
            ("similar_to", {"section_tipo": "oh1", "section_id": 2}),
            ("read_chunk", {"chunk_id": passages[0]["chunk_id"], "after": 2}),
            ("ask", {"query": DAM}),
            ("ask", {"query": "Silver coins from the third century"}),
        ]
        for name, arguments in calls:
            status, body = await corpus_gateway.call(name, arguments, bearer=RESEARCHER)
            is_error, payload = await _tool(client, name, arguments)
            assert status == 200 and not is_error, (name, payload)
            assert payload == {"msg": body["msg"], "data": body["data"]}, name
        # The principal is the token's: a record outside its projects stays invisible.
        _, answer = await _tool(client, "ask", {"query": "Silver coins from the third century", "limit": 20})
        assert ("oh1", 3) not in {(p["section_tipo"], p["section_id"]) for p in answer["data"]["provenance"]}


async def test_tool_errors_carry_the_api_error(corpus_gateway: Gateway) -> None:
    settings = corpus_gateway.app[SETTINGS_KEY]
    server = build_mcp_server(corpus_gateway.app, principal_from_token(settings, RESEARCHER))
    async with Client(server) as client:
        for name, arguments in (
            ("ask", {}),
            ("read_chunk", {"chunk_id": "nope"}),
            ("retrieve", {"limit": 3}),
        ):
            status, body = await corpus_gateway.call(name, arguments, bearer=RESEARCHER)
            is_error, payload = await _tool(client, name, arguments)
            assert is_error and status == 400
            assert payload["error"]["code"] == body["error"]["code"] == "request.invalid_options"
            assert payload["error"]["message"] == body["error"]["message"]
        is_error, payload = await _tool(client, "read_chunk", {"chunk_id": "oh1-3/rag:card/lg-eng/0"})
        assert is_error and payload["error"]["code"] == "rag.chunk_not_found"  # project 2: as if missing


async def test_a_spent_budget_is_an_mcp_tool_error_like_the_api(
    corpus_database_url: str, sidecar_url: str
) -> None:
    sub = "mcp-spent"
    bearer = token(sub, projects=[1], oh1=1)
    async with running_gateway(corpus_database_url, sidecar_url, RAG_BUDGET_LIMITS="user.ask=0") as gw:
        # the ask run is spent by the role's limit, the query embeddings by this principal's own
        await budget_admin.set_limit(gw.app[BUDGETS_KEY].ledger, sub, "query_embeddings", 0)
        status, body = await gw.call("ask", {"query": DAM}, bearer=bearer)
        assert (status, body["error"]["code"]) == (429, "budget_exhausted")
        server = build_mcp_server(gw.app, principal_from_token(gw.app[SETTINGS_KEY], bearer))
        async with Client(server) as client:
            for name, arguments, meter in (
                ("ask", {"query": DAM}, "ask"),
                ("retrieve", {"query": DAM}, "query_embeddings"),
            ):
                is_error, payload = await _tool(client, name, arguments)
                assert is_error and payload["error"]["code"] == "budget_exhausted"
                assert payload["error"]["meter"] == meter and payload["error"]["reset_at"]


def test_the_principal_is_fixed_from_a_verified_token(corpus_gateway: Gateway) -> None:
    settings = corpus_gateway.app[SETTINGS_KEY]
    assert principal_from_token(settings, RESEARCHER).sub == "researcher"
    for bad in (None, "", "garbage", token("eve", admin=True)[:-4] + "AAAA"):
        with pytest.raises(McpStartupError, match="RAG_MCP_TOKEN"):
            principal_from_token(settings, bad)
    assert principal_from_token(dataclasses.replace(settings, auth="off"), None) is ANONYMOUS_ADMIN


def _mcp_env(database_url: str, sidecar_url: str, **extra: str) -> dict[str, str]:
    from tests.fixtures.gateway import SECRET, TEXT_MODEL

    return {
        "RAG_JWT_SECRET": SECRET,
        "RAG_DATABASE_URL": database_url,
        "RAG_SIDECAR_URL": sidecar_url,
        "RAG_TEXT_MODEL": TEXT_MODEL,
        **extra,
    }


async def test_mnemo_mcp_over_stdio(
    corpus_gateway: Gateway, corpus_database_url: str, sidecar_url: str
) -> None:
    """The real transport: an MCP client starts ``mnemo mcp`` and talks to it over stdin/stdout."""
    import sys
    from pathlib import Path

    from mcp.client.stdio import StdioServerParameters

    mnemo = str(Path(sys.executable).with_name("mnemo"))
    params = StdioServerParameters(
        command=mnemo,
        args=["--log-level", "WARNING", "mcp"],
        env=_mcp_env(corpus_database_url, sidecar_url, RAG_MCP_TOKEN=RESEARCHER),
    )
    async with Client(params, read_timeout_seconds=120) as client:
        assert "ask" in {t.name for t in (await client.list_tools()).tools}
        _, payload = await _tool(client, "retrieve", {"query": DAM, "limit": 3})
    body = await corpus_gateway.ok("retrieve", {"query": DAM, "limit": 3}, bearer=RESEARCHER)
    assert payload == {"msg": "ok", "data": body}


def test_mnemo_mcp_refuses_to_start_without_a_valid_token() -> None:
    import subprocess
    import sys
    from pathlib import Path

    mnemo = str(Path(sys.executable).with_name("mnemo"))
    for extra in ({}, {"RAG_MCP_TOKEN": "not-a-jwt"}):
        env = {"PATH": "/usr/bin:/bin", **_mcp_env("postgresql://unused/x", "http://127.0.0.1:9", **extra)}
        done = subprocess.run(
            [mnemo, "mcp"], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 2 and "RAG_MCP_TOKEN" in done.stderr, done.stderr
