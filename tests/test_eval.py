"""The quality harness (benchmarks.eval) on the ADI collection: the real intake, drain and retrieval."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.datasets import dataset_dir
from benchmarks.eval import (
    BeirDataset,
    EvalSession,
    load_beir,
    mrr_at,
    ndcg_at,
    recall_at,
    score_runs,
    section_for,
)
from benchmarks.quality import metrics_json, run_quality_benchmark
from gateway.base.settings import load_gateway_settings
from gateway.retrieval.engines import build_retrieval
from index.ingest import queue
from inference.client import SidecarClient
from schema import create_pool

pytestmark = pytest.mark.ray
ADI = dataset_dir("adi")
REPO_ROOT = Path(__file__).resolve().parent.parent


def test_metrics_by_hand() -> None:
    rels = {"a": 1, "b": 1, "z": 0}
    assert ndcg_at(["a", "b"], rels) == 1.0
    assert ndcg_at(["x", "a"], rels) == pytest.approx((1 / 1.5849625) / (1 + 1 / 1.5849625))
    assert recall_at(["a", "x"], rels) == 0.5 and mrr_at(["x", "z", "b"], rels) == pytest.approx(1 / 3)
    assert score_runs({"q": ["a"]}, {"q": rels, "r": {"c": 1}})["mrr@10"] == 0.5  # a missing run scores 0
    assert section_for("xquad-es") == "eval_xquad_es"


def test_load_beir_keeps_judged_queries_only() -> None:
    ds = load_beir(ADI)
    assert len(ds.corpus) == 82 and ds.queries and set(ds.queries) == set(ds.qrels)


async def test_eval_beside_a_running_drain_waits_for_its_own_section_only(
    database_url: str, sidecar_url: str
) -> None:
    """Another drain worker (a gateway's) holds leases on the eval's records when the eval queues its
    corpus: the eval waits (it used to fail with "not fully indexed"), then, once that worker lets
    go, indexes its own section (the newer versions it pushed) and leaves other sections queued."""
    settings = load_gateway_settings(
        {"RAG_SIDECAR_URL": sidecar_url, "RAG_TEXT_MODEL": "all-minilm-l6-v2"}, auth="off"
    )
    adi = load_beir(ADI)
    mini = BeirDataset("adi-mini", dict(list(adi.corpus.items())[:6]), {}, {})
    pool = await create_pool(database_url)
    try:
        await queue.enqueue(pool, [queue.Job("gateway_work", 7, "delete")])  # not the eval's to drain
        # Earlier pushes of the eval's records, leased by the other worker, which is busy with them.
        await queue.enqueue(pool, [queue.Job("eval_adi_mini", i, "delete") for i in range(1, 7)])
        gateway_drain = queue.Lease("gateway@elsewhere:1#0-x", 300)
        held = await queue.claim_ready(pool, 10, 5, lease=gateway_drain, section_tipos=["eval_adi_mini"])
        assert len(held) == len(mini.corpus)
        async with SidecarClient(sidecar_url) as client:
            session = EvalSession(
                mini, pool, client, build_retrieval(pool, client, settings).retriever, "eval_adi_mini"
            )
            ingest = asyncio.create_task(session.ingest())
            pushed = (
                "SELECT count(*) FROM rag_index_queue WHERE section_tipo = 'eval_adi_mini' AND version = 2"
            )
            while not ingest.done() and await pool.fetchval(pushed) < len(mini.corpus):  # noqa: ASYNC110 (polls the database)
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # several polls while the other worker holds the leases
            assert not ingest.done(), ingest.exception()
            await queue.release_all(pool, gateway_drain.owner)  # it stops; its versions were superseded
            count = "SELECT count(*) FROM rag_index_queue WHERE section_tipo = 'eval_adi_mini'"
            report = await asyncio.wait_for(ingest, 300)
        assert report["indexed"] == len(mini.corpus)
        stored = await pool.fetchval(
            "SELECT count(DISTINCT section_id) FROM rag_embeddings WHERE section_tipo = 'eval_adi_mini'"
        )
        assert stored == len(mini.corpus) and await pool.fetchval(count) == 0
        others = await pool.fetch("SELECT section_tipo, section_id FROM rag_index_queue")
        assert [tuple(r) for r in others] == [("gateway_work", 7)]
    finally:
        await pool.close()


async def test_adi_modes_references_and_bars(database_url: str, sidecar_url: str) -> None:
    settings = load_gateway_settings(
        {"RAG_SIDECAR_URL": sidecar_url, "RAG_TEXT_MODEL": "all-minilm-l6-v2"}, auth="off"
    )
    result = await run_quality_benchmark(
        ADI, settings, database_url=database_url, tune=True, lexical_engines=("tantivy",)
    )
    modes, refs = result["modes"], result["references"]
    assert set(modes) == {"dense", "lexical", "hybrid"}  # MiniLM has no sparse head: that mode is skipped
    for row in [*modes.values(), *refs.values()]:
        assert 0.0 < row["ndcg@10"] <= 1.0 and 0.0 < row["recall@100"] <= 1.0 and 0.0 < row["mrr@10"] <= 1.0
    # ADI is tiny (82 documents): an ANN index over it must be exact.
    assert modes["dense"]["ndcg@10"] == pytest.approx(refs["exact_dense"]["ndcg@10"], abs=1e-3)
    assert all(bar["pass"] for bar in result["bars"].values()), result["bars"]
    tuned = result["tuned"]  # 2-fold cross-validated: may fall below the defaults, never above in-sample
    assert tuned["in_sample"]["ndcg@10"] >= modes["hybrid"]["ndcg@10"]  # the defaults are a candidate
    assert 0.0 < tuned["metrics"]["ndcg@10"] <= 1.0 and tuned["fusion"] in ("dbsf", "minmax", "rrf")
    assert sum(f["test"] for f in tuned["folds"]) == result["queries"]
    # The Tantivy engine, its index built from the eval's store by the writer, served every query;
    # its candidates are re-read and scored by the SQL leg, so on ADI (every match a candidate) its
    # rows are the SQL leg's.
    tantivy = result["engines"]["tantivy"]
    assert result["lexical_leg"] == "sql" and tantivy["served"] == {"hit": result["queries"]}
    assert tantivy["modes"] == {"lexical": modes["lexical"], "hybrid": modes["hybrid"]}
    assert set(tantivy["bars"]) == {"lexical [tantivy] >= 0.95 * bm25", "hybrid [tantivy] >= hybrid [sql]"}
    assert set(metrics_json(result)) == {
        "dense",
        "lexical",
        "hybrid",
        "lexical:tantivy",
        "hybrid:tantivy",
        "reference:exact_dense",
        "reference:bm25",
        "reference:rrf",
        "tuned:cross_validated",
    }


def test_mnemo_eval_cli_writes_the_json(database_url: str, sidecar_url: str, tmp_path: Path) -> None:
    out = tmp_path / "adi.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "eval",
            "--dataset",
            str(ADI),
            "--modes",
            "lexical,hybrid",
            "--json",
            str(out),
            "--no-references",
            "--database-url",
            database_url,
            "--sidecar-url",
            sidecar_url,
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ndcg@10" in proc.stdout and "hybrid" in proc.stdout
    written = json.loads(out.read_text())
    assert set(written) == {"lexical", "hybrid"} and set(written["hybrid"]) == {
        "ndcg@10",
        "recall@100",
        "mrr@10",
    }
