"""The CPU vector cache mapped from a snapshot against the cache loaded from PostgreSQL, per process.

``python -m benchmarks.vector_mmap --sizes 100000 --out DIR`` builds, per size, a partition of
``n`` clustered 384-d unit vectors (:func:`benchmarks.faiss_cache.populate`, no HNSW: nothing here
searches pgvector) on a throw-away embedded PostgreSQL (or ``--database-url``), has the writer
(:class:`index.vectors.writer.VectorWriter`, what ``mnemo vectors rebuild`` runs) write its
snapshot, then, per mode (``store``: ``RAG_FAISS_CACHE=cpu``, every vector read from PostgreSQL;
``mmap``: the snapshot mapped), starts two gateway-like worker processes one after the other, the
first still holding its cache while the second loads. Each worker measures:

- **ready**: seconds from the start of its cache's load to the partition being ready;
- **RSS growth**: resident memory after one exact search over every vector (which touches every
  page of the mapping) less before the load;
- **search p50**: the cache's dense search, unfiltered (every vector scanned) and for a researcher
  who sees 10% (the bitmap path), measured after the memory;
- **USS**: private memory (``Private_Clean + Private_Dirty`` of ``/proc/PID/smaps_rollup``): what
  the process alone holds, i.e. what each further worker costs the machine.

The same run measures both modes (these machines are noisy); the report gives mmap / store ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .acl_shares import VISIBILITY_PROJECT
from .faiss_cache import DIM, MODEL, SECTION, populate, vectors
from .gateway import bench_database
from .measure import percentile
from .report import Headline, SuiteResult, Table, write_report

__all__ = ["run_vector_mmap_benchmark"]

MODES = ("store", "mmap")
LATENCY_QUERIES = 20


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


def _model(n: int) -> str:
    return f"{MODEL}-{n}"  # a partition per size: each run builds its own (no HNSW to drop and restore)


async def _worker(url: str, root: Path, mode: str, n: int) -> tuple[dict[str, Any], Any]:
    """One worker: load (or map) the partition, search every vector once; its time and memory, and
    the cache (the caller holds it: a cache let go unmaps its pages, and the next worker shares none)."""
    from index.store.hits import Scope
    from index.store.partitions import list_partitions
    from index.vectors.cache import VectorCache
    from index.vectors.mapped_cache import MappedVectorCache
    from index.vectors.partition import CacheConfig
    from schema import create_pool

    pool = await create_pool(url, max_size=4)
    try:
        (partition,) = [p for p in await list_partitions(pool) if p.model == _model(n)]
        before = _memory()
        common = {"max_bytes": 8 * 2**30, "cpu_broad_scan_max": 0}
        cache = (
            MappedVectorCache(pool, url, CacheConfig(mode="mmap", snapshot_root=root, **common))  # type: ignore[arg-type]
            if mode == "mmap"
            else VectorCache(pool, url, CacheConfig(mode="cpu", **common))  # type: ignore[arg-type]
        )
        start = time.perf_counter()
        pc = await cache.load(partition)
        ready_s = time.perf_counter() - start
        if pc.state != "ready":
            raise RuntimeError(f"{mode}: the partition is {pc.state}, not ready")
        q = vectors(
            1, np.random.default_rng(1), np.random.default_rng(0).standard_normal((200, DIM), np.float32)
        )
        async with pool.acquire() as conn:  # an unfiltered exact scan reads every vector once
            hits = await cache.search(conn, partition, q[0], Scope(), 10)
        if not hits:
            raise RuntimeError(f"{mode}: the cache served no search")
        after = _memory()  # before the latency runs: their scope bitmaps are not the load's
        latency = await _latency_ms(pool, cache, partition)
        await cache.stop()  # stops following the feed; the loaded or mapped vectors stay
        return {
            "ready_s": ready_s,
            "vectors": pc.live,
            "rss_growth": after["rss"] - before["rss"],
            "uss": after["uss"],
            "uss_growth": after["uss"] - before["uss"],
            "pss": after["pss"],
            "latency_ms": latency,
        }, cache
    finally:
        await pool.close()


async def _latency_ms(pool: Any, cache: Any, partition: Any) -> dict[str, float]:
    """p50 of the cache's dense search (scan and the SQL re-read), unfiltered and for a researcher
    who sees 10% (a bitmap over every slot), after warm-up searches."""
    from gateway.access.acl import pushdown
    from gateway.access.auth import Principal
    from index.store.hits import Scope

    centers = np.random.default_rng(0).standard_normal((200, DIM), np.float32)
    qs = vectors(LATENCY_QUERIES + 3, np.random.default_rng(2), centers)
    scopes = {
        "unfiltered": Scope(),
        "ACL 10%": Scope(acl=pushdown(Principal("r", frozenset({VISIBILITY_PROJECT["10%"]}), {SECTION: 1}))),
    }
    out = {}
    for label, scope in scopes.items():
        times = []
        for i, q in enumerate(qs):
            async with pool.acquire() as conn:
                start = time.perf_counter()
                hits = await cache.search(conn, partition, q, scope, 10)
                if i >= 3:  # the first ones build the scope's bitmap and warm the pages
                    times.append((time.perf_counter() - start) * 1000)
            if hits is None:
                raise RuntimeError(f"the cache declined a {label} search")
        out[label] = percentile(times, 50)
    return out


async def _child(url: str, root: Path, mode: str, n: int) -> None:
    """The worker process's side: report as one JSON line, then hold the cache until stdin closes."""
    report, cache = await _worker(url, root, mode, n)
    print(json.dumps(report), flush=True)
    await asyncio.to_thread(sys.stdin.read)
    del cache  # held until here


async def _two_workers(url: str, root: Path, mode: str, n: int) -> list[dict[str, Any]]:
    """The first worker keeps its cache while the second loads: what a further worker costs."""
    procs = []
    out = []
    try:
        for _ in range(2):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "benchmarks.vector_mmap", "--child", mode, "--database-url", url,
                "--dir", str(root), "--sizes", str(n), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            procs.append(proc)
            line = await proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                raise RuntimeError(f"{mode} worker exited without a report (rc {await proc.wait()})")
            out.append(json.loads(line))
    finally:
        for proc in procs:
            proc.stdin.close()  # type: ignore[union-attr]
            await proc.wait()
    return out


async def run_vector_mmap_benchmark(sizes: Sequence[int], database_url: str | None = None) -> dict[str, Any]:
    from index.vectors.writer import VectorWriter
    from schema import create_pool

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mnemo-vector-mmap-") as tmp:
        async with bench_database(database_url, Path(tmp)) as url:
            for n in sizes:
                pool = await create_pool(url, max_size=4)
                root = Path(tmp) / f"vectors-{n}"
                try:
                    centers = np.random.default_rng(0).standard_normal((200, DIM), dtype=np.float32)
                    t0 = time.perf_counter()
                    partition = await populate(pool, n, centers, hnsw=False, model=_model(n))
                    populate_s = time.perf_counter() - t0
                    writer = VectorWriter(pool, url, root)
                    t0 = time.perf_counter()
                    await writer.rebuild(partition)
                    snapshot_s = time.perf_counter() - t0
                    await writer.stop()
                finally:
                    await pool.close()
                size: dict[str, Any] = {"populate_s": populate_s, "snapshot_s": snapshot_s}
                for mode in MODES:
                    size[mode] = await _two_workers(url, root, mode, n)
                results[str(n)] = size
                print(json.dumps({n: size}), flush=True)
    return results


def as_suite(result: dict[str, Any]) -> SuiteResult:
    rows = []
    headlines = []
    for n, size in result.items():
        for mode in MODES:
            for i, w in enumerate(size[mode]):
                rows.append([
                    n, mode, f"worker {i + 1}", f"{w['ready_s']:.2f}", f"{w['rss_growth'] / 2**20:.0f}",
                    f"{w['uss'] / 2**20:.0f}", f"{w['uss_growth'] / 2**20:.0f}",
                    f"{w['latency_ms']['unfiltered']:.1f}", f"{w['latency_ms']['ACL 10%']:.1f}",
                ])  # fmt: skip
        store, mapped = size["store"][1], size["mmap"][1]
        headlines.append(
            Headline(
                f"second worker ready at {int(n):,} vectors, mmap",
                mapped["ready_s"],
                "s",
                "loaded from PostgreSQL",
                store["ready_s"],
                higher_is_better=False,
            )
        )
        headlines.append(
            Headline(
                f"second worker's private memory growth at {int(n):,} vectors, mmap",
                mapped["uss_growth"] / 2**20,
                "MiB",
                "loaded from PostgreSQL",
                store["uss_growth"] / 2**20,
                higher_is_better=False,
            )
        )
    table = Table(
        "workers",
        [
            "vectors",
            "mode",
            "worker",
            "ready s",
            "RSS growth MiB",
            "USS MiB",
            "USS growth MiB",
            "search p50 ms: unfiltered",
            "ACL 10%",
        ],
        rows,
    )
    notes = [
        "store: RAG_FAISS_CACHE=cpu (every vector read from PostgreSQL by binary COPY); mmap: the snapshot "
        "mapped copy-on-write. Worker 2 loads while worker 1 still holds its cache.",
        "Search p50: the cache's whole dense search (the scan, then the SQL re-read of the candidates), "
        f"{LATENCY_QUERIES} sequential queries after 3 warm-ups; the unfiltered one scans every vector "
        "(cpu_broad_scan_max=0 here; the gateway's default leaves those to HNSW past 50k vectors).",
        "RSS growth counts the mapped file's pages too (shared: the page cache holds them once); USS is "
        "what the worker alone holds.",
    ]
    return SuiteResult(suite="vector_mmap", headlines=headlines, tables=[table], figures=result, notes=notes)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.vector_mmap", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100000", help="vectors per run, comma-separated")
    p.add_argument(
        "--database-url", default=None, help="a PostgreSQL to use (default: a throw-away embedded one)"
    )
    p.add_argument("--out", type=Path, help="report folder (results.json, REPORT.md)")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)  # a measured worker process
    p.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        asyncio.run(_child(args.database_url, args.dir, args.child, int(args.sizes)))
        return 0
    if args.out is None:
        p.error("--out is required")
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    result = asyncio.run(run_vector_mmap_benchmark(sizes, args.database_url))
    report = write_report(args.out, [as_suite(result)], {"suite": "vector_mmap", "sizes": sizes})
    print(report.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
