"""The embedded database survives restarts, and `mnemo up` stops cleanly on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import psutil

from schema import EmbeddedPostgres, migrate

REPO_ROOT = Path(__file__).resolve().parent.parent


def _postgres_processes(data_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["name"] == "postgres" and any(str(data_dir) in part for part in cmdline):
            found.append(proc)
    return found


async def test_data_directory_is_reused_across_restarts(tmp_path: Path) -> None:
    data_dir = tmp_path / "pg"
    with EmbeddedPostgres(data_dir) as server:
        await migrate(server.url)
        conn = await asyncpg.connect(server.url)
        await conn.execute("CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)")
        await conn.close()
    assert not _postgres_processes(data_dir.resolve()), "stop() leaves no server behind"

    with EmbeddedPostgres(data_dir) as server:
        assert await migrate(server.url) == []
        conn = await asyncpg.connect(server.url)
        assert await conn.fetchval("SELECT v FROM kept") == 42
        await conn.close()


def test_mnemo_up_reaches_a_migrated_database_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    data_dir = (tmp_path / "state").resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "up", "--data-dir", str(data_dir)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl-C stops everything" in line:
            break
    output = "".join(lines)
    assert "migrations applied" in output, output
    assert _postgres_processes(data_dir / "pg"), "the database is running while `up` runs"

    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output + rest
    assert "Mnemo stopped." in rest
    assert not _postgres_processes(data_dir / "pg"), "Ctrl-C leaves no database process behind"
