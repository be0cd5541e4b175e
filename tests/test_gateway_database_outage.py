"""The database going away under a running gateway: a coded, retryable 503, and the service comes back.

The gateway reaches the real test server through a TCP relay this test owns; cutting the relay (every
open session reset, new connections refused) is the database becoming unreachable, and opening it
again on the same port is the database coming back, without stopping the server the other tests share.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import aiohttp
import asyncpg
import pytest

from gateway.base.errors import unexpected_failure
from schema.database import database_unreachable
from tests.fixtures.gateway import ADMIN, running_gateway
from tests.waiting import until


class DatabaseRelay:
    """127.0.0.1:port -> the server's Unix socket, byte for byte, until :meth:`cut`."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.port = 0
        self._server: asyncio.Server | None = None
        self._links: list[asyncio.StreamWriter] = []

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._links:
            writer.transport.abort()  # a reset, as when the server's host goes away
        self._links.clear()
        await self._server.wait_closed()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_unix_connection(self.socket_path)
        self._links += [client_w, server_w]

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            writer.close()

        await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))


def _relayed(database_url: str) -> tuple[str, str]:
    """(the Unix socket of the server ``database_url`` names, that URL's database)."""
    parts = urlsplit(database_url)
    socket_dir = parse_qs(parts.query)["host"][0]
    return f"{socket_dir}/.s.PGSQL.{parts.port or 5432}", parts.path.lstrip("/")


async def _search(http: aiohttp.ClientSession, url: str) -> tuple[int, dict, str | None]:
    body = {"dd_api": "dd_rag_api", "action": "semantic_search", "options": {"query": "flood"}}
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with http.post(url + "/api/v1/json", json=body, headers=headers) as r:
        return r.status, await r.json(), r.headers.get("Retry-After")


async def test_a_search_while_the_database_is_unreachable_is_a_retryable_503_and_the_gateway_recovers(
    corpus_database_url: str, sidecar_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    socket_path, database = _relayed(corpus_database_url)
    relay = DatabaseRelay(socket_path)
    await relay.open()
    url = f"postgresql://postgres@127.0.0.1:{relay.port}/{database}"
    async with running_gateway(url, sidecar_url) as gw, aiohttp.ClientSession() as http:
        status, answer, _ = await _search(http, gw.url)
        assert status == 200 and answer["ok"], answer  # the query's vector is cached from here on

        await relay.cut()
        caplog.clear()
        status, answer, retry_after = await _search(http, gw.url)
        assert status == 503, answer
        assert answer["error"]["code"] == "service.unavailable" and answer["error"]["retryable"] is True
        assert retry_after == "1"
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], (
            "an outage is not logged as a bug"
        )
        async with http.get(gw.url + "/healthz") as r:
            assert r.status == 200  # the process stays up

        await relay.open()  # the database is back on the same address

        async def answers() -> bool:
            return (await _search(http, gw.url))[0] == 200

        await until("a search answered after the database came back", answers)


async def test_only_the_databases_own_failures_count_as_it_being_unreachable() -> None:
    """The classifier behind the 503: a connection error raised inside asyncpg, or a task group of
    them; not the same exception types raised by anything else (a missing file, a sidecar timeout)."""
    refused = None
    try:
        await asyncpg.connect("postgresql://postgres@127.0.0.1:9/none", timeout=30)
    except OSError as exc:
        refused = exc
    assert refused is not None and database_unreachable(refused)
    assert database_unreachable(ExceptionGroup("legs", [refused, refused]))
    assert not database_unreachable(ExceptionGroup("legs", [refused, ValueError("a bug")]))
    missing = None
    try:
        Path("/nonexistent/media.jpg").read_bytes()  # noqa: ASYNC240 - a file error, raised here on purpose
    except OSError as exc:
        missing = exc
    assert missing is not None and not database_unreachable(missing)
    # what the HTTP middleware and the MCP tools answer for each (one definition)
    assert unexpected_failure(ExceptionGroup("legs", [refused]), "a search").code == "service.unavailable"
    assert unexpected_failure(missing, "a search").code == "internal"
    assert not database_unreachable(TimeoutError("the sidecar"))
