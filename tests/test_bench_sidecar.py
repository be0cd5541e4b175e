"""The sidecar benchmark's honest ceilings and spreads: sweeps, repeated windows, interleaved pairs, reports."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from pathlib import Path

import pytest

from benchmarks.grid import combine_windows, load_grid, normalize
from benchmarks.inprocess import sweep
from benchmarks.peers import add_to_suite, interleaved_pairs, summarize_pairs
from benchmarks.report import Headline, SuiteResult, write_report
from benchmarks.sidecar import bar_verdicts


def _cell(items_per_s: float, concurrency: int = 16, size: int = 1, p95: float = 10.0) -> dict:
    return {
        "mode": "sidecar",
        "concurrency": concurrency,
        "request_size": size,
        "requests": 10,
        "items_per_s": items_per_s,
        "tokens_per_s": 20 * items_per_s,
        "latency_ms": {"p50": p95 / 2, "p95": p95, "p99": p95 * 1.5},
    }


def test_sweep_picks_the_batch_with_the_most_items_per_second() -> None:
    speeds = {8: 100.0, 16: 180.0, 32: 170.0, 64: 90.0}
    result = sweep(lambda b: {"items_per_s": speeds[b], "tokens_per_s": 1.0}, (8, 16, 32, 64))
    assert result["best_batch"] == 16
    assert [p["batch"] for p in result["points"]] == [8, 16, 32, 64]
    with pytest.raises(ValueError, match="at least one batch size"):
        sweep(lambda b: {"items_per_s": 1.0}, ())


def test_normalize_gives_each_configuration_its_ratio_and_per_window_spread() -> None:
    cell = normalize(
        _cell(60.0), [{"inprocess": 100.0, "strongest": 200.0}, {"inprocess": 150.0, "strongest": 100.0}]
    )
    assert cell["baseline_items_per_s"] == 125.0 and cell["ratio_to_inprocess"] == pytest.approx(0.48)
    assert cell["strongest_items_per_s"] == 150.0 and cell["ratio_to_strongest"] == pytest.approx(0.4)
    assert cell["spread"]["ratio_to_inprocess"] == pytest.approx([0.4, 0.6])
    assert cell["spread"]["ratio_to_strongest"] == pytest.approx([0.3, 0.6])


def test_repeated_windows_combine_mean_over_mean_with_the_spread_of_every_window() -> None:
    windows = [
        normalize(_cell(50.0, p95=10.0), [{"inprocess": 100.0}, {"inprocess": 100.0}]),
        normalize(_cell(70.0, p95=30.0), [{"inprocess": 100.0}, {"inprocess": 140.0}]),
        normalize(_cell(60.0, p95=20.0), [{"inprocess": 140.0}, {"inprocess": 60.0}]),
    ]
    cell = combine_windows(windows)
    assert cell["items_per_s"] == pytest.approx(60.0) and cell["requests"] == 30
    assert cell["baseline_items_per_s"] == pytest.approx((100 + 120 + 100) / 3)
    assert cell["ratio_to_inprocess"] == pytest.approx(60.0 / ((100 + 120 + 100) / 3))
    assert cell["spread"]["ratio_to_inprocess"] == pytest.approx([60 / 140, 1.0])  # 60/140 and 60/60
    assert cell["latency_ms"]["p95"] == 20.0  # the median of the windows' p95s
    assert len(cell["windows"]) == 3 and len(cell["baseline_windows"]) == 6
    assert combine_windows(windows[:1]) == windows[0]


def test_a_spread_across_the_bar_is_not_settled() -> None:
    verdicts = bar_verdicts(
        {"sidecar_c16_1item": 0.52, "sidecar_c16_32item": 0.9},
        {"sidecar_c16_1item": [0.45, 0.6], "sidecar_c16_32item": [0.85, 0.95]},
    )
    assert verdicts["c16_1item"]["met"] and verdicts["c16_1item"]["settled"] is False
    assert verdicts["c16_32item"]["met"] and verdicts["c16_32item"]["settled"] is True
    assert bar_verdicts({}, {})["c16_1item"] == {
        "bar": 0.5,
        "ratio": None,
        "met": False,
        "spread": None,
        "settled": None,
    }


def test_the_grid_repeats_only_the_headline_cells_each_beside_its_own_baselines() -> None:
    events: list[str] = []

    async def call(texts: list[str]) -> int:
        await asyncio.sleep(0.001)
        return 3 * len(texts)

    def baseline() -> dict[str, float]:
        events.append("baseline")
        return {"inprocess": 1000.0 + len(events), "strongest": 2000.0}

    cells = asyncio.run(
        load_grid(
            "sidecar",
            call,
            ["a", "b", "c", "d"],
            baseline=baseline,
            concurrencies=(1, 16),
            sizes=(1, 2),
            seconds=0.02,
            repeats=3,
        )
    )
    # one window before, one after each size's grid, one after each extra headline window
    assert len(events) == 1 + 2 * (1 + 2)
    assert [(c["concurrency"], c["request_size"], len(c.get("windows", [c]))) for c in cells] == [
        (1, 1, 1),
        (16, 1, 3),
        (1, 2, 1),
        (16, 2, 3),
    ]
    for cell in cells:  # each timed against both baselines (what the ratios come to is timing)
        assert all(map(math.isfinite, [cell["ratio_to_inprocess"], *cell["spread"]["ratio_to_inprocess"]]))
        assert math.isfinite(cell["ratio_to_strongest"])


def test_interleaved_pairs_alternate_the_order_and_report_each_pairs_ratio() -> None:
    order: list[str] = []

    def caller(mode: str, delay: float):
        async def call(texts: list[str]) -> int:
            if not order or order[-1] != mode:
                order.append(mode)
            await asyncio.sleep(delay)
            return len(texts)

        return call

    pairs = asyncio.run(
        interleaved_pairs(
            {"sidecar": caller("sidecar", 0.002), "infinity": caller("infinity", 0.004)},
            ["x", "y"],
            concurrency=2,
            sizes=(1,),
            seconds=0.05,
            pairs=3,
        )
    )
    (pair,) = pairs
    assert pair["order"] == [["sidecar", "infinity"], ["infinity", "sidecar"], ["sidecar", "infinity"]]
    # the calls themselves, runs of one mode collapsed: warm-up s i, then s i | i s | s i
    assert order == ["sidecar", "infinity", "sidecar", "infinity", "sidecar", "infinity"]
    assert pair["pairs"] == 3 and pair["concurrency"] == 2 and pair["request_size"] == 1
    # The ratio is of timed windows: which side is faster is timing, not structure (a loaded run
    # measured 1.15 for callers that sleep half as long); how it is summarized is the next test's.
    assert len(pair["spread"]) == 2 and all(map(math.isfinite, [pair["ratio"], *pair["spread"]]))


def test_summarized_pairs_are_the_ratio_of_the_means_with_the_pairs_spread() -> None:
    rows = [
        {"sidecar": _cell(110.0), "infinity": _cell(100.0)},
        {"sidecar": _cell(90.0), "infinity": _cell(100.0)},
    ]
    summary = summarize_pairs(rows, "sidecar", "infinity")
    assert summary["ratio"] == pytest.approx(1.0) and summary["spread"] == pytest.approx([0.9, 1.1])
    assert summary["sidecar"]["windows"] == [110.0, 90.0]


def _grid_with_configurations() -> dict:
    configs = {
        "inprocess_batch32": {"batch": 32, "items_per_s": 100.0, "tokens_per_s": 4000.0, "windows": [100.0]},
        "strongest": {
            "batch": 64,
            "overlap": False,
            "items_per_s": 150.0,
            "tokens_per_s": 6000.0,
            "windows": [150.0],
        },
        "ceiling": {"batch": 64, "items_per_s": 200.0, "tokens_per_s": 8000.0, "windows": [200.0]},
        "st_encode": {"batch": 16, "items_per_s": 120.0, "tokens_per_s": 4800.0, "windows": [120.0]},
        "sweeps": {
            "strongest": {
                "best_batch": 64,
                "points": [{"batch": 32, "items_per_s": 140.0}, {"batch": 64, "items_per_s": 150.0}],
            },
            "st_encode": {
                "best_batch": 16,
                "points": [{"batch": 16, "items_per_s": 120.0}, {"batch": 32, "items_per_s": 110.0}],
            },
        },
        "sentence_transformers": "9.9.9",
    }
    windows = [{"inprocess": 100.0, "strongest": 150.0}, {"inprocess": 100.0, "strongest": 150.0}]
    cells = [
        normalize(_cell(30.0, 1, 1), windows),
        normalize(_cell(55.0, 16, 1), windows),
        normalize(_cell(90.0, 16, 32), windows),
    ]
    ratios = {f"sidecar_c{c['concurrency']}_{c['request_size']}item": c["ratio_to_inprocess"] for c in cells}
    spreads = {
        f"sidecar_c{c['concurrency']}_{c['request_size']}item": c["spread"]["ratio_to_inprocess"]
        for c in cells
    }
    return {
        "model": "all-minilm-l6-v2",
        "baseline": {"windows": 2, "items_per_s": 100.0, "min_items_per_s": 100.0, "max_items_per_s": 100.0},
        "repeats": 1,
        "cells": cells,
        "bars": bar_verdicts(ratios, spreads),
        "configurations": configs,
    }


def test_the_suite_reports_the_configurations_the_ceiling_and_both_ratios(tmp_path: Path) -> None:
    from benchmarks.suite_sidecar import _as_suite

    suite = _as_suite(_grid_with_configurations(), {"points": [], "skipped_lengths": []}, None)
    configurations = suite.tables[0]
    assert configurations.title.startswith("In-process configurations")
    rows = {row[0].split(",")[0].split(":")[0]: row for row in configurations.rows}
    assert [r[1] for r in configurations.rows] == [32, 64, 64, 16]  # the batch each configuration ran at
    assert rows["ceiling"][5] == 1.0 and rows["in-process strongest"][4] == pytest.approx(1.5)
    by_concurrency = suite.tables[1]
    assert "vs strongest in-process" in by_concurrency.columns
    c16 = next(r for r in by_concurrency.rows if r[0] == 16 and r[1] == 1)
    assert c16[by_concurrency.columns.index("vs strongest in-process")] == pytest.approx(55 / 150)
    assert [h.spread for h in suite.headlines] == [(0.55, 0.55), (0.9, 0.9)]
    notes = " ".join(suite.notes)
    assert (
        "batch 64" in notes
        and "0.75 of the ceiling" in notes
        and "overlapping them" in notes
        and "sentence-transformers 9.9.9" in notes
    )
    assert "0.37 of the strongest" in notes  # 55 / 150
    report = write_report(tmp_path, [suite], {}).read_text()
    assert "In-process configurations" in report and "0.55 (0.55–0.55)" in report


def test_a_headline_whose_spread_crosses_its_bar_says_so(tmp_path: Path) -> None:
    crossing = Headline("sidecar 1-item", 52.0, "items/s", "in-process", 100.0, bar=0.5, spread=(0.45, 0.6))
    clear = dataclasses.replace(crossing, name="sidecar 32-item", spread=(0.51, 0.6))
    assert crossing.spread_crosses_bar and not clear.spread_crosses_bar
    report = write_report(tmp_path, [SuiteResult("sidecar", headlines=[crossing, clear])], {}).read_text()
    assert "| 0.52 (0.45–0.6) | ≥ 0.5 ✓ (spread crosses it) |" in report
    assert "| 0.52 (0.51–0.6) | ≥ 0.5 ✓ |" in report


def test_peer_headlines_come_from_the_interleaved_pairs_with_their_spread() -> None:
    suite = SuiteResult("sidecar", figures={"grid": {"cells": []}})
    pair = summarize_pairs(
        [
            {"sidecar": _cell(95.0), "infinity": _cell(100.0)},
            {"sidecar": _cell(115.0), "infinity": _cell(100.0)},
        ],
        "sidecar",
        "infinity",
    ) | {"concurrency": 16, "request_size": 32}
    peers = {
        "status": "ok",
        "peer": "infinity-emb",
        "version": "0.78",
        "model_dir": "/m",
        "cells": [],
        "pairs": [pair],
    }
    add_to_suite(suite, peers)
    (headline,) = suite.headlines
    assert (
        headline.name == "sidecar / infinity-emb 0.78, 32-item requests, concurrency 16 (2 interleaved pairs)"
    )
    assert headline.ratio == pytest.approx(1.05) and headline.bar == 1.0
    assert headline.spread == pytest.approx((0.95, 1.15)) and headline.spread_crosses_bar
    assert any(t.title.startswith("Sidecar vs infinity-emb 0.78, interleaved pairs") for t in suite.tables)


async def test_the_http_caller_retries_coded_shedding_counts_it_and_raises_on_anything_else() -> None:
    """A real aiohttp server on 127.0.0.1 sheds some calls the way the sidecar does (503 not_ready,
    429 overloaded, with Retry-After): the caller sends them again, counts them per cell, and raises
    on a 400 or on a sidecar that keeps shedding."""
    import aiohttp
    from aiohttp import web

    from benchmarks.grid import SHED_RETRIES, SidecarCaller, load_cell

    plan: list[int] = []  # statuses to answer, in order; 200 once empty

    async def embed(request: web.Request) -> web.Response:
        body = await request.json()
        status = plan.pop(0) if plan else 200
        if status == 200:
            return web.json_response({"usage": {"tokens": 3 * len(body["input"])}})
        code = {503: "not_ready", 429: "overloaded", 400: "invalid_input"}[status]
        return web.json_response(
            {"error": {"code": code, "message": "m"}}, status=status, headers={"Retry-After": "0"}
        )

    app = web.Application()
    app.router.add_post("/embed", embed)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as http:
            caller = SidecarCaller(http, f"http://127.0.0.1:{port}", "m")
            plan[:] = [503, 429]
            assert await caller(["a", "b"]) == 6 and caller.shed == 2
            plan[:] = [503]
            cell = await load_cell(
                "sidecar", caller, ["x"] * 8, concurrency=1, size=1, seconds=0.2, server_cpu=False
            )
            assert cell["shed_answers"] == 1 and caller.shed == 3 and cell["requests"] >= 1
            plan[:] = [400]
            with pytest.raises(RuntimeError, match="answered 400 \\(after 0 shed"):
                await caller(["a"])
            plan[:] = [503] * (SHED_RETRIES + 1)
            with pytest.raises(RuntimeError, match=f"answered 503 \\(after {SHED_RETRIES} shed"):
                await caller(["a"])
            assert caller.shed == 3 + SHED_RETRIES
    finally:
        await runner.cleanup()
