"""The partition's row layout at N chunks, each built fresh by populate() (the backfill path), all
three stores side by side: the vector TOASTed (pgvector's EXTERNAL storage, before 0018), MAIN
storage only, and MAIN with toast_tuple_target 8160 (0018's layout). Per leg, the three layouts run
in interleaved windows (benchmarks.measure.interleaved_windows: every probe or query on every
layout back to back, the order alternating), 3 windows; p50 pooled and each layout's ratio to the
external layout per window.

Usage (from the repository root at the commit that adds 0018): python layouts_interleaved.py N"""

import asyncio
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, ".")
from benchmarks.acl_shares import VISIBILITY_PROJECT
from benchmarks.gateway import gateway_read_pool, mixed_vectors
from benchmarks.lexical import SECTION, build_corpus, dataset_queries, populate
from benchmarks.measure import interleaved_windows, percentile, window_ratios
from benchmarks.stack import BENCH_MODEL, open_stack
from gateway.acl import pushdown
from gateway.auth import Principal
from index.bm25 import CorpusStats
from index.cache_partition import CacheConfig
from index.dense_leg import dense_search
from index.hits import Scope
from index.lexical_index import LexicalConfig, LexicalIndex
from index.lexical_leg import lexical_search
from index.partitions import ensure_partition
from index.vector_cache import VectorCache

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
LAYOUTS = {
    "external": [
        "ALTER TABLE {t} ALTER COLUMN embedding SET STORAGE EXTERNAL",
        "ALTER TABLE {t} RESET (toast_tuple_target)",
    ],
    "MAIN": ["ALTER TABLE {t} RESET (toast_tuple_target)"],
    "MAIN+8160": [],
}


async def build(url, ddl, texts, bases):
    pool = await gateway_read_pool(url)
    part = await ensure_partition(pool, BENCH_MODEL, 384)
    async with pool.acquire() as conn:
        for d in ddl:
            await conn.execute(d.format(t=part.table))
    part = await populate(
        pool,
        texts,
        model=BENCH_MODEL,
        dimension=384,
        vectors=lambda a, b: mixed_vectors(bases, b - a, seed=a),
    )
    index = LexicalIndex(pool, url, LexicalConfig())
    await index.load(part)
    cache = VectorCache(pool, url, CacheConfig(mode="cpu"))
    t = time.perf_counter()
    await cache.load(part)
    load_s = time.perf_counter() - t
    await cache.stop()
    async with pool.acquire() as conn:
        sizes = await conn.fetchrow(f"""select pg_relation_size('{part.table}')/2^20 heap,
             pg_relation_size(reltoastrelid)/2^20 toast from pg_class where oid='{part.table}'::regclass""")
    return pool, part, index, load_s, sizes


async def main(stack):
    rng = np.random.default_rng(0)
    bases = rng.normal(size=(1000, 384)).astype(np.float32)
    bases /= np.linalg.norm(bases, axis=1, keepdims=True)
    texts = build_corpus(N)
    probes = list(mixed_vectors(bases, 30, seed=999))
    qs = dataset_queries()
    random.Random(7).shuffle(qs)
    qs = qs[:60]
    stores = {}
    for i, (label, ddl) in enumerate(LAYOUTS.items()):
        stores[label] = await build(await stack.fresh_database(f"il{i}"), ddl, texts, bases)
    ten = Scope(acl=pushdown(Principal("r", frozenset({VISIBILITY_PROJECT["10%"]}), {SECTION: 1})))
    one = Scope(acl=pushdown(Principal("r", frozenset({VISIBILITY_PROJECT["1%"]}), {SECTION: 1})))
    stats = {label: CorpusStats(ttl=3600.0) for label in stores}

    def leg(kind, label):
        pool, part, index, _, _ = stores[label]

        async def run(x):
            if kind == "exact 10%" or kind == "exact 1%":
                async with pool.acquire() as c:
                    await dense_search(c, part, x, ten if kind == "exact 10%" else one, 40, exact=True)
            elif kind == "HNSW admin":
                async with pool.acquire() as c:
                    await dense_search(c, part, x, Scope(), 40)
            elif kind == "lexical SQL":
                await lexical_search(pool, part, x, Scope(), 40, stats=stats[label])
            else:
                async with pool.acquire() as c:
                    await index.search(c, part, x, Scope(), 40)

        return run

    print(
        f"{N:,} chunks (384 dims); p50 ms pooled over 3 interleaved windows (ratio to external: pooled, windows)"
    )
    print("| leg | " + " | ".join(LAYOUTS) + " |")
    print("| --- |" + " --- |" * len(LAYOUTS))
    for kind, items in (
        ("exact 10%", probes),
        ("exact 1%", probes),
        ("HNSW admin", probes),
        ("lexical SQL", qs),
        ("lexical index leg", qs),
    ):
        times = await interleaved_windows({label: leg(kind, label) for label in stores}, items, 3, warmup=3)
        base = percentile([t for w in times["external"] for t in w], 50)
        cells = []
        for label in stores:
            p = percentile([t for w in times[label] for t in w], 50)
            r = window_ratios(times[label], times["external"])
            cells.append(f"{p * 1e3:.2f} ({p / base:.2f}; {min(r):.2f}-{max(r):.2f})")
        print(f"| {kind} | " + " | ".join(cells) + " |", flush=True)
    print("| FAISS cache load s | " + " | ".join(f"{s[3]:.2f}" for s in stores.values()) + " |")
    print(
        "| heap MiB / TOAST MiB | "
        + " | ".join(f"{s[4]['heap']:.0f} / {s[4]['toast']:.0f}" for s in stores.values())
        + " |"
    )
    for pool, _, index, _, _ in stores.values():
        await index.stop()
        await pool.close()


with open_stack(Path("/tmp/mnemo-bench-toast2"), database=True, sidecar=False) as stack:
    asyncio.run(main(stack))
