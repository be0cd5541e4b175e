"""The suites' declared tables (benchmarks.tables): where a value comes from, and the rows it makes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.report import SuiteResult
from benchmarks.tables import Column, Figure, HeadlineRow, figure_rows, headings, pick, rows

MEASURED = {"lost": 0, "dup": 2, "rss": {"max": 12.5}, "spread": [0.9, 1.1], "name": "x", "n": 12345}


def test_a_lone_field_keeps_its_type_and_a_template_formats() -> None:
    assert pick("{lost}", MEASURED) == 0 and isinstance(pick("{lost}", MEASURED), int)
    assert pick("{rss[max]}", MEASURED) == 12.5  # nested keys as str.format reads them
    assert pick("{spread[0]}", MEASURED) == 0.9
    assert pick("{lost} / {dup}", MEASURED) == "0 / 2"
    assert pick("{n:,} rows", MEASURED) == "12,345 rows"
    assert pick("{{error: {{code}}}} of {name}", MEASURED) == "{error: {code}} of x"  # braces doubled
    assert pick(lambda m: m["dup"] * 2, MEASURED) == 4
    assert pick(0, MEASURED) == 0 and pick(True, MEASURED) is True and pick(None, MEASURED) is None
    assert pick("no field", MEASURED) == "no field"


def test_a_missing_field_names_itself() -> None:
    with pytest.raises(KeyError, match="absent"):
        pick("{absent}", MEASURED)
    with pytest.raises(KeyError, match="absent"):
        pick("{absent} / {lost}", MEASURED)


def test_columns_and_figures_make_rows() -> None:
    columns = (Column("name", "{name}"), Column("lost / dup", "{lost} / {dup}"))
    assert headings(columns) == ["name", "lost / dup"]
    assert rows(columns, [MEASURED, {**MEASURED, "name": "y"}]) == [["x", "0 / 2"], ["y", "0 / 2"]]
    figures = (
        Figure("records lost of {n}", "{lost}", 0),
        Figure("RSS max", "{rss[max]}", lambda m: f"<= {m['n']}"),
    )
    assert figure_rows(figures, MEASURED) == [["records lost of 12345", 0, 0], ["RSS max", 12.5, "<= 12345"]]


def test_a_headline_row_reads_its_value_baseline_bar_and_spread() -> None:
    row = HeadlineRow(
        "{name} p50", "{dup}", "ms", "{name} baseline", "{lost}", bar=lambda m: 1.5, spread="{spread}"
    )
    h = row.read({**MEASURED, "lost": 4})
    assert (h.name, h.value, h.unit, h.baseline_name, h.baseline) == ("x p50", 2, "ms", "x baseline", 4)
    assert h.bar == 1.5 and h.spread == (0.9, 1.1) and h.ratio == 0.5
    assert HeadlineRow("a", "{dup}", "", "b", 1.0).read(MEASURED).spread is None


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "2026-12-04"


def _stored(folder: str, suite: str) -> dict[str, Any]:
    payload = json.loads((RESULTS / folder / "results.json").read_text())
    return next(s for s in payload["suites"] if s["suite"] == suite)


def _as_written(suite: SuiteResult) -> dict[str, Any]:
    """The suite as write_report puts it in results.json (JSON, unknown types as strings)."""
    return json.loads(json.dumps(dataclasses.asdict(suite), default=str))


def test_the_declared_reports_rebuild_the_tables_the_stored_runs_wrote() -> None:
    """The reliability, sidecar and gateway reports, rebuilt from the figures of the 2026-12-04
    runs, give the tables those runs wrote (their notes and later headlines have moved on since)."""
    from benchmarks.gateway_figures import as_suite as gateway_report
    from benchmarks.plan import QUICK
    from benchmarks.reliability_figures import as_suite as reliability_report
    from benchmarks.suite_sidecar import _as_suite as sidecar_report

    for folder in ("reliability-quick", "tantivy-reliability"):  # the latter with the Tantivy figures
        reliability = _stored(folder, "reliability")
        assert _as_written(reliability_report(reliability["figures"]))["tables"] == reliability["tables"]

    sidecar = _stored("full-goal-table", "sidecar")
    grid, lengths = sidecar["figures"]["grid"], sidecar["figures"]["lengths"]
    rebuilt = _as_written(sidecar_report(grid, lengths, sidecar["figures"].get("peers")))
    assert rebuilt["tables"] == sidecar["tables"] and rebuilt["headlines"] == [
        {k: v for k, v in h.items() if k not in ("ratio", "meets_bar", "spread_crosses_bar")}
        for h in sidecar["headlines"]
    ]

    gateway = _stored("quick-gateway-floor", "gateway")
    points = gateway["figures"]["points"]
    for point in points:  # the run predates the non-admin headline's spread, which no table shows
        for measured in (point, *point["caches"].values()):
            for visible in measured.get("by_selectivity", ()):
                visible.setdefault("admin_dense_ratio_spread", [1.0, 1.0])
    setup = {k: v for k, v in gateway["figures"].items() if k != "points"}
    assert _as_written(gateway_report(QUICK.gateway, points, setup, limit=10))["tables"] == gateway["tables"]
