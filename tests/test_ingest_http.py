"""Intake over HTTP on a real gateway (127.0.0.1): descriptors, records, deletes, queue stats, the
background drain, and an outage seen through intake."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import aiohttp
import asyncpg
import pytest

from index.ingest import intake
from index.ingest.drain import drain_once
from tests.fixtures.gateway import ADMIN, Gateway, running_gateway, token
from tests.ingest_support import (
    ORAL_HISTORY,
    SETTINGS,
    TEXT_MODEL,
    CountingClient,
    closed_port_url,
    queue_rows,
    record,
    text_rows,
)
from tests.waiting import until

QUIET = {"RAG_INGEST_DRAIN": "false"}  # routes only: no background drain


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch, database_url: str) -> Any:
    """``running_gateway`` with RAG_INGEST_* set in the process environment, where intake reads them."""

    def start(sidecar_url: str, **env: str) -> Any:
        for name, value in env.items():
            if name.startswith("RAG_INGEST_"):
                monkeypatch.setenv(name, value)
        return running_gateway(database_url, sidecar_url, **env)

    return start


async def _http(
    gw: Gateway,
    method: str,
    path: str,
    body: Any = None,
    *,
    bearer: str | None = ADMIN,
    raw: bytes | None = None,
) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if bearer:
        headers["Authorization"] = f"Bearer {bearer}"
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, gw.url + path, data=data, headers=headers) as r,
    ):
        return r.status, await r.json()


def _error(answer: tuple[int, dict[str, Any]]) -> tuple[int, str, str]:
    status, body = answer
    assert body["ok"] is False
    return status, body["error"]["code"], body["error"]["message"]


async def test_descriptors_are_stored_and_read_back(gateway: Any, sidecar_url: str) -> None:
    async with gateway(sidecar_url, **QUIET) as gw:
        assert _error(await _http(gw, "GET", "/v1/sections/oh1"))[:2] == (404, "not_found")
        status, body = await _http(gw, "PUT", "/v1/sections/oh1", ORAL_HISTORY)
        assert status == 200 and body["data"]["descriptor"]["embed"][0]["chunk"]["max_tokens"] == 450
        status, body = await _http(gw, "GET", "/v1/sections/oh1")
        assert status == 200 and [g["id"] for g in body["data"]["descriptor"]["embed"]] == [
            "summary",
            "transcription",
        ]

        bad = {"embed": [{"id": "summary", "contributors": []}]}
        status, code, message = _error(await _http(gw, "PUT", "/v1/sections/oh1", bad))
        assert (status, code) == (400, "request.invalid_descriptor") and "embed[0].contributors" in message
        assert _error(await _http(gw, "PUT", "/v1/sections/oh1", raw=b"{nope"))[:2] == (
            400,
            "request.invalid_json",
        )
        assert _error(await _http(gw, "PUT", "/v1/sections/bad%20tipo", ORAL_HISTORY))[:2] == (
            400,
            "request.invalid_descriptor",
        )


async def test_intake_is_admin_only(gateway: Any, sidecar_url: str) -> None:
    async with gateway(sidecar_url, **QUIET) as gw:
        reader = token("reader", projects=[1], oh1=1)
        for method, path in [
            ("POST", "/v1/records"),
            ("PUT", "/v1/sections/oh1"),
            ("GET", "/v1/sections/oh1"),
            ("DELETE", "/v1/records/oh1/1"),
            ("GET", "/v1/queue/stats"),
            ("POST", "/v1/queue/retry"),
        ]:
            assert _error(await _http(gw, method, path, {}, bearer=None))[:2] == (401, "auth.not_logged")
            assert _error(await _http(gw, method, path, {}, bearer=reader))[:2] == (403, "auth.forbidden")


async def test_records_are_accepted_validated_and_queued(
    gateway: Any, sidecar_url: str, db_pool: asyncpg.Pool
) -> None:
    async with gateway(sidecar_url, RAG_INGEST_MAX_RECORDS="3", **QUIET) as gw:
        await _http(gw, "PUT", "/v1/sections/oh1", ORAL_HISTORY)
        status, body = await _http(gw, "POST", "/v1/records", record(1))
        assert (status, body["msg"], body["data"]) == (202, "accepted", {"accepted": 1, "queued": 1})
        status, body = await _http(gw, "POST", "/v1/records", [record(2), record(3), record(2)])
        assert (status, body["data"]) == (202, {"accepted": 3, "queued": 2})

        cases = [
            ({**record(4), "section_id": "four"}, 400, "request.invalid_record", "[0].section_id"),
            ([record(4), {**record(5), "projects": "all"}], 400, "request.invalid_record", "[1].projects"),
            ({**record(4), "section_tipo": "zz9"}, 422, "request.unknown_section", "[0].section_tipo"),
            ({**record(4), "groups": {"cards": {}}}, 422, "request.unknown_group", "[0].groups.cards"),
            ([record(i) for i in range(4, 8)], 413, "request.too_many_records", "limit is 3"),
            ("a string", 400, "request.invalid_record", "array"),
        ]
        for body_, status_, code, fragment in cases:
            status, code_, message = _error(await _http(gw, "POST", "/v1/records", body_))
            assert (status, code_) == (status_, code) and fragment in message, message
        assert _error(await _http(gw, "POST", "/v1/records", raw=b"[{"))[:2] == (400, "request.invalid_json")

        status, body = await _http(gw, "DELETE", "/v1/records/oh1/3")
        assert status == 202 and body["data"]["queued"] == 1
        assert _error(await _http(gw, "DELETE", "/v1/records/oh1/x"))[:2] == (400, "request.invalid_record")

        status, body = await _http(gw, "GET", "/v1/queue/stats")
        assert status == 200
        assert {k: body["data"][k] for k in ("pending", "ready", "blocked", "failed")} == {
            "pending": 3,
            "ready": 3,
            "blocked": 0,
            "failed": 0,
        }
        assert isinstance(body["data"]["oldest_age_s"], float)  # its value: test_ingest_queue.py
        async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics") as r:
            metrics = await r.text()
        assert 'mnemo_ingest_queue_records{state="pending"} 3.0' in metrics
    rows = await queue_rows(db_pool)
    assert [(r["section_id"], r["operation"]) for r in rows] == [(1, "index"), (2, "index"), (3, "delete")]


async def _wait_for(gw: Gateway, predicate: Any) -> dict[str, Any]:
    """Poll the queue stats until ``predicate(stats)``; returns them."""

    async def stats() -> dict[str, Any] | None:
        status, body = await _http(gw, "GET", "/v1/queue/stats")
        assert status == 200
        return body["data"] if predicate(body["data"]) else None

    return await until("the queue to reach the expected state", stats, every_s=0.25)


async def test_the_background_drain_indexes_what_intake_accepts(
    gateway: Any, sidecar_url: str, db_pool: asyncpg.Pool
) -> None:
    async with gateway(sidecar_url, RAG_INGEST_DRAIN_INTERVAL="0.2") as gw:
        await _http(gw, "PUT", "/v1/sections/oh1", ORAL_HISTORY)
        assert (await _http(gw, "POST", "/v1/records", [record(1), record(2)]))[0] == 202
        stats = await _wait_for(gw, lambda s: s["pending"] == 0)
        assert stats["failed"] == 0 and stats["drain"]["sidecar_available"] is True
        assert {r["section_id"] for r in await text_rows(db_pool)} == {1, 2}
        assert (await _http(gw, "DELETE", "/v1/records/oh1/1"))[0] == 202
        await _wait_for(gw, lambda s: s["pending"] == 0)
        assert {r["section_id"] for r in await text_rows(db_pool)} == {2}


async def test_intake_accepts_during_an_outage_and_nothing_is_lost(
    gateway: Any, sidecar_url: str, db_pool: asyncpg.Pool
) -> None:
    env = {"RAG_INGEST_DRAIN_INTERVAL": "0.1", "RAG_INGEST_OUTAGE_PAUSE": "0.2", "RAG_SIDECAR_TIMEOUT": "2"}
    async with gateway(closed_port_url(), **env) as gw:
        await _http(gw, "PUT", "/v1/sections/oh1", ORAL_HISTORY)
        status, body = await _http(gw, "POST", "/v1/records", [record(i) for i in range(1, 6)])
        assert status == 202 and body["data"]["queued"] == 5
        # The rows' outage mark is committed inside the drain's pass, its sidecar flag set as the
        # pass returns: a read between the two sees the first without the second, so wait for both.
        stats = await _wait_for(
            gw, lambda s: s["waiting_on_sidecar"] == 5 and s["drain"]["sidecar_available"] is False
        )
        assert (stats["pending"], stats["failed"]) == (5, 0)
        assert "sidecar unavailable" in stats["drain"]["last_error"]
        async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics") as r:
            assert "mnemo_ingest_sidecar_available 0.0" in await r.text()
    assert await text_rows(db_pool) == []
    assert all(r["attempts"] == 0 for r in await queue_rows(db_pool))
    async with CountingClient(sidecar_url) as client:  # the sidecar is back
        report = await drain_once(db_pool, client, SETTINGS, text_model=TEXT_MODEL)
    assert report.indexed == 5 and await queue_rows(db_pool) == []
    assert {r["section_id"] for r in await text_rows(db_pool)} == {1, 2, 3, 4, 5}


async def test_a_large_batch_is_validated_off_the_event_loop(
    gateway: Any, sidecar_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1,000-record intake is validated in a worker thread, so other requests go on meanwhile.

    Proven by its structure, not by timing: validation is held at its first record until a probe
    request has been answered. Were it on the event loop, the hold would block the loop, the probe
    would only be answered after the batch, and the validating thread would be the loop's own."""
    loop_thread = threading.get_ident()
    validating_threads: set[int] = set()
    entered, release = threading.Event(), threading.Event()
    validate_record = intake.validate_record

    def held(*args: Any, **kwargs: Any) -> Any:
        validating_threads.add(threading.get_ident())
        if not entered.is_set():
            entered.set()
            release.wait(timeout=120)  # a safety net: the probe below releases it
        return validate_record(*args, **kwargs)

    monkeypatch.setattr(intake, "validate_record", held)
    async with gateway(sidecar_url, **QUIET) as gw:
        await _http(gw, "PUT", "/v1/sections/oh1", ORAL_HISTORY)
        post = asyncio.create_task(_http(gw, "POST", "/v1/records", [record(i) for i in range(1, 1001)]))
        try:
            assert await asyncio.to_thread(entered.wait, 120)
            probe_status, _ = await _http(gw, "GET", "/v1/queue/stats")
            answered_while_validating = not post.done()
        finally:
            release.set()
        status, body = await post
    assert probe_status == 200 and answered_while_validating
    assert loop_thread not in validating_threads, "validation ran on the event loop"
    assert status == 202 and body["data"]["queued"] == 1000, body
