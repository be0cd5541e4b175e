"""The dense leg at 1M chunks per visibility, as the gateway runs it (Retriever._dense): the FAISS cache
on CPU with small scopes packed (the default), the cache with every scope through its bitmap
(RAG_FAISS_PACKED_SCOPE_ROWS=0), and no cache (pgvector: HNSW, or the exact path for a small scope);
interleaved per query, 3 repetitions; recall@10 against exact search.

Needs a store built like exact_scopes.py's (1M chunks whose vectors mix two of 10,000 real MiniLM
embeddings; queries: 30 real queries of the data sets) in the database at URL, and those queries'
vectors in PROBES.npy. Usage: python dense_per_visibility.py URL PROBES.npy"""

import asyncio
import sys
import time

import numpy as np

sys.path.insert(0, ".")
from benchmarks.acl_shares import VISIBILITY_PROJECT
from benchmarks.gateway import gateway_read_pool
from benchmarks.lexical import SECTION
from benchmarks.measure import percentile, tie_aware_recall
from benchmarks.stack import BENCH_MODEL
from gateway.acl import pushdown
from gateway.auth import Principal
from gateway.retrieval import Retriever
from gateway.settings import load_gateway_settings
from index.cache_partition import CacheConfig
from index.dense_leg import dense_search
from index.hits import Scope
from index.packed_scopes import PackedScopes
from index.partitions import get_partition
from index.vector_cache import VectorCache

FETCH = 40  # the gateway's over-fetch per leg


async def main(url: str, probes: np.ndarray) -> None:
    pool = await gateway_read_pool(url)
    partition = await get_partition(pool, BENCH_MODEL)
    settings = load_gateway_settings({}, auth="off")
    cache = VectorCache(pool, url, CacheConfig(mode="cpu", threads=1))
    t = time.perf_counter()
    await cache.load(partition)
    print(
        f"cache loaded {cache.partitions[partition.partition].live:,} vectors in {time.perf_counter() - t:.0f} s"
    )
    packed = cache.packed
    cached, plain = (
        Retriever(pool, client=None, settings=settings, vector_cache=cache),
        Retriever(pool, client=None, settings=settings),
    )

    async def packed_leg(q, scope):
        cache.packed = packed
        return await cached._dense(partition, q, scope, FETCH)

    async def bitmap_leg(q, scope):
        cache.packed = PackedScopes(0, 0)
        return await cached._dense(partition, q, scope, FETCH)

    async def pgvector_leg(q, scope):
        return await plain._dense(partition, q, scope, FETCH)

    legs = {"cache, packed": packed_leg, "cache, bitmap": bitmap_leg, "pgvector": pgvector_leg}
    scopes = {"admin": Scope()} | {
        s: Scope(acl=pushdown(Principal("r", frozenset({p}), {SECTION: 1})))
        for s, p in VISIBILITY_PROJECT.items()
    }
    print("| visibility | leg | served by cache | p50 ms | p99 ms | recall@10 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, scope in scopes.items():
        async with pool.acquire() as conn:
            exact = [[(h.key, 1 - h.score) for h in await dense_search(conn, partition, q, scope, 10, exact=True)]
                     for q in probes]  # fmt: skip
        t = time.perf_counter()
        await packed_leg(probes[0], scope)  # takes the scope's packed copy (small scopes only)
        first = time.perf_counter() - t
        times = {name: [] for name in legs}
        recall = {name: [] for name in legs}
        by_cache = {name: 0 for name in legs}
        for rep in range(3):
            for i, (q, truth) in enumerate(zip(probes, exact, strict=True)):
                order = list(legs) if (i + rep) % 2 == 0 else list(legs)[::-1]
                for name in order:
                    t0 = time.perf_counter()
                    hits, served = await legs[name](q, scope)
                    times[name].append(time.perf_counter() - t0)
                    by_cache[name] += served
                    if rep == 0:
                        recall[name].append(
                            tie_aware_recall([(h.key, 1 - h.score) for h in hits[:10]], truth)
                        )
        for name in legs:
            share = by_cache[name] / len(times[name])
            print(f"| {label} | {name} | {share:.0%} | {percentile(times[name], 50) * 1e3:.2f} "
                  f"| {percentile(times[name], 99) * 1e3:.2f} | {np.mean(recall[name]):.3f} |", flush=True)  # fmt: skip
        print(f"<!-- {label}: first packed search (taking the copy) {first * 1e3:.1f} ms; "
              f"packed copies {len(packed)}, {packed.nbytes / 2**20:.1f} MiB -->", flush=True)  # fmt: skip
    await cache.stop()
    await pool.close()


asyncio.run(main(sys.argv[1], np.load(sys.argv[2])))
