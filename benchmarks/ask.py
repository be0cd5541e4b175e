"""Grounded answers: how often ``ask`` contains the gold answer, cites the right paragraph, refuses.

On XQuAD (``../shared/datasets/xquad-es``, ``xquad-de``: 240 paragraphs each, questions with gold
answer spans in ``answers.jsonl`` and their paragraph in ``qrels``), per set and per provider
available offline (``extractive``), with the cross-encoder and without:

- **answer contains gold**: share of questions whose answer contains a gold span (case- and
  accent-folded, whitespace-normalized);
- **citation precision**: share of citations that point at the question's qrels paragraph;
- **refusal (in scope)**: share of answerable questions refused (``no_grounded_context``);
- **refusal (out of scope)**: the same questions scoped to a section that holds nothing relevant,
  refused share (higher is better). That section is ``adi`` (English abstracts on information
  science), not the other XQuAD set: xquad-es and xquad-de are translations of the same
  paragraphs, so each holds the other's answers;
- **latency**: ``ask`` p50 beside ``retrieve`` p50 for the same questions, same run; query vectors
  are embedded up front in one batch for both, so the difference is what ``ask`` adds (grounding,
  rerank, sentence embeddings, selection, citation checks).

The offline reranker (``tiny-reranker-random``) has RANDOM weights: "reranked" rows measure the
path and its cost, and its order is noise; expect them to score worse than the fused order.

``python -m benchmarks.ask --start-sidecar [--questions 100] [--json out.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.eval import BeirDataset, EvalSession, load_beir, section_for
from index.text import fold

REPO_ROOT = Path(__file__).resolve().parent.parent
DATASETS = REPO_ROOT.parent / "shared" / "datasets"
SETS = ("xquad-es", "xquad-de")
OUT_OF_SCOPE = "adi"

__all__ = ["contains_gold", "load_answers", "main", "render", "run_ask_benchmark"]


def load_answers(directory: Path) -> dict[str, list[str]]:
    """Query id -> gold answer spans (``answers.jsonl``)."""
    out: dict[str, list[str]] = {}
    with open(directory / "answers.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                out[str(row["_id"])] = [str(a) for a in row["answers"]]
    return out


def _norm(text: str) -> str:
    return " ".join(fold(text).split())


def contains_gold(answer: str, golds: Sequence[str]) -> bool:
    """Whether the answer contains one of the gold spans (folded, whitespace-normalized)."""
    normalized = _norm(answer)
    return any(_norm(g) and _norm(g) in normalized for g in golds)


def _p50(values: Sequence[float]) -> float:
    return round(statistics.median(values) * 1000, 1) if values else float("nan")


async def _measure(
    ctx: Any,
    session: EvalSession,
    answers: Mapping[str, list[str]],
    qids: Sequence[str],
    rerank: bool,
    other: str,
) -> dict[str, Any]:
    from gateway.actions.specs import ACTIONS

    retrieve, ask = ACTIONS["retrieve"], ACTIONS["ask"]
    dataset = session.dataset
    contains = cited = cited_right = refused = refused_out = 0
    ask_s: list[float] = []
    retrieve_s: list[float] = []
    for qid in qids:
        query = dataset.queries[qid]
        options = {"query": query, "section_tipo": session.section_tipo}
        start = time.perf_counter()
        await retrieve.handler(ctx, retrieve.read(options))
        retrieve_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        msg, data = await ask.handler(ctx, ask.read({**options, "rerank": rerank}))
        ask_s.append(time.perf_counter() - start)
        if msg != "ok":
            refused += 1
        contains += contains_gold(data["answer"], answers.get(qid, []))
        relevant = set(dataset.qrels[qid])
        for c in data["citations"]:
            cited += 1
            cited_right += session.ids.get(c["sectionId"]) in relevant
        if other:
            msg, _ = await ask.handler(
                ctx, ask.read({"query": query, "section_tipo": other, "rerank": rerank})
            )
            refused_out += msg == "no_grounded_context"
    n = len(qids)
    return {
        "questions": n,
        "answer_contains_gold": round(contains / n, 4),
        "citation_precision": round(cited_right / cited, 4) if cited else None,
        "citations_per_answer": round(cited / n, 2),
        "refusal_in_scope": round(refused / n, 4),
        "refusal_out_of_scope": round(refused_out / n, 4) if other else None,
        "ask_p50_ms": _p50(ask_s),
        "retrieve_p50_ms": _p50(retrieve_s),
    }


async def run_ask_benchmark(
    sidecar_url: str, *, questions: int, database_url: str | None = None, datasets: Path = DATASETS
) -> dict[str, Any]:
    """Ingest the sets and the out-of-scope section, then measure every (set, reranked) pair."""
    from gateway.access.auth import ANONYMOUS_ADMIN
    from gateway.actions.context import ActionContext, AskServices, PassageServices
    from gateway.actions.providers import build_provider
    from gateway.base.metrics import Metrics
    from gateway.base.settings import load_gateway_settings
    from gateway.retrieval.rerank import Reranker
    from gateway.retrieval.retriever import Retriever
    from index.store.sections import SectionStore
    from schema.database import open_database

    env = {"RAG_SIDECAR_URL": sidecar_url, "RAG_QUERY_CACHE_SIZE": "8192", "RAG_AUTH": "off"}
    settings = load_gateway_settings(env)
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-ask-") as tmp:
        database = dataclasses.replace(settings.database, database_url=database_url, data_dir=Path(tmp))
        async with open_database(database) as db, settings.sidecar.client(timeout=120) as client:
            metrics = Metrics()
            retriever = Retriever(db.pool, client, settings, metrics)
            sessions: dict[str, EvalSession] = {}
            started = time.perf_counter()
            for name in (*SETS, OUT_OF_SCOPE):
                dataset: BeirDataset = load_beir(datasets / name)
                sessions[name] = EvalSession(dataset, db.pool, client, retriever, section_for(name))
                await sessions[name].ingest()
            ingest_s = time.perf_counter() - started
            provider = build_provider(settings.ask, client, retriever.text_model)
            reranker = Reranker(client, settings.sidecar.rerank_model, settings.ask.rerank_timeout, metrics)
            passages = PassageServices.configured(reranker, settings.ask)
            services = AskServices(settings.ask, provider, SectionStore(db.pool), metrics)
            ctx = ActionContext(ANONYMOUS_ADMIN, retriever, db.pool, passages=passages, ask=services)
            model = await retriever.text_model()
            out: dict[str, Any] = {
                "text_model": model.id,
                "reranker": await reranker._model_id(),
                "reranker_note": "tiny-reranker-random has random weights: its order is noise",
                "provider": provider.name,
                "grounding_min_similarity": settings.ask.grounding_min_similarity,
                "out_of_scope_section": section_for(OUT_OF_SCOPE),
                "ingest_s": round(ingest_s, 1),
                "runs": [],
            }
            for name in SETS:
                session = sessions[name]
                answers = load_answers(datasets / name)
                # Evenly spaced over the sorted ids, so a small sample spans many paragraphs.
                ordered = sorted(session.dataset.queries)
                qids = ordered[:: max(1, len(ordered) // questions)][:questions]
                await retriever.queries.warm_queries(
                    ANONYMOUS_ADMIN, [session.dataset.queries[q] for q in qids]
                )
                for rerank in (False, True):
                    # Out of scope once per set: the gate refuses before the reranker runs.
                    other = "" if rerank else section_for(OUT_OF_SCOPE)
                    row = await _measure(ctx, session, answers, qids, rerank, other)
                    out["runs"].append({"set": name, "provider": provider.name, "reranked": rerank, **row})
                    print(json.dumps(out["runs"][-1]), file=sys.stderr, flush=True)
            await provider.close()
            for session in sessions.values():
                await session.cleanup()
    return out


def render(result: Mapping[str, Any]) -> str:
    cols = [
        "set",
        "provider",
        "reranked",
        "questions",
        "answer_contains_gold",
        "citation_precision",
        "refusal_in_scope",
        "refusal_out_of_scope",
        "ask_p50_ms",
        "retrieve_p50_ms",
    ]
    lines = [
        f"ask on XQuAD: text model {result['text_model']}, reranker {result['reranker']} "
        f"({result['reranker_note']}), grounding floor {result['grounding_min_similarity']}, "
        f"out-of-scope section {result['out_of_scope_section']}",
        "",
        "| " + " | ".join(cols) + " |",
        "| " + " | ".join("---" for _ in cols) + " |",
    ]
    for run in result["runs"]:
        lines.append("| " + " | ".join(str(run[c]) for c in cols) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.ingest import _offline_sidecar

    p = argparse.ArgumentParser(prog="python -m benchmarks.ask", description=__doc__.splitlines()[0])
    p.add_argument(
        "--questions", type=int, default=100, help="questions per set (evenly spaced ids; 1190 in all)"
    )
    p.add_argument("--sidecar-url", default=None, help="a running sidecar serving a text and a rerank model")
    p.add_argument("--start-sidecar", action="store_true", help="run the offline profile here")
    p.add_argument("--database-url", default=None, help="default: a throwaway embedded PostgreSQL")
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    p.add_argument(
        "--datasets", type=Path, default=DATASETS, help=f"where xquad-es, xquad-de, adi live ({DATASETS})"
    )
    args = p.parse_args(argv)
    with _offline_sidecar(args.start_sidecar, args.sidecar_url) as url:
        result = asyncio.run(
            run_ask_benchmark(
                url, questions=args.questions, database_url=args.database_url, datasets=args.datasets
            )
        )
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
