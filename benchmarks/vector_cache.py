"""The FAISS cache under load, following writes, and shared by worker processes: the retrieval
section's cache cells beside :func:`benchmarks.search_scale.measure_dense_cache` (32 callers with
the cache on and off, its sync lag under a writer that leaves the store as it was, and worker
processes loading it from PostgreSQL against mapping its snapshot). benchmarks/README.md says what
each figure is.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .measure import closed_loop, percentile, summarize

__all__ = ["MAPPED_MODES", "callers_32", "mapped_workers", "sync_lag", "worker_main"]

MAPPED_MODES = ("store", "mmap")
LATENCY_QUERIES = 20
LAND_WAIT_S = 120.0  # at most, for the sync cell's last transaction to reach the cache


async def callers_32(
    legs: Mapping[str, Callable[[np.ndarray], Awaitable[Any]]], probes: np.ndarray, seconds: float
) -> dict[str, dict[str, float]]:
    """Each leg (cache on, cache off) in a closed loop of 32 callers for ``seconds``: p50 ms, queries/s."""
    out = {}
    for name, leg in legs.items():
        load = await closed_loop(
            lambda i, leg=leg: leg(probes[i % len(probes)]),
            concurrency=32,
            requests=10**6,
            max_seconds=seconds,
        )
        out[name] = {"p50_ms": load.latency.median * 1e3, "qps": load.requests_per_s}
    return out


async def sync_lag(
    pool: Any, cache: Any, partition: Any, texts: Sequence[str], seconds: float
) -> dict[str, Any]:
    """A drain-like writer rewrites records of the store :func:`benchmarks.lexical.populate` built
    from ``texts`` in transactions of 32 for ``seconds`` while ``cache`` (loaded) follows the change
    feed; each change's write -> applied lag and each transaction's commit -> applied lag (the
    first application whose watermark covers its changes)."""
    from index.store.store import upsert_rows

    from .lexical import SECTION, corpus_row

    await cache.start()  # the listener and the follow loop
    for _ in range(100):
        if cache.listener is not None and cache.listener.connected:
            break
        await asyncio.sleep(0.05)
    cache.recent_lags.clear()
    rng = random.Random(5)
    deadline = time.perf_counter() + seconds
    written = 0
    commits: list[tuple[float, int]] = []  # (monotonic commit time, the transaction's highest seq)
    while time.perf_counter() < deadline:
        async with pool.acquire() as conn, conn.transaction():
            for i in rng.sample(range(len(texts)), min(32, len(texts))):
                vector = await conn.fetchval(
                    f"SELECT embedding::real[] FROM {partition.table} WHERE section_tipo = $1 AND section_id = $2",
                    SECTION, i + 1,
                )  # fmt: skip
                await upsert_rows(
                    conn, partition, [corpus_row(i, texts[i], np.asarray(vector), f"w{written}")]
                )
                written += 1
            seq = await conn.fetchval(
                "SELECT max(seq) FROM rag_embedding_changes WHERE model = $1 AND xid = pg_current_xact_id()",
                partition.model,
            )
            # Stamped as the COMMIT is sent: the cache may apply the transaction before this
            # coroutine resumes after it (its listener runs on the same loop), and a stamp taken
            # then would come after the application that covers it.
            at = time.monotonic()
        commits.append((at, int(seq)))
        await asyncio.sleep(0.05)
    # Let every transaction land: the figure is the lag, not whether it fits a wait chosen here (on a
    # loaded machine the cache's follow loop can take seconds); past LAND_WAIT_S one is unapplied.
    last = commits[-1][1] if commits else 0
    waited = time.perf_counter()
    while time.perf_counter() - waited < LAND_WAIT_S:
        if max((seq for _, model, seq in cache.applied_log if model == partition.model), default=0) >= last:
            break
        await asyncio.sleep(0.05)
    lags = list(cache.recent_lags)
    applied = [(t, seq) for t, model, seq in cache.applied_log if model == partition.model]
    commit_lags = [next((t - at for t, s in applied if s >= seq and t >= at), None) for at, seq in commits]
    lag = summarize(lags) if lags else None
    landed = [x for x in commit_lags if x is not None]
    commit_lag = summarize(landed) if landed else None
    return {
        "rows_written": written,
        "changes_applied": len(lags),
        "lag_p50_s": lag and lag.median,
        "lag_p99_s": lag and lag.p99,
        "transactions": len(commits),
        "unapplied_transactions": len(commit_lags) - len(landed),
        "commit_lag_p50_s": commit_lag and commit_lag.median,
        "commit_lag_p99_s": commit_lag and commit_lag.p99,
    }


async def mapped_workers(url: str, partition: Any, root: Path) -> dict[str, Any]:
    """The partition's snapshot written under ``root``, then two workers per mode (the first
    holding its cache while the second loads: what a further worker costs)."""
    from index.vectors.writer import VectorWriter
    from schema import create_pool

    pool = await create_pool(url, max_size=4)
    try:
        writer = VectorWriter(pool, url, root)
        started = time.perf_counter()
        await writer.rebuild(partition)
        snapshot_s = time.perf_counter() - started
        await writer.stop()
    finally:
        await pool.close()
    out: dict[str, Any] = {"snapshot_s": snapshot_s}
    for mode in MAPPED_MODES:
        procs, out[mode] = [], []
        try:
            for _ in range(2):
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "benchmarks.cli", "vector-worker", mode, url, str(root), partition.model,
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                )  # fmt: skip
                procs.append(proc)
                line = await proc.stdout.readline()  # type: ignore[union-attr]
                if not line:
                    raise RuntimeError(f"a {mode} worker exited without a report (rc {await proc.wait()})")
                out[mode].append(json.loads(line))
        finally:
            for proc in procs:
                proc.stdin.close()  # type: ignore[union-attr]
                await proc.wait()
    return out


def _memory() -> dict[str, int]:
    """This process's RSS, PSS and USS in bytes (smaps_rollup: one read, the kernel's own sums)."""
    fields: dict[str, int] = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        name, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            fields[name] = int(rest.split()[0]) * 1024
    return {
        "rss": fields["Rss"],
        "pss": fields["Pss"],
        "uss": fields["Private_Clean"] + fields["Private_Dirty"],
    }


async def _worker(mode: str, url: str, root: Path, model: str) -> tuple[dict[str, Any], Any]:
    """Load (or map) the partition, search every vector once; the time, the memory and the cache
    (held by the caller: a cache let go unmaps its pages, and the next worker would share none)."""
    from index.store.hits import Scope
    from index.store.partitions import list_partitions
    from index.vectors.cache import VectorCache
    from index.vectors.mapped_cache import MappedVectorCache
    from index.vectors.partition import CacheConfig
    from schema import create_pool

    from .lexical import visibility_scopes

    pool = await create_pool(url, max_size=4)
    try:
        (partition,) = [p for p in await list_partitions(pool) if p.model == model]
        before = _memory()
        # Broad scans on the cache too: an unfiltered search scans every vector, every page.
        config = CacheConfig(mode="mmap" if mode == "mmap" else "cpu", snapshot_root=root, max_bytes=8 * 2**30,
                             cpu_broad_scan_max=0)  # fmt: skip
        cache = (MappedVectorCache if mode == "mmap" else VectorCache)(pool, url, config)
        started = time.perf_counter()
        loaded = await cache.load(partition)
        ready_s = time.perf_counter() - started
        if loaded.state != "ready":
            raise RuntimeError(f"{mode}: the partition is {loaded.state}, not ready")
        probes = np.random.default_rng(1).standard_normal(
            (LATENCY_QUERIES + 4, partition.dimension), np.float32
        )
        async with pool.acquire() as conn:
            await cache.search(conn, partition, probes[0], Scope(), 10)
        after = _memory()  # before the latency runs: their scope bitmaps are not the load's
        scopes = {"unfiltered": Scope(), "ACL 10%": visibility_scopes()["10%"]}
        latency = {}
        for label, scope in scopes.items():
            times = []
            for i, q in enumerate(probes[1:]):
                async with pool.acquire() as conn:
                    started = time.perf_counter()
                    if await cache.search(conn, partition, q, scope, 10) is None:
                        raise RuntimeError(f"{mode}: the cache declined a {label} search")
                    if i >= 3:  # the first ones build the scope's bitmap and warm the pages
                        times.append((time.perf_counter() - started) * 1000)
            latency[label] = percentile(times, 50)
        await cache.stop()  # stops following the feed; the loaded or mapped vectors stay
        report = {"ready_s": ready_s, "vectors": loaded.live, "rss_growth": after["rss"] - before["rss"],
                  "uss": after["uss"], "uss_growth": after["uss"] - before["uss"], "pss": after["pss"],
                  "latency_ms": latency}  # fmt: skip
        return report, cache
    finally:
        await pool.close()


def worker_main(argv: Sequence[str]) -> int:
    """``python -m benchmarks.cli vector-worker MODE URL ROOT MODEL``: one measured worker; its
    report as one JSON line, then it holds its cache until its stdin closes."""

    async def run() -> None:
        mode, url, root, model = argv
        report, cache = await _worker(mode, url, Path(root), model)
        print(json.dumps(report), flush=True)
        await asyncio.to_thread(sys.stdin.read)
        del cache  # held until here

    asyncio.run(run())
    return 0
