"""The dense leg through RetrievalLegs.hnsw_search at 1M chunks, per visibility: RAG_DENSE_EXACT_MAX_ROWS
at its default against 0 (always HNSW), interleaved per query; recall@10 against exact search.
From the repository root: python exact_scopes.py CHUNKS (output: exact-scopes-1m.md)"""

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, ".")
from benchmarks.acl_shares import VISIBILITY_PROJECT
from benchmarks.gateway import gateway_read_pool, load_queries, mixed_vectors
from benchmarks.lexical import SECTION, populate
from benchmarks.measure import percentile, tie_aware_recall
from benchmarks.stack import BENCH_MODEL, open_stack

N = int(sys.argv[1])


async def main(stack):
    from benchmarks.datasets import find_datasets
    from benchmarks.scale_store import embed_bases
    from gateway.acl import pushdown
    from gateway.auth import Principal
    from gateway.retrieval import Retriever
    from gateway.settings import load_gateway_settings
    from index.dense_leg import dense_search
    from index.hits import Scope
    from inference.client import SidecarClient

    dirs, _ = find_datasets(("*",))
    async with SidecarClient(stack.sidecar_url, timeout=300) as client:
        bases = (await embed_bases(client, BENCH_MODEL, 10_000, dirs[0].parent)).vectors
        queries = load_queries(30, dirs[0].parent)
        probes = np.asarray(
            (await client.embed(BENCH_MODEL, queries, truncate=True)).embeddings, dtype=np.float32
        )
    url = await stack.fresh_database("exact1m")
    pool = await gateway_read_pool(url)
    t = time.perf_counter()
    part = await populate(pool, [f"chunk {i}" for i in range(N)], model=BENCH_MODEL, dimension=bases.shape[1],
                          vectors=lambda a, b: mixed_vectors(bases, b - a, seed=a))  # fmt: skip
    print(f"built {N} in {time.perf_counter() - t:.0f} s", flush=True)
    scopes = {"admin": Scope()} | {
        s: Scope(acl=pushdown(Principal("r", frozenset({p}), {SECTION: 1})))
        for s, p in VISIBILITY_PROJECT.items()
    }
    legs = {
        "default": Retriever(pool, client=None, settings=load_gateway_settings({}, auth="off")),
        "always HNSW": Retriever(pool, client=None, settings=load_gateway_settings({"RAG_DENSE_EXACT_MAX_ROWS": "0"}, auth="off")),
    }  # fmt: skip
    print("| visibility | leg | p50 ms | recall@10 |\n| --- | --- | --- | --- |", flush=True)
    async with pool.acquire() as conn:
        for label, scope in scopes.items():
            exact = [[(h.key, 1 - h.score) for h in await dense_search(conn, part, q, scope, 10, exact=True)]
                     for q in probes]  # fmt: skip
            times = {name: [] for name in legs}
            recall = {name: [] for name in legs}
            for rep in range(2):
                for i, (q, truth) in enumerate(zip(probes, exact, strict=True)):
                    for name in list(legs) if (i + rep) % 2 == 0 else list(legs)[::-1]:
                        t0 = time.perf_counter()
                        hits = await legs[name].legs.hnsw_search(conn, part, q, scope, 40)
                        times[name].append(time.perf_counter() - t0)
                        if rep == 0:
                            recall[name].append(
                                tie_aware_recall([(h.key, 1 - h.score) for h in hits[:10]], truth)
                            )
            for name in legs:
                print(f"| {label} | {name} | {percentile(times[name], 50) * 1e3:.1f} | {np.mean(recall[name]):.3f} |",
                      flush=True)  # fmt: skip
    await pool.close()


with (
    tempfile.TemporaryDirectory(prefix="exact1m-") as work,
    open_stack(Path(work), database=True, sidecar=True) as stack,
):
    asyncio.run(main(stack))
