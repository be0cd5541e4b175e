"""The gateway suite: ``semantic_search`` beside the legs' raw SQL, by corpus size, filter selectivity and cache.

For each corpus size (1k and 10k chunks quick, 100k too in ``--full``) a fresh database gets the
gateway benchmark's corpus (:func:`benchmarks.gateway.load_corpus`: real sentences, the first
``embedded`` vectors from the sidecar, the rest mixtures of them), and the suite records:

- the load time (COPY into the partition, its HNSW index maintained row by row), a from-scratch
  ``REINDEX`` of that index, and the index and table sizes;
- ``semantic_search`` over HTTP (a ``mnemo gateway`` subprocess: auth, hybrid legs, fusion, ACL
  gate) beside the legs' SQL run as the gateway runs them (dense and lexical concurrently,
  :class:`benchmarks.gateway.RawLegs`) and the dense leg's SQL alone (the earlier baseline), for
  the same queries, p50/p95 and requests/s.

At the largest size it adds filter selectivity (callers who may read 100%, 10% and 1% of the records,
through their projects; the raw SQL gets the same ACL push-down) and the gateway benchmark's
concurrency points (1, 8, 32), once per FAISS cache mode in ``plan.caches`` (``off``: the SQL path;
``auto``: the cache, once loaded). Every size also runs one caller (the goal cells of issue 27:
latency and the gateway's CPU per request with nothing queued). Headlines: the gateway's p50 at one
caller over the legs' SQL at every size from 10k chunks (per cache mode at the largest), its
throughput at the most callers; and the non-admin dense leg at 100% visibility over the admin's.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from .gateway import api_request
from .gateway_figures import as_suite
from .http_floor import FloorCaller, floor_process, write_queries
from .levers import parse_variant, run_levers
from .measure import LoadResult, alternating_passes, closed_loop, percentile, process_cpu_s, ratio, spread
from .plan import GatewayPlan
from .report import SuiteResult
from .stack import BENCH_MODEL, BenchStack

__all__ = ["GatewayCaller", "gateway_window", "run_suite"]

LIMIT = 10


class _EmbedOnce:
    """The sidecar client for :func:`load_corpus`, embedding each distinct text list once.

    Every corpus size starts from the same sentences, so the sidecar embeds them for the first size
    only, and the load time then measures the database alone.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.cache: dict[tuple[str, tuple[str, ...]], Any] = {}

    async def embed(self, model: str, texts: Sequence[str], **kwargs: Any) -> Any:
        key = (model, tuple(texts))
        if key not in self.cache:
            self.cache[key] = await self.client.embed(model, list(texts), **kwargs)
        return self.cache[key]


def _projects_of(selectivity: Sequence[float]) -> Callable[[int], list[int]]:
    """Record ``r`` belongs to project ``k + 1`` when ``r`` is a multiple of ``1 / selectivity[k]``."""
    moduli = [max(1, round(1 / s)) for s in selectivity]
    return lambda record: [k + 1 for k, m in enumerate(moduli) if record % m == 0]


def _ms(load: LoadResult) -> dict[str, float]:
    lat = load.latency
    return {
        "p50": lat.median * 1000,
        "p95": lat.p95 * 1000,
        "p99": lat.p99 * 1000,
        "rps": load.requests_per_s,
    }


async def _index_figures(pool: Any, partition: Any) -> dict[str, float]:
    """A from-scratch HNSW build (REINDEX) of the partition's index, and the index and table sizes."""
    async with pool.acquire() as conn:
        index = await conn.fetchval(
            "SELECT indexname FROM pg_indexes WHERE tablename = $1 AND indexdef ILIKE '%USING hnsw%'",
            partition.partition,
        )
        if index is None:
            raise RuntimeError(f"no HNSW index on {partition.partition}")
        started = time.perf_counter()
        await conn.execute(f'REINDEX INDEX "{index}"')
        reindex_s = time.perf_counter() - started
        index_bytes = await conn.fetchval("SELECT pg_relation_size($1::regclass)", f'"{index}"')
        table_bytes = await conn.fetchval("SELECT pg_total_relation_size($1::regclass)", partition.table)
    return {"reindex_s": reindex_s, "index_mb": index_bytes / 2**20, "table_mb": table_bytes / 2**20}


class GatewayCaller:
    """One principal's paths: ``semantic_search`` over HTTP, the legs' SQL as the gateway runs them
    (:class:`benchmarks.gateway.RawLegs`, with the caller's ACL push-down), and the dense leg alone."""

    def __init__(
        self, http: Any, gateway: Any, token: str, pool: Any, partition: Any, scope: Any, queries: Any
    ):
        from .gateway import RawLegs

        self.http, self.url, self.pid, self.token = http, gateway.url, gateway.process.pid, token
        self.pool, self.partition, self.scope = pool, partition, scope
        self.texts, self.vectors = queries
        self.hits: list[int] = []
        self.raw = RawLegs(pool, partition, self.texts, self.vectors, LIMIT, scope)

    async def search(self, i: int) -> None:
        body = api_request("semantic_search", query=self.texts[i % len(self.texts)], limit=LIMIT)
        headers = {"Authorization": f"Bearer {self.token}"}
        async with self.http.post(self.url + "/api/v1/json", json=body, headers=headers) as response:
            payload = await response.json()
            if response.status != 200 or not payload.get("ok"):
                raise RuntimeError(f"semantic_search failed: {response.status} {payload}")
            self.hits.append(len(payload["data"]))

    async def warm(self) -> dict[str, float]:
        """One pass of every query on every path (the gateway caches query vectors after it); the
        gateway's p50 and p95 over it, each query embedded by the sidecar on its way (ms)."""
        first = []
        for i in range(len(self.texts)):
            started = time.perf_counter()
            await self.search(i)
            first.append(time.perf_counter() - started)
            await self.raw.legs(i)
        self.hits.clear()
        return {"p50": percentile(first, 50) * 1000, "p95": percentile(first, 95) * 1000}


async def served_window(
    call: Callable[[int], Awaitable[None]], pid: int, run: Callable[..., Awaitable[LoadResult]]
) -> dict[str, float]:
    """One window of a server's path, with that server process's CPU per request over it (ms)."""
    before = process_cpu_s(pid)
    load = await run(call)
    cpu_ms = (process_cpu_s(pid) - before) * 1000 / max(1, load.requests)
    return {**_ms(load), "cpu_ms": cpu_ms}


async def gateway_window(
    caller: GatewayCaller, run: Callable[..., Awaitable[LoadResult]]
) -> dict[str, float]:
    """One gateway window, with the gateway process's CPU per request over it (ms)."""
    return await served_window(caller.search, caller.pid, run)


async def _pair(
    caller: GatewayCaller,
    plan: GatewayPlan,
    concurrency: int,
    admin: GatewayCaller | None = None,
    floor: FloorCaller | None = None,
) -> dict[str, Any]:
    """The caller's gateway point beside its baselines; with ``admin``, also the admin's dense leg
    interleaved with the caller's (the non-admin headline's same-time baseline); with ``floor``,
    the HTTP floor's window in every pair too (:mod:`benchmarks.http_floor`: what the HTTP hop alone
    costs over the SQL).

    The gateway and the legs' SQL run as ``plan.pairs`` interleaved pairs of windows (gateway then
    SQL, then SQL then gateway, ...), so a drift of the machine falls on both alike; each pair's
    ratio is direct, and their min and max are the spread printed beside the ratio (two
    configurations that run the same code once gave 1.51x and 2.09x from single windows). The
    floor's window closes the first pair and opens the second (gateway, SQL, floor; floor, SQL,
    gateway ...)."""
    run: Callable[[Callable[[int], Awaitable[None]]], Awaitable[LoadResult]] = lambda call: closed_loop(  # noqa: E731
        call, concurrency=concurrency, requests=plan.requests, max_seconds=plan.seconds
    )

    async def legs_window() -> dict[str, float]:
        return _ms(await run(caller.raw.legs))

    windows: dict[str, Callable[[], Awaitable[dict[str, float]]]] = {
        "gateway": functools.partial(gateway_window, caller, run),
        "sql": legs_window,
    }
    if floor is not None:
        windows["floor"] = functools.partial(served_window, floor.legs, floor.pid, run)
    caller.hits.clear()
    passes = await alternating_passes(windows, max(1, plan.pairs))
    pairs = [(p["gateway"], p["sql"]) for p in passes]
    floors = [p["floor"] for p in passes if "floor" in p]
    dense, extra = (
        (_ms(await run(caller.raw.dense)), {})
        if admin is None
        else await _dense_pairs(caller, admin, plan, run)
    )
    gw = _combine([g for g, _ in pairs])
    sql = _combine([s for _, s in pairs])
    return {
        **extra,
        **(_floor_figures(floors, pairs) if floors else {}),
        "concurrency": concurrency,
        "gateway": gw,
        "sql": sql,
        "dense_sql": dense,
        "windows": [{"gateway": g, "sql": s} for g, s in pairs],
        "p50_ratio": ratio(gw["p50"], sql["p50"]),
        "p50_ratio_spread": spread([ratio(g["p50"], s["p50"]) for g, s in pairs]),
        "p50_ratio_dense": ratio(gw["p50"], dense["p50"]),
        "rps_ratio": ratio(gw["rps"], sql["rps"]),
        "rps_ratio_spread": spread([ratio(g["rps"], s["rps"]) for g, s in pairs]),
        "mean_hits": float(np.mean(caller.hits)) if caller.hits else 0.0,
    }


async def _dense_pairs(
    caller: GatewayCaller,
    admin: GatewayCaller,
    plan: GatewayPlan,
    run: Callable[[Callable[[int], Awaitable[None]]], Awaitable[LoadResult]],
) -> tuple[dict[str, float], dict[str, Any]]:
    """The caller's dense leg and the admin's in ``plan.pairs`` interleaved pairs of windows (caller
    then admin, then admin then caller ...), as the headlines' pairs: one pair of single windows
    gave the same code 1.42x in one run and 1.11x in the next."""

    async def dense_window(who: GatewayCaller) -> dict[str, float]:
        return _ms(await run(who.raw.dense))

    passes = await alternating_passes(
        {"caller": functools.partial(dense_window, caller), "admin": functools.partial(dense_window, admin)},
        max(1, plan.pairs),
    )
    pairs = [(p["caller"], p["admin"]) for p in passes]
    return _combine([m for m, _ in pairs]), {
        "admin_dense_sql": _combine([t for _, t in pairs]),
        "admin_dense_ratio_spread": spread([ratio(m["p50"], t["p50"]) for m, t in pairs]),
    }


def _floor_figures(
    floors: Sequence[dict[str, float]], pairs: Sequence[tuple[dict[str, float], dict[str, float]]]
) -> dict[str, Any]:
    """The HTTP floor's windows against the SQL's and the gateway's of the same pairs."""
    fl = _combine(floors)
    gw = _combine([g for g, _ in pairs])
    sql = _combine([s for _, s in pairs])
    return {
        "floor": fl,
        "floor_p50_ratio": ratio(fl["p50"], sql["p50"]),
        "floor_p50_ratio_spread": spread(
            [ratio(f["p50"], s["p50"]) for f, (_, s) in zip(floors, pairs, strict=True)]
        ),
        "floor_rps_ratio": ratio(fl["rps"], sql["rps"]),
        "floor_rps_ratio_spread": spread(
            [ratio(f["rps"], s["rps"]) for f, (_, s) in zip(floors, pairs, strict=True)]
        ),
        "p50_over_floor": ratio(gw["p50"], fl["p50"]),
    }


def _combine(windows: Sequence[dict[str, float]]) -> dict[str, float]:
    """Windows of one path: the median of their percentiles and CPU per request, the mean of their
    requests/s (as the sidecar suite's peer pairs)."""
    out = {key: statistics.median(w[key] for w in windows) for key in windows[0] if key != "rps"}
    return out | {"rps": statistics.fmean(w["rps"] for w in windows)}


async def _measure_size(
    stack: BenchStack,
    plan: GatewayPlan,
    size: int,
    sentences: list[str],
    client: _EmbedOnce,
    model: Any,
    queries,
) -> dict[str, Any]:
    import aiohttp

    from gateway.access.acl import pushdown
    from gateway.access.auth import Principal, issue_token
    from index.store.hits import Scope

    from .gateway import SECTION, cache_ready, gateway_read_pool, load_corpus

    url = await stack.fresh_database("bench_gateway")
    pool = await gateway_read_pool(url)
    floors = contextlib.AsyncExitStack()
    try:
        started = time.perf_counter()
        partition = await load_corpus(
            pool, client, model, sentences[:size], min(plan.embedded, size), _projects_of(plan.selectivity)
        )
        point: dict[str, Any] = {"chunks": size, "load_s": time.perf_counter() - started}
        point.update(await _index_figures(pool, partition))
        secret = secrets.token_urlsafe(48)
        assert stack.sidecar_url is not None
        largest = size == max(plan.sizes)
        # the selectivity curve's callers, one per share: the load test's non-admin principals
        readers = [f"bench-{k}" for k in range(len(plan.selectivity))] if largest else []
        point["caches"] = {}
        floor = await floors.enter_async_context(
            floor_process(url, model, write_queries(stack.work_dir / "floor-queries.npz", *queries),
                          stack.work_dir / f"floor-{size}.log", limit=LIMIT)
        )  # fmt: skip
        for cache in plan.caches if largest else plan.caches[:1]:
            log = stack.work_dir / f"gateway-{size}-{cache}.log"
            async with (
                _gateway(url, stack.sidecar_url, secret, log, model.id, cache, readers) as gateway,
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http,
            ):
                faiss = await cache_ready(http, gateway.url)
                admin = issue_token(secret=secret, sub="bench-admin", projects=None, admin=True)
                caller = GatewayCaller(http, gateway, admin, pool, partition, Scope(), queries)
                first_pass = await caller.warm()
                bare = FloorCaller(http, floor)
                await bare.warm(len(caller.texts))
                measured: dict[str, Any] = {"faiss": faiss, "first_pass": first_pass,
                                            **await _pair(caller, plan, plan.concurrency)}  # fmt: skip
                if largest and cache == plan.caches[0]:  # issue 45: what metering adds, same run
                    measured["metering"] = await _metering(url, stack.sidecar_url, secret, log, model.id, cache,
                                                           gateway.url, caller.texts, plan)  # fmt: skip
                # one caller at every size (the goal table's latency and CPU cells), the whole
                # concurrency sweep at the largest; the HTTP floor beside the goal cells (one
                # caller, the most callers)
                sweep = sorted({1, *plan.load_concurrency}) if largest else [1]
                measured["by_concurrency"] = [
                    await _pair(caller, plan, c, floor=bare if c in (1, sweep[-1]) else None) for c in sweep
                ]
                if largest:
                    measured["by_selectivity"] = []
                    perms = {SECTION: 1}
                    for k, share in enumerate(plan.selectivity):
                        who = Principal(readers[k], projects=frozenset({k + 1}), perms=perms)
                        token = issue_token(secret=secret, sub=who.sub, projects=[k + 1], perms=perms)
                        scoped = GatewayCaller(
                            http, gateway, token, pool, partition, Scope(acl=pushdown(who)), queries
                        )
                        await scoped.warm()
                        measured["by_selectivity"].append(
                            {"visible": share, **await _pair(scoped, plan, plan.concurrency, caller)}
                        )
                measured["leg_mean_ms"] = await _leg_means(gateway.url)
                point["caches"][cache] = measured
        point.update(point["caches"][plan.caches[0]])  # the first mode's figures at the top level
        if largest and plan.levers:  # one lever A/B, its gateways the only ones up
            point["levers"] = await run_levers(
                stack, url, pool, partition, queries, plan.levers, GatewayCaller, gateway_window,
                concurrency=sorted({1, max(plan.load_concurrency)}),
                pairs=max(2, plan.pairs), seconds=plan.seconds, requests=plan.requests,
            )  # fmt: skip
    finally:
        await floors.aclose()
        await pool.close()
    return point


async def _leg_means(url: str) -> dict[str, float]:
    """Mean milliseconds per retrieval leg over everything the gateway served, from its /metrics."""
    from .measure import metric_samples

    samples = await metric_samples(url, "mnemo_retrieval_leg_seconds")
    sums, counts = (
        {s.labels["leg"]: s.value for s in samples if s.name.endswith(f"_{kind}")}
        for kind in ("sum", "count")
    )
    return {leg: 1000 * total / counts[leg] for leg, total in sums.items() if counts.get(leg)}


@contextlib.asynccontextmanager
async def _gateway(
    database_url: str, sidecar_url: str, secret: str, log: Any, model: str, cache: str, readers: Sequence[str]
) -> AsyncIterator[Any]:
    """The gateway benchmark's ``mnemo gateway`` subprocess (a :class:`benchmarks.gateway.GatewayProcess`),
    told which text model the corpus is in, which ``RAG_FAISS_CACHE`` to run and which non-admin
    principals the suite loops (set up for a load test: :mod:`benchmarks.principals`)."""
    from .gateway import gateway_process

    async with gateway_process(
        database_url, sidecar_url, secret, log, text_model=model, load_testers=readers, RAG_FAISS_CACHE=cache
    ) as gateway:
        yield gateway


async def _metering(
    url: str, sidecar_url: str, secret: str, log: Any, model: str, cache: str, metered_url: str,
    texts: Sequence[str], plan: GatewayPlan,
) -> dict[str, Any]:  # fmt: skip
    """:func:`benchmarks.flood.metering_cost` against a twin gateway with ``RAG_BUDGETS=false``."""
    from .flood import metering_cost
    from .gateway import gateway_process

    twin = log.with_name(log.stem + "-unmetered.log")
    env = {"RAG_FAISS_CACHE": cache, "RAG_BUDGETS": "false"}
    async with gateway_process(url, sidecar_url, secret, twin, text_model=model, **env) as unmetered:
        return await metering_cost(
            metered_url, unmetered.url, secret, texts, requests=plan.requests, pairs=max(2, plan.pairs)
        )


async def run_suite(stack: BenchStack, plan: GatewayPlan) -> SuiteResult:
    from index.models import resolve_model
    from inference.client import SidecarClient

    from .gateway import load_queries, load_sentences

    assert stack.sidecar_url is not None
    for spec in plan.levers:  # a malformed variant fails the suite before anything is measured
        parse_variant(spec)
    sizes = sorted(plan.sizes)
    sentences = load_sentences(sizes[-1])[: sizes[-1]]
    async with SidecarClient(stack.sidecar_url, timeout=300) as client:
        model = await resolve_model(client, "text", BENCH_MODEL)
        texts = load_queries(plan.queries)
        vectors = np.asarray(
            (await client.embed(model.id, texts, truncate=True)).embeddings, dtype=np.float32
        )
        once = _EmbedOnce(client)
        started = time.perf_counter()
        for n in sorted({min(plan.embedded, size) for size in sizes}):  # outside the load timings
            await once.embed(model.id, sentences[:n], truncate=True)
        embed_s = time.perf_counter() - started
        points = [
            await _measure_size(stack, plan, size, sentences, once, model, (texts, vectors)) for size in sizes
        ]
    setup = {"model": model.id, "embedded": plan.embedded, "queries": len(texts), "embed_s": embed_s}
    return as_suite(plan, points, setup, limit=LIMIT)
