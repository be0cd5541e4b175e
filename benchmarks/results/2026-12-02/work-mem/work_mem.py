"""work_mem and the retrieval legs at N chunks (populate() store, migration 0018's row layout):
three read pools like the gateway's whose sessions open with work_mem 1MB, 4MB (PostgreSQL's
default) and 64MB, each leg run on the three in interleaved windows (every probe or query on every
pool back to back, the order alternating; 3 windows). Also the exact 10% plan's heap blocks (exact
or lossy) under each.

Usage (from the repository root): python work_mem.py N"""

import asyncio
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, ".")
from benchmarks.acl_shares import VISIBILITY_PROJECT
from benchmarks.gateway import mixed_vectors
from benchmarks.lexical import SECTION, build_corpus, dataset_queries, populate
from benchmarks.measure import interleaved_windows, percentile, window_ratios
from benchmarks.stack import BENCH_MODEL, open_stack
from gateway.acl import pushdown
from gateway.auth import Principal
from gateway.settings import GatewaySettings
from index.bm25 import CorpusStats
from index.dense_leg import _dense_query, dense_search
from index.hits import Scope
from index.lexical_leg import lexical_search
from index.read_settings import read_session_settings
from schema import create_pool

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
VALUES = ("1MB", "4MB", "64MB")


async def main(url):
    d = GatewaySettings()
    base = read_session_settings(d.hnsw_ef_search, d.hnsw_max_scan_tuples)
    pools = {
        v: await create_pool(url, max_size=4, reset_session=False, session={**base, "work_mem": v})
        for v in VALUES
    }
    rng = np.random.default_rng(0)
    bases = rng.normal(size=(1000, 384)).astype(np.float32)
    bases /= np.linalg.norm(bases, axis=1, keepdims=True)
    texts = build_corpus(N)
    part = await populate(
        pools["4MB"],
        texts,
        model=BENCH_MODEL,
        dimension=384,
        vectors=lambda a, b: mixed_vectors(bases, b - a, seed=a),
    )
    probes = list(mixed_vectors(bases, 30, seed=999))
    qs = dataset_queries()
    random.Random(7).shuffle(qs)
    qs = qs[:60]
    scopes = {"admin": Scope()} | {
        s: Scope(acl=pushdown(Principal("r", frozenset({p}), {SECTION: 1})))
        for s, p in VISIBILITY_PROJECT.items()
    }
    stats = {v: CorpusStats(ttl=3600.0) for v in VALUES}
    for v, pool in pools.items():
        async with pool.acquire() as conn:
            q, params = _dense_query(part, probes[0], scopes["10%"], 40, "text", False)
            async with conn.transaction():
                await conn.execute("SET LOCAL enable_indexscan = off")
                plan = [r[0] for r in await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + q, *params)]
            print(
                f"<!-- work_mem {v}, exact 10%: "
                + "; ".join(
                    line.strip() for line in plan if "Heap Blocks" in line or "Execution Time" in line
                )
                + " -->"
            )

    def leg(kind, v):
        pool = pools[v]

        async def run(x):
            if kind.startswith("exact"):
                async with pool.acquire() as c:
                    await dense_search(c, part, x, scopes[kind.split()[1]], 40, exact=True)
            elif kind == "HNSW admin":
                async with pool.acquire() as c:
                    await dense_search(c, part, x, Scope(), 40)
            else:
                await lexical_search(pool, part, x, scopes[kind.split()[-1]], 40, stats=stats[v])

        return run

    print(f"{N:,} chunks; p50 ms pooled over 3 interleaved windows (ratio to 4MB: pooled; windows)")
    print("| leg | " + " | ".join(f"work_mem {v}" for v in VALUES) + " |")
    print("| --- |" + " --- |" * len(VALUES))
    for kind, items in (
        ("exact 10%", probes),
        ("exact 1%", probes),
        ("HNSW admin", probes),
        ("lexical SQL admin", qs),
        ("lexical SQL 10%", qs),
    ):
        times = await interleaved_windows({v: leg(kind, v) for v in VALUES}, items, 3, warmup=3)
        b = percentile([t for w in times["4MB"] for t in w], 50)
        cells = []
        for v in VALUES:
            p = percentile([t for w in times[v] for t in w], 50)
            r = window_ratios(times[v], times["4MB"])
            cells.append(f"{p * 1e3:.2f} ({p / b:.2f}; {min(r):.2f}-{max(r):.2f})")
        print(f"| {kind} | " + " | ".join(cells) + " |", flush=True)
    for pool in pools.values():
        await pool.close()


with open_stack(Path("/tmp/mnemo-bench-wm"), database=True, sidecar=False) as stack:

    async def go():
        await main(await stack.fresh_database("wm"))

    asyncio.run(go())
