"""The gateway benchmarks' shared parts: the corpus, the ``mnemo gateway`` process, the legs' SQL.

The gateway and scale suites (:mod:`benchmarks.suite_gateway`, :mod:`benchmarks.search_scale`) and
the reliability suite's gateway faults build on these: real sentences of the bundled data sets
(:func:`load_sentences`, :func:`load_queries`), each chunk's vector from the sidecar or a seeded
mixture of those (:func:`load_corpus`, :func:`mixed_vectors`: a 2-core CPU sidecar would spend the
whole time budget embedding, and latency depends on the index's size and shape, not on which
sentence a vector came from; the texts stay real so the lexical leg sees real term statistics); a
``mnemo gateway`` subprocess (:func:`gateway_process`) and its ``/readyz``; the store's Tantivy index
and vector snapshot as ``mnemo lexical|vectors rebuild`` write them (:func:`writer_rebuild`); and
the legs' SQL as the gateway runs them (:class:`RawLegs`, on :func:`gateway_read_pool`), the baseline
of every gateway figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inference.net import log_tail

from .bulk_load import bulk_load
from .corpus_text import zipf_texts
from .datasets import dataset_dir, read_jsonl
from .measure import folder_mib
from .principals import grant_load_test_budgets, load_test_env
from .processes import serving_subprocess, start_mnemo
from .settings import child_environment

SECTION = "bench1"
SENTENCE_CORPORA = ("med", "xquad-es", "xquad-de", "adi")  # bundled BEIR data sets with prose
CHUNKS_PER_RECORD = 5


def api_request(action: str, **options: Any) -> dict[str, Any]:
    """A ``POST /api/v1/json`` body: the dd_rag_api ``action`` with ``options``."""
    return {"dd_api": "dd_rag_api", "action": action, "options": options}


def load_sentences(minimum: int) -> list[str]:
    """Real sentences of at least 6 words from the bundled BEIR corpora (about 10k), then text drawn
    from real word frequencies (:func:`benchmarks.corpus_text.zipf_texts`) to reach ``minimum``."""
    sentences: list[str] = []
    for name in SENTENCE_CORPORA:
        for doc in read_jsonl(dataset_dir(name), "corpus.jsonl"):
            text = doc.get("text", "").replace("\ufeff", "")
            for s in re.split(r"(?<=[.!?])\s+", text):
                if len(s.split()) >= 6:
                    sentences.append(s.strip())
    return sentences + zipf_texts(max(0, minimum - len(sentences)), np.random.default_rng(0))


def load_queries(n: int) -> list[str]:
    """``n`` of the bundled corpora's queries, in a seeded random order."""
    queries: list[str] = []
    for name in SENTENCE_CORPORA:
        queries += [q["text"] for q in read_jsonl(dataset_dir(name, "queries.jsonl"), "queries.jsonl")]
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
async def gateway_process(
    database_url: str,
    sidecar_url: str,
    secret: str,
    log: Path,
    *,
    text_model: str | None = None,
    source: Path | None = None,
    load_testers: Sequence[str] = (),
    **env: str,
) -> AsyncIterator[GatewayProcess]:
    """``mnemo gateway`` in a subprocess on a free loopback port, ready (``/healthz``); terminated after.

    ``env``: more ``RAG_*`` settings for it. ``source``: a source tree to run the gateway's code from
    (a git worktree of another commit, for an A/B of a code change); None runs this one.
    ``load_testers``: the non-admin principals whose calls the suite loops, set up for a load test
    (:mod:`benchmarks.principals`). The caller may signal or stop the process itself.
    """
    await grant_load_test_budgets(database_url, load_testers)
    env = load_test_env(load_testers) | env
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


async def writer_rebuild(kind: str, database_url: str, root: Path) -> dict[str, float]:
    """``mnemo <kind> rebuild`` as an operator runs it (``lexical``: the store's Tantivy index,
    ``vectors``: its vector snapshot), writing under ``root`` (a gateway's ``RAG_LEXICAL_DIR`` or
    ``RAG_VECTOR_DIR``): its wall time, the writer's peak RSS and peak private (anonymous) memory
    (sampled together every 0.1 s), and the folder's size. The RSS also counts the pages of the files
    the writer maps (the Tantivy segments it merges: the page cache's, shared and reclaimable), the
    private memory does not."""
    log = root.with_name(root.name + "-rebuild.log")
    started = time.perf_counter()
    proc = await start_mnemo([kind, "rebuild", "--database-url", database_url, "--dir", str(root)], log)
    peak = anon = 0
    while proc.returncode is None:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            rss, private = _resident(proc.pid)
            peak, anon = max(peak, rss), max(anon, private)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 0.1)
    if proc.returncode != 0:
        raise RuntimeError(f"mnemo {kind} rebuild failed ({proc.returncode}):\n{log_tail(log)}")
    seconds = time.perf_counter() - started
    return {
        "s": seconds,
        "writer_peak_rss_mib": peak / 2**20,
        "writer_peak_private_mib": anon / 2**20,
        "disk_mib": await asyncio.to_thread(folder_mib, root),
    }


def _resident(pid: int) -> tuple[int, int]:
    """A process's resident memory and its anonymous (private) part, in bytes, from one read of
    ``/proc/<pid>/status`` (``VmRSS``, ``RssAnon``), so the part is never above the whole; (0, 0)
    for a process that has exited (a zombie holds no memory)."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            fields[key] = int(value.split()[0]) * 1024
    return fields.get("VmRSS", 0), fields.get("RssAnon", 0)


async def gateway_read_pool(database_url: str) -> Any:
    """A pool like the gateway's read pool at its default settings: ``RAG_DB_READ_POOL_SIZE``'s size, no
    reset query, sessions opened with the legs' settings. :class:`RawLegs` on it runs the SQL the
    gateway runs, in as many round trips."""
    from gateway.base.settings import GatewaySettings
    from index.search.read_settings import read_session_settings
    from schema import create_pool

    defaults = GatewaySettings()
    session = read_session_settings(defaults.hnsw_ef_search, defaults.hnsw_max_scan_tuples)
    return await create_pool(
        database_url, max_size=defaults.database.read_pool_size, reset_session=False, session=session
    )


class RawLegs:
    """The legs' SQL as the gateway runs them, without HTTP, JSON, fusion or the gate: the product's
    :class:`gateway.retrieval.legs.RetrievalLegs` at the gateway's default settings (its over-fetch,
    its exact-or-HNSW choice per scope, its corpus statistics), with no FAISS cache or lexical
    engine, on a read pool like the gateway's. ``legs`` runs dense and lexical concurrently, each on
    its own connection, as a search does; ``dense`` the dense leg alone. ``scope``: the caller's
    (its ACL push-down), settable between windows."""

    def __init__(self, pool: Any, partition: Any, texts: Sequence[str], vectors: np.ndarray, limit: int,
                 scope: Any = None) -> None:  # fmt: skip
        from gateway.base.metrics import Metrics
        from gateway.base.settings import GatewaySettings
        from gateway.retrieval.legs import RetrievalLegs, over_fetch
        from index.store.hits import Scope

        self.partition, self.texts, self.vectors = partition, texts, vectors
        self.fetch = over_fetch(limit)
        self.scope = Scope() if scope is None else scope
        self.product = RetrievalLegs(pool, GatewaySettings(), Metrics())

    async def dense(self, i: int) -> None:
        vector = self.vectors[i % len(self.vectors)]
        await self.product.dense_leg(self.partition, vector, self.scope, self.fetch)

    async def legs(self, i: int) -> None:
        from gateway.retrieval.query_cache import QueryVector

        vector = QueryVector(self.vectors[i % len(self.vectors)], None)
        text = self.texts[i % len(self.texts)]
        await self.product.gather(self.partition, text, vector, self.scope, self.fetch, ("dense", "lexical"))
