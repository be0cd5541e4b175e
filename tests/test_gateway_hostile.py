"""Hostile input against a real gateway on 127.0.0.1: each case answered 500, hung, leaked or served
the wrong record before its fix (issue 9, items 6-14); now each is a coded envelope-v2 answer."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gateway.actions.context import RETRIEVER_KEY, query_error
from gateway.retrieval.query_embedding import EmbeddingUnavailable, QueryRejected
from index.store.hits import Scope
from index.store.validation import FieldError, parse_id
from tests.fixtures.gateway import (
    ADMIN,
    RAW_SEARCH,
    RAW_SEARCH_HEAD,
    Gateway,
    read_raw_answer,
    running_gateway,
    token,
)
from tests.waiting import until

RESEARCHER = token("researcher", projects=[1], oh1=1)
LONE = "\ud800"
JSON = {"Content-Type": "application/json"}


async def _send(
    gw: Gateway,
    method: str,
    path: str,
    data: bytes | None = None,
    *,
    headers: dict[str, str] | None = None,
    bearer: str | None = ADMIN,
) -> tuple[int, dict[str, Any], Any]:
    all_headers = {**JSON, **(headers or {})}
    if bearer:
        all_headers["Authorization"] = f"Bearer {bearer}"
    async with (
        aiohttp.ClientSession(auto_decompress=False) as s,
        s.request(method, gw.url + path, data=data, headers=all_headers) as r,
    ):
        return r.status, await r.json(content_type=None), r.headers


def _code(answer: tuple[int, dict[str, Any], Any]) -> tuple[int, str]:
    status, body, headers = answer
    assert body["ok"] is False and set(body["error"]) >= {"code", "message", "label_key", "retryable"}
    assert headers["X-Request-Id"] == body["request_id"]
    return status, body["error"]["code"]


def _search(query: Any, **options: Any) -> bytes:
    return json.dumps(
        {"dd_api": "dd_rag_api", "action": "semantic_search", "options": {"query": query, **options}}
    ).encode()


# -- 6, 7: lone surrogates and NUL ---------------------------------------------------------------


@pytest.mark.parametrize("query", ["water\u0000", "water" + LONE, "\udfff"])
async def test_nul_and_surrogates_in_a_query_are_a_coded_400(corpus_gateway: Gateway, query: str) -> None:
    answer = await _send(corpus_gateway, "POST", "/api/v1/json", _search(query), bearer=RESEARCHER)
    assert _code(answer) == (400, "request.invalid_text")
    assert "options.query" in answer[1]["error"]["message"]


async def test_a_query_the_sidecar_refuses_is_the_callers_400_not_an_outage(
    corpus_gateway: Gateway,
) -> None:
    # Past the gateway's own check (as a future sidecar rule would be): the sidecar's 4xx for the
    # input is a QueryRejected, not EmbeddingUnavailable's retryable 503.
    retriever = corpus_gateway.app[RETRIEVER_KEY]
    from gateway.access.auth import Principal

    with pytest.raises(QueryRejected) as info:
        await retriever.ranked(
            Principal("r", frozenset({1}), {"oh1": 1}), "x" + LONE, Scope(), 5, per_record=True
        )
    assert info.value.code == "invalid_text"
    error = query_error(info.value)
    assert (error.status, error.code, error.retryable) == (400, "request.invalid_options", False)
    assert query_error(EmbeddingUnavailable("down")).status == 503


# -- 9, 14: parser limits before authentication, content types, protocol errors ------------------


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (
            b'{"dd_api": "dd_rag_api", "options": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
            "request.json_too_deep",
        ),
        (
            b'{"dd_api": "dd_rag_api", "action": "semantic_search", "options": {"limit": '
            + b"9" * 5000
            + b"}}",
            "request.number_too_long",
        ),
        (b'{"dd_api": "dd_rag_api", "options": {"limit": 1e999}}', "request.number_too_long"),
        (b'{"dd_api": "dd_rag_api", "options": {"limit": 1}, "x": NaN}', "request.invalid_json"),
        (b'{"dd_api": "dd_rag_api", "action": "\xff"}', "request.invalid_json"),
    ],
)
async def test_parser_limits_are_coded_400s_before_authentication(
    corpus_gateway: Gateway, body: bytes, code: str
) -> None:
    assert _code(await _send(corpus_gateway, "POST", "/api/v1/json", body, bearer=None)) == (400, code)


async def test_gzip_bodies_are_inflated_within_limits_or_refused(corpus_gateway: Gateway) -> None:
    gw = corpus_gateway
    groups = json.dumps(
        {"dd_api": "dd_rag_api", "action": "embed_groups", "options": {"section_tipo": "oh1"}}
    )
    status, body, _ = await _send(
        gw, "POST", "/api/v1/json", gzip.compress(groups.encode()), headers={"Content-Encoding": "gzip"}
    )
    assert status == 200 and body["data"]["groups"]
    not_gzip = await _send(gw, "POST", "/api/v1/json", groups.encode(), headers={"Content-Encoding": "gzip"})
    assert _code(not_gzip) == (400, "request.invalid_encoding")
    bomb = gzip.compress(b" " * (64 * 1024 * 1024))  # 64 KiB on the wire, far over the 8 MiB limit inflated
    assert _code(await _send(gw, "POST", "/api/v1/json", bomb, headers={"Content-Encoding": "gzip"})) == (
        413,
        "request.payload_too_large",
    )
    brotli = await _send(gw, "POST", "/api/v1/json", groups.encode(), headers={"Content-Encoding": "br"})
    assert _code(brotli) == (415, "request.unsupported_media_type")


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/xml", "multipart/form-data"],
)
async def test_non_json_bodies_are_415(corpus_gateway: Gateway, content_type: str) -> None:
    answer = await _send(
        corpus_gateway, "POST", "/api/v1/json", _search("water"), headers={"Content-Type": content_type}
    )
    assert _code(answer) == (415, "request.unsupported_media_type")


async def test_protocol_errors_are_envelope_v2(corpus_gateway: Gateway) -> None:
    answer = await _send(corpus_gateway, "GET", "/healthz", headers={"X-Long": "x" * 20_000}, bearer=None)
    assert answer[2]["Content-Type"].startswith("application/json")
    assert _code(answer) == (400, "request.invalid_request")


# -- 8: ids --------------------------------------------------------------------------------------


def test_ids_are_ascii_digits_only() -> None:
    assert parse_id("3") == 3 and parse_id("0") == 0 and parse_id(str(2**63 - 1)) == 2**63 - 1
    for raw in ("٣", "²", "³", "３", " 3", "+3", "1_000", "", "-1", "3.0", str(2**63), "9" * 5000):
        with pytest.raises(FieldError):
            parse_id(raw)


@pytest.fixture
async def intake_gateway(
    database_url: str, sidecar_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Gateway]:
    """A gateway on a database of its own, drain off: a wrongly accepted delete stays visible in the queue."""
    monkeypatch.setenv("RAG_INGEST_DRAIN", "false")
    async with running_gateway(database_url, sidecar_url, RAG_INGEST_DRAIN="false") as gw:
        yield gw


async def test_intake_refuses_non_ascii_ids_nul_and_surrogates(intake_gateway: Gateway) -> None:
    gw = intake_gateway
    for raw in ("%C2%B2", "%D9%A3", "%EF%BC%93", "3%00", "9" * 30):  # ², ٣, ３ (fullwidth), NUL, too big
        assert _code(await _send(gw, "DELETE", f"/v1/records/oh1/{raw}")) == (400, "request.invalid_record")
    status, body, _ = await _send(gw, "GET", "/v1/queue/stats")
    assert status == 200 and body["data"]["pending"] == 0  # nothing was queued for record 3
    await _send(
        gw,
        "PUT",
        "/v1/sections/oh1",
        json.dumps({"embed": [{"id": "card", "contributors": ["c1"]}]}).encode(),
    )
    record = {"section_tipo": "oh1", "section_id": 1, "projects": [1], "groups": {"card": {"lg-eng": "ok"}}}
    for bad, field in (
        ({**record, "title": "Interview\u0000"}, "title"),
        ({**record, "groups": {"card": {"lg-eng": "text" + LONE}}}, "groups.card.lg-eng"),
        ({**record, "metadata": {"period": {"from": "a\u0000"}}}, "metadata.period.from"),
        ({**record, "metadata": {"x" + LONE: 1}}, "metadata.x\\ud800"),
    ):
        answer = await _send(gw, "POST", "/v1/records", json.dumps([bad]).encode())
        assert _code(answer) == (400, "request.invalid_text")
        assert f"[0].{field}" in answer[1]["error"]["message"]
    assert _code(await _send(gw, "POST", "/v1/records", b"[{")) == (400, "request.invalid_json")


# -- 11, 12, 13: hang-ups, slow clients, concurrency, side channels -------------------------------


@contextlib.asynccontextmanager
async def black_hole() -> AsyncIterator[tuple[str, asyncio.Event, asyncio.Event]]:
    """A "sidecar" that accepts connections and never answers: (url, got a request, peer hung up)."""
    got, closed = asyncio.Event(), asyncio.Event()

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(4096):
            got.set()
        closed.set()
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", got, closed
    finally:
        server.close()


async def test_a_client_that_hangs_up_cancels_the_work_and_the_bound_answers_429(
    corpus_database_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAG_INGEST_DRAIN", "false")  # only the search may talk to the black hole
    caplog.set_level(logging.INFO, logger="gateway.access")
    async with (
        black_hole() as (sidecar, got, closed),
        running_gateway(
            corpus_database_url, sidecar, RAG_GATEWAY_MAX_CONCURRENCY="1", RAG_SIDECAR_TIMEOUT="120"
        ) as gw,
        aiohttp.ClientSession() as s,
    ):
        headers = {**JSON, "Authorization": f"Bearer {ADMIN}"}

        async def search() -> int:
            async with s.post(gw.url + "/api/v1/json", data=_search("flood"), headers=headers) as r:
                return r.status

        first = asyncio.create_task(search())
        await asyncio.wait_for(got.wait(), 30)  # the gateway is waiting on the sidecar for this request
        busy = await _send(gw, "POST", "/api/v1/json", _search("dam"))
        assert _code(busy) == (429, "service.overloaded") and busy[2]["Retry-After"] == "1"
        assert busy[1]["error"]["retryable"] is True
        async with s.get(gw.url + "/healthz") as r:
            assert r.status == 200  # probes are never refused
        first.cancel()  # the client hangs up
        with contextlib.suppress(asyncio.CancelledError):
            await first
        # The gateway drops its own sidecar call at once, long before the 120 s sidecar timeout.
        await asyncio.wait_for(closed.wait(), 60)
    records = [r for r in caplog.records if r.name == "gateway.access" and r.path == "/api/v1/json"]
    assert any(getattr(r, "outcome", None) == "client_abort" for r in records), records
    assert not any(r.levelno >= logging.ERROR for r in caplog.records if r.name.startswith("gateway"))


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """Everything the server sent until it closed the connection (fails if it stays open). A reset
    is a close too: when the server closes while the client is still sending, its kernel answers
    the unread bytes with RST (a loaded run met that on the dribbling client)."""

    async def until_closed() -> bytes:
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := await reader.read(65536):
                received += chunk
        return received

    return await asyncio.wait_for(until_closed(), seconds)


async def test_slow_and_idle_connections_are_closed(
    corpus_database_url: str, sidecar_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running_gateway(
        corpus_database_url, sidecar_url, RAG_GATEWAY_IDLE_TIMEOUT="0.5", RAG_GATEWAY_BODY_TIMEOUT="0.5"
    ) as gw:
        host, port = gw.url.removeprefix("http://").split(":")
        # Connects and sends nothing.
        reader, writer = await asyncio.open_connection(host, int(port))
        assert await _closed_within(reader, 60) == b""
        writer.close()
        # Sends its headers one byte at a time.
        reader, writer = await asyncio.open_connection(host, int(port))

        async def dribble() -> None:
            with contextlib.suppress(ConnectionError):
                for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 1000:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.05)

        task = asyncio.create_task(dribble())
        assert b"200" not in await _closed_within(reader, 60)
        task.cancel()
        writer.close()
        # Sends its headers, then its body one byte at a time: a 408 in envelope v2.
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /api/v1/json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        await writer.drain()
        status, headers, body = await read_raw_answer(reader)
        assert status == 408 and headers["connection"] == "close"
        assert body["error"]["code"] == "request.timeout"
        assert await _closed_within(reader, 60) == b""
        writer.close()
        # Hangs up in the middle of its body: a client abort in the log, not an internal error.
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /api/v1/json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.close()
        await until(  # the access line is written as the handler unwinds
            "the client abort's access line",
            lambda: any(getattr(r, "outcome", None) == "client_abort" for r in caplog.records),
        )
    access = [r for r in caplog.records if r.name == "gateway.access" and r.path == "/api/v1/json"]
    assert [r.outcome for r in access] == ["request.timeout", "client_abort"], access  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "no internal error logged"


async def test_a_body_that_arrives_after_its_head_is_read_whole(
    corpus_database_url: str, sidecar_url: str
) -> None:
    """The body read waits (under its deadline) for bytes that come after the head; only a body
    already complete is read without arming the deadline. Both halves must reach the parser: the
    action name sits in the second one."""
    async with running_gateway(corpus_database_url, sidecar_url, RAG_GATEWAY_BODY_TIMEOUT="30") as gw:
        host, port = gw.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(RAW_SEARCH_HEAD + RAW_SEARCH[:20])
        await writer.drain()
        await asyncio.sleep(0.3)  # the handler is reading by now, its body not complete
        writer.write(RAW_SEARCH[20:])
        await writer.drain()
        status, _, answer = await read_raw_answer(reader)
        writer.close()
    assert status == 200, answer
    assert answer["ok"] is True and isinstance(answer["data"], list)


async def test_query_cache_is_per_caller_and_metrics_need_the_token(
    corpus_database_url: str, sidecar_url: str
) -> None:
    metrics_token = "m" * 24
    async with running_gateway(corpus_database_url, sidecar_url, RAG_METRICS_TOKEN=metrics_token) as gw:
        alice, bob = token("alice", projects=[1], oh1=1), token("bob", projects=[1], oh1=1)
        for bearer in (alice, bob, alice):
            status, _, _ = await _send(
                gw, "POST", "/api/v1/json", _search("displaced families"), bearer=bearer
            )
            assert status == 200
        assert _code(await _send(gw, "GET", "/metrics", bearer=None)) == (401, "auth.not_logged")
        assert _code(await _send(gw, "GET", "/metrics", bearer="wrong" * 5)) == (401, "auth.invalid_token")
        async with (
            aiohttp.ClientSession() as s,
            s.get(gw.url + "/metrics", headers={"Authorization": f"Bearer {metrics_token}"}) as r,
        ):
            assert r.status == 200
            text = await r.text()
    counts = dict(re.findall(r'mnemo_query_vector_cache_total\{result="(\w+)"\} ([\d.]+)', text))
    # bob's identical query is a miss (no timing tells him alice asked it); alice's repeat is a hit.
    assert (counts.get("miss"), counts.get("hit")) == ("2.0", "1.0"), counts
