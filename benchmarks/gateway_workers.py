"""Gateway workers: ``semantic_search`` throughput of ``mnemo gateway --workers 2`` against one process.

Issue 44's bar: 2 workers against 1, 32 callers, a 100k-chunk store, same run: at least 1.3x
(PostgreSQL and the sidecar share the machine's 2 cores with the gateway, so this is bound by the
hardware: a third of the CPU goes to the database). Both gateways run side by side on one store,
each warmed on the query set; then closed-loop windows at the same concurrency alternate between
them (one worker, two workers; then two, one; ...), so a slow spell of the shared machine falls on
both alike. The headline is the median of the windows' ratios, with their spread.

``python -m benchmarks.gateway_workers`` (a sidecar at ``RAG_SIDECAR_URL``; a throw-away embedded
database unless ``RAG_DATABASE_URL``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .gateway import (
    bench_database,
    gateway_process,
    gateway_read_pool,
    load_corpus,
    load_queries,
    load_sentences,
)
from .measure import alternating_passes, closed_loop, spread
from .settings import configured_database_url, configured_sidecar, configured_text_model

WARM_PASSES = 5  # each worker holds its own query-vector cache: enough passes that each has seen most


async def _searcher(
    session: Any, url: str, texts: Sequence[str], limit: int, *, warming: bool = False
) -> Any:
    """One ``semantic_search`` per call. ``warming``: a retryable answer (the sidecar, which shares
    the cores, timing out a query embedding while the caches are cold) is let pass; a measured
    window raises on anything but 200."""

    async def search(i: int) -> None:
        body = {"dd_api": "dd_rag_api", "action": "semantic_search",
                "options": {"query": texts[i % len(texts)], "limit": limit}}  # fmt: skip
        async with session.post(url + "/api/v1/json", json=body) as r:
            payload = await r.json()
            if r.status == 200 and payload.get("ok"):
                return
            if warming and payload.get("error", {}).get("retryable"):
                return
            raise RuntimeError(f"semantic_search failed: {r.status} {payload}")

    return search


async def run_workers_benchmark(
    *,
    sidecar_url: str,
    database_url: str | None = None,
    text_model: str | None = None,
    chunks: int = 100_000,
    embedded: int = 1_000,
    queries: int = 100,
    callers: int = 32,
    workers: int = 2,
    passes: int = 4,
    window_s: float = 15.0,
    limit: int = 10,
    lexical: str = "off",
) -> dict[str, Any]:
    """One gateway process and one of ``workers`` workers on one store: alternating windows' req/s.

    ``lexical``: the gateways' ``RAG_LEXICAL_INDEX``; ``tantivy`` builds the store's index first
    (``mnemo lexical rebuild``'s writer) so the lexical leg is the engine's, not PostgreSQL's."""
    import aiohttp

    from gateway.auth import issue_token
    from index.models import resolve_model
    from inference.client import SidecarClient

    workdir = Path(tempfile.mkdtemp(prefix="mnemo-bench-workers-"))
    async with bench_database(database_url, workdir) as database_url:
        pool = await gateway_read_pool(database_url)
        async with SidecarClient(sidecar_url) as client:
            model = await resolve_model(client, "text", text_model)
            sentences = load_sentences(chunks)[:chunks]
            partition = await load_corpus(pool, client, model, sentences, min(embedded, chunks))
        await pool.close()
        engine = {"RAG_LEXICAL_INDEX": lexical}
        if lexical == "tantivy":
            engine["RAG_LEXICAL_DIR"] = str(
                await _tantivy_index(database_url, partition, workdir / "lexical")
            )
        texts = load_queries(queries)
        secret = secrets.token_urlsafe(48)
        bearer = issue_token(secret=secret, sub="bench", projects=None, admin=True)
        headers = {"Authorization": f"Bearer {bearer}"}
        async with (
            gateway_process(
                database_url, sidecar_url, secret, workdir / "one.log", text_model=model.id, **engine
            ) as one,
            gateway_process(
                database_url,
                sidecar_url,
                secret,
                workdir / "many.log",
                text_model=model.id,
                RAG_GATEWAY_WORKERS=str(workers),
                **engine,
            ) as many,
            aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=callers * 2, force_close=False), headers=headers
            ) as session,
        ):
            searches = {
                "1 worker": await _searcher(session, one.url, texts, limit),
                f"{workers} workers": await _searcher(session, many.url, texts, limit),
            }
            for url in (one.url, many.url):  # query vectors cached in every worker, pages warm
                warm = await _searcher(session, url, texts, limit, warming=True)
                await closed_loop(warm, concurrency=4, requests=len(texts) * WARM_PASSES, max_seconds=600)

            def window(name: str) -> Any:
                async def run() -> dict[str, Any]:
                    result = await closed_loop(
                        searches[name], concurrency=callers, requests=10**9, max_seconds=window_s
                    )
                    return result.as_dict()

                return run

            runs = await alternating_passes({name: window(name) for name in searches}, passes)
    names = list(searches)
    ratios = [run[names[1]]["requests_per_s"] / run[names[0]]["requests_per_s"] for run in runs]
    return {
        "suite": "gateway_workers",
        "chunks": len(sentences),
        "model": model.id,
        "callers": callers,
        "workers": workers,
        "lexical": lexical,
        "window_s": window_s,
        "passes": runs,
        "throughput_ratio": round(statistics.median(ratios), 3),
        "throughput_ratio_spread": [round(v, 3) for v in spread(ratios)],
        "requests_per_s": {
            name: round(statistics.median(run[name]["requests_per_s"] for run in runs), 1) for name in names
        },
        "p50_ms": {
            name: round(statistics.median(run[name]["latency_s"]["median"] for run in runs) * 1000, 1)
            for name in names
        },
    }


async def _tantivy_index(database_url: str, partition: Any, root: Path) -> Path:
    """The store's Tantivy index under ``root``, built as ``mnemo lexical rebuild`` builds it."""
    from index.tantivy_writer import LexicalWriter
    from schema import create_pool

    pool = await create_pool(database_url, max_size=4)
    writer = LexicalWriter(pool, database_url, root)
    try:
        await writer.rebuild(partition, lambda _n: None)
    finally:
        await writer.stop()
        await pool.close()
    return root


def render(result: dict[str, Any]) -> str:
    names = list(result["requests_per_s"])
    lines = [
        f"## Gateway workers: {result['workers']} against 1 ({result['chunks']:,} chunks, "
        f"{result['callers']} callers, {len(result['passes'])} alternating passes of {result['window_s']:.0f} s, "
        f"RAG_LEXICAL_INDEX={result['lexical']})",
        "",
        "| gateway | req/s (median) | p50 ms (median) |",
        "| --- | --- | --- |",
        *(f"| {n} | {result['requests_per_s'][n]} | {result['p50_ms'][n]} |" for n in names),
        "",
        f"Throughput ratio {names[1]} / {names[0]}: **{result['throughput_ratio']}x** "
        f"(windows {result['throughput_ratio_spread'][0]}-{result['throughput_ratio_spread'][1]}; "
        "goal >= 1.3x; PostgreSQL and the sidecar share the same 2 cores).",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gateway_workers", description=__doc__.splitlines()[0]
    )
    p.add_argument("--sidecar-url", default=None, help="default: RAG_SIDECAR_URL, else http://127.0.0.1:8001")
    p.add_argument("--database-url", default=None, help="default: RAG_DATABASE_URL, else embedded")
    p.add_argument("--text-model", default=None, help="default: RAG_TEXT_MODEL, else the first text model")
    p.add_argument("--chunks", type=int, default=100_000)
    p.add_argument("--callers", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--passes", type=int, default=4)
    p.add_argument("--window-s", type=float, default=15.0)
    p.add_argument(
        "--lexical", choices=("off", "memory", "tantivy"), default="off", help="the gateways' lexical leg"
    )
    p.add_argument("--out", type=Path, default=None, help="a folder for result.json and result.md")
    args = p.parse_args(argv)
    started = time.perf_counter()
    result = asyncio.run(
        run_workers_benchmark(
            sidecar_url=configured_sidecar(args.sidecar_url).sidecar_url,
            database_url=configured_database_url(args.database_url),
            text_model=configured_text_model(args.text_model),
            chunks=args.chunks,
            callers=args.callers,
            workers=args.workers,
            passes=args.passes,
            window_s=args.window_s,
            lexical=args.lexical,
        )
    )
    result["wall_s"] = round(time.perf_counter() - started, 1)
    text = render(result)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "result.json").write_text(json.dumps(result, indent=2))
        (args.out / "result.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
