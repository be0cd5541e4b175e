"""The FAISS vector cache against pgvector, measured in one run on one embedded PostgreSQL.

``python -m benchmarks.faiss_cache --sizes 10000,100000 --out DIR`` builds, per size, a partition
of ``n`` unit vectors (384 dims, as all-MiniLM-L6-v2; clustered so neighbours mean something) whose
records carry projects that make an ACL of known selectivity: every record is in project 1 (100%),
every 10th in project 2 (10%), every 100th in project 3 (1%). Then, all in the same run:

- **recall@10** of the dense leg against exact search (a full scan, ``dense_search(exact=True)``),
  unfiltered (admin) and for a researcher holding project 1, 2 or 3: the cache
  (:meth:`index.vectors.cache.VectorCache.search`) beside pgvector's HNSW leg with the gateway's
  settings (``ef_search`` 100, iterative scans up to 20 000 tuples). Tie-aware: a hit counts when
  its exact score reaches the 10th exact score.
- **latency of the dense leg** (the part of ``semantic_search`` the cache replaces; query
  embedding, lexical leg, fusion and HTTP are the same either way): non-admin at 100% visibility
  vs admin, p50 of sequential calls, for the cache and for HNSW; and 32 concurrent callers, cache
  on vs off (p50 and queries/s).
- **load**: seconds and index bytes (and process RSS growth) per 100k vectors.
- **sync lag** while a writer rewrites records the way the drain does (a transaction per batch of
  records, 32 at a time): seconds from each row's write to its change being applied, p50/p99.

No sidecar: query vectors are drawn from the same clusters (``mixed_vectors``-style), which keeps
the run about the store and the cache.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .acl_shares import VISIBILITY_PROJECT, projects_of
from .measure import closed_loop, percentile, rss_bytes, summarize, tie_aware_recall
from .report import Headline, SuiteResult, Table, write_report

__all__ = ["DIM", "MODEL", "populate", "run_faiss_cache_benchmark", "vectors"]

MODEL = "bench-faiss-384"
DIM = 384
SECTION = "bench1"
K = 10


def vectors(n: int, rng: np.random.Generator, centers: np.ndarray) -> np.ndarray:
    picks = rng.integers(0, len(centers), n)
    out = centers[picks] + 0.35 * rng.standard_normal((n, DIM), dtype=np.float32)
    return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


async def populate(pool: Any, n: int, centers: np.ndarray, *, hnsw: bool = True, model: str = MODEL) -> Any:
    """``n`` clustered rows (bulk COPY), then the partition's HNSW index (``hnsw``: a run that never
    searches pgvector skips its build, minutes at 1M rows)."""
    from index.store.partitions import ensure_partition
    from index.store.store import EmbeddingRow, copy_rows

    partition = await ensure_partition(pool, model, DIM)
    rng = np.random.default_rng(n)
    meta = {"contributors": ["c1"]}
    async with pool.acquire() as conn:
        index_sql = await conn.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE tablename = $1 AND indexname = $2",
            partition.partition,
            partition.partition + "_hnsw",
        )
        await conn.execute(f'DROP INDEX "{partition.partition}_hnsw"')  # bulk load first, index after
        for start in range(0, n, 20_000):
            vecs = vectors(min(20_000, n - start), rng, centers)
            rows = [
                EmbeddingRow("text", SECTION, start + i + 1, "rag:card", "lg-nolan", 0, f"h{start + i}", "t",
                             "t", vecs[i], projects=projects_of(start + i + 1), chunk_meta=meta)
                for i in range(len(vecs))
            ]  # fmt: skip
            await copy_rows(conn, partition, rows)
        # The whole graph in memory (about 2 KiB per 384-d row): a build that spills is many times slower.
        if hnsw:
            await conn.execute(f"SET maintenance_work_mem = '{max(512, n * 4096 // 2**20)}MB'")
            await conn.execute(index_sql)
        await conn.execute(f"ANALYZE {partition.table}")
    return partition


def _recall(got: Sequence[Any], exact: Sequence[Any]) -> float:
    """Tie-aware recall of hits (higher score is nearer) against the exact hits."""
    return tie_aware_recall([(h.key, -h.score) for h in got], [(h.key, -h.score) for h in exact])


async def _sync_lag(
    pool: Any, cache: Any, partition: Any, n: int, centers: np.ndarray, seconds: float
) -> dict[str, Any]:
    """Sync lag: a drain-like writer rewrites records in transactions of 32 for ``seconds`` while the
    cache follows the change feed; each change's write -> applied lag and each transaction's
    commit -> applied lag (the first application whose watermark covers its changes)."""
    from index.store.store import EmbeddingRow, upsert_rows

    await cache.start()  # listener + follow loop (the partition is already loaded)
    for _ in range(100):
        if cache.listener is not None and cache.listener.connected:
            break
        await asyncio.sleep(0.05)
    cache.recent_lags.clear()
    rng = random.Random(5)
    wrng = np.random.default_rng(9)
    deadline = time.perf_counter() + seconds
    written = 0
    commits: list[tuple[float, int]] = []  # (monotonic commit time, the transaction's highest seq)
    while time.perf_counter() < deadline:
        async with pool.acquire() as conn:
            async with conn.transaction():
                for _ in range(32):
                    record = rng.randint(1, n)
                    vec = vectors(1, wrng, centers)[0]
                    row = EmbeddingRow("text", SECTION, record, "rag:card", "lg-nolan", 0, f"w{written}", "t",
                                       "t", vec, projects=projects_of(record),
                                       chunk_meta={"contributors": ["c1"]})  # fmt: skip
                    await upsert_rows(conn, partition, [row])
                    written += 1
                seq = await conn.fetchval(
                    "SELECT max(seq) FROM rag_embedding_changes WHERE model = $1 AND xid = pg_current_xact_id()",
                    MODEL,
                )
            commits.append((time.monotonic(), int(seq)))
        await asyncio.sleep(0.05)
    for _ in range(100):  # let the last batch land
        if len(cache.recent_lags) >= written:
            break
        await asyncio.sleep(0.05)
    lags = list(cache.recent_lags)
    applied = [(t, seq) for t, model, seq in cache.applied_log if model == MODEL]
    await cache.stop()
    lag = summarize(lags) if lags else None
    # Commit -> applied: the first application whose watermark covers the transaction's changes.
    commit_lags = [
        next((t - at for t, s in applied if s >= seq and t >= at), float("nan")) for at, seq in commits
    ]
    commit_lag = summarize([x for x in commit_lags if x == x]) if commits else None
    return {
        "rows_written": written,
        "changes_applied": len(lags),
        "lag_p50_s": None if lag is None else lag.median,
        "lag_p99_s": None if lag is None else lag.p99,
        "transactions": len(commits),
        "unapplied_transactions": sum(1 for x in commit_lags if x != x),
        "commit_lag_p50_s": None if commit_lag is None else commit_lag.median,
        "commit_lag_p99_s": None if commit_lag is None else commit_lag.p99,
    }


async def _recall_by_scope(
    pool: Any, partition: Any, qs: np.ndarray, scopes: dict[str, Any], legs: dict[str, Any]
) -> dict[str, dict[str, float]]:
    """Each leg's mean recall@10 against exact search, per scope (``legs``: name -> search(q, scope))."""
    from index.search.dense_leg import dense_search

    recall: dict[str, dict[str, float]] = {}
    for label, scope in scopes.items():
        found: dict[str, list[float]] = {name: [] for name in legs}
        for q in qs:
            async with pool.acquire() as conn:
                exact = await dense_search(conn, partition, q, scope, K, exact=True)
            for name, search in legs.items():
                found[name].append(_recall(await search(q, scope), exact))
        recall[label] = {name: float(np.mean(r)) for name, r in found.items()}
    return recall


async def _latency_p50s(qs: np.ndarray, legs: dict[str, Any], scopes: dict[str, Any]) -> dict[str, float]:
    """p50 ms of the cache and of HNSW for the admin, the 100% researcher and the 1% one (``scopes``
    as :func:`_one_size` names them)."""

    async def p50(fn: Any, scope: Any) -> float:
        for q in qs[:3]:
            await fn(q, scope)  # warm-up (and the scope's bitmap)
        times = []
        for q in qs:
            t = time.perf_counter()
            await fn(q, scope)
            times.append(time.perf_counter() - t)
        return percentile(times, 50) * 1e3

    from index.store.hits import Scope

    admin, non_admin, one_percent = Scope(), scopes["ACL 100%"], scopes["ACL 1%"]  # admin: a fresh scope
    cached, hnsw = legs["cache"], legs["hnsw"]
    return {
        "cache admin": await p50(cached, admin),
        "cache non-admin 100%": await p50(cached, non_admin),
        "hnsw admin": await p50(hnsw, admin),
        "hnsw non-admin 100%": await p50(hnsw, non_admin),
        "cache non-admin 1%": await p50(cached, one_percent),
        "hnsw non-admin 1%": await p50(hnsw, one_percent),
    }


async def _one_size(url: str, n: int, queries: int, seconds: float) -> dict[str, Any]:
    from gateway.access.acl import pushdown
    from gateway.access.auth import Principal
    from index.search.dense_leg import dense_search
    from index.store.hits import Scope
    from index.vectors.cache import VectorCache
    from index.vectors.partition import CacheConfig
    from schema import create_pool

    pool = await create_pool(url, max_size=40)
    try:
        centers = np.random.default_rng(0).standard_normal((200, DIM), dtype=np.float32)
        t0 = time.perf_counter()
        partition = await populate(pool, n, centers)
        populate_s = time.perf_counter() - t0
        rss = rss_bytes()
        # cpu_broad_scan_max=0: the cache serves unfiltered scopes too, so its own recall and latency are
        # measured there (the gateway's default hands those over 50k vectors to HNSW on CPU).
        cache = VectorCache(pool, url, CacheConfig(mode="cpu", max_bytes=8 * 2**30, cpu_broad_scan_max=0))
        start = time.perf_counter()
        await cache.load(partition)
        load_s = time.perf_counter() - start
        rss_growth = rss_bytes() - rss
        pc = cache.partitions[partition.partition]
        qs = vectors(queries, np.random.default_rng(1), centers)
        scopes = {"unfiltered (admin)": Scope()}
        for label, project in VISIBILITY_PROJECT.items():
            scopes[f"ACL {label}"] = Scope(acl=pushdown(Principal("r", frozenset({project}), {SECTION: 1})))

        async def hnsw(q: np.ndarray, scope: Scope) -> list[Any]:
            async with pool.acquire() as conn:
                return await dense_search(conn, partition, q, scope, K)

        async def cached(q: np.ndarray, scope: Scope) -> list[Any]:
            async with pool.acquire() as conn:
                hits = await cache.search(conn, partition, q, scope, K)
            assert hits is not None, "the cache declined a search it should serve"
            return hits

        recall = await _recall_by_scope(pool, partition, qs, scopes, {"cache": cached, "hnsw": hnsw})

        non_admin = scopes["ACL 100%"]
        latency = await _latency_p50s(qs, {"cache": cached, "hnsw": hnsw}, scopes)
        load = {}
        for name, fn in (("cache on", cached), ("cache off", hnsw)):  # 32 callers, the 100% researcher
            result = await closed_loop(
                lambda i, fn=fn: fn(qs[i % len(qs)], non_admin),
                concurrency=32,
                requests=100_000,
                max_seconds=seconds,
            )
            load[name] = {"p50_ms": result.latency.median * 1e3, "qps": result.requests_per_s}

        sync = await _sync_lag(pool, cache, partition, n, centers, seconds)
        return {
            "vectors": n,
            "populate_s": populate_s,
            "load_s": load_s,
            "load_s_per_100k": load_s * 100_000 / n,
            "index_bytes": pc.index.nbytes,
            "index_mib_per_100k": pc.index.nbytes / 2**20 * 100_000 / n,
            "rss_growth_mib_per_100k": rss_growth / 2**20 * 100_000 / n,
            "recall_at_10": recall,
            "latency_p50_ms": latency,
            "load_32": load,
            "sync": sync,
            "queries": queries,
        }
    finally:
        await pool.close()


async def run_faiss_cache_benchmark(sizes: Sequence[int], *, queries: int, seconds: float) -> dict[str, Any]:
    """Every size on its own database of one embedded PostgreSQL; a JSON-able dict."""
    import asyncpg

    from schema import EmbeddedPostgres, migrate

    root = Path(tempfile.mkdtemp(prefix="mnemo-bench-faiss-"))
    server = EmbeddedPostgres(root / "pg")
    server.start()
    results = []
    try:
        for n in sizes:
            name = f"faiss_{n}"
            conn = await asyncpg.connect(server.url)
            await conn.execute(f"DROP DATABASE IF EXISTS {name}")
            await conn.execute(f"CREATE DATABASE {name}")
            await conn.close()
            await migrate(server.url_for(name))
            results.append(await _one_size(server.url_for(name), n, queries, seconds))
    finally:
        server.stop()
    return {"sizes": results}


def as_suite(result: dict[str, Any]) -> SuiteResult:
    headlines: list[Headline] = []
    recall_rows, latency_rows, other_rows = [], [], []
    for r in result["sizes"]:
        n = f"{r['vectors']:,}"
        for label, rec in r["recall_at_10"].items():
            recall_rows.append([n, label, rec["cache"], rec["hnsw"]])
        lat = r["latency_p50_ms"]
        latency_rows.append([n, lat["cache admin"], lat["cache non-admin 100%"], lat["hnsw admin"],
                             lat["hnsw non-admin 100%"], r["load_32"]["cache on"]["p50_ms"],
                             r["load_32"]["cache off"]["p50_ms"], r["load_32"]["cache on"]["qps"],
                             r["load_32"]["cache off"]["qps"], lat["cache non-admin 1%"],
                             lat["hnsw non-admin 1%"]])  # fmt: skip
        other_rows.append([n, r["load_s_per_100k"], r["index_mib_per_100k"], r["rss_growth_mib_per_100k"],
                           r["sync"]["commit_lag_p50_s"], r["sync"]["commit_lag_p99_s"], r["sync"]["lag_p99_s"],
                           r["sync"]["rows_written"]])  # fmt: skip
        headlines.append(Headline(f"{n}: non-admin dense p50 (cache)", lat["cache non-admin 100%"], "ms",
                                  "admin, same queries (cache)", lat["cache admin"], higher_is_better=False,
                                  bar=1.2))  # fmt: skip
        # issue 24: the ACL push-down at 1% visibility against admin
        headlines.append(Headline(f"{n}: non-admin dense p50 at 1% visibility (HNSW)", lat["hnsw non-admin 1%"], "ms",
                                  "admin, same queries (HNSW)", lat["hnsw admin"], higher_is_better=False,
                                  bar=2.0))  # fmt: skip
        headlines.append(Headline(f"{n}: 32 callers queries/s, cache on", r["load_32"]["cache on"]["qps"], "q/s",
                                  "cache off (HNSW)", r["load_32"]["cache off"]["qps"], bar=1.0))  # fmt: skip
        headlines.append(Headline(f"{n}: recall@10 at 1% ACL (cache)", r["recall_at_10"]["ACL 1%"]["cache"], "",
                                  "pgvector HNSW", r["recall_at_10"]["ACL 1%"]["hnsw"]))  # fmt: skip
    tables = [
        Table("Dense recall@10 vs exact search", ["vectors", "scope", "cache", "pgvector HNSW"], recall_rows),
        Table(
            "Dense leg latency (ms)",
            [
                "vectors",
                "cache admin p50",
                "cache non-admin p50",
                "HNSW admin p50",
                "HNSW non-admin p50",
                "32 callers cache on p50",
                "32 callers cache off p50",
                "cache on q/s",
                "cache off q/s",
                "cache non-admin 1% p50",
                "HNSW non-admin 1% p50",
            ],
            latency_rows,
        ),
        Table(
            "Load, memory, sync",
            [
                "vectors",
                "load s / 100k",
                "index MiB / 100k",
                "RSS MiB / 100k",
                "commit->applied p50 s",
                "commit->applied p99 s",
                "write->applied p99 s",
                "rows written",
            ],
            other_rows,
        ),
    ]
    notes = [
        "Latency is the dense leg alone (cache search + re-read through the store, vs pgvector's HNSW SQL); "
        "the rest of semantic_search is identical with the cache on or off.",
        "The cache serves unfiltered (admin) scopes here too (cpu_broad_scan_max=0), so its own recall and "
        "latency are measured; the gateway's default on CPU hands unfiltered searches over 50k vectors to HNSW.",
        "Sync lag: commit->applied runs from each writer transaction's commit to the first cache update whose "
        "watermark covers it; write->applied from each row's write inside the transaction (so it includes the "
        "transaction's own duration, 32 upserts).",
    ]
    return SuiteResult(suite="faiss_cache", headlines=headlines, tables=tables, figures=result, notes=notes)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.faiss_cache", description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes", default="10000,100000", help="vectors per run, comma-separated (--full: add 1000000)"
    )
    p.add_argument("--queries", type=int, default=50, help="query vectors per measurement")
    p.add_argument("--seconds", type=float, default=8.0, help="seconds per load and sync measurement")
    p.add_argument("--out", type=Path, required=True, help="report folder (results.json, REPORT.md)")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    result = asyncio.run(run_faiss_cache_benchmark(sizes, queries=args.queries, seconds=args.seconds))
    report = write_report(args.out, [as_suite(result)], {"suite": "faiss_cache", "sizes": sizes})
    print(report.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
