"""Why the 1% researcher's dense leg is slow at 1M: a store like search_scale's (only the vectors
matter; 2,000 real bases mixed, so more near-ties than the run's 10,000), then EXPLAIN ANALYZE of the
dense leg per visibility and 20 real queries timed with the gateway's settings, two scan-tuple bounds
and the exact path. From the repository root: python dense_acl.py CHUNKS (output: dense-acl-1m.txt)."""

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, ".")
import index.dense_leg as dense_leg
from benchmarks.acl_shares import VISIBILITY_PROJECT
from benchmarks.gateway import gateway_read_pool, load_queries, mixed_vectors
from benchmarks.lexical import SECTION, populate
from benchmarks.measure import percentile, tie_aware_recall
from benchmarks.stack import BENCH_MODEL, open_stack

N = int(sys.argv[1])


async def main(stack):
    from benchmarks.datasets import find_datasets
    from benchmarks.scale_store import embed_bases
    from inference.client import SidecarClient

    dirs, _ = find_datasets(("*",))
    async with SidecarClient(stack.sidecar_url, timeout=300) as client:
        bases = (await embed_bases(client, BENCH_MODEL, 2000, dirs[0].parent)).vectors
        queries = load_queries(40, dirs[0].parent)
        probes = np.asarray(
            (await client.embed(BENCH_MODEL, queries, truncate=True)).embeddings, dtype=np.float32
        )
    url = await stack.fresh_database("acl1m")
    pool = await gateway_read_pool(url)
    t = time.perf_counter()
    texts = [f"chunk {i}" for i in range(N)]
    part = await populate(
        pool,
        texts,
        model=BENCH_MODEL,
        dimension=bases.shape[1],
        vectors=lambda a, b: mixed_vectors(bases, b - a, seed=a),
    )
    print(f"built {N} in {time.perf_counter() - t:.0f} s", flush=True)
    from gateway.acl import pushdown
    from gateway.auth import Principal
    from index.dense_leg import dense_search
    from index.hits import Scope

    scopes = {"admin": Scope()} | {
        s: Scope(acl=pushdown(Principal("r", frozenset({p}), {SECTION: 1})))
        for s, p in VISIBILITY_PROJECT.items()
    }
    real = dense_leg.fetch_with_local_settings
    explain = {"on": False}

    async def spy(conn, settings, query, params):
        if explain["on"]:
            plan = await real(conn, settings, "EXPLAIN (ANALYZE, BUFFERS) " + query, params)
            print("\n".join(r[0] for r in plan), flush=True)
        return await real(conn, settings, query, params)

    dense_leg.fetch_with_local_settings = spy
    async with pool.acquire() as conn:
        for label, scope in scopes.items():
            print(f"=== {label}", flush=True)
            explain["on"] = True
            await dense_search(conn, part, probes[0], scope, 40)
            explain["on"] = False
            exact = [
                [(h.key, 1 - h.score) for h in await dense_search(conn, part, q, scope, 10, exact=True)]
                for q in probes[:20]
            ]
            for name, kw in (
                ("default", {}),
                ("max_scan 2000", {"max_scan_tuples": 2000}),
                ("max_scan 100000", {"max_scan_tuples": 100000}),
                ("exact", {"exact": True}),
            ):
                times, rec = [], []
                for q, truth in zip(probes[:20], exact, strict=True):
                    t0 = time.perf_counter()
                    hits = await dense_search(conn, part, q, scope, 40, **kw)
                    times.append(time.perf_counter() - t0)
                    rec.append(tie_aware_recall([(h.key, 1 - h.score) for h in hits[:10]], truth))
                print(
                    f"{label} {name}: p50 {percentile(times, 50) * 1e3:.1f} ms recall {np.mean(rec):.3f}",
                    flush=True,
                )
    await pool.close()


with (
    tempfile.TemporaryDirectory(prefix="acl1m-") as work,
    open_stack(Path(work), database=True, sidecar=True) as stack,
):
    asyncio.run(main(stack))
