"""Issue 44's bars at scale: the Tantivy lexical engine on disk, shared by gateway workers.

``python -m benchmarks.tantivy_scale --chunks 1000000 --out DIR`` builds one store of ``--chunks``
(the retrieval-at-scale corpus and vectors: :func:`benchmarks.lexical.build_corpus`,
:func:`benchmarks.gateway.mixed_vectors`, every index, HNSW included) and measures, in one run:

- **the index build**: ``mnemo lexical rebuild`` (the one writer's build from PostgreSQL), its wall
  time and the index's size on disk;
- **the lexical leg** in this process, the same queries (the bundled data sets' and Zipfian ones) on
  the Tantivy engine and the SQL leg, in interleaved windows, for an admin and a researcher who sees
  1% of the chunks: p50 and p99 per leg. Bar: Tantivy's p99 <= 25 ms;
- **gateways as an operator starts them** (``mnemo gateway``, defaults otherwise): the Tantivy
  engine on one worker and on two (``--workers 2``): seconds from the command's start until
  ``/readyz`` is ready with every lexical partition served by the engine, and each process's RSS,
  USS and PSS once searches ran. Bars: ready <= 5 s; each further worker adds <= 200 MiB (the PSS of
  the gateway's processes with two workers against one: mapped index pages count once, shared);
- **``semantic_search`` out of the box**: the two-worker Tantivy gateway and the SQL leg's gateway
  (``RAG_LEXICAL_INDEX=off``), an admin at 1 and 32 callers: p50, p99. Bar: p99 <= 50 ms.

Every figure comes from this run, on this machine (2 cores shared by PostgreSQL, the sidecar, the
gateways and this process); the README beside the results says what else ran.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from .acl_shares import VISIBILITY_PROJECT
from .flood import warm
from .gateway import gateway_process, gateway_read_pool, load_queries, mixed_vectors
from .lexical import SECTION, build_corpus, dataset_queries, populate
from .measure import closed_loop, interleaved_windows, p50_p99_ms
from .stack import BENCH_MODEL, BenchStack, open_stack

__all__ = ["run_tantivy_scale"]

READY_BAR_S = 5.0
WORKER_GROWTH_BAR_MIB = 200.0
LEXICAL_P99_BAR_MS = 25.0
SEARCH_P99_BAR_MS = 50.0
LIMIT = 10


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _rebuild(database_url: str, root: Path) -> dict[str, Any]:
    """``mnemo lexical rebuild`` as an operator runs it: wall time, the writer's peak RSS, the size."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "lexical",
            "rebuild",
            "--database-url",
            database_url,
            "--dir",
            str(root),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    peak = 0
    while proc.poll() is None:
        try:
            peak = max(peak, psutil.Process(proc.pid).memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.5)
    output = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        raise RuntimeError(f"mnemo lexical rebuild failed ({proc.returncode}): {output[-2000:]}")
    return {
        "s": time.perf_counter() - started,
        "writer_peak_rss_mib": peak / 2**20,
        "disk_mib": _folder_bytes(root) / 2**20,
    }


async def _lexical_legs(
    pool: Any, url: str, partition: Any, root: Path, queries: Sequence[str], windows: int
) -> dict[str, Any]:
    """The lexical legs in this process, same queries, interleaved windows, per visibility: the
    Tantivy engine and the SQL leg."""
    from gateway.access.acl import pushdown
    from gateway.access.auth import Principal
    from index.lexical.engine import TantivyConfig, TantivyLexical
    from index.search.bm25 import CorpusStats
    from index.search.lexical_leg import lexical_search
    from index.store.hits import Scope

    stats = CorpusStats(ttl=3600)
    engine = TantivyLexical(root, TantivyConfig(stats_ttl_s=3600))
    scopes = {
        "admin": Scope(),
        "1%": Scope(acl=pushdown(Principal("r", frozenset({VISIBILITY_PROJECT["1%"]}), {SECTION: 1}))),
    }
    out: dict[str, Any] = {}
    async with pool.acquire() as conn:
        for name, scope in scopes.items():

            def leg(search: Any, scope: Any = scope) -> Any:
                async def run(query: str) -> None:
                    if await search(query, scope) is None:
                        raise RuntimeError("a leg did not serve a loaded partition")

                return run

            legs = {
                "tantivy": leg(lambda q, s: engine.search(conn, partition, q, s, 4 * LIMIT)),
                "sql": leg(lambda q, s: lexical_search(conn, partition, q, s, 4 * LIMIT, stats=stats)),
            }
            times = await interleaved_windows(legs, list(queries), windows)
            out[name] = {leg_name: p50_p99_ms([t for w in ts for t in w]) for leg_name, ts in times.items()}
    return out


def _tree_memory(pid: int) -> dict[str, Any]:
    """RSS, USS and PSS (MiB) of a gateway command and each of its worker processes."""
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    rows = []
    for p in procs:
        try:
            m = p.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        rows.append(
            {"pid": p.pid, "rss_mib": m.rss / 2**20, "uss_mib": m.uss / 2**20, "pss_mib": m.pss / 2**20}
        )
    return {"processes": rows, "pss_mib": sum(r["pss_mib"] for r in rows)}


def _lexical_served(status: dict[str, Any]) -> bool:
    """``/readyz``'s lexical detail: every partition served by the engine (none cold or behind)."""
    parts = status.get("partitions") or {}
    return bool(parts) and all(p.get("state") == "ready" for p in parts.values())


async def _ready(session: Any, url: str, search: Any, started: float, wait_s: float = 1800.0) -> float:
    """Seconds from ``started`` until ``/readyz`` is 200 with the lexical engine serving every
    partition (the Tantivy engine opens a partition's index at its first search, so one is sent)."""
    while True:
        async with session.get(url + "/readyz") as r:
            body = await r.json()
        if r.status == 200:
            lexical = body["data"]["lexical_index"]
            if not lexical.get("running") or _lexical_served(lexical):
                return time.perf_counter() - started
            await search(0)
        if time.perf_counter() - started > wait_s:
            raise TimeoutError(f"the gateway was not ready in {wait_s:.0f} s: {body}")
        await asyncio.sleep(0.05)


async def _gateway(
    stack: BenchStack,
    url: str,
    model: str,
    queries: Sequence[str],
    root: Path,
    workdir: Path,
    name: str,
    env: dict[str, str],
    callers: Sequence[int],
    seconds: float,
) -> dict[str, Any]:
    """One ``mnemo gateway``: its time to ready, its processes' memory, ``semantic_search`` cells."""
    import aiohttp

    from gateway.access.auth import issue_token

    assert stack.sidecar_url is not None
    secret = secrets.token_urlsafe(48)
    admin = issue_token(secret=secret, sub="bench", projects=None, admin=True)
    env = {"RAG_LEXICAL_DIR": str(root), "RAG_FAISS_CACHE": "off", **env}
    started = time.perf_counter()
    log = workdir / f"gateway-{name}.log"
    async with gateway_process(url, stack.sidecar_url, secret, log, text_model=model, **env) as gateway:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2 * max(callers))) as session:
            headers = {"Authorization": f"Bearer {admin}"}

            async def search(i: int) -> None:
                body = {
                    "dd_api": "dd_rag_api",
                    "action": "semantic_search",
                    "options": {"query": queries[i % len(queries)], "limit": LIMIT},
                }
                async with session.post(gateway.url + "/api/v1/json", json=body, headers=headers) as r:
                    if r.status != 200:
                        raise RuntimeError(f"semantic_search on {name}: {r.status} {await r.text()}")
                    await r.read()

            ready_s = await _ready(session, gateway.url, search, started)
            await warm(gateway.url, admin, queries)  # every worker embeds and counts each query once
            cells = {}
            for c in callers:
                load = await closed_loop(search, concurrency=c, requests=10**6, max_seconds=seconds)
                cells[f"{c} caller{'s' if c > 1 else ''}"] = {
                    "p50_ms": load.latency.median * 1e3,
                    "p99_ms": load.latency.p99 * 1e3,
                    "rps": load.requests_per_s,
                }
            memory = _tree_memory(gateway.process.pid)
    return {"ready_s": ready_s, "memory": memory, "cells": cells}


async def run_tantivy_scale(
    stack: BenchStack,
    chunks: int,
    *,
    bases: int,
    windows: int,
    seconds: float,
    callers: Sequence[int],
    workdir: Path,
) -> dict[str, Any]:
    from inference.client import SidecarClient

    from .scale_store import embed_bases

    assert stack.sidecar_url is not None
    async with SidecarClient(stack.sidecar_url, timeout=300) as client:
        base = (await embed_bases(client, BENCH_MODEL, bases)).vectors
    queries = load_queries(100)
    lexical_queries = dataset_queries()[:60]
    url = await stack.fresh_database(f"tantivy_scale_{chunks}")
    out: dict[str, Any] = {"chunks": chunks, "bases": bases, "windows": windows}
    pool = await gateway_read_pool(url)
    try:
        started = time.perf_counter()
        texts = build_corpus(chunks)
        partition = await populate(
            pool,
            texts,
            model=BENCH_MODEL,
            dimension=base.shape[1],
            vectors=lambda first, stop: mixed_vectors(base, stop - first, seed=first),
        )
        out["store_s"] = time.perf_counter() - started
        del texts
        root = workdir / "lexical"
        out["rebuild"] = await asyncio.to_thread(_rebuild, url, root)
        out["lexical"] = await _lexical_legs(pool, url, partition, root, lexical_queries, windows)
    finally:
        await pool.close()
    configs = {
        # The defaults (RAG_LEXICAL_INDEX=auto: Tantivy once its index exists), as installed.
        "tantivy, 1 worker": {"RAG_GATEWAY_WORKERS": "1"},
        "tantivy, 2 workers": {"RAG_GATEWAY_WORKERS": "2"},
        "off (SQL leg), 2 workers": {"RAG_LEXICAL_INDEX": "off", "RAG_GATEWAY_WORKERS": "2"},
    }
    out["gateways"] = {}
    for name, env in configs.items():
        out["gateways"][name] = await _gateway(
            stack, url, BENCH_MODEL, queries, root, workdir, name, env, callers, seconds
        )
    return out


def verdicts(result: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(figure, value, bar, met) for each of issue 44's bars this run measured."""
    rows = []
    lex = result["lexical"]
    for scope in ("admin", "1%"):
        t = lex[scope]["tantivy"]
        rows.append(
            (
                f"lexical p99, {scope}: Tantivy",
                f"{t['p99_ms']:.1f} ms (p50 {t['p50_ms']:.2f}; SQL {lex[scope]['sql']['p99_ms']:.0f})",
                f"<= {LEXICAL_P99_BAR_MS:g} ms",
                t["p99_ms"] <= LEXICAL_P99_BAR_MS,
            )
        )
    gws = result["gateways"]
    one, two = gws["tantivy, 1 worker"], gws["tantivy, 2 workers"]
    for name in ("tantivy, 1 worker", "tantivy, 2 workers"):
        rows.append(
            (
                f"ready, {name}",
                f"{gws[name]['ready_s']:.1f} s",
                f"<= {READY_BAR_S:g} s",
                gws[name]["ready_s"] <= READY_BAR_S,
            )
        )
    growth = two["memory"]["pss_mib"] - one["memory"]["pss_mib"]
    rows.append(
        (
            "PSS growth of the second worker (2 workers' processes against 1)",
            f"{growth:.0f} MiB (1 worker: {one['memory']['pss_mib']:.0f} MiB in all)",
            f"<= {WORKER_GROWTH_BAR_MIB:g} MiB",
            growth <= WORKER_GROWTH_BAR_MIB,
        )
    )
    for name in ("tantivy, 2 workers", "off (SQL leg), 2 workers"):
        for cell, v in gws[name]["cells"].items():
            rows.append(
                (
                    f"semantic_search p99, {name}, {cell}",
                    f"{v['p99_ms']:.1f} ms (p50 {v['p50_ms']:.1f}, {v['rps']:.0f}/s)",
                    f"<= {SEARCH_P99_BAR_MS:g} ms",
                    v["p99_ms"] <= SEARCH_P99_BAR_MS,
                )
            )
    return rows


def render(result: dict[str, Any]) -> str:
    rb = result["rebuild"]
    lines = [
        f"# The Tantivy lexical engine at {result['chunks']:,} chunks (issue 44)",
        "",
        f"Store built in {result['store_s']:.0f} s; `mnemo lexical rebuild` {rb['s']:.0f} s "
        f"(writer peak RSS {rb['writer_peak_rss_mib']:.0f} MiB, index {rb['disk_mib']:.0f} MiB on disk).",
        "",
        "| figure | value | bar | met |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {f} | {v} | {b} | {'yes' if ok else '**no**'} |" for f, v, b, ok in verdicts(result)]
    lines += ["", "Each gateway's processes once searches ran (MiB):", ""]
    for name, g in result["gateways"].items():
        procs = ", ".join(
            f"pid {p['pid']}: RSS {p['rss_mib']:.0f}, USS {p['uss_mib']:.0f}, PSS {p['pss_mib']:.0f}"
            for p in g["memory"]["processes"]
        )
        lines.append(
            f"- {name}: ready {g['ready_s']:.1f} s; PSS in all {g['memory']['pss_mib']:.0f}; {procs}"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.tantivy_scale", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "--chunks", type=int, default=100_000, help="chunks in the store (issue 44's bars: 1000000)"
    )
    p.add_argument("--bases", type=int, default=2_000, help="real sentences embedded for the vectors")
    p.add_argument("--windows", type=int, default=3, help="interleaved windows of the lexical legs")
    p.add_argument("--seconds", type=float, default=20.0, help="each semantic_search closed loop")
    p.add_argument("--callers", default="1,32", help="semantic_search callers, comma-separated")
    p.add_argument("--sidecar-url", default=None, help="a running sidecar (default: the bench stack's own)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    callers = [int(c) for c in args.callers.split(",") if c.strip()]
    with (
        tempfile.TemporaryDirectory(prefix="mnemo-bench-tantivy-scale-") as work,
        open_stack(Path(work), database=True, sidecar=True, sidecar_url=args.sidecar_url) as stack,
    ):
        result = asyncio.run(
            run_tantivy_scale(
                stack,
                args.chunks,
                bases=args.bases,
                windows=args.windows,
                seconds=args.seconds,
                callers=callers,
                workdir=Path(work),
            )
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    (args.out / "REPORT.md").write_text(render(result))
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
