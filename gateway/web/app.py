"""The gateway's aiohttp application: factory, shared resources, operational routes, serving.

``create_app(settings)`` wires everything; each shared resource (database pool,
sidecar client, retrieval engine) is one cleanup context that creates it,
yields, and closes it. ``serve()`` runs an app until SIGTERM/SIGINT and then
finishes in-flight requests before closing (graceful drain).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import signal
import socket
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from aiohttp import web

from gateway.access.auth import setup_auth
from gateway.actions.context import (
    ASK_KEY,
    OBJECTS_KEY,
    PASSAGES_KEY,
    RETRIEVER_KEY,
    WINDOWS_KEY,
    AskServices,
    PassageServices,
)
from gateway.actions.providers import build_provider
from gateway.base.errors import ApiError, envelope_ok, error_middleware
from gateway.base.metrics import Metrics
from gateway.base.resources import (
    CORPUS_STATS_KEY,
    DATABASE_URL_KEY,
    LEXICAL_INDEX_KEY,
    METRICS_KEY,
    POOL_KEY,
    QUERY_SIDECAR_KEY,
    READ_POOL_KEY,
    SETTINGS_KEY,
    SIDECAR_KEY,
    VECTOR_CACHE_KEY,
    WORKERS_KEY,
)
from gateway.base.settings import GatewaySettings
from gateway.budgets.ledger import BUDGETS_KEY, Budgets
from gateway.budgets.routes import setup_budget_routes
from gateway.retrieval.engines import build_retrieval
from gateway.retrieval.rerank import Reranker
from gateway.web.console import setup_console
from gateway.web.dispatch import json_api
from gateway.web.embeddings import setup_openai_routes
from gateway.web.intake import DRAIN_KEY, setup_intake
from gateway.web.observe import observe_middleware
from gateway.web.openapi import openapi
from gateway.web.server import GatewayRunner, concurrency_middleware, handler_args
from gateway.web.thumbnails import setup_thumbnails
from index.lexical.engine import TantivyConfig, TantivyLexical
from index.lexical.metrics import LexicalMetrics
from index.search.bm25 import CorpusStats
from index.search.read_settings import PLANNED_ONCE, read_session_settings
from index.store.partitions import list_partitions
from index.store.sections import SectionStore
from index.vectors.metrics import CacheMetrics
from index.vectors.partition import CacheConfig  # configuration only: FAISS loads with the cache
from inference.eventloop import loop_name
from schema.database import create_pool, open_database
from schema.read_pool import ReadPool

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 5.0  # a readiness probe answers promptly, even when a dependency hangs


async def _database_ctx(app: web.Application) -> AsyncIterator[None]:
    """Open (embedded or external) PostgreSQL, apply migrations, share a pool."""
    settings = app[SETTINGS_KEY]
    async with open_database(settings.database) as db:
        app[POOL_KEY] = db.pool
        app[DATABASE_URL_KEY] = db.url
        yield


async def _budgets_ctx(app: web.Application) -> AsyncIterator[None]:
    """The budget ledger and the fairness limiter. The ledger writes through a pool of its own: one
    statement per call leaves no session state, so no reset round trip on release (the main pool's
    0.4-0.8 ms), and its sessions commit as ``RAG_BUDGET_DURABLE_COMMIT`` says."""
    settings = app[SETTINGS_KEY]
    ledger_pool = await create_pool(
        app[DATABASE_URL_KEY],
        max_size=settings.database.pool_size,
        reset_session=False,
        session={"synchronous_commit": "on" if settings.budgets.durable_commit else "off"},
    )
    budgets = Budgets.configured(
        ledger_pool, settings.budgets, app[METRICS_KEY], workers=app.get(WORKERS_KEY, 1)
    )
    app[BUDGETS_KEY] = budgets
    try:
        async with budgets.leases_returned():  # a lease's unused units back to the ledger, idle or at the end
            yield
    finally:
        await ledger_pool.close()


async def _sidecar_ctx(app: web.Application) -> AsyncIterator[None]:
    """The sidecar client shared by intake and readiness checks (retries with backoff)."""
    client = app[SETTINGS_KEY].sidecar.client()
    app[SIDECAR_KEY] = client
    try:
        yield
    finally:
        await client.close()


def vector_cache_config(settings: GatewaySettings) -> CacheConfig:
    """The FAISS cache's configuration from the gateway's ``RAG_FAISS_*`` settings (one definition:
    the gateway and the benchmarks that run its cache in-process build it here)."""
    return CacheConfig(
        mode=settings.faiss_cache,
        snapshot_root=settings.ingest.vector_root(settings.database.data_dir),
        max_bytes=settings.faiss_max_bytes,
        cpu_broad_scan_max=settings.faiss_cpu_broad_scan_max,
        threads=settings.faiss_threads,
        packed_scope_rows=settings.faiss_packed_scope_rows,
        packed_max_bytes=settings.faiss_packed_bytes,
    )


async def _vector_cache_ctx(app: web.Application) -> AsyncIterator[None]:
    """The FAISS cache: loads in the background (pgvector serves until a partition is ready)."""
    settings = app[SETTINGS_KEY]
    if settings.faiss_cache == "off":
        yield
        return
    # Deliberately lazy: FAISS (a heavy optional dependency) loads only when a cache is configured.
    from index.vectors.cache import VectorCache
    from index.vectors.faiss_backend import gpu_available
    from index.vectors.mapped_cache import MappedVectorCache

    if settings.faiss_cache == "auto" and not gpu_available():
        # Measured on CPU (issue 15): the flat scan made the gateway slower than pgvector's HNSW at
        # every size tried, while HNSW kept full recall, so `auto` caches on a GPU only.
        log.info("FAISS cache off: RAG_FAISS_CACHE=auto caches on a GPU only (set cpu to force it)")
        yield
        return

    # mmap: every worker maps the snapshots `mnemo vectors follow` writes, instead of loading the store.
    kind = MappedVectorCache if settings.faiss_cache == "mmap" else VectorCache
    cache = kind(
        app[POOL_KEY],
        app[DATABASE_URL_KEY],
        vector_cache_config(settings),
        CacheMetrics(app[METRICS_KEY].registry),
    )
    app[VECTOR_CACHE_KEY] = cache
    await cache.start()
    try:
        yield
    finally:
        await cache.stop()


async def _lexical_index_ctx(app: web.Application) -> AsyncIterator[None]:
    """The lexical engine (``RAG_LEXICAL_INDEX``): the Tantivy indexes on disk (``auto``, the default,
    or ``tantivy``: opened read-only on first search, the SQL leg serving a partition without one;
    their writer is ``mnemo lexical follow``), or none (``off``: the SQL leg alone). Never fails the
    start for a missing index."""
    settings = app[SETTINGS_KEY]
    if settings.lexical_index == "off":
        yield
        return
    # Its statistics from its index, held as long as the SQL leg's (RAG_LEXICAL_STATS_TTL).
    root = settings.ingest.lexical_root(settings.database.data_dir)
    config = TantivyConfig(
        stats_ttl_s=settings.lexical_stats_ttl, max_behind=settings.ingest.lexical_max_behind
    )
    metrics = LexicalMetrics(app[METRICS_KEY].registry)
    engine = TantivyLexical(root, config, metrics=metrics, mode=settings.lexical_index)
    app[LEXICAL_INDEX_KEY] = engine
    await engine.start()
    try:
        yield
    finally:
        await engine.stop()


async def _read_pool(app: web.Application, session: Mapping[str, str]) -> ReadPool:
    """Retrieval read connections whose sessions open with ``session``, released without asyncpg's
    reset query: their users leave no session state (SET LOCAL only), and the reset cost a round
    trip plus RESET ALL / CLOSE ALL / UNLISTEN on the server per leg (issue 15). With
    ``RAG_DATABASE_READ_URL``, a streaming replica serves them while it is up and fresh."""
    database = app[SETTINGS_KEY].database
    primary = await create_pool(
        app[DATABASE_URL_KEY], max_size=database.read_pool_size, reset_session=False, session=session
    )
    reads = ReadPool(
        primary,
        database.read_url,
        max_size=database.read_pool_size,
        session=session,
        max_lag_s=database.read_max_lag,
        check_interval_s=database.read_check_interval,
    )
    await reads.start()
    return reads


async def _retriever_ctx(app: web.Application) -> AsyncIterator[None]:
    """The retrieval engines (text, and image beside it), with their own sidecar client: one quick
    retry, then a 503 for the caller."""
    settings = app[SETTINGS_KEY]
    # Its own pools of read connections (_read_pool). The legs' sessions open with the legs'
    # settings, so a leg is one round trip, not three (issue 27). Writes, the drain's advisory
    # lock and the cache's listener stay on the main pool.
    reads = await _read_pool(
        app, read_session_settings(settings.hnsw_ef_search, settings.hnsw_max_scan_tuples)
    )
    # The lexical engine's re-read, planned once per session: a pool of its own, since the legs'
    # sessions plan every statement with its values (index.search.read_settings says why each).
    rereads = await _read_pool(app, PLANNED_ONCE)
    app[READ_POOL_KEY] = reads
    app[METRICS_KEY].watch_read_pool(reads.status)
    client = settings.sidecar.client(max_retries=1)
    # Built with the cache and the lexical engine (their contexts come first); both may still be
    # loading, and pgvector and the SQL leg serve until a partition is ready.
    engines = build_retrieval(
        reads,
        client,
        settings,
        app[METRICS_KEY],
        vector_cache=app.get(VECTOR_CACHE_KEY),
        lexical_engine=app.get(LEXICAL_INDEX_KEY),
        corpus_stats=app[CORPUS_STATS_KEY],
        reread_pool=rereads,
    )
    app[QUERY_SIDECAR_KEY] = client
    app[RETRIEVER_KEY] = engines.retriever
    app[OBJECTS_KEY] = engines.objects
    app[WINDOWS_KEY] = engines.windows
    # Expired corpus statistics are recounted in the background on the read pool (index.search.bm25).
    app[CORPUS_STATS_KEY].refresh_on(reads)
    try:
        yield
    finally:
        await app[CORPUS_STATS_KEY].stop()
        await client.close()
        await reads.close()
        await rereads.close()


async def _ask_ctx(app: web.Application) -> AsyncIterator[None]:
    """The passage steps (the reranker on the query side's sidecar client, expansion's widths) and
    ask's generator and section store."""
    settings = app[SETTINGS_KEY]
    client, retriever = app[QUERY_SIDECAR_KEY], app[RETRIEVER_KEY]
    reranker = Reranker(client, settings.sidecar.rerank_model, settings.ask.rerank_timeout, app[METRICS_KEY])
    provider = build_provider(settings.ask, client, retriever.text_model)
    app[PASSAGES_KEY] = PassageServices.configured(reranker, settings.ask)
    app[ASK_KEY] = AskServices(settings.ask, provider, SectionStore(app[POOL_KEY]), app[METRICS_KEY])
    try:
        yield
    finally:
        await provider.close()


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers."""
    return envelope_ok(request, {"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: the database answers a query and the sidecar reports ready."""
    database = False
    try:
        database = await request.app[POOL_KEY].fetchval("SELECT 1", timeout=READY_TIMEOUT_S) == 1
    except Exception as exc:
        log.warning("readiness: database check failed: %s", exc)
    try:
        sidecar = await asyncio.wait_for(request.app[SIDECAR_KEY].ready(), READY_TIMEOUT_S)
    except TimeoutError:
        sidecar = False
    if not (database and sidecar):
        down = [name for name, up in (("database", database), ("sidecar", sidecar)) if not up]
        raise ApiError("service.unavailable", "Not ready: " + ", ".join(down) + " unreachable")
    # Search still serves while a crashed drain waits to restart, so readiness holds; the drain's
    # state is reported here so that a monitor sees records are not being indexed.
    drain = request.app.get(DRAIN_KEY)
    drain_status = drain.status() if drain is not None else None
    status = "degraded" if drain_status and drain_status["state"] == "crashed" else "ready"
    settings = request.app[SETTINGS_KEY]
    cache = request.app.get(VECTOR_CACHE_KEY)
    lexical = request.app.get(LEXICAL_INDEX_KEY)
    # A cold or lagging cache does not make the gateway unready either: pgvector answers meanwhile.
    # Not running: off, or auto without a GPU (the configured mode says which).
    faiss = {"mode": settings.faiss_cache, "running": False} if cache is None else cache.status()
    lexical_detail: dict[str, object] = {"mode": "off", "running": False}
    async with request.app[POOL_KEY].acquire() as conn:
        partitions = await list_partitions(conn)
        # Each index folder's state in the one vocabulary (index.follow.folder_state), as `mnemo
        # lexical status` and `mnemo vectors status` say it.
        if cache is not None and settings.faiss_cache == "mmap":
            changes = settings.ingest.vector_snapshot_changes
            faiss["snapshots"] = await cache.snapshots(conn, partitions, changes)
        if lexical is not None:
            lexical_detail = await lexical.status(conn, partitions)
    replica = request.app[READ_POOL_KEY].status().as_dict()
    return envelope_ok(
        request,
        {
            "status": status,
            "database": True,
            "sidecar": True,
            "drain": drain_status,
            "faiss": faiss,
            # Like the cache: a cold lexical index leaves the SQL leg serving, the gateway stays ready.
            "lexical_index": lexical_detail,
            "read_replica": replica,
        },
    )


async def metrics(request: web.Request) -> web.Response:
    """Prometheus exposition of this gateway's metrics (behind ``RAG_METRICS_TOKEN`` when set)."""
    expected = request.app[SETTINGS_KEY].metrics_token
    if expected is not None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if not token:
            raise ApiError.not_logged()
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected.encode()):
            raise ApiError.invalid_token("The metrics token is invalid")
    body, content_type = request.app[METRICS_KEY].render()
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response


def _add_engine(app: web.Application, settings: GatewaySettings, metrics: Metrics | None = None) -> None:
    """The resources every action runs on: database pool, sidecar clients, retrieval, ask services."""
    app[SETTINGS_KEY] = settings
    app[METRICS_KEY] = metrics or Metrics()
    app[CORPUS_STATS_KEY] = CorpusStats(ttl=settings.lexical_stats_ttl)
    app.cleanup_ctx.append(_database_ctx)
    app.cleanup_ctx.append(_budgets_ctx)
    app.cleanup_ctx.append(_sidecar_ctx)
    # The cache and the lexical engine before the retriever, which is built with them.
    app.cleanup_ctx.append(_vector_cache_ctx)
    app.cleanup_ctx.append(_lexical_index_ctx)
    app.cleanup_ctx.append(_retriever_ctx)
    app.cleanup_ctx.append(_ask_ctx)


def create_engine(settings: GatewaySettings) -> web.Application:
    """The gateway's engine without routes or the ingestion drain: what ``mnemo mcp`` runs the
    actions on (start it with ``web.AppRunner(engine).setup()``)."""
    app = web.Application()
    _add_engine(app, settings)
    return app


def create_app(
    settings: GatewaySettings,
    *,
    database_url: str | None = None,
    metrics_dir: Path | None = None,
    workers: int = 1,
) -> web.Application:
    """The gateway app. ``database_url`` overrides the configured database (tests, eval).
    ``metrics_dir`` and ``workers``: the multi-process metrics folder of a worker of ``mnemo gateway
    --workers N``, and N."""
    if database_url is not None:
        settings = dataclasses.replace(
            settings, database=dataclasses.replace(settings.database, database_url=database_url)
        )
    app = web.Application(
        middlewares=[observe_middleware, error_middleware, concurrency_middleware(settings.max_concurrency)],
        client_max_size=settings.max_body_bytes,
        handler_args=handler_args(settings),
    )
    _add_engine(app, settings, Metrics(multiprocess_dir=metrics_dir))
    app[WORKERS_KEY] = workers
    setup_auth(app, settings)
    app.router.add_post("/api/v1/json", json_api)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    setup_intake(app)
    setup_thumbnails(app)
    setup_budget_routes(app)
    setup_openai_routes(app)
    app.router.add_get("/openapi.json", openapi)
    setup_console(app)
    return app


async def serve(
    app: web.Application,
    host: str,
    port: int,
    *,
    shutdown_timeout: float = 30.0,
    stop: asyncio.Event | None = None,
    started: asyncio.Event | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set), then drain in-flight requests and close.

    ``sock``: a listening socket to accept on instead of binding ``host:port``: the one that every
    worker of ``mnemo gateway --workers N`` shares (:mod:`gateway.run.processes`)."""
    loop = asyncio.get_running_loop()
    installed = []
    if stop is None:  # the process's own server: signals stop it
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
                installed.append(sig)
            except (NotImplementedError, RuntimeError):  # not the main thread
                pass
    runner = GatewayRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port) if sock is None else web.SockSite(runner, sock)
        await site.start()
        event_loop = loop_name(loop)
        log.info(
            "gateway listening on http://%s:%s (event loop: %s)",
            host,
            port,
            event_loop,
            extra={"host": host, "port": port, "event_loop": event_loop},
        )
        if started is not None:
            started.set()
        await stop.wait()
        log.info("stopping: finishing in-flight requests (up to %.0fs)", shutdown_timeout)
    finally:
        await runner.cleanup()
        for sig in installed:
            loop.remove_signal_handler(sig)
    log.info("gateway stopped")
