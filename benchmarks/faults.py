"""Faults injected into real services for the reliability suite.

:func:`sigterm_under_load`: a ``mnemo gateway`` subprocess serving ``semantic_search`` to several
closed-loop callers (half with a connection per request, half kept alive) is sent SIGTERM. Requests
already read must finish with 200; others must be refused cleanly (connection refused, or a coded
retryable 503 with ``Retry-After``), never reset or dropped after being sent, never answered 500. Bounded: a fixed number of callers, a fixed load window, an exit deadline.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = ["sigterm_gateway", "sigterm_under_load"]


def _search(conn: http.client.HTTPConnection, token: str, body: bytes) -> tuple[str, int]:
    """("ok" | "refused" | "coded" | "broken", status) for one request.

    ``conn`` reconnects by itself once closed: a fresh connection per request when the caller closes
    it after each answer, a kept-alive one otherwise.
    """
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
        conn.close()
        return "refused", 0
    except (OSError, http.client.HTTPException):
        conn.close()
        return "broken", 0  # accepted, then dropped: the failure this fault counts
    if response.status == 200:
        return "ok", 200
    try:
        error = json.loads(payload).get("error", {})
        coded = isinstance(error.get("code"), str) and error.get("retryable") is True
    except (ValueError, AttributeError):
        coded = False
    retry_after = response.getheader("Retry-After") is not None
    return ("coded" if coded and retry_after and response.status in (429, 503) else "broken"), response.status


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
    from .gateway import gateway_process

    async with gateway_process(database_url, sidecar_url, secret, log, text_model=text_model) as gateway:
        return await sigterm_gateway(
            gateway.url,
            gateway.process,
            token,
            callers=callers,
            load_seconds=load_seconds,
            exit_deadline_s=exit_deadline_s,
        )


async def sigterm_gateway(
    url: str,
    proc: asyncio.subprocess.Process,
    token: str,
    *,
    callers: int,
    load_seconds: float,
    exit_deadline_s: float = 60.0,
) -> dict[str, Any]:
    """Closed-loop ``semantic_search`` callers on a running gateway process, then SIGTERM to it."""
    body = json.dumps(
        {"dd_api": "dd_rag_api", "action": "semantic_search", "options": {"query": "reservoir families"}}
    ).encode()
    signalled = threading.Event()
    stop = threading.Event()
    outcomes: list[tuple[bool, str, int]] = []  # (sent after SIGTERM, outcome, status)
    lock = threading.Lock()

    parts = urlsplit(url)

    def caller(keep_alive: bool) -> None:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        try:
            while not stop.is_set():
                after = signalled.is_set()
                outcome, status = _search(conn, token, body)
                if not keep_alive:
                    conn.close()
                with lock:
                    outcomes.append((after, outcome, status))
                if after and outcome == "refused":
                    return  # the listener is gone: this caller is done
        finally:
            conn.close()

    # half the callers open a connection per request, half keep theirs alive
    threads = [threading.Thread(target=caller, args=(i % 2 == 1,), daemon=True) for i in range(callers)]
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
        # finished (200), refused (connection refused, or a coded retryable 429/503 with Retry-After),
        # or broken (reset, dropped, or any other status): the goal is 0 broken on either side
        "before_sigterm": {k: sum(o[1] == k for o in before) for k in ("ok", "refused", "coded", "broken")},
        "after_sigterm": {k: sum(o[1] == k for o in after) for k in ("ok", "refused", "coded", "broken")},
        "exit_code": code,
        "seconds_to_exit": round(exit_s, 2),
        "statuses": sorted({o[2] for o in outcomes}),
        "broken_statuses": sorted({o[2] for o in outcomes if o[1] == "broken"}),
    }
