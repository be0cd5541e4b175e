"""Operations: health, readiness, metrics, OpenAPI, structured logs, graceful SIGTERM."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gateway.base.logs import REQUEST_ID, JsonFormatter, RequestIdFilter
from gateway.base.settings import load_gateway_settings
from gateway.web.app import create_app, serve
from gateway.web.openapi import build_spec
from inference.net import await_ready, free_port
from tests.fixtures.gateway import (
    ADMIN,
    RAW_SEARCH,
    RAW_SEARCH_HEAD,
    SECRET,
    TEXT_MODEL,
    Gateway,
    read_raw_answer,
    running_gateway,
)
from tests.waiting import until

pytestmark = pytest.mark.ray
REPO_ROOT = Path(__file__).resolve().parent.parent


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.text()


async def test_health_and_readiness(corpus_gateway: Gateway, corpus_database_url: str) -> None:
    status, text = await _get(corpus_gateway.url + "/healthz")
    assert status == 200 and json.loads(text)["data"] == {"status": "ok"}
    status, text = await _get(corpus_gateway.url + "/readyz")
    assert status == 200 and json.loads(text)["data"]["sidecar"] is True
    async with running_gateway(corpus_database_url, f"http://127.0.0.1:{free_port()}") as down:
        status, text = await _get(down.url + "/healthz")
        assert status == 200
        status, text = await _get(down.url + "/readyz")
        body = json.loads(text)
        assert status == 503 and body["error"]["code"] == "service.unavailable"
        assert "sidecar" in body["error"]["message"]


async def test_metrics_count_actions_outcomes_and_legs(corpus_gateway: Gateway) -> None:
    await corpus_gateway.ok("semantic_search", {"query": "reservoir metrics probe"})
    await corpus_gateway.call("semantic_search", {})
    status, text = await _get(corpus_gateway.url + "/metrics")
    assert status == 200
    assert 'mnemo_gateway_requests_total{action="semantic_search",outcome="ok"}' in text
    assert 'mnemo_gateway_requests_total{action="semantic_search",outcome="request.invalid_options"}' in text
    for leg in ("embed", "dense", "lexical", "fusion", "acl"):
        assert f'mnemo_retrieval_leg_seconds_count{{leg="{leg}"}}' in text
    assert 'mnemo_gateway_request_seconds_bucket{action="semantic_search"' in text


async def test_openapi_describes_every_route(corpus_gateway: Gateway) -> None:
    status, text = await _get(corpus_gateway.url + "/openapi.json")
    spec = json.loads(text)
    assert status == 200 and spec["openapi"].startswith("3.")
    for route in corpus_gateway.app.router.routes():
        if route.method != "HEAD":
            assert route.method.lower() in spec["paths"][route.resource.canonical], route
    dispatch = spec["paths"]["/api/v1/json"]["post"]
    actions = {v["title"] for v in dispatch["requestBody"]["content"]["application/json"]["schema"]["oneOf"]}
    assert "semantic_search" in actions and "characterize_object" in actions
    assert {"400", "401", "501", "503"} <= set(dispatch["responses"])
    assert "/v1/records" in spec["paths"] and "/metrics" in spec["paths"]
    assert build_spec(corpus_gateway.app) == spec


def test_json_logs_carry_the_request_id() -> None:
    record = logging.LogRecord("gateway.x", logging.INFO, __file__, 1, "hello %s", ("world",), None)
    record.action = "semantic_search"
    token = REQUEST_ID.set("rid-1")
    try:
        RequestIdFilter().filter(record)
    finally:
        REQUEST_ID.reset(token)
    line = json.loads(JsonFormatter().format(record))
    assert (
        line["msg"] == "hello world" and line["request_id"] == "rid-1" and line["action"] == "semantic_search"
    )


def test_a_json_log_line_holds_what_orjson_refuses() -> None:
    """The formatter writes through orjson; a value it refuses (an integer past 64 bits, a lone
    surrogate from a hostile query string) is still written, by json, and non-JSON types as str."""
    record = logging.LogRecord("gateway.x", logging.INFO, __file__, 1, "q=%s", ("caf\u00e9",), None)
    record.count, record.path = 2**70, Path("/x")
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "q=caf\u00e9" and line["count"] == 2**70 and line["path"] == "/x"
    record.count, record.query = 1, "\ud800 lone"
    assert json.loads(JsonFormatter().format(record))["query"] == "\ud800 lone"


async def test_stopping_finishes_in_flight_requests(corpus_database_url: str, sidecar_url: str) -> None:
    settings = load_gateway_settings({"RAG_JWT_SECRET": SECRET, "RAG_SIDECAR_URL": sidecar_url})
    app = create_app(settings, database_url=corpus_database_url)
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        """A test route that waits to be released."""
        entered.set()
        await release.wait()
        return web.json_response({"done": True})

    app.router.add_get("/slow", slow)
    port = free_port()
    stop, started = asyncio.Event(), asyncio.Event()
    server = asyncio.create_task(
        serve(app, "127.0.0.1", port, shutdown_timeout=10, stop=stop, started=started)
    )
    await started.wait()
    async with aiohttp.ClientSession() as s:
        pending = asyncio.create_task(s.get(f"http://127.0.0.1:{port}/slow"))
        await entered.wait()
        stop.set()  # what SIGTERM does
        await asyncio.sleep(0.2)
        assert not server.done()  # still draining
        release.set()
        response = await pending
        assert response.status == 200 and await response.json() == {"done": True}
        response.release()
    await asyncio.wait_for(server, 30)
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/healthz"):
            pass


@pytest.mark.parametrize(("uvloop", "event_loop"), [("on", "uvloop"), ("off", "asyncio")])
async def test_mnemo_gateway_stops_cleanly_on_sigterm(
    corpus_database_url: str, sidecar_url: str, uvloop: str, event_loop: str
) -> None:
    """On either event loop (``RAG_UVLOOP``), ``mnemo gateway`` (one worker per core, their lines on
    its stderr) serves, each worker says which loop, and all stop on SIGTERM."""
    port = free_port()
    env = {**os.environ, "RAG_JWT_SECRET": SECRET, "RAG_LOG_FORMAT": "json", "RAG_UVLOOP": uvloop}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli",
        "gateway",
        "--port",
        str(port),
        "--database-url",
        corpus_database_url,
        "--sidecar-url",
        sidecar_url,
        cwd=REPO_ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await await_ready(f"http://127.0.0.1:{port}", 120, path="/healthz", process=proc)
        proc.send_signal(signal.SIGTERM)
        _out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    lines = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    access = [line for line in lines if line["logger"] == "gateway.access"]
    assert access and access[0]["path"] == "/healthz" and access[0]["request_id"]
    assert any(line["msg"] == "gateway stopped" for line in lines)
    loops = [line["event_loop"] for line in lines if "event_loop" in line]
    assert loops == [event_loop] * (os.cpu_count() or 1), "one line per worker, each on the chosen loop"


async def _refused(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


async def test_sigterm_drops_no_request_it_accepted(
    database_url: str, sidecar_url: str, tmp_path: Path
) -> None:
    """SIGTERM to a ``mnemo gateway`` with callers in every state: none is reset or left unanswered.

    Before the fix aiohttp closed every connection at once and ignored what arrived on them: the body
    in transit (B), the request on a fresh connection (C) and the kept-alive request (A) got nothing.
    """
    from benchmarks.gateway import gateway_process

    async with gateway_process(
        database_url, sidecar_url, SECRET, tmp_path / "gw.log", text_model=TEXT_MODEL
    ) as gw:
        host, port = "127.0.0.1", int(gw.url.rsplit(":", 1)[1])
        # A: a kept-alive connection that has been served once, idle when the signal comes.
        a_reader, a_writer = await asyncio.open_connection(host, port)
        a_writer.write(RAW_SEARCH_HEAD + RAW_SEARCH)
        status, headers, _ = await read_raw_answer(a_reader)
        assert status == 200 and headers.get("connection", "").lower() != "close"
        # B: its head and half its body sent: a request in progress.
        b_reader, b_writer = await asyncio.open_connection(host, port)
        b_writer.write(RAW_SEARCH_HEAD + RAW_SEARCH[:10])
        # C: connected, nothing sent yet (its request is "in transit").
        c_reader, c_writer = await asyncio.open_connection(host, port)
        # D: connected and sent while the gateway cannot accept it: it waits in the listen backlog.
        gw.process.send_signal(signal.SIGSTOP)
        try:
            d_reader, d_writer = await asyncio.open_connection(host, port)
            d_writer.write(RAW_SEARCH_HEAD + RAW_SEARCH)
            await d_writer.drain()
            gw.process.send_signal(signal.SIGTERM)
        finally:
            gw.process.send_signal(signal.SIGCONT)
        # The listener closes as the stop begins.
        await until(
            "the gateway to refuse new connections after SIGTERM", lambda: _refused(host, port), every_s=0.01
        )
        # New connections are refused; everything already connected is answered.
        a_writer.write(RAW_SEARCH_HEAD + RAW_SEARCH)
        c_writer.write(RAW_SEARCH_HEAD + RAW_SEARCH)
        await asyncio.gather(a_writer.drain(), c_writer.drain())
        a_status, a_headers, a_body = await read_raw_answer(a_reader)
        c_status, c_headers, _ = await read_raw_answer(c_reader)
        b_writer.write(RAW_SEARCH[10:])
        b_status, b_headers, _ = await read_raw_answer(b_reader)
        d_status, _, _ = await read_raw_answer(d_reader)
        code = await asyncio.wait_for(gw.process.wait(), 60)
        for writer in (a_writer, b_writer, c_writer, d_writer):
            writer.close()
    # A kept-alive connection's next request: refused with a coded, retryable 503.
    assert a_status == 503 and a_body["error"]["code"] == "service.stopping", a_body
    assert a_body["error"]["retryable"] is True and a_headers["retry-after"] == "1"
    # The request in progress, the fresh connection's and the backlog's: served, each the last.
    assert (b_status, c_status, d_status) == (200, 200, 200)
    assert all(h["connection"].lower() == "close" for h in (a_headers, b_headers, c_headers))
    assert code == 0, gw.log.read_text()[-2000:]


async def test_sigterm_under_closed_loop_load_fails_no_request(
    database_url: str, sidecar_url: str, tmp_path: Path
) -> None:
    """The reliability suite's SIGTERM fault, small: 8 callers (4 kept alive), 1 s of load."""
    from benchmarks.faults import sigterm_gateway
    from benchmarks.gateway import gateway_process

    async with gateway_process(
        database_url, sidecar_url, SECRET, tmp_path / "gw.log", text_model=TEXT_MODEL
    ) as gw:
        result = await sigterm_gateway(gw.url, gw.process, ADMIN, callers=8, load_seconds=1.0)
    assert result["before_sigterm"]["ok"] > 0 and result["exit_code"] == 0, result
    assert result["before_sigterm"]["broken"] == 0 and result["after_sigterm"]["broken"] == 0, result
