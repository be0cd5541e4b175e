"""Issue 24's goal cell at 1M chunks: the 1% researcher's dense leg against the admin's, same queries,
as the gateway runs them with RAG_FAISS_CACHE=cpu (the admin's unfiltered search goes to pgvector's
HNSW past RAG_FAISS_CPU_BROAD_SCAN_MAX; the researcher's scope to the cache's packed copy). Five
repetitions of the 30 queries, admin and researcher alternating per query; each repetition's p50
ratio, and their median. Same store and arguments as dense_per_visibility.py."""

import asyncio
import sys
import time

import numpy as np

sys.path.insert(0, ".")
from benchmarks.acl_shares import VISIBILITY_PROJECT
from benchmarks.gateway import gateway_read_pool
from benchmarks.lexical import SECTION
from benchmarks.measure import percentile
from benchmarks.stack import BENCH_MODEL
from gateway.acl import pushdown
from gateway.auth import Principal
from gateway.retrieval import Retriever
from gateway.settings import load_gateway_settings
from index.cache_partition import CacheConfig
from index.hits import Scope
from index.partitions import get_partition
from index.vector_cache import VectorCache


async def main(url: str, probes: np.ndarray) -> None:
    pool = await gateway_read_pool(url)
    partition = await get_partition(pool, BENCH_MODEL)
    cache = VectorCache(pool, url, CacheConfig(mode="cpu", threads=1))
    await cache.load(partition)
    retriever = Retriever(
        pool, client=None, settings=load_gateway_settings({}, auth="off"), vector_cache=cache
    )
    scopes = {
        "admin": Scope(),
        "1%": Scope(acl=pushdown(Principal("r", frozenset({VISIBILITY_PROJECT["1%"]}), {SECTION: 1}))),
    }
    for scope in scopes.values():  # the researcher's scope bitmap and packed copy, taken once
        await retriever._dense(partition, probes[0], scope, 40)
    print("| repetition | admin p50 ms | 1% p50 ms | ratio | 1% served by the cache |")
    print("| --- | --- | --- | --- | --- |")
    ratios = []
    for rep in range(5):
        times = {name: [] for name in scopes}
        served = 0
        for i, q in enumerate(probes):
            for name in list(scopes) if (i + rep) % 2 == 0 else list(scopes)[::-1]:
                t = time.perf_counter()
                _, by_cache = await retriever._dense(partition, q, scopes[name], 40)
                times[name].append(time.perf_counter() - t)
                served += by_cache and name == "1%"
        admin, researcher = (percentile(times[n], 50) * 1e3 for n in scopes)
        ratios.append(researcher / admin)
        print(
            f"| {rep + 1} | {admin:.2f} | {researcher:.2f} | {ratios[-1]:.2f} | {served}/{len(probes)} |",
            flush=True,
        )
    print(
        f"\nmedian ratio {np.median(ratios):.2f} (repetitions {min(ratios):.2f}-{max(ratios):.2f}); goal <= 2"
    )
    await cache.stop()
    await pool.close()


asyncio.run(main(sys.argv[1], np.load(sys.argv[2])))
