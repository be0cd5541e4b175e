"""``mnemo bench`` end to end with miniature plans: every suite writes a real report (JSON, Markdown, PNGs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.cli import _suites
from gateway.cli import main as mnemo

TINY_PLAN = [
    "sidecar.concurrencies=1,2",
    "sidecar.sizes=1,4",
    "sidecar.seconds_per_cell=0.3",
    "sidecar.baseline_seconds=0.2",
    "sidecar.repeats=2",
    "sidecar.sweep_batches=4,8",
    "sidecar.sweep_seconds=0.05",
    "sidecar.sweep_sample=16",
    "sidecar.lengths=16,64,512",  # 512 is over the session MiniLM's 256: skipped, and said so
    "sidecar.length_concurrency=2",
    "sidecar.length_request_size=2",
    "ingest.records=6",
    "ingest.batch_records=1,6",
    "gateway.sizes=60,200",
    "gateway.embedded=20",
    "gateway.queries=4",
    "gateway.seconds=0.3",
    "gateway.requests=12",
    "gateway.concurrency=2",
    "gateway.load_concurrency=1,2",
    "gateway.selectivity=1,0.1",
    "quality.tune=true",  # the full plan's cross-validated row (the quick plan leaves it out)
    "gpu.lengths=16",
    "gpu.seconds=0.1",
]


def _tiny_beir(root: Path) -> Path:
    """A five-document BEIR data set: two queries whose answers share their words."""
    root.mkdir(parents=True)
    docs = {
        "d1": "The dam flooded the village church in 1959 and the families left.",
        "d2": "A silver denarius of Augustus with Gaius and Lucius on the reverse.",
        "d3": "Oral history of the harvest, the mill and the market square.",
        "d4": "Red-figure amphora from the necropolis, found in 1921.",
        "d5": "Glass plate negative of a procession, about 1910.",
    }
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in docs.items())
    )
    queries = {"q1": "village flooded by the dam", "q2": "silver coin of Augustus"}
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in queries.items())
    )
    (root / "qrels").mkdir()
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    return root


@pytest.mark.ray
@pytest.mark.slow
def test_every_suite_writes_a_report_with_baselines_and_plots(
    sidecar_url: str, pg_server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    args = ["bench", "--suite", "sidecar,ingest,gateway,quality,gpu", "--out", str(out)]
    args += [
        "--sidecar-url",
        sidecar_url,
        "--database-url",
        pg_server.url,
        "--work-dir",
        str(tmp_path / "work"),
    ]
    args += ["--dataset", str(_tiny_beir(tmp_path / "tiny-beir"))]
    for assignment in TINY_PLAN:
        args += ["--set", assignment]
    assert mnemo(args) == 0
    printed = capsys.readouterr().out
    assert "## Headlines" in printed and f"report: {out / 'REPORT.md'}" in printed

    payload = json.loads((out / "results.json").read_text())
    assert payload["config"]["plan"]["gateway"]["sizes"] == [60, 200]
    suites = {s["suite"]: s for s in payload["suites"]}
    assert set(suites) == {"sidecar", "ingest", "gateway", "quality", "gpu"}
    assert not any(s["skipped"] for s in suites.values())
    for suite in suites.values():
        assert suite["headlines"], suite["suite"]
        for h in suite["headlines"]:  # every headline beside a baseline from this run, as a ratio
            assert h["baseline_name"] and h["baseline"] > 0 and math.isfinite(h["ratio"]), h

    sidecar = suites["sidecar"]
    assert [h["name"] for h in sidecar["headlines"]] == [
        "sidecar 1-item requests, concurrency 2",
        "sidecar 4-item requests, concurrency 2",
    ]
    # Each headline is a ratio with its windows' spread; the arithmetic is test_bench_sidecar.py's.
    assert all(
        len(h["spread"]) == 2 and all(map(math.isfinite, [h["ratio"], *h["spread"]]))
        for h in sidecar["headlines"]
    )
    assert sidecar["tables"][0]["title"].startswith("In-process configurations")
    lengths = sidecar["figures"]["lengths"]
    assert [p["tokens_per_text"] for p in lengths["points"]] == [16, 64] and lengths["skipped_lengths"] == [
        512
    ]
    assert {c["name"] for c in sidecar["curves"]} >= {
        "Sidecar throughput vs concurrency",
        "Sidecar p95 latency vs concurrency",
    }

    ingest = suites["ingest"]
    (curve,) = ingest["curves"]
    assert [x for x, _ in curve["series"]["ingest (chunk, embed, write)"]] == [1, 6]

    gateway = suites["gateway"]
    points = gateway["figures"]["points"]
    assert [p["chunks"] for p in points] == [60, 200]
    assert all(p["index_mb"] > 0 and math.isfinite(p["reindex_s"]) for p in points)
    largest = points[-1]
    assert [p["concurrency"] for p in largest["by_concurrency"]] == [1, 2]
    visible = {p["visible"]: p["mean_hits"] for p in largest["by_selectivity"]}
    # 200 chunks = 40 records; a caller who sees 10% of them gets at most their 4 records.
    assert visible[1.0] == 10 and 0 < visible[0.1] <= 4
    assert gateway["headlines"][0]["higher_is_better"] is False  # latency: lower is better
    # The non-admin dense headline comes from interleaved pairs, like the others: a ratio and its spread.
    (dense,) = [h for h in gateway["headlines"] if h["name"].startswith("non-admin dense leg")]
    assert len(dense["spread"]) == 2 and all(map(math.isfinite, [dense["ratio"], *dense["spread"]]))
    # The HTTP floor (a real aiohttp process running the legs' SQL) beside the goal cells: one caller
    # at every size, and the most callers at the largest; its requests were served.
    floored = [(p["chunks"], c["concurrency"]) for p in points for c in p["by_concurrency"] if "floor" in c]
    assert floored == [(60, 1), (200, 1), (200, 2)]
    assert all(c["floor"]["rps"] > 0 for c in largest["by_concurrency"])
    floor_table = next(t for t in gateway["tables"] if t["title"].startswith("The HTTP floor"))
    assert [row[:3] for row in floor_table["rows"]] == [
        [60, "off", 1], [200, "off", 1], [200, "off", 2], [200, "auto", 1], [200, "auto", 2]
    ]  # fmt: skip

    quality = suites["quality"]
    names = [h["name"] for h in quality["headlines"]]
    assert names == [
        "lexical nDCG@10 (tiny-beir)",
        "hybrid nDCG@10 (tiny-beir)",
        "dense nDCG@10 (tiny-beir)",
        "lowest lexical recall@k, Tantivy engine (candidates x2)",  # the recall section
    ]
    assert quality["headlines"][0]["bar"] == 0.95
    # one table of every data set, each leg, hybrid, tuned, references; then the recall section's two
    table, recall, timing = quality["tables"]
    assert {row[0] for row in recall["rows"]} == {"tiny-beir"} and recall["columns"][4] == "recall x1"
    assert timing["rows"][0][:2] == ["tiny-beir", 5]
    modes = {row[1] for row in table["rows"]}
    assert {"dense", "lexical", "hybrid", "hybrid, tuned (2-fold CV)", "ref: BM25 (bm25s)"} <= modes
    assert table["columns"] == ["data set", "mode", "ndcg@10", "recall@100", "mrr@10"]
    (chart,) = quality["bars"]  # and one plot
    assert chart["categories"] == ["tiny-beir"] and (out / "quality-ndcg-10-per-data-set.png").is_file()

    assert suites["gpu"]["figures"]["config"]["tiny"] is True

    report = (out / "REPORT.md").read_text()
    for suite in payload["suites"]:
        for curve in suite["curves"]:
            slug = "".join(c if c.isalnum() else "-" for c in f"{suite['suite']}-{curve['name']}".lower())
            png = out / (slug.strip("-") + ".png")
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
            assert f"]({png.name})" in report
    assert "Suite wall time" in report


def test_suite_selection_and_device_rules() -> None:
    assert _suites("all", "cpu") == ["sidecar", "ingest", "gateway", "quality", "reliability", "scale"]
    assert _suites("all", "cuda") == ["gpu"] and _suites("gpu", "cpu") == ["gpu"]
    with pytest.raises(SystemExit, match="unknown suite"):
        _suites("sidecar,nope", "cpu")
    with pytest.raises(SystemExit, match="--device cuda runs the GPU mode"):
        _suites("gateway", "cuda")


def test_a_bad_override_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert mnemo(["bench", "--suite", "ingest", "--out", str(tmp_path), "--set", "ingest.records=many"]) == 2
    assert "ingest.records=many" in capsys.readouterr().err
    assert not (tmp_path / "REPORT.md").exists()


@pytest.mark.ray
@pytest.mark.slow
# The suite in small: fuzzing, the ACL and token checks, SIGTERM, overload and mixed load (its hang
# guard: the slow tests' one, tests/conftest.py). The faults (PostgreSQL stopped, a drain worker, a
# backfill and the sidecar killed, replicas killed) each have their own test with their figures
# (tests/test_faults.py, test_backfill.py, test_failfast.py): run here too they cost about 100 s.
def test_reliability_suite_writes_its_figures(sidecar_url: str, pg_server, tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = ["bench", "--suite", "reliability", "--out", str(out), "--sidecar-url", sidecar_url]
    args += ["--database-url", pg_server.url, "--work-dir", str(tmp_path / "work")]
    args += ["--set", "reliability.cases_per_route=2", "--set", "reliability.sidecar_oversize_bytes=4194305"]
    args += ["--set", "reliability.sigterm_callers=3", "--set", "reliability.faults=false"]
    args += ["--set", "reliability.overload_seconds=1", "--set", "reliability.mixed_seconds=1"]
    args += ["--set", "reliability.mixed_callers=8"]
    args += ["--set", "reliability.cluster_callers=0"]  # the two-node cluster: tests/test_ray_cluster.py
    # The Tantivy engine's figures (a 2-worker gateway and a writer killed: about a minute); their
    # engine's behaviour is tests/test_tantivy_lexical.py's, their run results/2026-12-04/tantivy-reliability.
    args += ["--set", "reliability.tantivy_records=0", "--set", "reliability.tantivy_kills=0"]
    assert mnemo(args) == 0
    (suite,) = json.loads((out / "results.json").read_text())["suites"]
    assert suite["skipped"] is None, suite
    figures = suite["figures"]
    assert (
        figures["fuzz"]["gateway"]["server_errors"] == 0 and figures["fuzz"]["sidecar"]["server_errors"] == 0
    )
    assert figures["acl"]["rows_leaked"] == 0 and figures["acl"]["restricted_rows"] > 0
    assert figures["tokens"]["not_refused"] == [] and figures["images"]["server_errors"] == 0
    assert figures["healthy_after"] == {"gateway": True, "sidecar": True}
    sigterm = figures["sigterm"]
    assert sigterm["requests_before_sigterm"] > 0 and sigterm["before_sigterm"]["broken"] == 0, sigterm
    assert sigterm["after_sigterm"]["broken"] == 0 and sigterm["exit_code"] == 0, sigterm
    faults = {"postgres_stopped", "drain_worker_killed", "backfill_killed", "sidecar_stopped"}
    faults |= {"replica_killed", "read_replica_restarted"}
    assert not faults & set(figures), "faults=false runs none of them"
    assert figures["overload"]["server_errors"] == 0 and figures["overload"]["served_after"], figures[
        "overload"
    ]
    assert figures["mixed_load"]["failed"] == 0, figures["mixed_load"]
    assert "Reliability figures" in (out / "REPORT.md").read_text()
