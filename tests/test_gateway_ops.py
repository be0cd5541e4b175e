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

from gateway.app import create_app, serve
from gateway.logs import REQUEST_ID, JsonFormatter, RequestIdFilter
from gateway.openapi import build_spec
from gateway.settings import load_gateway_settings
from inference.net import await_ready, free_port
from tests.fixtures.gateway import SECRET, Gateway, running_gateway

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


async def test_mnemo_gateway_stops_cleanly_on_sigterm(corpus_database_url: str, sidecar_url: str) -> None:
    port = free_port()
    env = {**os.environ, "RAG_JWT_SECRET": SECRET, "RAG_LOG_FORMAT": "json"}
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
