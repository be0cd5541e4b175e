import json
from pathlib import Path

from benchmarks.report import Curve, Headline, SuiteResult, Table, write_report


def test_report_writes_json_markdown_and_plots(tmp_path: Path) -> None:
    result = SuiteResult(
        suite="sidecar",
        headlines=[Headline("items/s at c=16", 50.0, "items/s", "in-process batch 32", 100.0, bar=0.5)],
        tables=[Table("latency", ["concurrency", "p50 ms"], [[1, 3.5], [16, 12.25]])],
        curves=[
            Curve(
                "throughput vs concurrency", "concurrency", "items/s", {"1-item": [(1, 10), (2, 19), (4, 20)]}
            )
        ],
    )
    report = write_report(
        tmp_path, [result, SuiteResult("peers", skipped="infinity-emb not installable")], {}
    )
    text = report.read_text()
    assert (
        "| sidecar | items/s at c=16 | 50 items/s | in-process batch 32: 100 items/s | 0.5 | ≥ 0.5 ✓ |"
        in text
    )
    assert "the knee is at concurrency = 2" in text
    assert "Skipped: infinity-emb not installable" in text
    png = tmp_path / "sidecar-throughput-vs-concurrency.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["suites"][0]["headlines"][0]["ratio"] == 0.5
    assert data["machine"]["cores"] >= 1
