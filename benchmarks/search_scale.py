"""Retrieval at scale, the scale suite's retrieval section (issues 24 and 44): one store per size,
every retrieval leg and ``semantic_search`` through real gateways on it, and each latency's growth
from the smallest size to the largest. What it measures, cell by cell, is benchmarks/README.md's
"scale, retrieval at scale"; its report is :mod:`benchmarks.search_scale_figures`. A gateway whose
lexical engine does not serve every partition, or a search answered with anything but 200, stops
the run.
"""

from __future__ import annotations

import dataclasses
import secrets
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .acl_shares import VISIBILITY_PROJECT
from .gateway import (
    api_request,
    cache_ready,
    gateway_process,
    gateway_read_pool,
    load_queries,
    mixed_vectors,
    partition_states,
    readyz_until,
    writer_rebuild,
)
from .gateway_workers import workers_ab
from .lexical import SECTION, build_corpus, measure_lexical, populate, visibility_scopes
from .measure import (
    closed_loop,
    interleaved_windows,
    percentile,
    process_cpu_s,
    rss_bytes,
    tie_aware_recall,
    tree_memory,
    window_ratios,
)
from .plan import ScalePlan
from .report import SuiteResult
from .search_cost import measure_search_cost
from .search_scale_figures import scale_report
from .stack import BENCH_MODEL, BenchStack
from .vector_cache import callers_32, mapped_workers, sync_lag

__all__ = ["REQUESTS", "as_suite", "run_search_scale"]

LIMIT = 10  # semantic_search's limit: the gateway over-fetches max(4 * limit, 20) per leg
# The gateway configurations semantic_search runs under: name -> environment beyond the defaults
# (and RAG_LEXICAL_DIR: the store's Tantivy index, built before the gateways start).
GATEWAY_CONFIGS: dict[str, dict[str, str]] = {
    "tantivy": {"RAG_LEXICAL_INDEX": "tantivy"},
    "tantivy, 2 workers": {"RAG_LEXICAL_INDEX": "tantivy", "RAG_GATEWAY_WORKERS": "2"},
    "tantivy, FAISS cpu": {"RAG_LEXICAL_INDEX": "tantivy", "RAG_FAISS_CACHE": "cpu"},
    "off": {"RAG_LEXICAL_INDEX": "off"},
}


# Fixed for every run (the plan's retrieval_* fields are the rest, benchmarks/plan.py: ScalePlan).
REQUESTS = 400  # per closed loop of semantic_search, bounded by retrieval_seconds too
RECALL_QUERIES = 40  # probes per visibility; each needs an exact scan of the store
RECALL_EF_SEARCH = (40, 100, 200, 400)
WINDOWS = 3  # interleaved windows of the lexical legs and of the dense goal cell


async def _wait_lexical_ready(session: Any, url: str, search: Any, wait_s: float) -> dict[str, Any]:
    """Until the gateway's lexical engine serves every partition (``/readyz``); its status.

    The Tantivy engine opens a partition's index at its first search, so ``search`` sends one. The
    SQL leg would serve a partition without its index (missing, behind, from another store), which
    is not the configuration being measured, so such a partition stops the run.
    """
    await search(0)
    status = await readyz_until(
        session, url, "lexical_index", lambda s: "indexed" not in partition_states(s), wait_s, 1.0
    )
    if partition_states(status) != {"ready"}:
        raise RuntimeError(f"the gateway's lexical engine does not serve every partition: {status}")
    return status


async def exact_top10(
    pool: Any, partition: Any, probes: np.ndarray
) -> dict[str, list[list[tuple[Any, float]]]]:
    """Per visibility, each probe's exact top 10 as ``(key, distance)``: the truth recall is judged by."""
    from index.search.dense_leg import dense_search

    out: dict[str, list[list[tuple[Any, float]]]] = {}
    async with pool.acquire() as conn:
        for label, scope in visibility_scopes().items():
            out[label] = [
                [
                    (h.key, 1.0 - h.score)
                    for h in await dense_search(conn, partition, q, scope, 10, exact=True)
                ]
                for q in probes
            ]
    return out


def _recall(hits: Sequence[Any], truth: Sequence[tuple[Any, float]]) -> float:
    return tie_aware_recall([(h.key, 1.0 - h.score) for h in hits[:10]], truth)


async def measure_dense_recall(
    pool: Any, partition: Any, probes: np.ndarray, ef_values: Sequence[int], exact: dict[str, Any]
) -> dict[str, dict[int, dict[str, float]]]:
    """Recall@10 and p50 of pgvector's dense leg per visibility and ``hnsw.ef_search``, against
    ``exact`` (:func:`exact_top10`).

    The leg as the gateway runs it without the FAISS cache:
    :meth:`gateway.retrieval.legs.RetrievalLegs.hnsw_search` at each ``RAG_HNSW_EF_SEARCH`` (other settings at
    their defaults, so a small scope may be answered exactly, as ``RAG_DENSE_EXACT_MAX_ROWS``
    decides) for :func:`gateway.retrieval.legs.over_fetch` candidates; its first 10 are judged.
    Tie-aware: a hit whose distance reaches the 10th exact one counts.
    """
    from gateway.base.settings import load_gateway_settings
    from gateway.retrieval.engines import build_retrieval
    from gateway.retrieval.legs import over_fetch

    legs = {
        ef: build_retrieval(
            pool, None, load_gateway_settings({"RAG_HNSW_EF_SEARCH": str(ef)}, auth="off")
        ).retriever
        for ef in ef_values
    }
    out: dict[str, dict[int, dict[str, float]]] = {}
    async with pool.acquire() as conn:
        for label, scope in visibility_scopes().items():
            out[label] = {}
            for ef, leg in legs.items():
                recalls, times = [], []
                for q, truth in zip(probes, exact[label], strict=True):
                    start = time.perf_counter()
                    hits = await leg.legs.hnsw_search(conn, partition, q, scope, over_fetch(LIMIT))
                    times.append(time.perf_counter() - start)
                    recalls.append(_recall(hits, truth))
                out[label][ef] = {
                    "recall_at_10": float(np.mean(recalls)),
                    "p50_ms": percentile(times, 50) * 1e3,
                }
    return out


async def measure_dense_cache(
    pool: Any, url: str, partition: Any, probes: np.ndarray, exact: dict[str, Any], windows: int,
    texts: Sequence[str] = (), seconds: float = 0.0,
) -> dict[str, Any]:  # fmt: skip
    """The dense leg as a gateway with ``RAG_FAISS_CACHE=cpu`` runs it
    (:meth:`gateway.retrieval.legs.RetrievalLegs.dense_leg`, the cache's defaults), beside the gateway's
    default (no cache: pgvector).

    - the cache's load time, vectors and bytes, and the process RSS its load added;
    - per visibility: recall@10 against ``exact``, p50, and the share of searches the cache served
      (an admin's unfiltered search goes to pgvector's HNSW past ``RAG_FAISS_CPU_BROAD_SCAN_MAX``);
    - issue 24's goal cell: the 1% researcher's leg against the admin's, alternating per probe in
      ``windows`` interleaved windows, with and without the cache; each window's p50 ratio;
    - with ``seconds``: the 100% researcher's leg at 32 callers with the cache and without, then the
      cache's sync lag under a writer rewriting the store built from ``texts``
      (:mod:`benchmarks.vector_cache`).
    """
    from gateway.base.settings import load_gateway_settings
    from gateway.retrieval.engines import build_retrieval
    from gateway.retrieval.legs import over_fetch
    from gateway.web.app import vector_cache_config
    from index.vectors.cache import VectorCache

    settings = load_gateway_settings({"RAG_FAISS_CACHE": "cpu"}, auth="off")
    cache = VectorCache(pool, url, vector_cache_config(settings))
    cached = build_retrieval(pool, None, settings, vector_cache=cache).retriever
    plain = build_retrieval(pool, None, load_gateway_settings({}, auth="off")).retriever
    fetch = over_fetch(LIMIT)
    scopes = visibility_scopes()
    rss = rss_bytes()
    try:
        start = time.perf_counter()
        await cache.load(partition)
        load_s = time.perf_counter() - start
        loaded = cache.status()["partitions"][partition.partition]  # type: ignore[index]
        per_visibility: dict[str, dict[str, float]] = {}
        for label, scope in scopes.items():
            await cached.legs.dense_leg(
                partition, probes[0], scope, fetch
            )  # the scope's mask and packed copy
            recalls, times, served = [], [], 0
            for q, truth in zip(probes, exact[label], strict=True):
                start = time.perf_counter()
                hits, by_cache = await cached.legs.dense_leg(partition, q, scope, fetch)
                times.append(time.perf_counter() - start)
                recalls.append(_recall(hits, truth))
                served += by_cache
            per_visibility[label] = {
                "recall_at_10": float(np.mean(recalls)),
                "p50_ms": percentile(times, 50) * 1e3,
                "served_by_cache": served / len(probes),
            }
        goal: dict[str, dict[str, Any]] = {}
        for config, retriever in (("pgvector", plain), ("FAISS cache", cached)):
            legs = {
                name: _dense_leg_of(retriever, partition, scopes[name], fetch) for name in ("admin", "1%")
            }
            times = await interleaved_windows(legs, list(probes), windows, warmup=2)
            goal[config] = {
                "admin_p50_ms": percentile([t for w in times["admin"] for t in w], 50) * 1e3,
                "one_percent_p50_ms": percentile([t for w in times["1%"] for t in w], 50) * 1e3,
                "window_ratios": window_ratios(times["1%"], times["admin"]),
            }
        packed = cache.status()["packed_scopes"]
        if seconds:
            legs = {f"cache {state}": _dense_leg_of(retriever, partition, scopes["100%"], fetch)
                    for state, retriever in (("on", cached), ("off", plain))}  # fmt: skip
            under_load = {"callers_32": await callers_32(legs, probes, seconds),
                          "sync": await sync_lag(pool, cache, partition, texts, seconds)}  # fmt: skip
    finally:
        await cache.stop()
    return {
        "load_s": load_s,
        "vectors": loaded["vectors"],
        "index_mib": loaded["bytes"] / 2**20,
        "rss_growth_mib": (rss_bytes() - rss) / 2**20,
        "packed_scopes": packed,
        "per_visibility": per_visibility,
        "one_percent_vs_admin": goal,
        **(under_load if seconds else {}),
    }


def _dense_leg_of(retriever: Any, partition: Any, scope: Any, fetch: int) -> Any:
    async def leg(q: np.ndarray) -> Any:
        return await retriever.legs.dense_leg(partition, q, scope, fetch)

    return leg


def _cell(result: Any, cpu_ms: float) -> dict[str, Any]:
    return {
        "requests": result.requests,
        "p50_ms": result.latency.median * 1e3,
        "p99_ms": result.latency.p99 * 1e3,
        "requests_per_s": result.requests_per_s,
        "cpu_ms_per_request": cpu_ms,
    }


async def measure_semantic_search(
    database_url: str,
    sidecar_url: str,
    model_id: str,
    queries: Sequence[str],
    plan: ScalePlan,
    mode: str,
    workdir: Path,
    lexical_dir: Path,
) -> dict[str, Any]:
    """``semantic_search`` through a gateway in configuration ``mode`` (:data:`GATEWAY_CONFIGS`),
    its Tantivy index the one under ``lexical_dir``, once its lexical engine serves every partition
    and its FAISS cache (when on) is ready: one cell per caller count (admin) and one for a
    researcher at 1% visibility, one caller."""
    import aiohttp

    from gateway.access.auth import issue_token

    secret = secrets.token_urlsafe(48)
    researcher = "researcher"  # the load test's non-admin principal (benchmarks.principals)
    tokens = {
        "admin": issue_token(secret=secret, sub="bench", projects=None, admin=True),
        "1% ACL": issue_token(
            secret=secret, sub=researcher, projects=[VISIBILITY_PROJECT["1%"]], perms={SECTION: 1}
        ),
    }
    env = {**GATEWAY_CONFIGS[mode], "RAG_LEXICAL_DIR": str(lexical_dir)}
    log = workdir / f"gateway-{mode.replace(' ', '').replace(',', '-')}.log"
    started = time.perf_counter()
    async with gateway_process(
        database_url, sidecar_url, secret, log, text_model=model_id, load_testers=[researcher], **env
    ) as gateway:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max(plan.retrieval_callers) * 2)
        ) as session:

            def caller(who: str) -> Any:
                headers = {"Authorization": f"Bearer {tokens[who]}"}

                async def search(i: int) -> None:
                    body = api_request("semantic_search", query=queries[i % len(queries)], limit=LIMIT)
                    async with session.post(gateway.url + "/api/v1/json", json=body, headers=headers) as r:
                        payload = await r.json()
                        if r.status != 200 or not payload.get("data"):
                            raise RuntimeError(f"semantic_search ({who}) failed: {r.status} {payload}")

                return search

            admin, narrow = caller("admin"), caller("1% ACL")
            if env.get("RAG_LEXICAL_INDEX", "off") != "off":
                await _wait_lexical_ready(session, gateway.url, admin, wait_s=1800.0)
            if env.get("RAG_FAISS_CACHE", "off") != "off":
                faiss = await cache_ready(session, gateway.url, wait_s=1800.0)
                if partition_states(faiss) != {"ready"}:
                    raise RuntimeError(f"the gateway's FAISS cache did not load: {faiss}")
            ready_s = time.perf_counter() - started
            for i in range(len(queries)):  # embeds each query once; the gateway caches the vectors
                await admin(i)
                await narrow(i)

            async def cell(search: Any, callers: int) -> dict[str, Any]:
                before = process_cpu_s(gateway.process.pid)
                result = await closed_loop(
                    search, concurrency=callers, requests=REQUESTS, max_seconds=plan.retrieval_seconds
                )
                cpu_ms = (process_cpu_s(gateway.process.pid) - before) * 1e3 / max(1, result.requests)
                return _cell(result, cpu_ms)

            cells = {
                f"admin, {c} caller{'s' if c > 1 else ''}": await cell(admin, c)
                for c in plan.retrieval_callers
            }
            cells["1% ACL, 1 caller"] = await cell(narrow, 1)
            memory = tree_memory(gateway.process.pid)
    return {"mode": mode, "ready_s": ready_s, "cells": cells, "memory": memory}


async def _one_size(stack: BenchStack, n: int, bases: np.ndarray, queries: Sequence[str], probes: np.ndarray,
                    plan: ScalePlan, workdir: Path) -> dict[str, Any]:  # fmt: skip
    assert stack.sidecar_url is not None
    url = await stack.fresh_database(f"search_scale_{n}")
    pool = await gateway_read_pool(url)
    try:
        texts = build_corpus(n)
        start = time.perf_counter()
        partition = await populate(
            pool,
            texts,
            model=BENCH_MODEL,
            dimension=bases.shape[1],
            vectors=lambda first, stop: mixed_vectors(bases, stop - first, seed=first),
        )
        store_s = time.perf_counter() - start
        recall_probes = probes[:RECALL_QUERIES]
        exact = await exact_top10(pool, partition, recall_probes)
        recall = await measure_dense_recall(pool, partition, recall_probes, RECALL_EF_SEARCH, exact)
        cache = await measure_dense_cache(
            pool, url, partition, recall_probes, exact, WINDOWS, texts, plan.retrieval_cache_seconds
        )
        # The store's Tantivy index as an operator writes it: the lexical cells' engine reads it,
        # and the gateways from their start.
        lexical_dir = workdir / f"lexical-{n}"
        rebuild = await writer_rebuild("lexical", url, lexical_dir)
        # And the vector snapshot as `mnemo vectors rebuild` writes it: the other writer's peak.
        vectors_rebuild = await writer_rebuild("vectors", url, workdir / f"vectors-rebuild-{n}")
        lexical = await measure_lexical(
            pool, partition, texts, lexical_dir, plan.retrieval_dataset_queries, plan.retrieval_generated_queries,
            WINDOWS,
        )  # fmt: skip
    finally:
        await pool.close()
    mapped = (
        await mapped_workers(url, partition, workdir / f"vectors-{n}")
        if plan.retrieval_mapped_workers
        else None
    )
    search = {
        mode: await measure_semantic_search(
            url, stack.sidecar_url, BENCH_MODEL, queries, plan, mode, workdir, lexical_dir
        )
        for mode in GATEWAY_CONFIGS
    }
    cost = None
    if plan.retrieval_cost_seconds > 0:
        cost = await measure_search_cost(
            url, stack.sidecar_url, BENCH_MODEL, queries, probes, partition, lexical_dir, workdir,
            callers=plan.retrieval_callers, seconds=plan.retrieval_cost_seconds,
            profile_s=plan.retrieval_profile_seconds, limit=LIMIT,
        )  # fmt: skip
    workers = None
    if plan.retrieval_worker_passes and n == max(
        plan.retrieval_sizes
    ):  # issue 44: 2 gateway workers against 1
        env = {"RAG_LEXICAL_INDEX": "tantivy", "RAG_LEXICAL_DIR": str(lexical_dir)}
        workers = await workers_ab(url, stack.sidecar_url, BENCH_MODEL, queries, workdir, env,
                                   callers=max(plan.retrieval_callers), passes=plan.retrieval_worker_passes, window_s=plan.retrieval_worker_window_s)  # fmt: skip
    return {
        **({"workers": workers} if workers else {}),
        "chunks": n,
        "store_s": store_s,
        "lexical_rebuild": rebuild,
        "vectors_rebuild": vectors_rebuild,
        "dense_recall": recall,
        **({"mapped_workers": mapped} if mapped else {}),
        "dense_cache": cache,
        "lexical": lexical,
        "semantic_search": search,
        **({"search_cost": cost} if cost else {}),
    }


async def run_search_scale(stack: BenchStack, plan: ScalePlan) -> dict[str, Any]:
    """Every size of ``plan.retrieval_sizes`` on its own fresh database; a JSON-able dict (:func:`as_suite` reports it)."""
    from inference.client import SidecarClient

    from .scale_store import embed_bases

    if stack.sidecar_url is None:
        raise RuntimeError("the retrieval-at-scale section needs the bench stack's sidecar (query vectors)")
    async with SidecarClient(stack.sidecar_url, timeout=300) as client:
        bases = (await embed_bases(client, BENCH_MODEL, plan.store_bases)).vectors
        queries = load_queries(plan.retrieval_queries)
        probes = np.asarray(
            (await client.embed(BENCH_MODEL, queries, truncate=True)).embeddings, dtype=np.float32
        )
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-search-scale-") as work:
        sizes = [
            await _one_size(stack, n, bases, queries, probes, plan, Path(work)) for n in plan.retrieval_sizes
        ]
    return {"plan": dataclasses.asdict(plan), "queries": len(queries), "sizes": sizes}


def as_suite(result: dict[str, Any]) -> SuiteResult:
    """The section's report (:func:`benchmarks.search_scale_figures.scale_report`) at this module's limit."""
    return scale_report(result, limit=LIMIT)
