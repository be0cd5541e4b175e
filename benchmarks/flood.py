"""Budgets and fairness, measured (issue 45): a flood one principal sends, and what metering costs.

- **flood** (the reliability suite's figure): principal A sends ``semantic_search`` open-loop at
  ``factor`` (10) times the service's capacity, from its own process (:mod:`benchmarks.flood_client`,
  cheap pipelined requests) so its client does not share the measuring loop; principal B calls at a
  steady rate within its share meanwhile. Windows with and without the flood alternate
  (:func:`benchmarks.measure.alternating_passes`), so B's p99 under the flood is compared with its
  quiet p99 of the same run. Bars: B's success 100%, B's p99 <= 1.5x quiet. Capacity is the served
  searches/s of a closed loop of ``RAG_FAIR_CONCURRENCY`` admin callers (admins are not shed); the
  limiter is sized as an operator sizes it, ``RAG_FAIR_RATE`` a share (``--fair-share``, 10%) of
  that capacity, measured first on the unmetered twin.
- **metering cost** (the gateway suite's figure): ``semantic_search`` p50 of one caller on a gateway
  with budgets on beside one with ``RAG_BUDGETS=false``, both over the same database, in
  interleaved windows. Bar: metered p50 <= 1.1x unmetered.

``python -m benchmarks.flood --chunks 100000 --out DIR`` runs both on their own stack (an embedded
PostgreSQL, the sidecar, two ``mnemo gateway`` processes on loopback) and writes ``budgets.json``
and ``budgets.md`` to ``DIR``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from .measure import alternating_passes, closed_loop, percentile, ratio, spread

FLOOD_FACTOR = 10.0
B_SHARE_OF_WORKER_RATE = 0.8  # B's steady rate: this share of one worker's slice of RAG_FAIR_RATE
B_P99_BAR = 1.5
METERING_P50_BAR = 1.1
SECTION_PERMS = {"bench1": 1}  # benchmarks.gateway.SECTION: the bench corpus's section


async def _search(http: Any, url: str, token: str, query: str) -> tuple[int, str, float]:
    """One ``semantic_search``: (status, error code or ok, seconds)."""
    body = {"dd_api": "dd_rag_api", "action": "semantic_search", "options": {"query": query, "limit": 10}}
    started = time.perf_counter()
    async with http.post(url + "/api/v1/json", json=body, headers={"Authorization": f"Bearer {token}"}) as r:
        payload = await r.json()
    code = "ok" if r.status == 200 else payload.get("error", {}).get("code", str(r.status))
    return r.status, code, time.perf_counter() - started


WARM_PASSES = 6  # each query this many times on fresh connections: every worker sees it (1 in 2**5 misses)


async def warm(url: str, token: str, queries: Sequence[str], passes: int = WARM_PASSES) -> None:
    """Send every query ``passes`` times, 8 at once, each on a new connection, so every worker of
    ``--workers N`` has embedded and cached it (each holds its own query cache and statistics):
    otherwise a window's first call of a query on the other worker pays the sidecar and a cold
    statistics count, which is the warm-up's cost, not the figure's."""
    import aiohttp

    gate = asyncio.Semaphore(8)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:

        async def one(q: str) -> None:
            async with gate:
                status, code, _ = await _search(http, url, token, q)
            if status != 200:
                raise RuntimeError(f"warm-up: {code}")

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
    argv = [sys.executable, "-m", "benchmarks.flood_client", url, token, str(rate), str(seconds)]
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


def render(result: dict[str, Any]) -> str:
    flood, cost = result.get("flood", {}), result.get("metering", {})
    fair = result.get("fair", {})
    lines = [
        f"# Budgets and fairness ({result['chunks']:,} chunks, {result['model']})",
        "",
        f"Fairness limiter: RAG_FAIR_RATE={fair.get('rate', 0):.2f} ({fair.get('share', 0):.0%} of the "
        f"{fair.get('capacity_rps', 0):.1f} searches/s the unmetered twin served first), "
        f"RAG_FAIR_BURST={fair.get('burst')}, RAG_FAIR_CONCURRENCY={fair.get('concurrency')}; "
        f"{fair.get('workers')} gateway workers, each holding 1/{fair.get('workers')} of them.",
        "",
    ]
    if "b_p99_ratio" in flood:
        lo, hi = flood["b_p99_ratio_spread"]
        lines += [
            "| figure | value | bar |",
            "| --- | --- | --- |",
            f"| capacity (searches/s, {flood.get('fair_concurrency', 8)} admin callers) | {flood['capacity_rps']:.1f} | |",
            f"| A's flood: target / sent (req/s) | {flood['flood_target_rps']:.0f} / {flood['a_sent_per_s']:.0f} | 10x capacity |",
            f"| B's success under the flood | {flood['b_success']:.1%} | 100% |",
            f"| B's p99 flood / quiet, every window's calls ({flood['b_rate']:g}/s) | "
            f"{flood['b_flood_p99_ms']:.1f} / {flood['b_quiet_p99_ms']:.1f} ms = {flood['b_p99_ratio']:.2f}x "
            f"(pairs {lo:.2f}-{hi:.2f}) | <= {B_P99_BAR}x |",
        ]
        for k, p in enumerate(flood["pairs"]):
            lines.append(
                f"| pair {k}: B p99 quiet {p['b_quiet_p99_ms']:.1f} ms, flood {p['b_flood_p99_ms']:.1f} ms; "
                f"A's codes {p['a']['codes']} | | |"
            )
    if "p50_ratio" in cost:
        lo, hi = cost["p50_ratio_spread"]
        lines.append(
            f"| semantic_search p50 metered / unmetered | {cost['p50_ratio']:.3f}x ({lo:.3f}-{hi:.3f}) | <= {METERING_P50_BAR}x |"
        )
        for k, p in enumerate(cost["pairs"]):
            lines.append(
                f"| pair {k}: p50 metered {p['metered']['p50_ms']:.2f} ms, unmetered {p['unmetered']['p50_ms']:.2f} ms | | |"
            )
    for name in ("flood", "metering"):
        if "error" in result.get(name, {}):
            lines.append(f"\n{name}: {result[name]['error']}")
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both figures on their own stack: a corpus of ``--chunks``, two gateways (budgets on, off)."""
    from index.models import resolve_model
    from inference.client import SidecarClient

    from .gateway import gateway_process, gateway_read_pool, load_corpus, load_queries, load_sentences
    from .stack import BENCH_MODEL, open_stack

    out: dict[str, Any] = {"chunks": args.chunks}
    with open_stack(args.work, database=True, sidecar=True, sidecar_url=args.sidecar_url) as stack:
        assert stack.sidecar_url is not None
        url = await stack.fresh_database("bench_budgets")
        async with SidecarClient(stack.sidecar_url, timeout=300) as client:
            model = await resolve_model(client, "text", BENCH_MODEL)
            pool = await gateway_read_pool(url)
            try:
                started = time.perf_counter()
                await load_corpus(
                    pool, client, model, load_sentences(args.chunks)[: args.chunks], args.embedded
                )
                out["load_s"] = time.perf_counter() - started
            finally:
                await pool.close()
        out["model"] = model.id
        queries = load_queries(args.queries)
        secret = secrets.token_urlsafe(48)
        env = {"RAG_GATEWAY_WORKERS": str(args.workers), "RAG_FAISS_CACHE": "off"}
        async with gateway_process(
            url,
            stack.sidecar_url,
            secret,
            args.work / "budgets-off.log",
            text_model=model.id,
            RAG_BUDGETS="false",
            **env,
        ) as off:
            # The limiter sized to this machine as an operator sizes it: a principal may take a share
            # of what the service serves (measured here first, on the unmetered twin).
            cap = await _capacity_of(off.url, secret, queries, args.fair_concurrency)
            rate = args.fair_rate or max(0.5, args.fair_share * cap)
            fair = {
                "RAG_FAIR_RATE": f"{rate:.2f}",
                "RAG_FAIR_BURST": str(max(4, math.ceil(rate))),
                "RAG_FAIR_CONCURRENCY": str(args.fair_concurrency),
            }
            out["fair"] = {
                "capacity_rps": cap,
                "rate": rate,
                "share": rate / cap,
                "workers": args.workers,
                "burst": int(fair["RAG_FAIR_BURST"]),
                "concurrency": args.fair_concurrency,
            }
            async with gateway_process(
                url,
                stack.sidecar_url,
                secret,
                args.work / "budgets-on.log",
                text_model=model.id,
                **env,
                **fair,
            ) as on:
                try:
                    if args.skip_metering:
                        raise RuntimeError("skipped (--skip-metering)")
                    out["metering"] = await metering_cost(
                        on.url, off.url, secret, queries, requests=args.requests, pairs=args.pairs
                    )
                except Exception as exc:  # the other figure still runs; the report says what broke
                    out["metering"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                try:
                    # B stays within its share on one worker (its calls ride one keep-alive
                    # connection, so one worker's 1/N of the rate), with a margin for timer jitter.
                    out["flood"] = await flood_figure(
                        on.url,
                        secret,
                        queries,
                        b_rate=B_SHARE_OF_WORKER_RATE * rate / args.workers,
                        capacity_rps=cap,
                        seconds=args.seconds,
                        pairs=args.pairs,
                    )
                except Exception as exc:
                    out["flood"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    return out


async def _capacity_of(url: str, secret: str, queries: Sequence[str], callers: int) -> float:
    """Served searches/s of ``url`` (an admin's closed loop of ``callers``, vectors cached first)."""
    import aiohttp

    from gateway.access.auth import issue_token

    admin = issue_token(secret=secret, sub="bench-admin", projects=None, admin=True)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await warm(url, admin, queries)
        return await capacity(http, url, admin, queries, callers, 10.0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flood", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    both = sub.add_parser("run", help="the flood and metering-cost figures on their own stack")
    both.add_argument("--chunks", type=int, default=100_000)
    both.add_argument(
        "--embedded", type=int, default=2_000, help="chunks embedded for real (the rest reuse them)"
    )
    both.add_argument("--queries", type=int, default=50)
    both.add_argument("--requests", type=int, default=300, help="searches per metering window")
    both.add_argument("--pairs", type=int, default=4)
    both.add_argument("--seconds", type=float, default=20.0, help="each flood window")
    both.add_argument("--sidecar-url", default=None)
    both.add_argument(
        "--fair-share",
        type=float,
        default=0.1,
        help="RAG_FAIR_RATE of the metered gateway as a share of the capacity measured first",
    )
    both.add_argument(
        "--fair-rate", type=float, default=None, help="RAG_FAIR_RATE itself (overrides the share)"
    )
    both.add_argument(
        "--fair-concurrency", type=int, default=8, help="RAG_FAIR_CONCURRENCY of the metered gateway"
    )
    both.add_argument(
        "--workers", type=int, default=2, help="RAG_GATEWAY_WORKERS of both gateways (2: this host's cores)"
    )
    both.add_argument("--skip-metering", action="store_true", help="the flood figure only")
    both.add_argument("--work", type=Path, default=Path(".mnemo/bench-budgets"))
    both.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "budgets.json").write_text(json.dumps(result, indent=2, default=str))
    (args.out / "budgets.md").write_text(render(result))
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
