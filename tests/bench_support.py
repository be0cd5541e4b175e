"""Helpers shared by the benchmark harness's end-to-end tests: ``mnemo bench`` on the session's stack."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.cli import main as mnemo
from schema import EmbeddedPostgres


def run_bench(
    suites: Sequence[str], plan: Sequence[str], sidecar_url: str, pg_server: EmbeddedPostgres, tmp_path: Path
) -> dict[str, dict[str, Any]]:
    """``mnemo bench --suite SUITES --set PLAN...`` against the session's sidecar and PostgreSQL; each
    suite's result (``results.json``) by name, once the run exited 0 with none of them skipped."""
    out = tmp_path / "report"
    args = ["bench", "--suite", ",".join(suites), "--out", str(out), "--sidecar-url", sidecar_url]
    args += ["--database-url", pg_server.url, "--work-dir", str(tmp_path / "work")]
    for assignment in plan:
        args += ["--set", assignment]
    assert mnemo(args) == 0
    results = {s["suite"]: s for s in json.loads((out / "results.json").read_text())["suites"]}
    assert {name: s["skipped"] for name, s in results.items()} == dict.fromkeys(suites), results.keys()
    return results
