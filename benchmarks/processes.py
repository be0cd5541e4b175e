"""The processes a benchmark starts: a ``mnemo`` command with its output in a log file
(:func:`start_mnemo`, :func:`mnemo_process`), and a server on a free loopback port, ready before it is
used and stopped after (:func:`serving_subprocess`)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from inference.net import ProcessExited, await_ready, free_port, stop_process

from .settings import child_environment

__all__ = ["mnemo_process", "serving_subprocess", "start_mnemo"]


async def start_mnemo(argv: Sequence[str], log: Path, **env: str) -> asyncio.subprocess.Process:
    """``mnemo ARGV`` (``python -m gateway.cli``) in a subprocess, with this process's environment
    plus ``env``, its output appended to ``log`` (a file, not a pipe nobody reads)."""
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", *argv, env=child_environment(**env), stdout=out, stderr=out
        )


@contextlib.asynccontextmanager
async def mnemo_process(
    argv: Sequence[str], log: Path, **env: str
) -> AsyncIterator[asyncio.subprocess.Process]:
    """:func:`start_mnemo`, stopped with SIGTERM after (a caller may kill it first)."""
    proc = await start_mnemo(argv, log, **env)
    try:
        yield proc
    finally:
        await stop_process(proc)


@contextlib.asynccontextmanager
async def serving_subprocess(
    argv: Sequence[str], log: Path, environ: dict[str, str], *, what: str, cwd: Path | None = None
) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """``python argv --port P`` on a free loopback port, ready (``/healthz``); its URL and process.

    Terminated after (killed if it has not exited a minute later); ``what`` names it in the error of
    a start that failed, beside its log."""
    port = free_port()
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *argv, "--port", str(port), env=environ, stdout=out, stderr=out, cwd=cwd
        )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            await await_ready(url, 120.0, path="/healthz", process=proc)
        except (ProcessExited, TimeoutError) as exc:
            raise RuntimeError(f"{what} did not start ({exc}); see {log}") from exc
        yield url, proc
    finally:
        await stop_process(proc)
