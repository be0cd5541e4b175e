"""The benchmarks' cheap closed-loop client and the machine's CPU split, against a real aiohttp server.

``benchmarks.gateway_workers`` measures throughput with :func:`closed_loop_searches` (a write and a
read per search, so the client leaves the cores to the gateway) and says where the cores went with
:func:`cores_used`: a client that miscounted, or let an error through, would be a wrong headline.
"""

from __future__ import annotations

import json
import os

import pytest
from aiohttp import web

from benchmarks import flood
from benchmarks.flood_client import closed_loop_searches
from benchmarks.measure import cores_used, cpu_by_process


async def _server(answers: list[int], seen: list[dict]) -> tuple[web.AppRunner, str]:
    """A stand-in for the gateway's JSON API: each call records its body and pops its status (200
    when none is planned); 503 answers as the gateway's retryable envelope, 400 as a final one."""

    async def api(request: web.Request) -> web.Response:
        seen.append({"body": await request.json(), "auth": request.headers.get("Authorization")})
        status = answers.pop(0) if answers else 200
        if status == 200:
            return web.json_response({"ok": True, "data": []})
        error = {"code": "x", "category": "c", "message": "m", "label_key": "k", "retryable": status == 503}
        return web.json_response({"ok": False, "error": error}, status=status)

    app = web.Application()
    app.router.add_post("/api/v1/json", api)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def test_the_closed_loop_sends_each_search_once_answered_and_counts_every_answer() -> None:
    seen: list[dict] = []
    runner, url = await _server([], seen)
    try:
        result = await closed_loop_searches(url, "tok", ["alpha", "beta"], callers=3, seconds=60, requests=20)
        assert result.requests == len(seen) == 20 and result.concurrency == 3
        assert result.latency.n == 20 and result.latency.min > 0
        assert {s["body"]["options"]["query"] for s in seen} == {"alpha", "beta"}
        assert all(s["auth"] == "Bearer tok" and s["body"]["action"] == "semantic_search" for s in seen)
        seen.clear()
        await closed_loop_searches(url, None, ["q"], callers=1, seconds=60, requests=2, limit=7)
        assert [(s["auth"], s["body"]["options"]["limit"]) for s in seen] == [(None, 7), (None, 7)]
    finally:
        await runner.cleanup()


async def test_an_error_answer_stops_the_loop() -> None:
    seen: list[dict] = []
    answers = [200, 503]
    runner, url = await _server(answers, seen)
    try:
        with pytest.raises(RuntimeError, match="semantic_search failed: 503"):
            await closed_loop_searches(url, None, ["q"], callers=1, seconds=60, requests=3)
        assert len(seen) == 2  # stopped at the error, the third never sent
        answers[:] = [400]
        with pytest.raises(RuntimeError, match="semantic_search failed: 400"):
            await closed_loop_searches(url, None, ["q"], callers=1, seconds=60, requests=3)
    finally:
        await runner.cleanup()


async def test_the_warm_up_asks_each_query_every_pass_and_again_when_retryable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """:func:`benchmarks.flood.warm` sends each query ``passes`` times (each on its own connection,
    so every gateway worker sees it); a retryable answer (the sidecar cold) is asked again, a final
    one, or a retryable one past ``WARM_TRIES``, is raised."""
    monkeypatch.setattr(flood, "WARM_RETRY_S", 0.0)
    seen: list[dict] = []
    answers = [503, 503]
    runner, url = await _server(answers, seen)
    try:
        await flood.warm(url, "tok", ["alpha", "beta"], passes=3)
        asked = [s["body"]["options"]["query"] for s in seen]
        assert len(asked) == 2 * 3 + 2 and answers == []  # every query 3 times, and the 2 retried answers
        assert asked.count("alpha") >= 3 and asked.count("beta") >= 3
        answers[:] = [400]
        with pytest.raises(RuntimeError, match="warm-up: 400 x"):
            await flood.warm(url, "tok", ["alpha"], passes=1)
        answers[:] = [503] * flood.WARM_TRIES
        with pytest.raises(RuntimeError, match="warm-up: 503 x"):
            await flood.warm(url, "tok", ["alpha"], passes=1)
    finally:
        await runner.cleanup()


def test_cores_used_counts_each_groups_cpu_over_the_window_and_new_processes_from_zero() -> None:
    before = {1: ("postgres: writer", 10.0), 2: ("python -m gateway.cli gateway", 5.0), 3: ("gone", 9.0)}
    after = {
        1: ("postgres: writer", 11.0),
        2: ("python -m gateway.cli gateway", 9.0),
        4: ("postgres: parallel worker", 0.5),  # started inside the window
    }
    group = lambda pid, command: "postgresql" if "postgres" in command else "gateway"  # noqa: E731
    assert cores_used(before, after, 2.0, group) == {"postgresql": 0.75, "gateway": 2.0}
    here = cpu_by_process()[os.getpid()]
    assert "pytest" in here[0] or "python" in here[0]
    assert here[1] > 0 and json.dumps(here)  # a plain, serializable snapshot
