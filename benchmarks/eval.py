"""The retrieval-quality harness: a BEIR data set through the real intake, drain and retrieval code.

:func:`load_beir` reads ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/test.tsv``.
:class:`EvalSession` ingests the corpus into its own section (descriptor, then
``enqueue_records`` + a drain pass scoped to that section, exactly what
``POST /v1/records`` and the gateway's drain do; beside a running gateway it waits
for whichever drain takes its records), asks every query through :class:`gateway.retrieval.retriever.Retriever`
with ``limit`` 100 (the API's [1, 50] clamp is the API's, not retrieval's) and
scores nDCG@10, recall@100 and MRR@10 per mode:

- ``dense``, ``lexical``, ``sparse``: one leg alone;
- ``hybrid``: every leg the model supports, fused with the configured weights.

The lexical leg is the gateway's (``RAG_LEXICAL_INDEX``): the SQL leg, or the Tantivy engine over
an index built from the ingested store by the lexical writer's own build (:func:`lexical_engine`).
:meth:`EvalSession.lexical_legs` asks another engine (:data:`LEXICAL_ENGINES`: Tantivy) for every
query's lexical leg beside the legs already fetched, so one run scores engines side by side.

Each query's legs are fetched once and fused per mode, which is the same as
running each mode on its own (the legs are independent); :meth:`EvalSession.tune`
reuses them to choose the fusion method and weights by 2-fold cross-validation
(:mod:`benchmarks.tuning`), and :func:`apply_tuning` stores a choice in a section's
descriptor. Nothing here is read at query time by the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import re
import tempfile
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import asyncpg

from gateway.access.acl import pushdown
from gateway.access.auth import Principal
from gateway.base.settings import FUSION_METHODS, LEGS, GatewaySettings
from gateway.retrieval.engines import build_retrieval
from gateway.retrieval.fusion import collapse
from gateway.retrieval.legs import LegResults, over_fetch
from gateway.retrieval.retriever import Retriever
from index.lexical.engine import MODE as TANTIVY_MODE
from index.lexical.engine import TantivyConfig, TantivyLexical
from index.lexical.metrics import LexicalMetrics
from index.search.bm25 import CorpusStats
from index.search.lexical_engine import LexicalEngine
from index.store.hits import Scope
from index.store.partitions import ModelPartition

from .datasets import read_jsonl

log = logging.getLogger(__name__)

MODES = ("dense", "lexical", "sparse", "hybrid")
# The lexical engines :func:`lexical_engine` builds from an evaluation's store (``--lexical-engines``).
LEXICAL_ENGINES = (TANTIVY_MODE,)
EVAL_LIMIT = 100
METRICS = ("ndcg@10", "recall@100", "mrr@10")
EVAL_PRINCIPAL = Principal("mnemo-eval", projects=None, admin=True)
TUNE_GRID = (0.25, 0.5, 1.0, 2.0, 4.0)  # lexical (and sparse) weight, dense fixed at 1


@dataclass(frozen=True)
class BeirDataset:
    name: str
    corpus: dict[str, tuple[str, str]]  # doc id -> (title, text), in file order
    queries: dict[str, str]  # query id -> text (only queries with judgments)
    qrels: dict[str, dict[str, int]]  # query id -> doc id -> relevance


def load_beir(directory: Path) -> BeirDataset:
    """A BEIR-layout data set; queries without judgments in ``qrels/test.tsv`` are skipped."""
    directory = Path(directory)
    corpus = {
        str(doc["_id"]): (str(doc.get("title") or ""), str(doc.get("text") or ""))
        for doc in read_jsonl(directory, "corpus.jsonl")
    }
    qrels: dict[str, dict[str, int]] = {}
    with open(directory / "qrels" / "test.tsv", encoding="utf-8") as f:
        for i, line in enumerate(f):
            parts = line.rstrip("\n").split("\t")
            if (i == 0 and parts[0] == "query-id") or len(parts) < 3:
                continue
            qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    queries = {
        str(q["_id"]): str(q["text"])
        for q in read_jsonl(directory, "queries.jsonl")
        if str(q["_id"]) in qrels
    }
    return BeirDataset(directory.name, corpus, queries, {q: qrels[q] for q in queries})


# -- metrics (trec_eval conventions: linear gain, relevance > 0 is relevant) ------------------------


def ndcg_at(ranked: Sequence[str], rels: Mapping[str, int], k: int = 10) -> float:
    dcg = sum(rels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted((r for r in rels.values() if r > 0), reverse=True)[:k]
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at(ranked: Sequence[str], rels: Mapping[str, int], k: int = 100) -> float:
    relevant = {d for d, r in rels.items() if r > 0}
    return len(relevant & set(ranked[:k])) / len(relevant) if relevant else 0.0


def mrr_at(ranked: Sequence[str], rels: Mapping[str, int], k: int = 10) -> float:
    for i, d in enumerate(ranked[:k]):
        if rels.get(d, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def per_query_metrics(
    runs: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, float]]:
    """nDCG@10, recall@100 and MRR@10 of every judged query (a missing run scores 0)."""
    out = {}
    for qid, rels in qrels.items():
        ranked = runs.get(qid, [])
        out[qid] = {
            "ndcg@10": ndcg_at(ranked, rels),
            "recall@100": recall_at(ranked, rels),
            "mrr@10": mrr_at(ranked, rels),
        }
    return out


def score_runs(runs: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    """Mean nDCG@10, recall@100 and MRR@10 over every judged query (a missing run scores 0)."""
    if not qrels:
        return dict.fromkeys(METRICS, 0.0)
    per_query = per_query_metrics(runs, qrels)
    return {m: round(sum(q[m] for q in per_query.values()) / len(per_query), 4) for m in METRICS}


def section_for(name: str) -> str:
    """The eval's own section tipo for a data set name (``xquad-es`` -> ``eval_xquad_es``)."""
    return "eval_" + (re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "dataset")[:40]


def format_table(results: Mapping[str, Mapping[str, float]], title: str = "") -> str:
    width = max([len(n) for n in results] + [10])
    lines = [title] if title else []
    lines.append(f"{'mode':<{width}}  " + "  ".join(f"{m:>10}" for m in METRICS))
    for name, row in results.items():
        lines.append(f"{name:<{width}}  " + "  ".join(f"{row.get(m, float('nan')):>10.4f}" for m in METRICS))
    return "\n".join(lines)


async def index_section(
    pool: asyncpg.Pool,
    client: Any,
    settings: Any,  # index.settings.IngestSettings
    section_tipo: str,
    *,
    text_model: str | None,
    max_wait: float = 3600.0,
    poll: float = 0.5,
) -> dict[str, Any]:
    """Drain ``section_tipo``'s queued records and wait until none is left; other sections' stay queued.

    Beside a running gateway, its drain may lease some of these records: a scoped
    pass then does part of the work, and we wait for the queue rows to go (whoever
    indexes them). A record that fails (it would be retried only minutes later) or
    a sidecar outage ends the wait with an error.
    """
    from index.ingest.drain import drain_once

    totals: dict[str, Any] = {"passes": 0, "indexed": 0, "chunks_embedded": 0, "rows_written": 0}
    deadline = asyncio.get_running_loop().time() + max_wait
    while True:
        report = await drain_once(
            pool, client, settings, text_model=text_model, section_tipos=(section_tipo,)
        )
        totals["passes"] += 1
        for key in ("indexed", "chunks_embedded", "rows_written"):
            totals[key] += getattr(report, key)
        if report.unavailable:
            raise RuntimeError(f"the corpus was not fully indexed: {report.error}")
        stats = await pool.fetchrow(
            "SELECT count(*) AS queued, count(*) FILTER (WHERE last_error IS NOT NULL) AS failed, "
            "min(last_error) AS error FROM rag_index_queue WHERE section_tipo = $1",
            section_tipo,
        )
        if not stats["queued"]:
            return totals
        if stats["failed"]:
            raise RuntimeError(
                f"the corpus was not fully indexed ({stats['queued']} records still queued, "
                f"{stats['failed']} failing): {stats['error']}"
            )
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(
                f"the corpus was not fully indexed after {max_wait:.0f} s ({stats['queued']} records queued)"
            )
        if not report.processed:  # other workers (the gateway's drain) hold leases on our records
            await asyncio.sleep(poll)


@dataclass
class EvalSession:
    """An ingested data set and the retrieval engine that queries it."""

    dataset: BeirDataset
    pool: asyncpg.Pool
    client: Any  # inference.client.SidecarClient
    retriever: Retriever
    section_tipo: str
    ids: dict[int, str] = field(default_factory=dict)  # section_id -> doc id
    legs: dict[str, LegResults] = field(default_factory=dict)  # query id -> its legs (fetched once)
    database_url: str | None = None  # the store's URL, for a lexical engine's own connections

    async def ingest(self, *, ingest_settings: Any = None, max_wait: float = 3600.0) -> dict[str, Any]:
        """Store the descriptor, queue every document through the intake, index this section only."""
        from index.ingest.intake import enqueue_records
        from index.settings import IngestSettings
        from index.store.sections import SectionStore
        from schema.settings import load_settings

        settings = ingest_settings or load_settings(IngestSettings, {})
        model = await self.retriever.text_model()
        max_tokens = min(450, int((model.max_input_tokens or 512) * 0.85))  # type: ignore[attr-defined]
        await SectionStore(self.pool).put(
            self.section_tipo,
            {
                "embed": [
                    {
                        "id": "doc",
                        "contributors": ["text"],
                        "chunk": {"max_tokens": max_tokens, "min_tokens": max_tokens // 4},
                    }
                ]
            },
        )
        records = []
        for section_id, (doc_id, (title, text)) in enumerate(self.dataset.corpus.items(), start=1):
            self.ids[section_id] = doc_id
            record: dict[str, Any] = {
                "section_tipo": self.section_tipo,
                "section_id": section_id,
                "projects": [],
                "groups": {"doc": {"lg-nolan": text}},
            }
            if title.strip():
                record["title"] = title
            records.append(record)
        for start in range(0, len(records), settings.max_records_per_request):
            await enqueue_records(self.pool, records[start : start + settings.max_records_per_request])
        report = await index_section(
            self.pool,
            self.client,
            settings,
            self.section_tipo,
            text_model=self.retriever.settings.sidecar.text_model,
            max_wait=max_wait,
        )
        self.retriever.legs.stats.invalidate()
        return report

    async def partition(self) -> ModelPartition:
        """The text model's partition of the evaluation's store."""
        model = await self.retriever.text_model()
        partition = await self.retriever.partitions.of(model.id)  # type: ignore[attr-defined]
        if partition is None:
            raise RuntimeError("the eval's store holds no partition of the text model")
        return partition

    async def fetch_legs(self, *, concurrency: int = 4) -> None:
        """Every query's legs at ``limit`` 100 (each leg over-fetching ``max(limit * 4, 20)``)."""
        await self.retriever.queries.warm_queries(EVAL_PRINCIPAL, list(self.dataset.queries.values()))
        scope = Scope(section_tipos=(self.section_tipo,))
        gate = asyncio.Semaphore(concurrency)

        async def one(qid: str, text: str) -> None:
            async with gate:
                self.legs[qid] = await self.retriever.query_legs(
                    EVAL_PRINCIPAL, text, scope, over_fetch(EVAL_LIMIT)
                )

        await asyncio.gather(*(one(q, t) for q, t in self.dataset.queries.items() if q not in self.legs))

    async def lexical_legs(self, engine: LexicalEngine) -> dict[str, LegResults]:
        """Every query's legs as fetched, with the lexical leg from ``engine`` instead.

        The engine is asked directly (as :class:`gateway.retrieval.legs.RetrievalLegs` asks it first), so a
        search it declines (None: the gateway's SQL leg would answer) is an error here: the figure
        must be the engine's own, never the SQL leg's under the engine's name.
        """
        partition = await self.partition()
        scope = Scope(section_tipos=(self.section_tipo,), acl=pushdown(EVAL_PRINCIPAL))
        fetch = over_fetch(EVAL_LIMIT)
        out = {}
        async with self.pool.acquire() as conn:
            for qid, legs in self.legs.items():
                hits = await engine.search(conn, partition, self.dataset.queries[qid], scope, fetch)
                if hits is None:
                    raise RuntimeError(f"the lexical engine declined query {qid} (the SQL leg would answer)")
                out[qid] = LegResults({**legs.lists, "lexical": hits}, legs.exact)
        return out

    def available_legs(self) -> list[str]:
        return [leg for leg in LEGS if any(leg in r.lists for r in self.legs.values())]

    def runs(
        self,
        weights: Mapping[str, float],
        method: str | None = None,
        legs: Mapping[str, LegResults] | None = None,
    ) -> dict[str, list[str]]:
        """Fuse each query's legs (``method``, ``weights``), gate, collapse to records: doc ids, best first.

        ``legs``: these instead of the session's (another lexical engine's, :meth:`lexical_legs`)."""
        scope = Scope(section_tipos=(self.section_tipo,))
        out = {}
        for qid, query_legs in (self.legs if legs is None else legs).items():
            ranked = self.retriever.fuse(EVAL_PRINCIPAL, query_legs, scope, weights=weights, method=method)
            records = collapse(ranked, lambda r: r.chunk.record)[:EVAL_LIMIT]
            out[qid] = [self.ids[r.chunk.section_id] for r in records if r.chunk.section_id in self.ids]
        return out

    def mode_weights(self, mode: str) -> dict[str, float]:
        if mode == "hybrid":
            return dict(self.retriever.settings.weights)
        return {leg: (1.0 if leg == mode else 0.0) for leg in LEGS}

    def evaluate(
        self, modes: Iterable[str], legs: Mapping[str, LegResults] | None = None
    ) -> dict[str, dict[str, float]]:
        """Metrics per mode (over ``legs`` when given); a leg the model does not provide (``sparse``
        with MiniLM) is skipped."""
        available = self.available_legs()
        results = {}
        for mode in modes:
            if mode != "hybrid" and mode not in available:
                log.warning("mode %s skipped: the model provides no %s leg", mode, mode)
                continue
            results[mode] = score_runs(self.runs(self.mode_weights(mode), legs=legs), self.dataset.qrels)
        return results

    def tune(self, grid: Sequence[float] = TUNE_GRID) -> dict[str, Any]:
        """Fusion method and per-leg weights (dense fixed at 1), chosen by 2-fold cross-validation.

        ``metrics`` is the cross-validated figure (each query scored by the choice made on the
        other half); ``weights``/``fusion`` are chosen on all queries (what ``--apply`` stores).
        """
        from .tuning import cross_validate

        legs = self.available_legs()
        others = [leg for leg in legs if leg != "dense"]
        candidates = [
            (method, (("dense", 1.0), *zip(others, combo, strict=True)))
            for method in FUSION_METHODS
            for combo in itertools.product(grid, repeat=len(others))
        ]

        def evaluate(candidate: tuple[str, tuple[tuple[str, float], ...]]) -> dict[str, dict[str, float]]:
            method, weights = candidate
            return per_query_metrics(self.runs(dict(weights), method), self.dataset.qrels)

        result = cross_validate(candidates, evaluate, list(self.dataset.qrels))
        method, weights = result["chosen"]
        return {
            "fusion": method,
            "weights": dict(weights),
            "setting": f"RAG_FUSION={method} RAG_FUSION_WEIGHTS="
            + ",".join(f"{k}={v:g}" for k, v in weights),
            "metrics": result["cv"],
            "in_sample": result["in_sample"],
            "folds": [
                {
                    "fusion": f["chosen"][0],
                    "weights": dict(f["chosen"][1]),
                    "train": f["train"],
                    "test": f["test"],
                }
                for f in result["folds"]
            ],
        }

    async def cleanup(self) -> None:
        """Remove the eval section's rows, queue entries and descriptor."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("DELETE FROM rag_embeddings WHERE section_tipo = $1", self.section_tipo)
            await conn.execute("DELETE FROM rag_index_queue WHERE section_tipo = $1", self.section_tipo)
            await conn.execute("DELETE FROM rag_sections WHERE section_tipo = $1", self.section_tipo)


async def apply_tuning(pool: asyncpg.Pool, section_tipo: str, tuned: Mapping[str, Any], dataset: str) -> None:
    """Store ``tuned`` fusion in ``section_tipo``'s descriptor (``retrieval``), which the gateway reads.

    Raises ``LookupError`` when the section has no descriptor (nothing to tune for).
    """
    from index.store.sections import SectionStore

    sections = SectionStore(pool)
    descriptor = await sections.get(section_tipo)
    if descriptor is None:
        raise LookupError(f"section {section_tipo!r} has no descriptor in this database")
    descriptor["retrieval"] = {
        "fusion": tuned["fusion"],
        "weights": dict(tuned["weights"]),
        "tuned_on": {"dataset": dataset, "cross_validated": dict(tuned["metrics"])},
    }
    await sections.put(section_tipo, descriptor)


def searches_served(metrics: LexicalMetrics) -> dict[str, int]:
    """A lexical engine's searches by outcome (``hit``: the engine served; the others: the SQL leg)."""
    return {
        s.labels["result"]: int(s.value)
        for s in metrics.searches.collect()[0].samples
        if s.name.endswith("_total")
    }


@asynccontextmanager
async def lexical_engine(
    mode: str, pool: asyncpg.Pool, database_url: str, partition: ModelPartition, stats: CorpusStats
) -> AsyncIterator[LexicalEngine]:
    """The lexical engine ``mode`` (one of :data:`LEXICAL_ENGINES`) loaded from the store's ``partition``.

    ``tantivy``: an index built in a temporary folder by the lexical writer's own build (what
    ``mnemo lexical rebuild`` runs), then read by the engine the gateway reads it with, its statistics
    held as long as ``stats`` (the SQL leg's); removed afterwards.
    """
    from index.lexical.writer import LexicalWriter

    if mode not in LEXICAL_ENGINES:
        raise ValueError(f"lexical engine {mode!r}: use one of {', '.join(LEXICAL_ENGINES)}")
    with tempfile.TemporaryDirectory(prefix="mnemo-eval-tantivy-") as folder:
        root = Path(folder)
        writer = LexicalWriter(pool, database_url, root)
        try:
            await writer.rebuild(partition)
        finally:
            await writer.stop()
        tantivy = TantivyLexical(root, TantivyConfig(stats_ttl_s=stats.ttl))
        try:
            yield tantivy
        finally:
            await tantivy.stop()


@asynccontextmanager
async def eval_session(
    dataset: BeirDataset,
    settings: GatewaySettings,
    *,
    database_url: str | None = None,
    keep: bool = False,
) -> AsyncIterator[EvalSession]:
    """Open the database (migrated) and the sidecar, ingest the data set, yield; clean up unless ``keep``."""
    from inference.client import SidecarClient
    from schema.database import open_database

    database = (
        settings.database if database_url is None else replace(settings.database, database_url=database_url)
    )
    # Every query's vector stays cached for the whole run (tuning and references reuse them).
    settings = replace(settings, query_cache_size=max(settings.query_cache_size, len(dataset.queries) + 16))
    sidecar = settings.sidecar
    async with (
        open_database(database) as db,
        SidecarClient(
            sidecar.sidecar_url, api_key=sidecar.sidecar_api_key, timeout=sidecar.sidecar_timeout
        ) as client,
        contextlib.AsyncExitStack() as engines,
    ):
        # One statistics cache for the SQL leg and a Tantivy engine's re-read, as the gateway shares it.
        stats = CorpusStats(ttl=settings.lexical_stats_ttl)
        retriever = build_retrieval(db.pool, client, settings, corpus_stats=stats).retriever
        session = EvalSession(
            dataset, db.pool, client, retriever, section_for(dataset.name), database_url=db.url
        )
        engine: LexicalEngine | None = None
        try:
            await session.ingest()
            # `auto` (the default) serves from a writer's index once one exists; a throw-away
            # evaluation store never has one, so the SQL leg answers, as `auto` does without one.
            # `tantivy` is built here from the ingested store.
            if settings.lexical_index == TANTIVY_MODE:
                # The gateway's lexical engine (RAG_LEXICAL_INDEX), loaded from the ingested store,
                # so it joins the retriever after the ingest; its searches by outcome are logged at
                # the end (the SQL leg answers whatever it declines).
                engine = await engines.enter_async_context(
                    lexical_engine(settings.lexical_index, db.pool, db.url, await session.partition(), stats)
                )
                retriever.legs.lexical_engine = engine
            yield session
        finally:
            if engine is not None:
                metrics = engine.metrics  # type: ignore[attr-defined]
                log.info("lexical engine searches by outcome: %s", searches_served(metrics))
            if not keep:
                await session.cleanup()
