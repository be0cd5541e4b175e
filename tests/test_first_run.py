"""A production operator's first contact: every database command against a database created empty.

Production points ``RAG_DATABASE_URL`` at a fresh PostgreSQL database: no ``vector`` extension, no
tables. Each command must bring it up on its own (migrations run before anything else touches it),
exactly as the embedded default does. Each test here gets a database created from ``template0``
and reaches it only through ``RAG_DATABASE_URL``, never a flag or a pre-migrated template.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from inference.net import free_port, wait_ready
from tests.conftest import REPO_ROOT
from tests.fixtures.gateway import SECRET, TEXT_MODEL
from tests.waiting import until

pytestmark = pytest.mark.ray


def _env(database_url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    return {
        **env,
        "RAG_DATABASE_URL": database_url,
        "RAG_DATA_DIR": str(tmp_path / "state"),
        "RAG_JWT_SECRET": SECRET,
        **extra,
    }


def _mnemo(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "--log-level", "WARNING", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
        env=env,
    )


def _foreground(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "--log-level", "WARNING", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _read_until(proc: subprocess.Popen[str], marker: str) -> str:
    """Lines of a foreground command up to ``marker`` (it must appear before the command ends)."""
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if marker in line:
            return "".join(lines)
    proc.wait(timeout=60)
    raise AssertionError(f"{marker!r} never printed (exit {proc.returncode}):\n{''.join(lines)}")


def _stop(proc: subprocess.Popen[str], sig: int = signal.SIGINT) -> tuple[int, str]:
    proc.send_signal(sig)
    try:
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.communicate(timeout=60)
    return proc.returncode, rest


async def _tables(database_url: str) -> set[str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {r["tablename"] for r in rows}
    finally:
        await conn.close()


@pytest.fixture
def beir_set(tmp_path: Path) -> Iterator[Path]:
    """A four-document BEIR set: enough for `mnemo eval` to index, search and score."""
    root = tmp_path / "mini"
    (root / "qrels").mkdir(parents=True)
    docs = {
        "d1": "The dam flooded the valley and the families had to leave their farms.",
        "d2": "A bronze coin struck at the mint of Emerita Augusta.",
        "d3": "Harvest songs sung by the women of the village in autumn.",
        "d4": "The amphora carried olive oil across the Mediterranean.",
    }
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": k, "title": "", "text": v}) + "\n" for k, v in docs.items())
    )
    queries = {"q1": "families leaving the flooded valley", "q2": "Roman coin mint"}
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in queries.items())
    )
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    yield root


async def test_migrate_creates_everything_on_an_empty_database(
    empty_database_url: str, tmp_path: Path
) -> None:
    env = _env(empty_database_url, tmp_path)
    first = _mnemo("migrate", env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("applied: 0001_extensions"), first.stdout
    assert {"rag_embeddings", "rag_index_queue", "schema_migrations"} <= await _tables(empty_database_url)
    again = _mnemo("migrate", env=env)
    assert again.returncode == 0 and again.stdout.strip() == "schema is up to date", again.stderr


async def test_db_serves_an_empty_database_until_ctrl_c(empty_database_url: str, tmp_path: Path) -> None:
    proc = _foreground("db", env=_env(empty_database_url, tmp_path))
    out = _read_until(proc, "migrations applied")
    assert "external server" in out
    code, rest = _stop(proc)
    assert code == 0 and "database stopped" in rest, out + rest
    assert "schema_migrations" in await _tables(empty_database_url)


def test_queue_commands_on_an_empty_database(
    empty_database_url: str, tmp_path: Path, sidecar_url: str
) -> None:
    env = _env(empty_database_url, tmp_path, RAG_SIDECAR_URL=sidecar_url, RAG_TEXT_MODEL=TEXT_MODEL)
    stats = _mnemo("queue", "stats", "--json", env=env)
    assert stats.returncode == 0 and json.loads(stats.stdout)["pending"] == 0, stats.stderr
    queued = _mnemo("ingest", "demo", env=env)
    assert queued.returncode == 0, queued.stderr
    drained = _mnemo("drain", "--once", env=env)
    assert drained.returncode == 0, drained.stderr
    assert "0 failed" in drained.stdout, drained.stdout
    assert json.loads(_mnemo("queue", "stats", "--json", env=env).stdout)["pending"] == 0


def test_gateway_starts_on_an_empty_database(
    empty_database_url: str, tmp_path: Path, sidecar_url: str
) -> None:
    port = free_port()
    proc = _foreground(
        "gateway", "--port", str(port), env=_env(empty_database_url, tmp_path, RAG_SIDECAR_URL=sidecar_url)
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}", 180, path="/healthz", exit_code=proc.poll)
    finally:
        code, rest = _stop(proc, signal.SIGTERM)
    assert code == 0, rest


def test_eval_on_an_empty_database(
    empty_database_url: str, tmp_path: Path, sidecar_url: str, beir_set: Path
) -> None:
    env = _env(empty_database_url, tmp_path, RAG_SIDECAR_URL=sidecar_url, RAG_TEXT_MODEL=TEXT_MODEL)
    done = _mnemo("eval", "--dataset", str(beir_set), "--modes", "lexical", "--no-references", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "lexical" in done.stdout


@pytest.mark.timeout(900)  # the whole stack from nothing: a hang guard, like the slow tests' one
def test_up_on_an_empty_database(empty_database_url: str, tmp_path: Path, sidecar_url: str) -> None:
    port = free_port()
    proc = _foreground(
        "up", "--port", str(port), env=_env(empty_database_url, tmp_path, RAG_SIDECAR_URL=sidecar_url)
    )
    out = _read_until(proc, "Ctrl-C stops everything")
    assert "external server" in out and "indexed" in out, out
    code, rest = _stop(proc)
    assert code == 0 and "Mnemo stopped." in rest, out + rest


def test_up_exits_promptly_with_the_log_when_the_sidecar_dies(
    empty_database_url: str, tmp_path: Path
) -> None:
    """The sidecar `up` starts dies at once: `up` says why and exits non-zero, without waiting out its poll."""
    env = _env(empty_database_url, tmp_path, RAG_SIDECAR_CONFIG=str(tmp_path / "no-such-models.yaml"))
    # The readiness poll it must abandon runs for 600 s; the subprocess timeout catches a hang.
    done = _mnemo("up", "--port", str(free_port()), env=env, timeout=240)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the sidecar did not start" in done.stderr and "last lines of" in done.stderr, done.stderr
    assert "no-such-models.yaml" in done.stderr, "the log's last lines name the cause"


def _status(group: str, env: dict[str, str]) -> dict[str, dict[str, object]]:
    done = _mnemo(group, "status", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["partitions"]


async def test_the_index_writers_on_an_empty_database(
    empty_database_url: str, tmp_path: Path, sidecar_url: str
) -> None:
    """`mnemo lexical` and `mnemo vectors` (follow, status, rebuild) on a database created empty and
    reached by URL alone: the followers start on it (migrating it) with nothing to build, build the
    partition the first drained records make and follow it; status says so; rebuild replaces it."""
    env = _env(empty_database_url, tmp_path, RAG_SIDECAR_URL=sidecar_url, RAG_TEXT_MODEL=TEXT_MODEL)
    followers = {group: _foreground(group, "follow", env=env) for group in ("lexical", "vectors")}
    try:
        for group, proc in followers.items():
            _read_until(proc, f"{group} writer: following the change feed")
        assert _status("lexical", env) == {} and _status("vectors", env) == {}  # no partition yet
        assert _mnemo("ingest", "demo", env=env).returncode == 0
        drained = _mnemo("drain", "--once", env=env)
        assert drained.returncode == 0 and "0 failed" in drained.stdout, drained.stdout + drained.stderr
        for group in followers:  # built by the followers from the feed, nothing else asked

            async def built(group: str = group) -> bool:
                shown = await asyncio.to_thread(_status, group, env)
                return {p["state"] for p in shown.values()} == {"ready"}

            await until(f"the {group} follower to build the drained partition", built, every_s=1)
    finally:
        stopped = {group: _stop(proc) for group, proc in followers.items()}
    for group, (code, rest) in stopped.items():
        assert code == 0 and f"{group} writer stopped" in rest, rest
    lexical = _status("lexical", env)
    (name,) = lexical
    rows = lexical[name]["documents"]
    assert rows > 0 and lexical[name]["behind"] == 0, lexical  # every drained row, committed
    rebuilt = _mnemo("lexical", "rebuild", "--no-progress", env=env)
    assert rebuilt.returncode == 0 and f"{name}: {rows} documents in" in rebuilt.stdout, rebuilt
    # The snapshot the follower wrote holds the rows of its first load (readers apply the feed on
    # top of it until it is rewritten); a rebuild writes them all.
    rebuilt = _mnemo("vectors", "rebuild", env=env)
    assert rebuilt.returncode == 0 and f"{name}: {rows} vectors in" in rebuilt.stdout, rebuilt
    after = _status("lexical", env)[name], _status("vectors", env)[name]
    assert [(s["state"], s["behind"]) for s in after] == [("ready", 0), ("ready", 0)], after
    assert after[0]["folder"] != lexical[name]["folder"]  # swapped in anew
