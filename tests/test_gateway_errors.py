"""Envelope v2 for every failure, request ids on every response, over real HTTP on 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from gateway.base.errors import ERRORS, ApiError, envelope_ok, error_middleware
from gateway.base.metrics import Metrics
from gateway.base.resources import METRICS_KEY
from gateway.web.observe import observe_middleware


async def _raise_api(request: web.Request) -> web.Response:
    raise ApiError.invalid_options("Missing query")


async def _crash(request: web.Request) -> web.Response:
    raise RuntimeError("secret database password in message")


async def _ok(request: web.Request) -> web.Response:
    return envelope_ok(request, {"x": 1})


async def _echo_body(request: web.Request) -> web.Response:
    return envelope_ok(request, len(await request.read()))


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    app = web.Application(middlewares=[observe_middleware, error_middleware], client_max_size=2048)
    app[METRICS_KEY] = Metrics()
    app.router.add_get("/api", _raise_api)
    app.router.add_get("/crash", _crash)
    app.router.add_get("/ok", _ok)
    app.router.add_post("/body", _echo_body)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


def _assert_failure(body: dict, code: str) -> None:
    assert set(body) == {"ok", "request_id", "error"} and body["ok"] is False
    assert set(body["error"]) == {"code", "category", "message", "label_key", "retryable"}
    assert body["error"]["code"] == code and body["error"]["label_key"] == "error." + code


async def test_api_error_becomes_its_envelope_and_status(base_url: str) -> None:
    async with ClientSession() as s, s.get(base_url + "/api") as r:
        body = await r.json()
        assert r.status == 400
        _assert_failure(body, "request.invalid_options")
        assert body["error"]["message"] == "Missing query" and body["error"]["retryable"] is False
        assert r.headers["X-Request-Id"] == body["request_id"]


async def test_unexpected_exception_is_a_500_without_the_message(base_url: str) -> None:
    async with ClientSession() as s, s.get(base_url + "/crash") as r:
        text = await r.text()
        assert r.status == 500 and "password" not in text
        _assert_failure(await r.json(), "internal")


async def test_framework_errors_are_envelopes_too(base_url: str) -> None:
    async with ClientSession() as s:
        async with s.get(base_url + "/nowhere") as r:
            assert r.status == 404
            _assert_failure(await r.json(), "not_found")
        async with s.post(base_url + "/ok") as r:
            assert r.status == 405 and "GET" in r.headers["Allow"]
            _assert_failure(await r.json(), "request.method_not_allowed")
        async with s.post(base_url + "/body", data=b"x" * 4096) as r:
            assert r.status == 413
            _assert_failure(await r.json(), "request.payload_too_large")


async def test_request_ids_are_echoed_when_plain_and_generated_otherwise(base_url: str) -> None:
    async with ClientSession() as s:
        async with s.get(base_url + "/ok", headers={"X-Request-Id": "abc-123"}) as r:
            body = await r.json()
            assert body == {"ok": True, "request_id": "abc-123", "msg": "ok", "data": {"x": 1}}
        async with s.get(base_url + "/ok", headers={"X-Request-Id": "bad id\twith spaces"}) as r:
            rid = (await r.json())["request_id"]
            assert rid != "bad id\twith spaces" and len(rid) == 32 and r.headers["X-Request-Id"] == rid


def test_status_table_is_consistent() -> None:
    for code, spec in ERRORS.items():
        err = ApiError(code)
        assert err.status == spec.status and 400 <= err.status < 600
        assert err.body("r")["error"]["category"] == code.split(".")[0] or code in ("not_found",)
    assert ApiError.embedding_unavailable().retryable and ApiError("rag.disabled").status == 503
    with pytest.raises(KeyError):
        ApiError("no.such.code")
