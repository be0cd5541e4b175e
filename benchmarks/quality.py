"""Retrieval quality: Mnemo's retrieval modes beside same-run references on BEIR data sets (the quality
suite and ``mnemo eval``): exact dense search over the stored vectors (``exact_dense``), ``bm25s``
over title and text (``bm25``) and plain RRF of the two (``rrf``), with the bars of
:func:`check_bars`; other lexical engines (``lexical_engines``) are scored on the same store and
query vectors beside the gateway's lexical leg, with issue 44's bars (:func:`engine_bars`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gateway.base.settings import GatewaySettings
from gateway.retrieval.fusion import rrf
from index.lexical.engine import AUTO_MODE

from .eval import (
    EVAL_LIMIT,
    EVAL_PRINCIPAL,
    MODES,
    BeirDataset,
    EvalSession,
    apply_tuning,
    eval_session,
    format_table,
    lexical_engine,
    load_beir,
    score_runs,
    searches_served,
)

BM25_STOPWORDS = "en"


async def exact_dense_runs(session: EvalSession) -> dict[str, list[str]]:
    """Exact cosine over the stored chunk vectors, best chunk per record, top 100 per query."""
    partition = await session.partition()
    rows = await session.pool.fetch(
        f"SELECT section_id, embedding FROM {partition.table} WHERE section_tipo = $1 AND modality = 'text'",
        session.section_tipo,
    )
    record_of = np.array([r["section_id"] for r in rows])
    vectors = np.stack(
        [
            np.asarray(r["embedding"].to_numpy() if hasattr(r["embedding"], "to_numpy") else r["embedding"])
            for r in rows
        ]
    ).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    records, inverse = np.unique(record_of, return_inverse=True)
    runs = {}
    for qid, text in session.dataset.queries.items():
        cached = session.retriever.queries.cache.get(partition.model, text, owner=EVAL_PRINCIPAL.sub)  # type: ignore[attr-defined]
        assert cached is not None, "queries are embedded once, by the retrieval run"
        sims = vectors @ cached.dense
        best = np.full(len(records), -np.inf, dtype=np.float32)
        np.maximum.at(best, inverse, sims)
        order = np.argsort(-best, kind="stable")[:EVAL_LIMIT]
        runs[qid] = [session.ids[int(records[i])] for i in order]
    return runs


def bm25_runs(dataset: BeirDataset) -> dict[str, list[str]]:
    """bm25s over title + text (its defaults and English stop words), top 100 per query."""
    import bm25s

    doc_ids = list(dataset.corpus)
    texts = [f"{title} {text}".strip() for title, text in dataset.corpus.values()]
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, stopwords=BM25_STOPWORDS, show_progress=False), show_progress=False)
    qids = list(dataset.queries)
    tokens = bm25s.tokenize([dataset.queries[q] for q in qids], stopwords=BM25_STOPWORDS, show_progress=False)
    k = min(EVAL_LIMIT, len(doc_ids))
    results, _scores = retriever.retrieve(tokens, k=k, show_progress=False)
    return {qid: [doc_ids[int(j)] for j in results[i]] for i, qid in enumerate(qids)}


def rrf_runs(*runs: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Plain RRF (k 60, equal weights) of document rankings."""
    out = {}
    for qid in runs[0]:
        fused = rrf({str(i): run.get(qid, []) for i, run in enumerate(runs)})
        out[qid] = [f.key for f in fused][:EVAL_LIMIT]
    return out


# Each mode's bar against its same-run reference: the mode, the reference, the reference's name in a
# report's headline, the bar's name, and its target on nDCG@10 from the reference's.
REFERENCE_BARS: tuple[tuple[str, str, str, str, Callable[[float], float]], ...] = (
    ("lexical", "bm25", "BM25 reference (bm25s)", "lexical >= 0.95 * bm25", lambda ref: 0.95 * ref),
    ("hybrid", "rrf", "plain RRF of references", "hybrid >= rrf - 0.005", lambda ref: ref - 0.005),
    ("dense", "exact_dense", "exact dense (numpy)", "dense >= exact_dense - 0.01", lambda ref: ref - 0.01),
)


def check_bars(
    modes: Mapping[str, Mapping[str, float]], refs: Mapping[str, Mapping[str, float]]
) -> dict[str, Any]:
    """The issue's bars on nDCG@10, each with its value, target and verdict."""
    bars = {
        name: _bar(modes[mode]["ndcg@10"], target(refs[ref]["ndcg@10"]))
        for mode, ref, _, name, target in REFERENCE_BARS
        if mode in modes and ref in refs
    }
    legs = [m for m in ("dense", "lexical", "sparse") if m in modes]
    if "hybrid" in modes and legs:
        best = max(legs, key=lambda m: modes[m]["ndcg@10"])
        bars[f"hybrid >= best leg ({best}) - 0.03"] = _bar(
            modes["hybrid"]["ndcg@10"], modes[best]["ndcg@10"] - 0.03
        )
    return bars


def _bar(value: float, target: float) -> dict[str, Any]:
    """A bar on nDCG@10: the value, its target and whether it is met (to within float noise)."""
    return {"value": value, "target": round(target, 4), "pass": value >= target - 1e-9}


def engine_label(mode: str) -> str:
    """The name of a lexical leg in the report: its ``RAG_LEXICAL_INDEX`` value, ``sql`` for off and
    for auto (an evaluation's store has no writer's index, so the SQL leg answers: benchmarks.eval)."""
    return "sql" if mode in ("off", AUTO_MODE) else mode


def engine_bars(
    name: str,
    engine: Mapping[str, Mapping[str, float]],
    modes: Mapping[str, Mapping[str, float]],
    refs: Mapping[str, Mapping[str, float]],
    baseline: str,
) -> dict[str, Any]:
    """Issue 44's bars for another lexical engine: its lexical leg at least 95% of ``bm25``, its
    hybrid no lower than the hybrid of the gateway's lexical leg (``baseline``) in the same run."""
    targets = {}
    if "lexical" in engine and "bm25" in refs:
        targets[f"lexical [{name}] >= 0.95 * bm25"] = ("lexical", 0.95 * refs["bm25"]["ndcg@10"])
    if "hybrid" in engine and "hybrid" in modes:
        targets[f"hybrid [{name}] >= hybrid [{baseline}]"] = ("hybrid", modes["hybrid"]["ndcg@10"])
    return {label: _bar(engine[mode]["ndcg@10"], target) for label, (mode, target) in targets.items()}


async def run_quality_benchmark(
    dataset_dir: Path,
    settings: GatewaySettings,
    *,
    database_url: str | None = None,
    modes: Sequence[str] = MODES,
    references: bool = True,
    tune: bool = False,
    keep: bool = False,
    apply: str | None = None,
    lexical_engines: Sequence[str] = (),
) -> dict[str, Any]:
    """Ingest one data set, evaluate the modes (and references, bars, tuning); a JSON-able dict.

    ``apply``: store the tuned fusion (chosen on every query) in that section's descriptor.
    ``lexical_engines``: engines of :data:`benchmarks.eval.LEXICAL_ENGINES` (``tantivy``) whose
    lexical and hybrid rows are scored beside the gateway's lexical leg
    (``engines``, with the searches each served and its bars).
    """
    dataset = load_beir(dataset_dir)
    started = time.perf_counter()
    async with eval_session(dataset, settings, database_url=database_url, keep=keep) as session:
        ingest_s = time.perf_counter() - started
        await session.fetch_legs()
        query_s = time.perf_counter() - started - ingest_s
        model = await session.retriever.text_model()
        out: dict[str, Any] = {
            "dataset": dataset.name,
            "model": model.id,  # type: ignore[attr-defined]
            "documents": len(dataset.corpus),
            "queries": len(dataset.queries),
            "weights": dict(settings.weights),
            "modes": session.evaluate(modes),
            "timing_s": {"ingest": round(ingest_s, 1), "queries": round(query_s, 1)},
        }
        if references:
            dense, bm25 = await exact_dense_runs(session), bm25_runs(dataset)
            out["references"] = {
                "exact_dense": score_runs(dense, dataset.qrels),
                "bm25": score_runs(bm25, dataset.qrels),
                "rrf": score_runs(rrf_runs(dense, bm25), dataset.qrels),
            }
            out["bars"] = check_bars(out["modes"], out["references"])
        if lexical_engines:
            out["lexical_leg"] = engine_label(settings.lexical_index)
            out["engines"] = await _other_engines(session, lexical_engines, modes, out)
        if tune or apply:
            out["tuned"] = session.tune()
            if apply:
                await apply_tuning(session.pool, apply, out["tuned"], dataset.name)
                out["tuned"]["applied_to"] = apply
    return out


async def _other_engines(
    session: EvalSession, names: Sequence[str], modes: Sequence[str], out: Mapping[str, Any]
) -> dict[str, Any]:
    """Each engine's lexical and hybrid metrics over the session's store and query vectors, the
    searches it served (every one: a declined search is an error) and its bars."""
    partition = await session.partition()
    assert session.database_url is not None
    engines: dict[str, Any] = {}
    for name in names:
        started = time.perf_counter()
        stats = session.retriever.legs.stats
        async with lexical_engine(name, session.pool, session.database_url, partition, stats) as engine:
            loaded_s = time.perf_counter() - started
            legs = await session.lexical_legs(engine)
            served = searches_served(engine.metrics)  # type: ignore[attr-defined]
        scored = session.evaluate([m for m in ("lexical", "hybrid") if m in modes], legs)
        engines[name] = {
            "modes": scored,
            "served": served,
            "load_s": round(loaded_s, 1),
            "bars": engine_bars(name, scored, out["modes"], out.get("references", {}), out["lexical_leg"]),
        }
    return engines


def metrics_json(result: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``{"<mode>": {"ndcg@10", "recall@100", "mrr@10"}}`` plus ``reference:<name>`` rows (and
    ``tuned:cross_validated`` after tuning)."""
    out = {mode: dict(m) for mode, m in result["modes"].items()}
    for name, m in result.get("references", {}).items():
        out[f"reference:{name}"] = dict(m)
    for name, engine in result.get("engines", {}).items():
        out.update({f"{mode}:{name}": dict(m) for mode, m in engine["modes"].items()})
    if "tuned" in result:
        out["tuned:cross_validated"] = dict(result["tuned"]["metrics"])
    return out


def render(result: Mapping[str, Any]) -> str:
    """The human report: one table of modes and references, the bars, the tuned weights."""
    rows = dict(result["modes"])
    engines = result.get("engines", {})
    for name, engine in engines.items():
        rows.update({f"{mode} [{name}]": m for mode, m in engine["modes"].items()})
    rows.update({f"ref: {k}": v for k, v in result.get("references", {}).items()})
    title = (
        f"{result['dataset']}: {result['documents']} documents, {result['queries']} queries, "
        f"model {result['model']}, limit {EVAL_LIMIT}"
    )
    lines = [format_table(rows, title)]
    if engines:
        lines.append(f"  lexical leg of the unmarked rows: {result['lexical_leg']}")
    for name, engine in engines.items():
        lines.append(f"  {name}: searches by outcome {engine['served']} (loaded in {engine['load_s']} s)")
    bars = dict(result.get("bars", {}))
    for engine in engines.values():
        bars.update(engine["bars"])
    for name, bar in bars.items():
        lines.append(
            f"  bar {name}: {bar['value']:.4f} vs {bar['target']:.4f}  {'PASS' if bar['pass'] else 'FAIL'}"
        )
    if "tuned" in result:
        t = result["tuned"]
        lines.append(
            f"  tuned (2-fold cross-validated): nDCG@10 {t['metrics']['ndcg@10']:.4f}, recall@100 "
            f"{t['metrics']['recall@100']:.4f}, MRR@10 {t['metrics']['mrr@10']:.4f}  "
            f"(in-sample {t['in_sample']['ndcg@10']:.4f}); on all queries: {t['setting']}"
        )
        if t.get("applied_to"):
            lines.append(f"  stored in the descriptor of section {t['applied_to']}")
    return "\n".join(lines)
