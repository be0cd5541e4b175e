"""The embedded database survives restarts, and `mnemo up` stops cleanly on Ctrl-C."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import asyncpg
import psutil
import pytest

from gateway.run.up import RESEARCHER_PERMS
from inference.launcher import free_port
from schema import EmbeddedPostgres, migrate
from schema.buffers import buffer_shortfall
from schema.database import open_database
from schema.settings import DatabaseSettings, load_settings

REPO_ROOT = Path(__file__).resolve().parent.parent


def _postgres_processes(data_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["name"] == "postgres" and any(str(data_dir) in part for part in cmdline):
            found.append(proc)
    return found


async def test_data_directory_is_reused_across_restarts(outside_basetemp: Path) -> None:
    """... and each start applies the embedded server's shared_buffers (RAG_EMBEDDED_SHARED_BUFFERS,
    through the production path: settings from the environment, open_database), from the first
    start of a new data folder on, while an operator's ALTER SYSTEM still has the last word."""
    data_dir = outside_basetemp / "pg"
    first = load_settings(
        DatabaseSettings, {"RAG_DATA_DIR": str(outside_basetemp), "RAG_EMBEDDED_SHARED_BUFFERS": "200MB"}
    )
    async with open_database(first) as db:
        assert db.embedded is not None
        async with db.pool.acquire() as conn:
            assert await conn.fetchval("SHOW shared_buffers") == "200MB"
            await conn.execute("CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)")
    assert not _postgres_processes(data_dir.resolve()), "stop() leaves no server behind"

    with EmbeddedPostgres(data_dir, shared_buffers="136MB") as server:
        assert await migrate(server.url) == []
        conn = await asyncpg.connect(server.url)
        assert await conn.fetchval("SELECT v FROM kept") == 42
        assert await conn.fetchval("SHOW shared_buffers") == "136MB", (
            "a changed value applies at the next start"
        )
        await conn.execute("ALTER SYSTEM SET shared_buffers = '144MB'")
        await conn.close()

    with EmbeddedPostgres(data_dir, shared_buffers="136MB") as server:
        conn = await asyncpg.connect(server.url)
        assert await conn.fetchval("SHOW shared_buffers") == "144MB", "ALTER SYSTEM overrides Mnemo's value"
        await conn.close()
    assert (data_dir / "postgresql.conf").read_text().count("include_if_exists = 'mnemo.conf'") == 1


async def test_a_start_waits_out_recovery_longer_than_pg_ctl_allows(outside_basetemp: Path) -> None:
    """After a crash the server replays WAL before it is ready; pgserver gives ``pg_ctl -w`` 10 s,
    and an archive's recovery can take longer. A start waits for the postmaster it launched.

    The long recovery is real PostgreSQL: an archive recovery (``recovery.signal``) whose first
    ``restore_command`` call takes 12 s, with ``hot_standby`` off so nothing is ready before it ends."""
    data_dir = outside_basetemp / "pg"
    server = EmbeddedPostgres(data_dir, recovery_wait_s=300)
    server.start()
    try:
        conn = await asyncpg.connect(server.url)
        await conn.execute("CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)")
        await conn.close()
        server.halt()
        assert not _postgres_processes(data_dir.resolve()), "halt() stops the server"
        (data_dir / "recovery.signal").write_text("")
        with (data_dir / "postgresql.auto.conf").open("a") as conf:
            conf.write("restore_command = '[ -e slept ] || { touch slept; sleep 12; }; false'\n")
            conf.write("hot_standby = off\n")

        server.start()

        assert (data_dir / "slept").exists(), "the slow restore_command ran"
        assert not (data_dir / "recovery.signal").exists(), "recovery finished before start returned"
        conn = await asyncpg.connect(server.url)
        assert await conn.fetchval("SELECT v FROM kept") == 42
        await conn.close()
    finally:
        server.stop()
    assert not _postgres_processes(data_dir.resolve()), "stop() after a waited start leaves no server"


def _post(url: str, token: str, action: str, options: dict) -> dict:
    body = json.dumps({"dd_api": "dd_rag_api", "action": action, "options": options}).encode()
    request = urllib.request.Request(
        url + "/api/v1/json",
        data=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _command(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:  # gone since the listing (Ray's short-lived helpers)
        return []


def _lexical_served_by_the_engine(url: str, token: str, query: dict) -> bool:
    """Whether a worker's /readyz says a partition is served from its Tantivy index, asked after a
    search (a worker opens an index on its first search), until the writer has built it."""
    for _ in range(240):  # a bounded wait for the writer's build, not a time limit
        _post(url, token, "semantic_search", query)
        with urllib.request.urlopen(url + "/readyz", timeout=60) as response:
            lexical = json.loads(response.read())["data"]["lexical_index"]
        if lexical["mode"] == "auto" and any(p["state"] == "ready" for p in lexical["partitions"].values()):
            return True
        time.sleep(0.5)
    return False


def _runtime_path(*code: str, warnings: str = "error") -> str:
    """What platformdirs names the user's runtime folder in a fresh process without XDG_RUNTIME_DIR,
    after ``code``; under ``-W error`` a warning fails the process."""
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    script = "; ".join([*code, "import platformdirs", "print(platformdirs.user_runtime_path())"])
    done = subprocess.run(
        [sys.executable, "-W", warnings, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_runtime_folder_is_platformdirs_own_named_without_a_warning() -> None:
    """pgserver asks platformdirs for the runtime folder on import; without XDG_RUNTIME_DIR that
    warned in `mnemo up`'s first screen. Named first, it is the same folder, and nothing warns."""
    with pytest.raises(AssertionError, match="RuntimeDirWarning: XDG_RUNTIME_DIR is not set"):
        _runtime_path()
    named = _runtime_path("from schema.settings import runtime_folder", "runtime_folder()")
    assert named == _runtime_path(warnings="ignore")


@pytest.mark.timeout(900)
def test_mnemo_up_serves_the_stack_and_stops_everything_on_ctrl_c(outside_basetemp: Path) -> None:
    """The README's `make up` path: database, its own sidecar, gateway, demo, tokens; Ctrl-C stops it
    all. Its first screen carries no library's warning, in a shell without XDG_RUNTIME_DIR too."""
    data_dir = (outside_basetemp / "state").resolve()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_") and k != "XDG_RUNTIME_DIR"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "up", "--data-dir", str(data_dir), "--port", str(port)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                break
        output = "".join(lines)
        assert not re.search(r"\w+Warning\b", output), output
        assert "migrations applied" in output and f"embedded, data in {data_dir / 'pg'}" in output, output
        assert _postgres_processes(data_dir / "pg"), "the database is running while `up` runs"
        assert f"gateway   http://127.0.0.1:{port}  ({os.cpu_count() or 1} worker" in output, output
        assert "indexed" in output
        tokens = dict(re.findall(r"export (ADMIN|RESEARCHER)=(\S+)", output))
        assert set(tokens) == {"ADMIN", "RESEARCHER"}, output

        url = f"http://127.0.0.1:{port}"
        query = {"query": "when the water came we had to leave", "limit": 50}
        admin = _post(url, tokens["ADMIN"], "semantic_search", query)
        researcher = _post(url, tokens["RESEARCHER"], "semantic_search", query)
        assert admin["ok"] and researcher["ok"]
        # limit 50 holds every record of the small demo collection, so the two lists compare exactly.
        admin_records = {(h["section_tipo"], h["section_id"]) for h in admin["data"]}
        researcher_records = {(h["section_tipo"], h["section_id"]) for h in researcher["data"]}
        assert len(admin_records) < 50, "the demo fits in one page"
        assert researcher_records, "the researcher may read oh1 and numisdata4"
        assert {tipo for tipo, _ in researcher_records} <= set(RESEARCHER_PERMS)
        assert researcher_records < admin_records, "the admin also sees what the researcher may not"

        # The one lexical writer runs beside the gateway (RAG_LEXICAL_INDEX=auto, the default) and
        # builds the demo's index, which a worker opens on a search, without a restart.
        assert f"lexical   `mnemo lexical follow` into {data_dir / 'lexical'}" in output, output
        assert _lexical_served_by_the_engine(url, tokens["ADMIN"], query), (
            data_dir / "lexical.log"
        ).read_text()

        started = psutil.Process(proc.pid).children(recursive=True)
        assert started, "up runs the sidecar (and Ray) as child processes"
        assert any(_command(p)[-4:-2] == ["lexical", "follow"] for p in started), "the writer is a child"
    except BaseException:
        proc.kill()
        proc.communicate(timeout=60)
        raise

    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, "".join(lines) + rest
    assert "Mnemo stopped." in rest and "sidecar   exited with code" not in rest, rest
    # SIGTERM from `up` gets the sidecar's whole graceful stop (it died of SIGABRT 3 s in before).
    assert "sidecar stopped" in (data_dir / "sidecar.log").read_text(errors="replace")
    _, alive = psutil.wait_procs(started, timeout=60)
    assert not alive, f"processes left behind: {[p.info for p in alive if hasattr(p, 'info')]}"
    assert not _postgres_processes(data_dir / "pg"), "Ctrl-C leaves no database process behind"


async def test_a_server_whose_buffers_cannot_hold_the_hnsw_indexes_is_named_at_start(
    outside_basetemp: Path,
) -> None:
    """A gateway or drain opening a database whose HNSW indexes outgrow ``shared_buffers`` warns,
    naming both sizes and the setting; one whose indexes fit says nothing (read by a handler on the
    module's own logger, independent of how other tests leave the root logger)."""
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("schema.buffers")
    with EmbeddedPostgres(outside_basetemp / "pg", shared_buffers="1MB") as server:
        conn = await asyncpg.connect(server.url)
        logger.addHandler(handler)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS vector; CREATE TABLE v (e vector(64))")
            # Distinct directions: the cosine opclass stores vectors normalized and pgvector folds a
            # duplicate into the element it equals, so rows of one repeated value (array_fill) built
            # an index whose size depended on the build (1 failure in CI, under 1 MB).
            await conn.execute(
                "INSERT INTO v SELECT ARRAY(SELECT random()::real FROM generate_series(1, 64) WHERE g > 0)"
                "::vector FROM generate_series(1, 6000) g"
            )
            await conn.execute("CREATE INDEX v_hnsw ON v USING hnsw (e vector_cosine_ops)")
            assert await conn.fetchval("SHOW shared_buffers") == "1MB"
            hnsw_bytes = await conn.fetchval("SELECT pg_relation_size('v_hnsw')")
            assert hnsw_bytes > 2 << 20, hnsw_bytes
            shortfall = await buffer_shortfall(conn)
            assert shortfall == (1 << 20, hnsw_bytes), shortfall
            async with open_database(DatabaseSettings(database_url=server.url)):
                pass
            assert seen == [str(shortfall)], (seen, logger.disabled, logging.root.manager.disable)
            assert re.match(
                r"shared_buffers \(1 MiB\) is smaller than this database's HNSW indexes \(\d+ MiB\)", seen[0]
            )
            assert "RAG_EMBEDDED_SHARED_BUFFERS" in seen[0]
            await conn.execute("DROP INDEX v_hnsw")
            assert await buffer_shortfall(conn) is None
        finally:
            logger.removeHandler(handler)
            await conn.close()
