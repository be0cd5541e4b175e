"""The retrieval-quality harness: a BEIR data set through the real intake, drain and retrieval code.

:func:`load_beir` reads ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/test.tsv``.
:class:`EvalSession` ingests the corpus into its own section (descriptor, then
``enqueue_records`` + ``drain_once``, exactly what ``POST /v1/records`` and the
gateway's drain do), asks every query through :class:`gateway.retrieval.Retriever`
with ``limit`` 100 (the API's [1, 50] clamp is the API's, not retrieval's) and
scores nDCG@10, recall@100 and MRR@10 per mode:

- ``dense``, ``lexical``, ``sparse``: one leg alone;
- ``hybrid``: every leg the model supports, fused with the configured weights.

Each query's legs are fetched once and fused per mode, which is the same as
running each mode on its own (the legs are independent); :meth:`EvalSession.tune`
reuses them to find the fusion weights that would have scored best.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import asyncpg

from index.search import Scope

from .auth import Principal
from .fusion import collapse
from .retrieval import LegResults, Retriever, over_fetch
from .settings import LEGS, GatewaySettings

log = logging.getLogger(__name__)

MODES = ("dense", "lexical", "sparse", "hybrid")
EVAL_LIMIT = 100
METRICS = ("ndcg@10", "recall@100", "mrr@10")
EVAL_PRINCIPAL = Principal("mnemo-eval", projects=None, admin=True)
TUNE_GRID = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)


@dataclass(frozen=True)
class BeirDataset:
    name: str
    corpus: dict[str, tuple[str, str]]  # doc id -> (title, text), in file order
    queries: dict[str, str]  # query id -> text (only queries with judgments)
    qrels: dict[str, dict[str, int]]  # query id -> doc id -> relevance


def load_beir(directory: Path) -> BeirDataset:
    """A BEIR-layout data set; queries without judgments in ``qrels/test.tsv`` are skipped."""
    directory = Path(directory)
    corpus: dict[str, tuple[str, str]] = {}
    with open(directory / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                doc = json.loads(line)
                corpus[str(doc["_id"])] = (str(doc.get("title") or ""), str(doc.get("text") or ""))
    qrels: dict[str, dict[str, int]] = {}
    with open(directory / "qrels" / "test.tsv", encoding="utf-8") as f:
        for i, line in enumerate(f):
            parts = line.rstrip("\n").split("\t")
            if (i == 0 and parts[0] == "query-id") or len(parts) < 3:
                continue
            qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    queries: dict[str, str] = {}
    with open(directory / "queries.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                q = json.loads(line)
                if str(q["_id"]) in qrels:
                    queries[str(q["_id"])] = str(q["text"])
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


def score_runs(runs: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    """Mean nDCG@10, recall@100 and MRR@10 over every judged query (a missing run scores 0)."""
    n = len(qrels)
    if n == 0:
        return dict.fromkeys(METRICS, 0.0)
    sums = dict.fromkeys(METRICS, 0.0)
    for qid, rels in qrels.items():
        ranked = runs.get(qid, [])
        sums["ndcg@10"] += ndcg_at(ranked, rels)
        sums["recall@100"] += recall_at(ranked, rels)
        sums["mrr@10"] += mrr_at(ranked, rels)
    return {m: round(v / n, 4) for m, v in sums.items()}


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

    async def ingest(self, *, ingest_settings: Any = None) -> dict[str, Any]:
        """Store the descriptor, queue every document through the intake and drain until indexed."""
        from index.drain import drain_once
        from index.intake import enqueue_records
        from index.sections import SectionStore
        from index.settings import IngestSettings
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
        report = await drain_once(
            self.pool, self.client, settings, text_model=self.retriever.settings.sidecar.text_model
        )
        stats = await self.pool.fetchrow(
            "SELECT count(*) FILTER (WHERE section_tipo = $1) AS queued, "
            "count(*) FILTER (WHERE section_tipo = $1 AND last_error IS NOT NULL) AS failed "
            "FROM rag_index_queue",
            self.section_tipo,
        )
        if report.unavailable or stats["queued"]:
            raise RuntimeError(
                f"the corpus was not fully indexed ({stats['queued']} records still queued, "
                f"{stats['failed']} failing): {report.error or 'see the queue'}"
            )
        self.retriever.stats.invalidate()
        return report.as_dict()

    async def fetch_legs(self, *, concurrency: int = 4) -> None:
        """Every query's legs at ``limit`` 100 (each leg over-fetching ``max(limit * 4, 20)``)."""
        await self.retriever.warm_queries(EVAL_PRINCIPAL, list(self.dataset.queries.values()))
        scope = Scope(section_tipos=(self.section_tipo,))
        gate = asyncio.Semaphore(concurrency)

        async def one(qid: str, text: str) -> None:
            async with gate:
                self.legs[qid] = await self.retriever.query_legs(
                    EVAL_PRINCIPAL, text, scope, over_fetch(EVAL_LIMIT)
                )

        await asyncio.gather(*(one(q, t) for q, t in self.dataset.queries.items() if q not in self.legs))

    def available_legs(self) -> list[str]:
        return [leg for leg in LEGS if any(leg in r.lists for r in self.legs.values())]

    def runs(self, weights: Mapping[str, float]) -> dict[str, list[str]]:
        """Fuse each query's legs with ``weights``, gate, collapse to records: doc ids, best first."""
        scope = Scope(section_tipos=(self.section_tipo,))
        out = {}
        for qid, legs in self.legs.items():
            ranked = self.retriever.fuse(EVAL_PRINCIPAL, legs, scope, weights=weights)
            records = collapse(ranked, lambda r: r.chunk.record)[:EVAL_LIMIT]
            out[qid] = [self.ids[r.chunk.section_id] for r in records if r.chunk.section_id in self.ids]
        return out

    def mode_weights(self, mode: str) -> dict[str, float]:
        if mode == "hybrid":
            return dict(self.retriever.settings.weights)
        return {leg: (1.0 if leg == mode else 0.0) for leg in LEGS}

    def evaluate(self, modes: Iterable[str]) -> dict[str, dict[str, float]]:
        """Metrics per mode; a leg the model does not provide (``sparse`` with MiniLM) is skipped."""
        available = self.available_legs()
        results = {}
        for mode in modes:
            if mode != "hybrid" and mode not in available:
                log.warning("mode %s skipped: the model provides no %s leg", mode, mode)
                continue
            results[mode] = score_runs(self.runs(self.mode_weights(mode)), self.dataset.qrels)
        return results

    def tune(self, grid: Sequence[float] = TUNE_GRID) -> dict[str, Any]:
        """The per-leg weights (dense fixed at 1: RRF is scale-free) with the best nDCG@10."""
        legs = self.available_legs()
        others = [leg for leg in legs if leg != "dense"]
        best: dict[str, Any] | None = None
        for combo in itertools.product(grid, repeat=len(others)):
            weights = {"dense": 1.0, **dict(zip(others, combo, strict=True))}
            metrics = score_runs(self.runs(weights), self.dataset.qrels)
            key = (metrics["ndcg@10"], metrics["mrr@10"], -sum(combo))
            if best is None or key > best["_key"]:
                best = {"_key": key, "weights": weights, "metrics": metrics}
        assert best is not None
        weights = best["weights"]
        return {
            "weights": weights,
            "setting": "RAG_FUSION_WEIGHTS=" + ",".join(f"{k}={v:g}" for k, v in weights.items()),
            "metrics": best["metrics"],
        }

    async def cleanup(self) -> None:
        """Remove the eval section's rows, queue entries and descriptor."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("DELETE FROM rag_embeddings WHERE section_tipo = $1", self.section_tipo)
            await conn.execute("DELETE FROM rag_index_queue WHERE section_tipo = $1", self.section_tipo)
            await conn.execute("DELETE FROM rag_sections WHERE section_tipo = $1", self.section_tipo)


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
    ):
        session = EvalSession(
            dataset, db.pool, client, Retriever(db.pool, client, settings), section_for(dataset.name)
        )
        try:
            await session.ingest()
            yield session
        finally:
            if not keep:
                await session.cleanup()
