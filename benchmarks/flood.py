"""Budgets and fairness, measured (issue 45): a flood one principal sends, and what metering costs.

- **flood** (the reliability suite's figure): principal A sends ``semantic_search`` open-loop at
  ``factor`` (10) times the service's capacity, from its own process (:mod:`benchmarks.flood_client`,
  cheap pipelined requests) so its client does not share the measuring loop; principal B calls at a
  steady rate within its share meanwhile. Windows with and without the flood alternate
  (:func:`benchmarks.measure.alternating_passes`), so B's p99 under the flood is compared with its
  quiet p99 of the same run. Bars: B's success 100%, B's p99 <= 1.5x quiet. Capacity is the served
  searches/s of a closed loop of ``RAG_FAIR_CONCURRENCY`` admin callers (admins are not shed).
- **metering cost** (the gateway suite's figure): ``semantic_search`` p50 of one caller on a gateway
  with budgets on beside one with ``RAG_BUDGETS=false``, both over the same database, in
  interleaved windows. Bar: metered p50 <= 1.1x unmetered.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .gateway import api_request
from .measure import alternating_passes, closed_loop, percentile, ratio, spread

FLOOD_FACTOR = 10.0
B_P99_BAR = 1.5
METERING_P50_BAR = 1.1
SECTION_PERMS = {"bench1": 1}  # benchmarks.gateway.SECTION: the bench corpus's section


async def _answer(http: Any, url: str, token: str, query: str) -> tuple[int, dict[str, Any], float]:
    """One ``semantic_search``: (status, its error envelope or {} when ok, seconds)."""
    body = api_request("semantic_search", query=query, limit=10)
    started = time.perf_counter()
    async with http.post(url + "/api/v1/json", json=body, headers={"Authorization": f"Bearer {token}"}) as r:
        payload = await r.json()
    error = {} if r.status == 200 else payload.get("error", {"code": str(r.status)})
    return r.status, error, time.perf_counter() - started


async def _search(http: Any, url: str, token: str, query: str) -> tuple[int, str, float]:
    """One ``semantic_search``: (status, error code or ok, seconds)."""
    status, error, seconds = await _answer(http, url, token, query)
    return status, "ok" if status == 200 else str(error.get("code", status)), seconds


WARM_PASSES = 8  # each query this many times on fresh connections: a worker of 2 misses one 1 in 2**8
WARM_TRIES = 5  # a retryable answer (the sidecar cold at start) is asked again, up to this many times
WARM_RETRY_S = 0.5


async def warm(url: str, token: str, queries: Sequence[str], passes: int = WARM_PASSES) -> None:
    """Send every query ``passes`` times, 8 at once, each on a new connection, so every worker of
    ``--workers N`` has embedded and cached it (each holds its own query cache and statistics):
    otherwise a window's first call of a query on the other worker pays the sidecar and a cold
    statistics count, which is the warm-up's cost, not the figure's. The query cache is per caller
    (``token``'s subject): warm each caller a window measures. A retryable error is asked again; any
    other error, or one still failing after ``WARM_TRIES``, is raised."""
    import aiohttp

    gate = asyncio.Semaphore(8)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:

        async def one(q: str) -> None:
            for _ in range(WARM_TRIES):
                async with gate:
                    status, error, _ = await _answer(http, url, token, q)
                if status == 200:
                    return
                if not error.get("retryable"):
                    break
                await asyncio.sleep(WARM_RETRY_S)
            raise RuntimeError(f"warm-up: {status} {error.get('code')}")

        for _ in range(passes):
            await asyncio.gather(*(one(q) for q in queries))


async def open_loop(call: Callable[[int], Awaitable[Any]], rate: float, seconds: float) -> list[Any]:
    """Start ``call(i)`` every ``1/rate`` s for ``seconds`` whether or not earlier calls finished (an
    arrival process that does not slow down with the server, as a flood does not); their results."""
    tasks = []
    started = time.perf_counter()
    i = 0
    while (now := time.perf_counter() - started) < seconds:
        due = i / rate
        if due > now:
            await asyncio.sleep(due - now)
        tasks.append(asyncio.create_task(call(i)))
        i += 1
    return await asyncio.gather(*tasks, return_exceptions=True)


def _flood_process(
    url: str, token: str, rate: float, seconds: float, queries: Sequence[str]
) -> dict[str, Any]:
    """A's flood from a process of its own (:mod:`benchmarks.flood_client`, pipelined raw requests,
    so the flooder's own CPU stays small beside the gateway's): what it sent and got back."""
    argv = [sys.executable, "-m", "benchmarks.cli", "flood-client", url, token, str(rate), str(seconds)]
    done = subprocess.run(
        argv,
        input=json.dumps(list(queries)),
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        check=True,
    )
    return json.loads(done.stdout)


async def capacity(
    http: Any, url: str, admin: str, queries: Sequence[str], concurrency: int, seconds: float
) -> float:
    """Served searches/s of a closed loop of ``concurrency`` admin callers (not shed by the limiter)."""

    async def call(i: int) -> None:
        status, code, _ = await _search(http, url, admin, queries[i % len(queries)])
        if status != 200:
            raise RuntimeError(f"capacity probe: {code}")

    load = await closed_loop(call, concurrency=concurrency, requests=10**6, max_seconds=seconds)
    return load.requests_per_s


async def flood_figure(
    url: str,
    secret: str,
    queries: Sequence[str],
    *,
    b_rate: float,
    capacity_rps: float | None = None,
    seconds: float = 10.0,
    pairs: int = 2,
    factor: float = FLOOD_FACTOR,
    fair_concurrency: int = 8,
    perms: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A at ``factor`` x capacity beside B at ``b_rate``/s; B's success and p99 against its quiet p99.
    ``capacity_rps``: the service's capacity when measured already (else measured here, on ``url``);
    ``perms``: what A and B may read (default: the bench corpus's section)."""
    import aiohttp

    from gateway.access.auth import issue_token

    admin = issue_token(secret=secret, sub="bench-admin", projects=None, admin=True)
    perms = SECTION_PERMS if perms is None else perms
    a = issue_token(secret=secret, sub="bench-flood-a", projects=None, perms=perms)
    b = issue_token(secret=secret, sub="bench-steady-b", projects=None, perms=perms)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await warm(url, admin, queries)  # query vectors cached: every window measures the same path
        cap = capacity_rps or await capacity(http, url, admin, queries, fair_concurrency, min(seconds, 5.0))
        flood_rate = factor * cap

        async def b_window() -> list[tuple[int, str, float]]:
            results = await open_loop(
                lambda i: _search(http, url, b, queries[i % len(queries)]), b_rate, seconds
            )
            return [r if isinstance(r, tuple) else (0, type(r).__name__, float("nan")) for r in results]

        async def quiet() -> dict[str, Any]:
            return {"b": await b_window()}

        async def flooded() -> dict[str, Any]:
            flood = asyncio.create_task(
                asyncio.to_thread(_flood_process, url, a, flood_rate, seconds, queries)
            )
            await asyncio.sleep(0.5)  # the flood is under way before B's window opens
            got = await b_window()
            return {"b": got, "a": await flood}

        passes = await alternating_passes({"quiet": quiet, "flood": flooded}, pairs)
    out: dict[str, Any] = {"capacity_rps": cap, "flood_target_rps": flood_rate, "b_rate": b_rate, "pairs": []}
    for p in passes:
        q, f = p["quiet"]["b"], p["flood"]["b"]
        q99 = percentile([r[2] for r in q if r[0] == 200], 99)
        f99 = percentile([r[2] for r in f if r[0] == 200], 99)
        out["pairs"].append(
            {
                "b_quiet_p99_ms": q99 * 1000,
                "b_flood_p99_ms": f99 * 1000,
                "b_p99_ratio": ratio(f99, q99),
                "b_sent": len(f),
                "b_success": sum(r[0] == 200 for r in f) / max(1, len(f)),
                "b_codes": dict(Counter(r[1] for r in f)),
                "a": p["flood"]["a"],
            }
        )
    # The headline pools every quiet window's and every flooded window's calls (windows alternate, so
    # both saw the same machine): one window's p99 rests on its slowest one or two calls. The pairs'
    # own ratios are reported beside it as its spread.
    ratios = [x["b_p99_ratio"] for x in out["pairs"]]
    quiet_all = [r[2] for p in passes for r in p["quiet"]["b"] if r[0] == 200]
    flood_all = [r[2] for p in passes for r in p["flood"]["b"] if r[0] == 200]
    out["b_quiet_p99_ms"] = percentile(quiet_all, 99) * 1000
    out["b_flood_p99_ms"] = percentile(flood_all, 99) * 1000
    out["b_p99_ratio"] = ratio(out["b_flood_p99_ms"], out["b_quiet_p99_ms"])
    out["b_p99_ratio_spread"] = spread(ratios)
    out["b_success"] = min(x["b_success"] for x in out["pairs"])
    out["a_sent_per_s"] = min(x["a"]["sent_per_s"] for x in out["pairs"])
    out["passed"] = out["b_success"] == 1.0 and out["b_p99_ratio"] <= B_P99_BAR
    return out


async def metering_cost(
    metered_url: str, unmetered_url: str, secret: str, queries: Sequence[str], *, requests: int, pairs: int
) -> dict[str, Any]:
    """``semantic_search`` p50 of one caller, metered vs unmetered, in interleaved windows.

    The caller is an admin: its role is counted (every call reserves in the ledger, the cost being
    measured) without a limit, and the fairness limiter, which would shed one caller's hundreds of
    searches a second as a flood, does not apply to it (its in-memory bucket costs microseconds)."""
    import aiohttp

    from gateway.access.auth import issue_token

    caller = issue_token(secret=secret, sub="bench-metered", projects=None, admin=True)
    async with aiohttp.ClientSession() as http:

        def window(url: str) -> Callable[[], Awaitable[dict[str, float]]]:
            async def run() -> dict[str, float]:
                async def call(i: int) -> None:
                    status, code, _ = await _search(http, url, caller, queries[i % len(queries)])
                    if status != 200:
                        raise RuntimeError(f"metering cost: {code}")

                load = await closed_loop(call, concurrency=1, requests=requests, max_seconds=120)
                return {"p50_ms": load.latency.median * 1000, "p99_ms": load.latency.p99 * 1000}

            return run

        await warm(metered_url, caller, queries)
        await warm(unmetered_url, caller, queries)
        passes = await alternating_passes(
            {"metered": window(metered_url), "unmetered": window(unmetered_url)}, pairs
        )
    ratios = [ratio(p["metered"]["p50_ms"], p["unmetered"]["p50_ms"]) for p in passes]
    median = sorted(ratios)[len(ratios) // 2]
    return {
        "pairs": passes,
        "p50_ratio": median,
        "p50_ratio_spread": spread(ratios),
        "passed": median <= METERING_P50_BAR,
    }
