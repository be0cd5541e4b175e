"""``mnemo up``: the whole stack in the foreground, for a first look and for demos.

Starts the database (embedded unless ``RAG_DATABASE_URL``), the sidecar (a
``mnemo sidecar`` subprocess with the offline profile, unless ``RAG_SIDECAR_URL``
or ``--sidecar-url`` names a running one), the gateway, and, when the gateway's
lexical leg reads Tantivy (``RAG_LEXICAL_INDEX=auto``, the default, or ``tantivy``),
the one writer of its index (a ``mnemo lexical follow`` subprocess); loads the demo
collection through the intake and waits for the drain; then prints two tokens
(an admin and a restricted researcher) and example requests that show the
difference. Ctrl-C (or SIGTERM) stops everything it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import secrets
import shlex
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import psutil

from gateway.access.auth import issue_token
from gateway.base.settings import GatewaySettings, child_environment
from gateway.run.processes import serving_workers, worker_count
from index.demo import load_demo
from index.ingest import queue
from index.lexical.engine import MODES as TANTIVY_LEXICAL_MODES
from inference.net import ProcessExited, await_ready, free_port, log_tail, stop_process
from schema.cli import stop_signal
from schema.database import create_pool

# The researcher reads the oral histories and the coin catalogue, whose cards also draw on the
# mint register (contributor numisdata6/numisdata16), so numisdata6 is granted too; not mus1, and
# not rsc35, so the interview transcriptions stay hidden.
RESEARCHER_PERMS = {"oh1": 1, "numisdata4": 1, "numisdata6": 1}
RESEARCHER_PROJECTS = [1]


@dataclasses.dataclass(frozen=True)
class DemoExample:
    """One printed example request; ``expect_empty`` marks the ones meant to show a refusal."""

    token_var: str  # ADMIN or RESEARCHER
    action: str
    options: dict
    expect_empty: bool = False
    comment: str = ""


_WATER = {"query": "when the water came we had to leave", "limit": 5}
_ASK = {"query": "What happened when the water came to Valdemora?"}
DEMO_EXAMPLES: tuple[DemoExample, ...] = (
    DemoExample("ADMIN", "retrieve", _WATER),
    DemoExample("RESEARCHER", "retrieve", _WATER),
    DemoExample("ADMIN", "semantic_search", {"query": "amphora MAC-2231"}),
    DemoExample("RESEARCHER", "semantic_search", {"query": "amphora MAC-2231"}),
    DemoExample("RESEARCHER", "similar_to", {"section_tipo": "numisdata4", "section_id": 101, "limit": 3}),
    DemoExample("RESEARCHER", "embed_groups", {"section_tipo": "mus1"}, True, "   # {groups: []}"),
    # A grounded answer with [n] citations (offline: the extractive provider, no language model).
    DemoExample("ADMIN", "ask", _ASK),
    DemoExample("RESEARCHER", "ask", _ASK),
)


def jwt_secret(configured: str | None, data_dir: Path) -> str:
    """The configured ``RAG_JWT_SECRET``, or a random one kept in ``<data dir>/jwt_secret`` (0600)
    across restarts."""
    if configured:
        return configured
    path = data_dir / "jwt_secret"
    if path.exists():
        return path.read_text().strip()
    data_dir.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(48)
    path.touch(mode=0o600)
    path.write_text(secret)
    return secret


SIDECAR_START_TIMEOUT_S = 600.0  # a cold start on two loaded cores with model loading and warm-up


class SidecarStartError(RuntimeError):
    """The sidecar ``mnemo up`` started died or never answered ready."""


@contextlib.asynccontextmanager
async def sidecar_process(data_dir: Path, port: int) -> AsyncIterator[str]:
    """``mnemo sidecar`` on ``port`` (its log in ``<data dir>/sidecar.log``) until ready; stopped on exit."""
    log_path = data_dir / "sidecar.log"
    await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "sidecar", "--port", str(port), stdout=log, stderr=log
        )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            await await_ready(url, SIDECAR_START_TIMEOUT_S, process=proc)
        except (ProcessExited, TimeoutError) as exc:
            await asyncio.sleep(0.2)  # let the last lines reach the log
            raise SidecarStartError(
                f"the sidecar did not start ({exc}); last lines of {log_path}:\n{log_tail(log_path)}"
            ) from exc
        yield url
    finally:
        # Ray's agents outlive their raylet for a while; remember the whole tree so that
        # nothing the sidecar started survives `mnemo up`.
        try:
            tree = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        if proc.returncode is None:
            await stop_process(proc)
            if proc.returncode != 0:  # its graceful stop did not finish: say so, with where to look
                print(f"  sidecar   exited with code {proc.returncode}; see {log_path}", file=sys.stderr)
        _, alive = await asyncio.to_thread(psutil.wait_procs, tree, 15)
        for leftover in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                leftover.kill()


FOLLOWER_START_TIMEOUT_S = 120.0  # the writer opens the database and takes its lock: seconds
FOLLOWING = "following the change feed"  # the line `mnemo lexical follow` prints once it runs


class FollowerStartError(RuntimeError):
    """The lexical writer ``mnemo up`` started died before it followed the feed (another writer
    holds the folder's lock, the database refused it)."""


@contextlib.asynccontextmanager
async def lexical_follower(data_dir: Path, root: Path, database_url: str) -> AsyncIterator[Path]:
    """``mnemo lexical follow`` into ``root`` (its log in ``<data dir>/lexical.log``) until it
    follows the feed; stopped (SIGTERM, its graceful stop) on exit. Yields the log's path."""
    log_path = data_dir / "lexical.log"
    await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "lexical", "follow", "--dir", str(root),
            stdout=log, stderr=log, env=child_environment(RAG_DATABASE_URL=database_url),
        )  # fmt: skip
    try:
        for _ in range(int(FOLLOWER_START_TIMEOUT_S / 0.2)):
            if proc.returncode is not None or FOLLOWING in log_tail(log_path):
                break
            await asyncio.sleep(0.2)
        if proc.returncode is not None or FOLLOWING not in log_tail(log_path):
            raise FollowerStartError(
                f"the lexical writer did not start (exit code {proc.returncode}); last lines of "
                f"{log_path}:\n{log_tail(log_path)}"
            )
        yield log_path
    finally:
        await stop_process(proc)
        if proc.returncode not in (0, None):
            print(f"  lexical   writer exited with code {proc.returncode}; see {log_path}", file=sys.stderr)


def _curl(url: str, token_var: str, action: str, options: dict) -> str:
    body = json.dumps({"dd_api": "dd_rag_api", "action": action, "options": options}, ensure_ascii=False)
    return (
        f'curl -s {url}/api/v1/json -H "Authorization: Bearer ${token_var}" '
        f"-H 'Content-Type: application/json' -d {shlex.quote(body)}"
    )


def examples(url: str, admin: str, researcher: str) -> str:
    lines = [
        "Tokens (1 hour; `mnemo token --help` makes more):",
        f"  export ADMIN={admin}",
        f"  export RESEARCHER={researcher}",
        "  (researcher: projects [1], read on oh1, numisdata4 and the mint register numisdata6 its",
        "   cards draw on; not mus1, not the interview transcriptions, whose text comes from rsc35)",
        "",
        "The same question, two principals: the admin also gets the timecoded transcription passages",
        "and records of project 2; the researcher only what they may read.",
    ]
    for example in DEMO_EXAMPLES:
        lines.append("  " + _curl(url, example.token_var, example.action, example.options) + example.comment)
    lines += [
        "",
        f"Console: {url}/console  (paste ADMIN or RESEARCHER above to sign in; API docs at {url}/docs)",
        "",
        f"Also: {url}/openapi.json  {url}/metrics  {url}/readyz",
    ]
    return "\n".join(lines)


async def _wait_for_drain(pool: asyncpg.Pool, timeout_s: float = 900.0) -> dict:
    stats = None
    for _ in range(int(timeout_s / 0.5)):
        stats = await queue.stats(pool, max_attempts=5)
        if stats.pending == 0:
            return stats.as_dict()
        await asyncio.sleep(0.5)
    raise TimeoutError(f"the demo collection was not indexed in {timeout_s:.0f}s: {stats}")


async def run_up(args: argparse.Namespace, settings: GatewaySettings, *, own_sidecar: bool) -> int:
    """Start everything, load the demo, print tokens and examples, serve until stopped.

    ``own_sidecar``: start a sidecar with the offline profile (no sidecar URL was configured). The
    gateway runs as ``mnemo gateway --workers N`` does (:mod:`gateway.run.processes`; ``RAG_GATEWAY_WORKERS``,
    one per core by default).
    """
    secret = settings.jwt_secret
    assert secret is not None  # the command resolved it (configured or kept in the data dir)
    stack = contextlib.AsyncExitStack()
    async with stack:
        stop = stack.enter_context(stop_signal())  # left last: Ctrl-C during the workers' stop is theirs
        if not own_sidecar:
            sidecar_url = settings.sidecar.sidecar_url
            print(f"  sidecar   {sidecar_url}  (already running)", flush=True)
        else:
            print("  sidecar   starting (Ray Serve, offline profile; about a minute)...", flush=True)
            sidecar_url = await stack.enter_async_context(
                sidecar_process(settings.database.data_dir, free_port())
            )
            print(
                f"  sidecar   {sidecar_url}  (log in {settings.database.data_dir / 'sidecar.log'})",
                flush=True,
            )
        settings = dataclasses.replace(
            settings, sidecar=dataclasses.replace(settings.sidecar, sidecar_url=sidecar_url)
        )
        count = worker_count(settings.workers)
        supervisor = await stack.enter_async_context(serving_workers(settings, count, "WARNING"))
        database_url = supervisor.settings.database.database_url
        url = f"http://{settings.host}:{settings.port}"
        data_dir = settings.database.data_dir.resolve()
        where = (
            "external server" if settings.database.database_url else f"embedded, data in {data_dir / 'pg'}"
        )
        print(f"  database  {database_url}  ({where}; migrations applied)", flush=True)
        print(f"  gateway   {url}  ({count} worker{'s' if count > 1 else ''})", flush=True)
        if settings.lexical_index in TANTIVY_LEXICAL_MODES:
            # The one writer of the gateways' Tantivy index: it builds each partition once its rows
            # exist and follows the feed; the workers pick the index up without a restart.
            root = settings.ingest.lexical_root(settings.database.data_dir).resolve()
            log_path = await stack.enter_async_context(
                lexical_follower(settings.database.data_dir, root, database_url)
            )
            print(f"  lexical   `mnemo lexical follow` into {root}  (log in {log_path})", flush=True)
        pool = await create_pool(database_url, max_size=2)
        try:
            queued = await load_demo(pool)
            print(f"  demo      {queued} records queued; indexing...", flush=True)
            stats = await _wait_for_drain(pool)
        finally:
            await pool.close()
        print(f"  demo      indexed (queue: {stats})", flush=True)
        admin = issue_token(secret=secret, sub="admin", projects=None, admin=True)
        researcher = issue_token(
            secret=secret,
            sub="researcher",
            projects=RESEARCHER_PROJECTS,
            perms=RESEARCHER_PERMS,
            grants=("ask",),  # the demo's researcher may ask (RAG_ASK_GRANT=required)
        )
        print("", flush=True)
        print(examples(url, admin, researcher), flush=True)
        print("\nCtrl-C stops everything started here.", flush=True)
        await supervisor.watch(stop)  # returns after SIGINT/SIGTERM; leaving stops the workers gracefully
    print("Mnemo stopped.", flush=True)
    return 0
