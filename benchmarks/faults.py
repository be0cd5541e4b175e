"""Faults injected into real services for the reliability suite.

:func:`sigterm_under_load`: a ``mnemo gateway`` subprocess serving ``semantic_search`` to several
closed-loop callers is sent SIGTERM. Requests already answered or in flight must finish with 200;
requests sent afterwards must be refused cleanly (connection refused, or a coded 503), never reset
mid-answer or answered 500. Bounded: a fixed number of callers, a fixed load window, an exit deadline.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from inference.net import await_ready, free_port

from .settings import child_environment

__all__ = ["sigterm_under_load"]


def _search(url: str, token: str, body: bytes) -> tuple[str, int]:
    """("ok" | "refused" | "coded" | "broken", status) for one request on a fresh connection."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        conn.request(
            "POST",
            "/api/v1/json",
            body,
            {"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        )
        response = conn.getresponse()
        payload = response.read()
    except ConnectionRefusedError:
        return "refused", 0
    except (OSError, http.client.HTTPException):
        return "broken", 0  # accepted, then dropped: the failure this fault counts
    finally:
        conn.close()
    if response.status == 200:
        return "ok", 200
    try:
        coded = isinstance(json.loads(payload).get("error", {}).get("code"), str)
    except (ValueError, AttributeError):
        coded = False
    return ("coded" if coded and response.status in (429, 503) else "broken"), response.status


def sigterm_under_load(
    database_url: str,
    sidecar_url: str,
    secret: str,
    token: str,
    log: Path,
    *,
    text_model: str,
    callers: int = 8,
    load_seconds: float = 3.0,
    exit_deadline_s: float = 60.0,
) -> dict[str, Any]:
    """SIGTERM a loaded gateway; count what each request met before and after the signal."""
    return asyncio.run(
        _sigterm(
            database_url, sidecar_url, secret, token, log, text_model, callers, load_seconds, exit_deadline_s
        )
    )


async def _sigterm(
    database_url: str,
    sidecar_url: str,
    secret: str,
    token: str,
    log: Path,
    text_model: str,
    callers: int,
    load_seconds: float,
    exit_deadline_s: float,
) -> dict[str, Any]:
    port = free_port()
    env = child_environment(RAG_JWT_SECRET=secret, RAG_AUTH="jwt", RAG_TEXT_MODEL=text_model)
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "gateway", "--port", str(port),
            "--database-url", database_url, "--sidecar-url", sidecar_url,
            env=env, stdout=out, stderr=out,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        await await_ready(url, 120.0, path="/healthz", process=proc)
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    body = json.dumps(
        {"dd_api": "dd_rag_api", "action": "semantic_search", "options": {"query": "reservoir families"}}
    ).encode()
    signalled = threading.Event()
    stop = threading.Event()
    outcomes: list[tuple[bool, str, int]] = []  # (sent after SIGTERM, outcome, status)
    lock = threading.Lock()

    def caller() -> None:
        while not stop.is_set():
            after = signalled.is_set()
            outcome, status = _search(url, token, body)
            with lock:
                outcomes.append((after, outcome, status))
            if after and outcome == "refused":
                return  # the listener is gone: this caller is done

    threads = [threading.Thread(target=caller, daemon=True) for _ in range(callers)]
    for thread in threads:
        thread.start()
    await asyncio.sleep(load_seconds)
    signalled.set()
    signalled_at = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = await asyncio.wait_for(proc.wait(), exit_deadline_s)
    except TimeoutError:
        proc.kill()
        code = await proc.wait()
    exit_s = time.monotonic() - signalled_at
    stop.set()
    for thread in threads:
        await asyncio.to_thread(thread.join, 130)
    before = [o for o in outcomes if not o[0]]
    after = [o for o in outcomes if o[0]]
    return {
        "callers": callers,
        "requests_before_sigterm": len(before),
        "failed_before_sigterm": sum(o[1] != "ok" for o in before),
        # sent after the signal: finished (200), refused (connection refused or coded 429/503), or broken
        "after_sigterm": {k: sum(o[1] == k for o in after) for k in ("ok", "refused", "coded", "broken")},
        "exit_code": code,
        "seconds_to_exit": round(exit_s, 2),
        "statuses": sorted({o[2] for o in outcomes}),
    }
