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
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from .flood_client import closed_loop_searches
from .gateway import (
    bench_database,
    gateway_process,
    gateway_read_pool,
    load_corpus,
    load_queries,
    load_sentences,
    tantivy_index,
)
from .measure import alternating_passes, cores_used, cpu_by_process, spread
from .settings import configured_database_url, configured_sidecar, configured_text_model

WARM_PASSES = 5  # each worker holds its own query-vector cache: enough passes that each has seen most


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
    from gateway.access.auth import issue_token
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
            engine["RAG_LEXICAL_DIR"] = str(await tantivy_index(database_url, partition, workdir / "lexical"))
        texts = load_queries(queries)
        secret = secrets.token_urlsafe(48)
        bearer = issue_token(secret=secret, sub="bench", projects=None, admin=True)
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
        ):
            urls = {"1 worker": one.url, f"{workers} workers": many.url}
            for url in urls.values():  # query vectors cached in every worker, pages warm
                await closed_loop_searches(
                    url, bearer, texts, callers=4, seconds=600, requests=len(texts) * WARM_PASSES,
                    limit=limit, let_retryable_pass=True,
                )  # fmt: skip
            group = _process_groups({"1 worker": one.process.pid, f"{workers} workers": many.process.pid})

            def window(name: str) -> Any:
                async def run() -> dict[str, Any]:
                    before = cpu_by_process()
                    result = await closed_loop_searches(
                        urls[name], bearer, texts, callers=callers, seconds=window_s, limit=limit
                    )
                    out = result.as_dict()
                    out["cores"] = cores_used(before, cpu_by_process(), result.wall_s, group)
                    return out

                return run

            runs = await alternating_passes({name: window(name) for name in urls}, passes)
    names = list(urls)
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
        "cores": {name: _median_cores([run[name]["cores"] for run in runs]) for name in names},
    }


def _process_groups(gateways: dict[str, int]) -> Any:
    """``group(pid, command line)`` for :func:`benchmarks.measure.cores_used`: each gateway's process
    tree by name, then PostgreSQL, the sidecar (its Ray processes included), this client, the rest."""
    trees = {
        pid: name
        for name, root in gateways.items()
        for pid in [root, *(c.pid for c in psutil.Process(root).children(recursive=True))]
    }
    here = os.getpid()

    def group(pid: int, command: str) -> str:
        if pid in trees:
            return f"gateway ({trees[pid]})"
        if pid == here:
            return "client (this benchmark)"
        if "postgres" in command:
            return "postgresql"
        if "sidecar" in command or "ray" in command:
            return "sidecar"
        return "other"

    return group


def _median_cores(windows: Sequence[dict[str, float]]) -> dict[str, float]:
    """Each group's median cores over the windows (a group absent from a window used none there)."""
    names = sorted({name for w in windows for name in w})
    return {name: round(statistics.median(w.get(name, 0.0) for w in windows), 2) for name in names}


def render(result: dict[str, Any]) -> str:
    names = list(result["requests_per_s"])
    lines = [
        f"## Gateway workers: {result['workers']} against 1 ({result['chunks']:,} chunks, "
        f"{result['callers']} callers, {len(result['passes'])} alternating passes of {result['window_s']:.0f} s, "
        f"RAG_LEXICAL_INDEX={result['lexical']})",
        "",
        "| gateway | req/s (median) | p50 ms (median) | cores used (median of the windows) |",
        "| --- | --- | --- | --- |",
        *(
            f"| {n} | {result['requests_per_s'][n]} | {result['p50_ms'][n]} | "
            + ", ".join(f"{g} {c}" for g, c in result["cores"][n].items() if c >= 0.01)
            + " |"
            for n in names
        ),
        "",
        f"Throughput ratio {names[1]} / {names[0]}: **{result['throughput_ratio']}x** "
        f"(windows {result['throughput_ratio_spread'][0]}-{result['throughput_ratio_spread'][1]}; "
        "goal >= 1.3x; PostgreSQL, the sidecar and this client share the machine's cores: the last "
        "column says where they went).",
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
    p.add_argument("--lexical", choices=("off", "tantivy"), default="off", help="the gateways' lexical leg")
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
