"""``mnemo up``: the whole stack in the foreground, for a first look and for demos.

Starts the database (embedded unless ``RAG_DATABASE_URL``), the sidecar (a
``mnemo sidecar`` subprocess with the offline profile, unless ``RAG_SIDECAR_URL``
or ``--sidecar-url`` names a running one), and the gateway; loads the demo
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
import os
import secrets
import shlex
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import psutil

from .settings import GatewaySettings

RESEARCHER_PERMS = {"oh1": 1, "numisdata4": 1}  # no mus1; no rsc35, so transcriptions stay hidden
RESEARCHER_PROJECTS = [1]


def jwt_secret(data_dir: Path) -> str:
    """``RAG_JWT_SECRET``, or a random one kept in ``<data dir>/jwt_secret`` (0600) across restarts."""
    configured = os.environ.get("RAG_JWT_SECRET")
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


@contextlib.asynccontextmanager
async def sidecar_process(data_dir: Path, port: int) -> AsyncIterator[str]:
    """``mnemo sidecar`` on ``port`` (its log in ``<data dir>/sidecar.log``) until ready; stopped on exit."""
    from inference.launcher import wait_ready

    log_path = data_dir / "sidecar.log"
    await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "sidecar", "--port", str(port), stdout=log, stderr=log
        )
    url = f"http://127.0.0.1:{port}"
    try:
        waiting = asyncio.create_task(asyncio.to_thread(wait_ready, url, 600.0))
        exited = asyncio.create_task(proc.wait())
        done, _ = await asyncio.wait({waiting, exited}, return_when=asyncio.FIRST_COMPLETED)
        if exited in done:
            waiting.cancel()
            raise RuntimeError(f"the sidecar exited with {proc.returncode}; see {log_path}")
        exited.cancel()
        waiting.result()
        yield url
    finally:
        # Ray's agents outlive their raylet for a while; remember the whole tree so that
        # nothing the sidecar started survives `mnemo up`.
        try:
            tree = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        _, alive = await asyncio.to_thread(psutil.wait_procs, tree, 15)
        for leftover in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                leftover.kill()


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
        "  (researcher: projects [1], read on oh1 and numisdata4; not mus1, not the interview",
        "   transcriptions, whose text comes from rsc35)",
        "",
        "The same question, two principals: the admin also gets the timecoded transcription passages",
        "and records of project 2; the researcher only what they may read.",
        "  " + _curl(url, "ADMIN", "retrieve", {"query": "when the water came we had to leave", "limit": 5}),
        "  "
        + _curl(url, "RESEARCHER", "retrieve", {"query": "when the water came we had to leave", "limit": 5}),
        "",
        "  " + _curl(url, "ADMIN", "semantic_search", {"query": "amphora MAC-2231"}),
        "  " + _curl(url, "RESEARCHER", "semantic_search", {"query": "amphora MAC-2231"}),
        "  "
        + _curl(
            url, "RESEARCHER", "similar_to", {"section_tipo": "numisdata4", "section_id": 101, "limit": 3}
        ),
        "  " + _curl(url, "RESEARCHER", "embed_groups", {"section_tipo": "mus1"}) + "   # {groups: []}",
        "",
        "A grounded answer with [n] citations (offline: the extractive provider, no language model):",
        "  " + _curl(url, "ADMIN", "ask", {"query": "What happened when the water came to Valdemora?"}),
        "  " + _curl(url, "RESEARCHER", "ask", {"query": "What happened when the water came to Valdemora?"}),
        "",
        f"Also: {url}/openapi.json  {url}/metrics  {url}/readyz",
    ]
    return "\n".join(lines)


async def _wait_for_drain(app: object, timeout_s: float = 900.0) -> dict:
    from index import queue

    from .resources import POOL_KEY

    pool = app[POOL_KEY]  # type: ignore[index]
    stats = None
    for _ in range(int(timeout_s / 0.5)):
        stats = await queue.stats(pool, max_attempts=5)
        if stats.pending == 0:
            return stats.as_dict()
        await asyncio.sleep(0.5)
    raise TimeoutError(f"the demo collection was not indexed in {timeout_s:.0f}s: {stats}")


async def run_up(args: argparse.Namespace, settings: GatewaySettings) -> int:
    """Start everything, load the demo, print tokens and examples, serve until stopped."""
    from index.demo import load_demo
    from inference.launcher import free_port

    from .app import create_app, serve
    from .auth import issue_token
    from .resources import DATABASE_URL_KEY, POOL_KEY

    secret = jwt_secret(settings.database.data_dir)
    settings = dataclasses.replace(settings, jwt_secret=secret, auth="jwt")
    stack = contextlib.AsyncExitStack()
    async with stack:
        if args.sidecar_url or os.environ.get("RAG_SIDECAR_URL"):
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
        app = create_app(settings)
        started = asyncio.Event()
        server = asyncio.create_task(
            serve(
                app, settings.host, settings.port, shutdown_timeout=settings.shutdown_timeout, started=started
            )
        )
        waiter = asyncio.create_task(started.wait())
        await asyncio.wait({server, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if server.done():
            waiter.cancel()
            server.result()  # raises why it could not start
            return 1
        url = f"http://{settings.host}:{settings.port}"
        data_dir = settings.database.data_dir.resolve()
        where = (
            "external server" if settings.database.database_url else f"embedded, data in {data_dir / 'pg'}"
        )
        print(f"  database  {app[DATABASE_URL_KEY]}  ({where}; migrations applied)", flush=True)
        print(f"  gateway   {url}", flush=True)
        queued = await load_demo(app[POOL_KEY])
        print(f"  demo      {queued} records queued; indexing...", flush=True)
        stats = await _wait_for_drain(app)
        print(f"  demo      indexed (queue: {stats})", flush=True)
        admin = issue_token(secret=secret, sub="admin", projects=None, admin=True)
        researcher = issue_token(
            secret=secret, sub="researcher", projects=RESEARCHER_PROJECTS, perms=RESEARCHER_PERMS
        )
        print("", flush=True)
        print(examples(url, admin, researcher), flush=True)
        print("\nCtrl-C stops everything started here.", flush=True)
        await server  # returns after SIGINT/SIGTERM and the graceful drain
    print("Mnemo stopped.", flush=True)
    return 0
