"""Retrieval at scale: one store per size, its lexical legs and ``semantic_search`` through a real
gateway, and each latency's growth from the smallest size to the largest (issue 24).

``python -m benchmarks.search_scale --sizes 100000,1000000 --out DIR``. Per size ``n``, on a fresh
database of the bench stack's PostgreSQL:

- **the store**: the lexical benchmark's corpus (:func:`benchmarks.lexical.build_corpus`: every
  unique sentence of the shared data sets, then Zipfian text in their languages), each chunk with a
  vector of the bench model (:func:`benchmarks.gateway.mixed_vectors`: each a random mixture of two
  real embeddings of the data sets' sentences, plus a little noise, so neighbours are spread as in
  real embeddings rather than near-copies of a few), loaded by the bulk path with every index, HNSW
  included. One record per chunk, in the projects of :func:`benchmarks.acl_shares.projects_of`
  (researchers who see 100%, 10% and 1% of the chunks);
- **dense recall@10** of the dense leg as the gateway runs it (HNSW with iterative scans, the
  gateway's over-fetch, its top 10) against an exact scan, unfiltered and for researchers who see
  100%, 10% and 1% of the chunks, at each ``hnsw.ef_search`` of the plan, with each one's p50;
  probes: the data sets' queries embedded by the bench model;
- **the lexical section** over it (:func:`benchmarks.lexical.measure_lexical`: the in-memory index,
  the SQL leg and Tantivy BM25, same chunks and queries);
- **``semantic_search``** through a ``mnemo gateway`` subprocess per lexical mode
  (``RAG_LEXICAL_INDEX`` ``memory``, then ``off``), defaults otherwise: the data sets' queries, each
  sent once first (the gateway embeds it through the sidecar and caches its vector), then a closed
  loop per caller count as an admin, and one caller as a researcher who sees 1% of the chunks;
  p50, p99, requests/s and the gateway's CPU per request, per cell.

Growth: every latency at the largest size against itself at the smallest, same run. A gateway whose
lexical index does not become ready, or a search answered with anything but 200, stops the run.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .acl_shares import VISIBILITY_PROJECT
from .datasets import find_datasets
from .gateway import (
    gateway_process,
    gateway_read_pool,
    load_queries,
    mixed_vectors,
    partition_states,
    readyz_until,
)
from .lexical import SECTION, build_corpus, measure_lexical, populate
from .lexical import as_suite as lexical_suite
from .measure import closed_loop, percentile, process_cpu_s, ratio, tie_aware_recall
from .report import Headline, SuiteResult, Table, write_report
from .stack import BENCH_MODEL, BenchStack, open_stack

__all__ = ["SearchScalePlan", "as_suite", "run_search_scale"]

LIMIT = 10  # semantic_search's limit: the gateway over-fetches max(4 * limit, 20) per leg
LEXICAL_MODES = ("memory", "off")
GROWTH_BAR = 1.5  # issue 24: semantic_search p50 at 1M within 1.5x of itself at 100k
RECALL_BAR = 0.95  # issue 24: dense recall@10 against exact at every visibility


@dataclass(frozen=True)
class SearchScalePlan:
    """What one run measures; the scale suite's plan fills it (``benchmarks/plan.py: ScalePlan``)."""

    sizes: tuple[int, ...]
    bases: int = 1_000  # real sentences embedded by the bench model; each row mixes two of them
    queries: int = 100  # the data sets' queries sent to semantic_search
    callers: tuple[int, ...] = (1, 32)
    requests: int = 400  # per closed loop, bounded by ``seconds`` too
    seconds: float = 20.0
    lexical_dataset_queries: int = 60
    lexical_generated_queries: int = 20  # of each kind: rare, common, mixed
    lexical_modes: tuple[str, ...] = LEXICAL_MODES
    recall_queries: int = 40  # probes per visibility; each needs an exact scan of the store
    recall_ef_search: tuple[int, ...] = (40, 100, 200, 400)


async def _wait_lexical_ready(session: Any, url: str, wait_s: float) -> dict[str, Any]:
    """Until every partition of the gateway's lexical index is ready (``/readyz``); its status.

    The SQL leg would serve a cold partition, which is not the configuration being measured, so a
    partition that fails, or one still loading past ``wait_s``, stops the run.
    """
    status = await readyz_until(
        session,
        url,
        "lexical_index",
        lambda s: partition_states(s) == {"ready"} or "failed" in partition_states(s),
        wait_s,
        1.0,
    )
    if "failed" in partition_states(status):
        raise RuntimeError(f"the gateway's lexical index failed to load: {status}")
    return status


async def measure_dense_recall(
    pool: Any, partition: Any, probes: np.ndarray, ef_values: Sequence[int]
) -> dict[str, dict[int, dict[str, float]]]:
    """Recall@10 and p50 of the dense leg per visibility and ``hnsw.ef_search``, against exact search.

    The leg as the gateway runs it: :meth:`gateway.retrieval.Retriever.hnsw_search` at each
    ``RAG_HNSW_EF_SEARCH`` (other settings at their defaults, so a small scope may be answered
    exactly, as ``RAG_DENSE_EXACT_MAX_ROWS`` decides) for :func:`gateway.retrieval.over_fetch`
    candidates; its first 10 are judged. Tie-aware: a hit whose distance reaches the 10th exact one
    counts.
    """
    from gateway.acl import pushdown
    from gateway.auth import Principal
    from gateway.retrieval import Retriever, over_fetch
    from gateway.settings import load_gateway_settings
    from index.search import Scope, dense_search

    scopes = {"admin": Scope()} | {
        share: Scope(acl=pushdown(Principal("r", frozenset({project}), {SECTION: 1})))
        for share, project in VISIBILITY_PROJECT.items()
    }
    legs = {
        ef: Retriever(
            pool, client=None, settings=load_gateway_settings({"RAG_HNSW_EF_SEARCH": str(ef)}, auth="off")
        )
        for ef in ef_values
    }
    out: dict[str, dict[int, dict[str, float]]] = {}
    async with pool.acquire() as conn:
        for label, scope in scopes.items():
            exact = [
                [
                    (h.key, 1.0 - h.score)
                    for h in await dense_search(conn, partition, q, scope, 10, exact=True)
                ]
                for q in probes
            ]
            out[label] = {}
            for ef, leg in legs.items():
                recalls, times = [], []
                for q, truth in zip(probes, exact, strict=True):
                    start = time.perf_counter()
                    hits = await leg.hnsw_search(conn, partition, q, scope, over_fetch(LIMIT))
                    times.append(time.perf_counter() - start)
                    recalls.append(tie_aware_recall([(h.key, 1.0 - h.score) for h in hits[:10]], truth))
                out[label][ef] = {
                    "recall_at_10": float(np.mean(recalls)),
                    "p50_ms": percentile(times, 50) * 1e3,
                }
    return out


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
    plan: SearchScalePlan,
    mode: str,
    workdir: Path,
) -> dict[str, Any]:
    """``semantic_search`` through a gateway with ``RAG_LEXICAL_INDEX=mode``: one cell per caller
    count (admin) and one for a researcher at 1% visibility, one caller."""
    import aiohttp

    from gateway.auth import issue_token

    secret = secrets.token_urlsafe(48)
    tokens = {
        "admin": issue_token(secret=secret, sub="bench", projects=None, admin=True),
        "1% ACL": issue_token(secret=secret, sub="researcher", projects=[3], perms={SECTION: 1}),
    }
    log = workdir / f"gateway-{mode}.log"
    started = time.perf_counter()
    async with gateway_process(
        database_url, sidecar_url, secret, log, text_model=model_id, RAG_LEXICAL_INDEX=mode
    ) as gateway:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max(plan.callers) * 2)
        ) as session:
            if mode != "off":
                await _wait_lexical_ready(session, gateway.url, wait_s=1800.0)
            ready_s = time.perf_counter() - started

            def caller(who: str) -> Any:
                headers = {"Authorization": f"Bearer {tokens[who]}"}

                async def search(i: int) -> None:
                    body = {"dd_api": "dd_rag_api", "action": "semantic_search",
                            "options": {"query": queries[i % len(queries)], "limit": LIMIT}}  # fmt: skip
                    async with session.post(gateway.url + "/api/v1/json", json=body, headers=headers) as r:
                        payload = await r.json()
                        if r.status != 200 or not payload.get("data"):
                            raise RuntimeError(f"semantic_search ({who}) failed: {r.status} {payload}")

                return search

            admin, narrow = caller("admin"), caller("1% ACL")
            for i in range(len(queries)):  # embeds each query once; the gateway caches the vectors
                await admin(i)
                await narrow(i)

            async def cell(search: Any, callers: int) -> dict[str, Any]:
                before = process_cpu_s(gateway.process.pid)
                result = await closed_loop(
                    search, concurrency=callers, requests=plan.requests, max_seconds=plan.seconds
                )
                cpu_ms = (process_cpu_s(gateway.process.pid) - before) * 1e3 / max(1, result.requests)
                return _cell(result, cpu_ms)

            cells = {f"admin, {c} caller{'s' if c > 1 else ''}": await cell(admin, c) for c in plan.callers}
            cells["1% ACL, 1 caller"] = await cell(narrow, 1)
    return {"mode": mode, "ready_s": ready_s, "cells": cells}


async def _one_size(stack: BenchStack, n: int, bases: np.ndarray, queries: Sequence[str], probes: np.ndarray,
                    plan: SearchScalePlan, workdir: Path) -> dict[str, Any]:  # fmt: skip
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
        recall = await measure_dense_recall(
            pool, partition, probes[: plan.recall_queries], plan.recall_ef_search
        )
        lexical = await measure_lexical(
            pool, url, partition, texts, store_s, plan.lexical_dataset_queries, plan.lexical_generated_queries
        )
    finally:
        await pool.close()
    search = {
        mode: await measure_semantic_search(url, stack.sidecar_url, BENCH_MODEL, queries, plan, mode, workdir)
        for mode in plan.lexical_modes
    }
    return {
        "chunks": n,
        "store_s": store_s,
        "dense_recall": recall,
        "lexical": lexical,
        "semantic_search": search,
    }


async def run_search_scale(stack: BenchStack, plan: SearchScalePlan) -> dict[str, Any]:
    """Every size of ``plan`` on its own fresh database; a JSON-able dict (:func:`as_suite` reports it)."""
    from inference.client import SidecarClient

    from .scale_store import embed_bases

    if stack.sidecar_url is None:
        raise RuntimeError("the retrieval-at-scale section needs the bench stack's sidecar (query vectors)")
    dirs, _ = find_datasets(("*",))
    if not dirs:
        raise LookupError("no shared data sets found (../shared/datasets): the corpus needs real sentences")
    async with SidecarClient(stack.sidecar_url, timeout=300) as client:
        bases = (await embed_bases(client, BENCH_MODEL, plan.bases, dirs[0].parent)).vectors
        queries = load_queries(plan.queries, dirs[0].parent)
        probes = np.asarray(
            (await client.embed(BENCH_MODEL, queries, truncate=True)).embeddings, dtype=np.float32
        )
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-search-scale-") as work:
        sizes = [await _one_size(stack, n, bases, queries, probes, plan, Path(work)) for n in plan.sizes]
    return {"plan": plan.__dict__, "queries": len(queries), "sizes": sizes}


def _growth_rows(sizes: list[dict[str, Any]]) -> tuple[list[list[Any]], list[Headline]]:
    """Each semantic_search latency at the largest size against the smallest (same run)."""
    if len(sizes) < 2:
        return [], []
    small, large = sizes[0], sizes[-1]
    label = f"{large['chunks']:,} vs {small['chunks']:,}"
    rows, headlines = [], []
    for mode, run in large["semantic_search"].items():
        for name, cell in run["cells"].items():
            base = small["semantic_search"][mode]["cells"][name]
            rows.append([mode, name, base["p50_ms"], cell["p50_ms"], ratio(cell["p50_ms"], base["p50_ms"]),
                         base["p99_ms"], cell["p99_ms"], ratio(cell["p99_ms"], base["p99_ms"])])  # fmt: skip
            if name.startswith("admin"):
                headlines.append(Headline(
                    f"semantic_search p50 growth {label} (lexical index {mode}, {name})", cell["p50_ms"], "ms",
                    f"itself at {small['chunks']:,} chunks", base["p50_ms"], higher_is_better=False,
                    bar=GROWTH_BAR if mode == "memory" else None,
                ))  # fmt: skip
    return rows, headlines


def _recall_rows(sizes: list[dict[str, Any]]) -> tuple[list[list[Any]], list[Headline]]:
    """Every size's recall per visibility and ef_search; headlines at the largest size and the
    gateway's default ef_search (bar: 0.95 of exact)."""
    from gateway.settings import GatewaySettings

    default_ef = GatewaySettings().hnsw_ef_search
    rows, headlines = [], []
    for size in sizes:
        for label, by_ef in size.get("dense_recall", {}).items():
            for ef, cell in by_ef.items():
                rows.append([f"{size['chunks']:,}", label, int(ef), cell["recall_at_10"], cell["p50_ms"]])
    largest = sizes[-1]
    for label, by_ef in largest.get("dense_recall", {}).items():
        cell = by_ef.get(default_ef, by_ef.get(str(default_ef)))
        if cell is not None and label != "admin":
            headlines.append(Headline(
                f"{largest['chunks']:,}: dense recall@10 at {label} visibility (HNSW, ef_search {default_ef})",
                cell["recall_at_10"], "", "exact search", 1.0, bar=RECALL_BAR,
            ))  # fmt: skip
    return rows, headlines


def as_suite(result: dict[str, Any]) -> SuiteResult:
    """The lexical section's report plus semantic_search per size and mode, and the growth."""
    lexical = lexical_suite({"sizes": [s["lexical"] for s in result["sizes"]]})
    cells = []
    for size in result["sizes"]:
        for mode, run in size["semantic_search"].items():
            for name, c in run["cells"].items():
                cells.append([f"{size['chunks']:,}", mode, name, c["requests"], c["p50_ms"], c["p99_ms"],
                              c["requests_per_s"], c["cpu_ms_per_request"], run["ready_s"]])  # fmt: skip
    growth, headlines = _growth_rows(result["sizes"])
    recall_rows, recall_headlines = _recall_rows(result["sizes"])
    tables = [
        Table(
            f"semantic_search through the gateway, limit {LIMIT}",
            [
                "chunks",
                "lexical index",
                "caller",
                "requests",
                "p50 ms",
                "p99 ms",
                "req/s",
                "gateway CPU ms/req",
                "gateway ready s",
            ],
            cells,
        ),
    ]
    tables.append(
        Table(
            "Dense recall@10 vs exact search (the dense leg as the gateway runs it)",
            ["chunks", "visibility", "hnsw.ef_search", "recall@10", "p50 ms"],
            recall_rows,
        )
    )
    if growth:
        tables.append(
            Table(
                "semantic_search growth, same run (largest size / smallest)",
                [
                    "lexical index",
                    "caller",
                    "small p50",
                    "large p50",
                    "p50 growth",
                    "small p99",
                    "large p99",
                    "p99 growth",
                ],
                growth,
            )
        )
    largest = result["sizes"][-1]
    memory = largest["semantic_search"].get("memory", {}).get("cells", {})
    if "admin, 1 caller" in memory:
        headlines.append(Headline(
            f"{largest['chunks']:,}: semantic_search p50, 1% ACL researcher (lexical index memory, 1 caller)",
            memory["1% ACL, 1 caller"]["p50_ms"], "ms", "admin, same store", memory["admin, 1 caller"]["p50_ms"],
            higher_is_better=False, bar=2.0,
        ))  # fmt: skip
    notes = [
        "semantic_search: a mnemo gateway subprocess with default settings but RAG_LEXICAL_INDEX; the data "
        "sets' queries, each sent once before the loops so its vector is cached (no sidecar in the loops); "
        "hybrid retrieval (dense HNSW + lexical), fusion, ACL, JSON over HTTP on 127.0.0.1.",
        "gateway ready s: from the process's start until its lexical index served every partition.",
        "The store: one record per chunk, every record in project 1, every 10th also in project 2, every "
        "100th also in project 3 (the researchers who see 100%, 10% and 1%).",
    ]
    return SuiteResult(
        suite="retrieval at scale",
        headlines=lexical.headlines + recall_headlines + headlines,
        tables=lexical.tables + tables,
        figures=result,
        notes=lexical.notes + notes,
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.search_scale", description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes", default="100000", help="chunks per store, comma-separated (a scale run: 100000,1000000)"
    )
    p.add_argument(
        "--callers", default="1,32", help="closed-loop callers of semantic_search, comma-separated"
    )
    p.add_argument("--seconds", type=float, default=20.0, help="at most this long per closed loop")
    p.add_argument(
        "--bases", type=int, default=1_000, help="real sentences embedded for the vectors (full plan: 10000)"
    )
    p.add_argument("--database-url", default=None, help="a PostgreSQL server to use (default: embedded)")
    p.add_argument("--out", type=Path, required=True, help="report folder (results.json, REPORT.md)")
    args = p.parse_args(argv)
    plan = SearchScalePlan(
        sizes=tuple(int(s) for s in args.sizes.split(",") if s.strip()),
        callers=tuple(int(c) for c in args.callers.split(",") if c.strip()),
        seconds=args.seconds,
        bases=args.bases,
    )
    with (
        tempfile.TemporaryDirectory(prefix="mnemo-bench-search-scale-") as work,
        open_stack(Path(work), database=True, sidecar=True, database_url=args.database_url) as stack,
    ):
        result = asyncio.run(run_search_scale(stack, plan))
    report = write_report(args.out, [as_suite(result)], {"suite": "search_scale", **plan.__dict__})
    print(report.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
