"""Gateway latency and throughput: ``semantic_search`` over HTTP beside the legs' raw SQL, same run.

Setup: at least 10,000 chunks of real sentences (MEDLINE and XQuAD paragraphs
bundled in ``benchmarks/datasets``) in one model partition with its HNSW index. The
first ``--embedded`` sentences get their vectors from the sidecar; the rest get
seeded mixtures of those vectors plus noise, because a 2-core CPU sidecar would
spend the whole time budget embedding. Latency depends on the index's size and
shape, not on which sentence a vector came from; the texts stay real so the
lexical leg sees real term statistics.

Measured: the gateway (a ``mnemo gateway`` subprocess, hybrid retrieval, ACL,
JSON over HTTP, query vectors cached after one warm pass) at concurrency 1, 8
and 32, once with the FAISS cache off (``RAG_FAISS_CACHE=off``: the dense leg is
pgvector's HNSW) and once with it on (``auto``, after it has loaded), each point
beside, measured just before it: the legs' SQL as the gateway runs them (dense
and lexical concurrently on two connections of a read pool like the gateway's:
:class:`RawLegs`) and, for continuity with earlier reports, the dense leg's SQL
alone. The overhead ratio is the gateway's p50 over the legs' p50; the
throughput ratio the gateway's requests/s over the legs'.

``python -m benchmarks.gateway`` (a sidecar at ``RAG_SIDECAR_URL``; a throwaway
embedded PostgreSQL unless ``--database-url``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import re
import secrets
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inference.net import ProcessExited, await_ready, free_port, stop_process

from .bulk_load import bulk_load
from .corpus_text import zipf_texts
from .datasets import dataset_dir
from .measure import closed_loop, process_cpu_s, ratio
from .settings import child_environment, configured_database_url, configured_sidecar, configured_text_model

SECTION = "bench1"
SENTENCE_CORPORA = ("med", "xquad-es", "xquad-de", "adi")  # bundled BEIR data sets with prose
CHUNKS_PER_RECORD = 5
CONCURRENCY = (1, 8, 32)
DEFAULT_QUERIES = 200
CACHE_MODES = ("off", "auto")  # the SQL path, then the FAISS cache (RAG_FAISS_CACHE's default)


def load_sentences(minimum: int) -> list[str]:
    """Real sentences of at least 6 words from the bundled BEIR corpora (about 10k), then text drawn
    from real word frequencies (:func:`benchmarks.corpus_text.zipf_texts`) to reach ``minimum``."""
    sentences: list[str] = []
    for name in SENTENCE_CORPORA:
        path = dataset_dir(name) / "corpus.jsonl"
        for line in path.read_text(encoding="utf-8").splitlines():
            text = json.loads(line).get("text", "").replace("\ufeff", "")
            for s in re.split(r"(?<=[.!?])\s+", text):
                if len(s.split()) >= 6:
                    sentences.append(s.strip())
    return sentences + zipf_texts(max(0, minimum - len(sentences)), np.random.default_rng(0))


def load_queries(n: int) -> list[str]:
    """``n`` of the bundled corpora's queries, in a seeded random order."""
    queries: list[str] = []
    for name in SENTENCE_CORPORA:
        path = dataset_dir(name, "queries.jsonl") / "queries.jsonl"
        queries += [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]
    rng = np.random.default_rng(7)
    return [queries[i] for i in rng.permutation(len(queries))[:n]]


def mixed_vectors(base: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """``n`` unit vectors, each a random mixture of two base vectors plus a little noise."""
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, len(base), n), rng.integers(0, len(base), n)
    w = rng.uniform(0.5, 1.0, (n, 1)).astype(np.float32)
    out = w * base[i] + (1 - w) * base[j] + rng.normal(0, 0.02, (n, base.shape[1])).astype(np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


async def load_corpus(
    pool: Any,
    client: Any,
    model: Any,
    sentences: Sequence[str],
    embedded: int,
    projects_of: Callable[[int], list[int]] | None = None,
) -> Any:
    """Write the chunks into the model's empty partition (:func:`benchmarks.bulk_load.bulk_load`); returns it.

    ``projects_of(record_id)`` gives each record's projects (default ``[1]`` for all), for callers
    that measure filters of a known selectivity.
    """
    from index.store.partitions import ensure_partition
    from index.store.store import EmbeddingRow
    from index.text import fold

    real = np.asarray((await client.embed(model.id, list(sentences[:embedded]), truncate=True)).embeddings)
    vectors = np.concatenate([real, mixed_vectors(real, len(sentences) - len(real))]).astype(np.float32)
    partition = await ensure_partition(pool, model.id, model.dimension)
    meta = {"contributors": ["c1"], "title": "", "heading_path": []}
    rows = [
        EmbeddingRow(
            "text", SECTION, i // CHUNKS_PER_RECORD + 1, "rag:card", "lg-nolan", i % CHUNKS_PER_RECORD,
            f"b{i}", text, fold(text), vectors[i],
            projects=projects_of(i // CHUNKS_PER_RECORD + 1) if projects_of else [1], chunk_meta=meta,
        )
        for i, text in enumerate(sentences)
    ]  # fmt: skip
    async with pool.acquire() as conn:  # COPY without indexes, one build: minutes, not an hour, at 1M
        await bulk_load(conn, partition, [rows], build_workers=2)
        await conn.execute(f"ANALYZE {partition.table}")
    return partition


@dataclasses.dataclass(frozen=True)
class GatewayProcess:
    """A running ``mnemo gateway`` subprocess: its base URL, the process (to signal) and its log."""

    url: str
    process: asyncio.subprocess.Process
    log: Path


@contextlib.asynccontextmanager
async def serving_subprocess(
    argv: Sequence[str], log: Path, environ: dict[str, str], *, what: str, cwd: Path | None = None
) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """``python argv --port P`` on a free loopback port, ready (``/healthz``); its URL and process.

    Terminated after (killed if it has not exited a minute later); ``what`` names it in the error of
    a start that failed, beside its log."""
    port = free_port()
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *argv, "--port", str(port), env=environ, stdout=out, stderr=out, cwd=cwd
        )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            await await_ready(url, 120.0, path="/healthz", process=proc)
        except (ProcessExited, TimeoutError) as exc:
            raise RuntimeError(f"{what} did not start ({exc}); see {log}") from exc
        yield url, proc
    finally:
        await stop_process(proc)


@contextlib.asynccontextmanager
async def gateway_process(
    database_url: str,
    sidecar_url: str,
    secret: str,
    log: Path,
    *,
    text_model: str | None = None,
    source: Path | None = None,
    **env: str,
) -> AsyncIterator[GatewayProcess]:
    """``mnemo gateway`` in a subprocess on a free loopback port, ready (``/healthz``); terminated after.

    ``env``: more ``RAG_*`` settings for it. ``source``: a source tree to run the gateway's code from
    (a git worktree of another commit, for an A/B of a code change); None runs this one. The caller
    may signal or stop the process itself.
    """
    # One process unless asked (RAG_GATEWAY_WORKERS in ``env``): the suites read the CPU time of
    # the process they measure, and the workers of `--workers N` are its children. The setting,
    # not the flag, so a tree from before the flag (levers' @TREE) starts the same way.
    extra = {"RAG_GATEWAY_WORKERS": "1"} | ({"RAG_TEXT_MODEL": text_model} if text_model else {}) | env
    environ = child_environment(RAG_JWT_SECRET=secret, RAG_LOG_FORMAT="json", RAG_AUTH="jwt", **extra)
    argv = ["-m", "gateway.cli", "gateway", "--database-url", database_url, "--sidecar-url", sidecar_url]
    async with serving_subprocess(argv, log, environ, what="the gateway", cwd=source) as (url, proc):
        yield GatewayProcess(url, proc, log)


async def readyz_until(
    session: Any,
    url: str,
    part: str,
    settled: Callable[[dict[str, Any]], bool],
    wait_s: float,
    interval: float,
) -> dict[str, Any]:
    """Ask the gateway's ``/readyz`` every ``interval`` s until ``settled`` holds for its ``part``
    (``faiss``, ``lexical_index``); that part's status. A 503 (not ready: the sidecar's probe can
    time out on a loaded machine) is asked again; past ``wait_s`` a TimeoutError names the last answer.
    """
    deadline = time.monotonic() + wait_s
    while True:
        async with session.get(url + "/readyz") as r:
            body = await r.json()
        status = body["data"][part] if r.status == 200 else body
        if r.status == 200 and settled(status):
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gateway's {part} did not settle in {wait_s:.0f} s: {status}")
        await asyncio.sleep(interval)


def partition_states(status: dict[str, Any]) -> set[str]:
    """The states of a ``/readyz`` part's partitions (``loading``, ``ready``, ``failed`` ...)."""
    return {p["state"] for p in status.get("partitions", {}).values()}


async def cache_ready(session: Any, url: str, wait_s: float = 300.0) -> dict[str, Any]:
    """Wait until the gateway's FAISS cache holds every partition (``/readyz``); its status.

    A cache that is off, over budget or failed returns at once: the SQL path serves then.
    """

    def settled(faiss: dict[str, Any]) -> bool:
        states = partition_states(faiss)
        return not faiss.get("running", True) or bool(states and "loading" not in states)

    return await readyz_until(session, url, "faiss", settled, wait_s, 0.5)


async def tantivy_index(database_url: str, partition: Any, root: Path) -> Path:
    """The store's Tantivy index of ``partition`` under ``root`` (a gateway's ``RAG_LEXICAL_DIR``),
    built as ``mnemo lexical rebuild`` builds it: what a ``RAG_LEXICAL_INDEX=auto|tantivy`` gateway
    reads from its start."""
    from index.lexical.writer import LexicalWriter
    from schema import create_pool

    pool = await create_pool(database_url, max_size=4)
    writer = LexicalWriter(pool, database_url, root)
    try:
        await writer.rebuild(partition, lambda _n: None)
    finally:
        await writer.stop()
        await pool.close()
    return root


async def gateway_read_pool(database_url: str) -> Any:
    """A pool like the gateway's read pool at its default settings: ``RAG_DB_POOL_SIZE``'s size, no
    reset query, sessions opened with the legs' settings. :class:`RawLegs` on it runs the SQL the
    gateway runs, in as many round trips."""
    from gateway.base.settings import GatewaySettings
    from index.search.read_settings import read_session_settings
    from schema import create_pool

    defaults = GatewaySettings()
    session = read_session_settings(defaults.hnsw_ef_search, defaults.hnsw_max_scan_tuples)
    return await create_pool(
        database_url, max_size=defaults.database.pool_size, reset_session=False, session=session
    )


class RawLegs:
    """The legs' SQL run directly, as the gateway runs them: dense and lexical concurrently, each on
    its own connection of a read pool like the gateway's (no reset query), corpus statistics cached.
    The gateway's over-fetch (``max(limit * 4, 20)``) and scope; no HTTP, JSON, fusion or gate.

    A scoped dense leg takes the gateway's path too: exact where the gateway's default
    ``RAG_DENSE_EXACT_MAX_ROWS`` sends the scope (:func:`index.search.dense_leg.reads_exactly`, decided once
    per scope as the gateway remembers it), HNSW otherwise. Without it the baseline of a 10% caller
    was an HNSW scan while the gateway read the scope's 10,000 rows exactly, and the suite put that
    difference on the gateway (2.9x its "own cost" at 100k chunks, 2026-12-03)."""

    def __init__(self, pool: Any, partition: Any, texts: Sequence[str], vectors: np.ndarray, limit: int):
        from gateway.base.settings import GatewaySettings
        from index.search.bm25 import CorpusStats
        from index.store.hits import Scope

        self.pool, self.partition, self.texts, self.vectors = pool, partition, texts, vectors
        self.fetch = max(limit * 4, 20)
        self.stats = CorpusStats(ttl=3600.0)
        self.scope = Scope()
        self.exact_max_rows = GatewaySettings().dense_exact_max_rows
        self._exact: dict[Any, bool] = {}  # scope_key -> the exact path's decision

    async def dense(self, i: int) -> None:
        from index.search.dense_leg import dense_search

        vector = self.vectors[i % len(self.vectors)]
        async with self.pool.acquire() as conn:
            exact = await self._reads_exactly(conn, vector)
            await dense_search(conn, self.partition, vector, self.scope, self.fetch, exact=exact)

    async def _reads_exactly(self, conn: Any, vector: np.ndarray) -> bool:
        from index.search.dense_leg import reads_exactly
        from index.store.hits import scope_key

        key = scope_key(self.scope)
        if key not in self._exact:
            self._exact[key] = await reads_exactly(
                conn, self.partition, vector, self.scope, self.fetch, self.exact_max_rows
            )
        return self._exact[key]

    async def lexical(self, i: int) -> None:
        from index.search.lexical_leg import lexical_search

        async with self.pool.acquire() as conn:
            await lexical_search(
                conn,
                self.partition,
                self.texts[i % len(self.texts)],
                self.scope,
                self.fetch,
                stats=self.stats,
            )

    async def legs(self, i: int) -> None:
        await asyncio.gather(self.dense(i), self.lexical(i))


def _load_dict(result: Any) -> dict[str, Any]:
    d = result.as_dict()
    lat = d.pop("latency_s")
    d["latency_ms"] = {k: round(v * 1000, 3) for k, v in lat.items() if k != "n"}
    d["requests_per_s"] = round(d["requests_per_s"], 1)
    return {k: v for k, v in d.items() if k not in ("items_per_request", "items_per_s")}


def _searcher(session: Any, url: str, texts: Sequence[str], limit: int) -> Callable[[int], Awaitable[None]]:
    """``semantic_search`` of the ``i``-th query (cycling) through the gateway at ``url``; anything
    but a 200 with ``limit`` hits stops the run."""

    async def search(i: int) -> None:
        body = {"dd_api": "dd_rag_api", "action": "semantic_search",
                "options": {"query": texts[i % len(texts)], "limit": limit}}  # fmt: skip
        async with session.post(url + "/api/v1/json", json=body) as r:
            payload = await r.json()
            if r.status != 200 or len(payload["data"]) != limit:
                raise RuntimeError(f"semantic_search failed: {r.status} {payload}")

    return search


async def _point(raw: RawLegs, search: Any, load: Any, pid: int, c: int) -> dict[str, Any]:
    """The gateway at ``c`` callers beside the baselines measured just before it (the legs' SQL,
    the dense leg's alone), with the gateway process's CPU per request."""
    legs, dense = await load(raw.legs, c), await load(raw.dense, c)
    cpu_before = process_cpu_s(pid)
    gw = await load(search, c)
    cpu_ms = (process_cpu_s(pid) - cpu_before) * 1000 / max(1, gw.requests)
    return {
        "concurrency": c,
        "gateway": _load_dict(gw) | {"cpu_ms_per_request": round(cpu_ms, 3)},
        "raw_legs_sql": _load_dict(legs),
        "raw_dense_sql": _load_dict(dense),
        "overhead_p50": round(ratio(gw.latency.median, legs.latency.median), 2),
        "throughput_ratio": round(ratio(gw.requests_per_s, legs.requests_per_s), 3),
        "overhead_p50_vs_dense": round(ratio(gw.latency.median, dense.latency.median), 2),
        "throughput_ratio_vs_dense": round(ratio(gw.requests_per_s, dense.requests_per_s), 3),
    }


async def _measure_cache(
    urls: tuple[str, str, str, str], model: str, cache: str, workdir: Path, raw: RawLegs, load: Any,
    queries: tuple[Sequence[str], int, Sequence[int]], first_pass: bool,
) -> tuple[dict[str, Any], Any]:  # fmt: skip
    """One gateway with ``RAG_FAISS_CACHE=cache`` (once its cache is ready): its points per caller
    count and the legs' mean times from its metrics, and its cold first pass when asked for (the
    first gateway's, which embeds every query); ``urls``: the database, the sidecar, the token secret
    and the bearer token."""
    import aiohttp

    database_url, sidecar_url, secret, bearer = urls
    texts, limit, concurrency = queries
    log = workdir / f"gateway-{cache}.log"
    async with gateway_process(
        database_url, sidecar_url, secret, log, text_model=model, RAG_FAISS_CACHE=cache
    ) as gateway:
        connector = aiohttp.TCPConnector(limit=max(concurrency) * 2)
        headers = {"Authorization": f"Bearer {bearer}"}
        async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
            status = await cache_ready(session, gateway.url)
            search = _searcher(session, gateway.url, texts, limit)
            first = await load(search, 1) if first_pass else None  # embeds every query
            for i in range(len(texts)):
                await search(i)
            rows = [await _point(raw, search, load, gateway.process.pid, c) for c in concurrency]
            async with session.get(gateway.url + "/metrics") as r:
                metrics_text = await r.text()
    return {"faiss": status, "by_concurrency": rows, "leg_mean_ms": _leg_means(metrics_text)}, first


@contextlib.asynccontextmanager
async def bench_database(database_url: str | None, workdir: Path) -> AsyncIterator[str]:
    """``database_url`` migrated, or a throw-away embedded server in ``workdir`` (stopped after)."""
    from schema import EmbeddedPostgres, migrate

    embedded = None
    if database_url is None:
        embedded = EmbeddedPostgres(workdir / "pg")
        database_url = embedded.start()
    try:
        await migrate(database_url)
        yield database_url
    finally:
        if embedded is not None:
            embedded.stop()


async def run_gateway_benchmark(
    *,
    sidecar_url: str,
    database_url: str | None = None,
    chunks: int = 10_000,
    embedded: int = 1_000,
    queries: int = DEFAULT_QUERIES,
    requests: int = 600,
    max_seconds: float = 30.0,
    concurrency: Sequence[int] = CONCURRENCY,
    limit: int = 10,
    text_model: str | None = None,
    caches: Sequence[str] = CACHE_MODES,
) -> dict[str, Any]:
    """Set up the corpus, measure the gateway (per FAISS cache mode) beside the legs' raw SQL."""
    from gateway.access.auth import issue_token
    from index.models import resolve_model
    from inference.client import SidecarClient

    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="mnemo-bench-gateway-"))
    async with bench_database(database_url, workdir) as database_url:
        pool = await gateway_read_pool(database_url)
        async with SidecarClient(sidecar_url) as client:
            model = await resolve_model(client, "text", text_model)
            sentences = load_sentences(chunks)[:chunks]
            partition = await load_corpus(pool, client, model, sentences, min(embedded, chunks))
            texts = load_queries(queries)
            qvecs = np.asarray(
                (await client.embed(model.id, texts, truncate=True)).embeddings, dtype=np.float32
            )
        setup_s = time.perf_counter() - started
        raw = RawLegs(pool, partition, texts, qvecs, limit)
        for i in range(len(qvecs)):  # warm the buffer cache and the statistics like the gateway's warm pass
            await raw.legs(i)

        async def load(call: Callable[[int], Any], c: int) -> Any:
            return await closed_loop(call, concurrency=c, requests=requests, max_seconds=max_seconds)

        secret = secrets.token_urlsafe(48)
        bearer = issue_token(secret=secret, sub="bench", projects=None, admin=True)
        by_cache: dict[str, Any] = {}
        cold = None
        for cache in caches:
            by_cache[cache], first = await _measure_cache(
                (database_url, sidecar_url, secret, bearer), model.id, cache, workdir, raw, load,
                (texts, limit, concurrency), cold is None,
            )  # fmt: skip
            cold = cold or first
        await pool.close()

    return {
        "suite": "gateway",
        "chunks": len(sentences),
        "records": (len(sentences) + CHUNKS_PER_RECORD - 1) // CHUNKS_PER_RECORD,
        "model": model.id,
        "embedded_vectors": min(embedded, chunks),
        "queries": len(texts),
        "limit": limit,
        "leg_fetch": raw.fetch,
        "setup_s": round(setup_s, 1),
        "cold_first_pass": _load_dict(cold) if cold is not None else None,
        "by_cache": by_cache,
    }


def _leg_means(metrics_text: str) -> dict[str, float]:
    """Mean seconds per leg (ms) from the gateway's Prometheus text."""
    sums, counts = ({
        m.group(1): float(m.group(2))
        for m in re.finditer(rf'mnemo_retrieval_leg_seconds_{kind}\{{leg="(\w+)"\}} ([0-9.e+-]+)', metrics_text)
    } for kind in ("sum", "count"))  # fmt: skip
    return {k: round(1000 * v / counts[k], 3) for k, v in sums.items() if counts.get(k)}


def render(result: dict[str, Any]) -> str:
    lines = [
        f"gateway: semantic_search (limit {result['limit']}) over {result['chunks']} chunks / "
        f"{result['records']} records, model {result['model']}",
    ]
    for cache, part in result["by_cache"].items():
        lines.append(f"FAISS cache {cache} ({part['faiss'].get('mode')})")
        lines.append(
            f"{'conc':>4}  {'gw p50':>8} {'gw p95':>8} {'gw rps':>8}   {'legs p50':>8} {'legs rps':>8}   "
            f"{'dense p50':>9} {'dense rps':>9}   {'p50 x':>6} {'rps x':>6}   {'p50 x dense':>11} {'gw CPU/req':>10}"
        )
        for row in part["by_concurrency"]:
            g, legs, d = row["gateway"], row["raw_legs_sql"], row["raw_dense_sql"]
            lines.append(
                f"{row['concurrency']:>4}  {g['latency_ms']['median']:>8.2f} {g['latency_ms']['p95']:>8.2f} "
                f"{g['requests_per_s']:>8.1f}   {legs['latency_ms']['median']:>8.2f} {legs['requests_per_s']:>8.1f}   "
                f"{d['latency_ms']['median']:>9.2f} {d['requests_per_s']:>9.1f}   {row['overhead_p50']:>6.2f} "
                f"{row['throughput_ratio']:>6.3f}   {row['overhead_p50_vs_dense']:>11.2f} {g['cpu_ms_per_request']:>10.3f}"
            )
        lines.append(f"  mean per leg inside the gateway (ms): {part['leg_mean_ms']}")
    lines.append(
        "  (ms; gateway = HTTP + JWT + dense and lexical legs + fusion + ACL gate + JSON; legs = the dense "
        "and lexical SQL run concurrently as the gateway runs them; dense = the dense SQL alone; gw CPU/req = the "
        "gateway process's CPU time over its window per request served)"
    )
    if result["cold_first_pass"]:
        cold = result["cold_first_pass"]["latency_ms"]
        lines.append(
            f"  first pass, query embedding included: p50 {cold['median']:.1f} ms, p95 {cold['p95']:.1f} ms"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gateway", description=__doc__.splitlines()[0])
    p.add_argument("--sidecar-url", default=None, help="default: RAG_SIDECAR_URL, else http://127.0.0.1:8001")
    p.add_argument("--database-url", default=None, help="default: RAG_DATABASE_URL, else embedded")
    p.add_argument("--text-model", default=None, help="default: RAG_TEXT_MODEL, else the first text model")
    p.add_argument("--chunks", type=int, default=10_000)
    p.add_argument("--embedded", type=int, default=1_000, help="chunks whose vectors come from the sidecar")
    p.add_argument(
        "--requests", type=int, default=600, help="requests per concurrency level (bounded by time)"
    )
    p.add_argument("--max-seconds", type=float, default=30.0)
    p.add_argument(
        "--caches", default=",".join(CACHE_MODES), help="RAG_FAISS_CACHE values to measure, in order"
    )
    p.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    result = asyncio.run(
        run_gateway_benchmark(
            sidecar_url=configured_sidecar(args.sidecar_url).sidecar_url,
            database_url=configured_database_url(args.database_url),
            text_model=configured_text_model(args.text_model),
            chunks=args.chunks,
            embedded=args.embedded,
            requests=args.requests,
            max_seconds=args.max_seconds,
            caches=tuple(args.caches.split(",")),
            concurrency=tuple(int(c) for c in args.concurrency.split(",")),
        )
    )
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
