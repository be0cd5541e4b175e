"""The read replica stopped and started again under search load (issue 25's last goal row).

A hot standby of the bench's embedded PostgreSQL (:class:`schema.embedded_replica.StreamingReplica`,
its own ``pg_basebackup``) serves a ``mnemo gateway`` subprocess's retrieval reads
(``RAG_DATABASE_READ_URL``). Closed-loop ``semantic_search`` callers run while the standby is stopped
(``-m fast``: sessions in flight are cut) and started again. Figures: searches failed (goal 0), the
seconds until the gateway stopped using the replica and until it used it again (``/readyz``), the
fallbacks to the primary it counted, and the slowest search.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from schema import EmbeddedPostgres
from schema.embedded_replica import StreamingReplica

from .faults import api_call
from .gateway import api_request, gateway_process

__all__ = ["read_replica_restarted"]

# Safety nets (a condition that never holds fails the fault instead of hanging it): not speed limits.
STATE_WAIT_S = 120.0


def _replica_state(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/readyz", timeout=30) as response:
        return json.loads(response.read())["data"]["read_replica"]  # the v2 envelope


async def _until(url: str, in_use: bool) -> tuple[float, dict[str, Any]]:
    started = time.monotonic()
    while True:
        state = await asyncio.to_thread(_replica_state, url)
        if state["in_use"] is in_use:
            return time.monotonic() - started, state
        if time.monotonic() - started > STATE_WAIT_S:
            raise TimeoutError(f"the gateway's read replica never became in_use={in_use}: {state}")
        await asyncio.sleep(0.1)


async def read_replica_restarted(
    primary: EmbeddedPostgres,
    database_url: str,
    sidecar_url: str,
    secret: str,
    token: str,
    work_dir: Path,
    *,
    text_model: str,
    callers: int = 4,
    steady_s: float = 2.0,
) -> dict[str, Any]:
    """Stop and restart a streaming replica of ``primary`` under ``callers`` search loops on a
    gateway reading from it; ``database_url`` is the primary's database holding a corpus."""
    database = urlsplit(database_url).path.lstrip("/")
    root = Path(tempfile.mkdtemp(prefix="replica-", dir=work_dir))
    body = json.dumps(api_request("semantic_search", query="the reservoir flooded the valley")).encode()
    with StreamingReplica(primary, root) as replica:
        env = {
            "RAG_DATABASE_READ_URL": replica.url_for(database),
            "RAG_READ_MAX_LAG": "5",
            "RAG_READ_CHECK_INTERVAL": "0.1",
        }
        log = work_dir / "reliability-read-replica-gateway.log"
        async with gateway_process(
            database_url, sidecar_url, secret, log, text_model=text_model, **env
        ) as gw:
            await _until(gw.url, True)
            stop = threading.Event()
            outcomes: list[tuple[str, int, float]] = []
            lock = threading.Lock()
            parts = urlsplit(gw.url)

            def caller() -> None:
                conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
                try:
                    while not stop.is_set():
                        started = time.monotonic()
                        outcome, status = api_call(conn, token, body)
                        with lock:
                            outcomes.append((outcome, status, time.monotonic() - started))
                finally:
                    conn.close()

            threads = [threading.Thread(target=caller, daemon=True) for _ in range(callers)]
            for thread in threads:
                thread.start()
            try:
                await asyncio.sleep(steady_s)
                stopped_at = time.monotonic()
                await asyncio.to_thread(replica.stop)
                to_primary_s, down = await _until(gw.url, False)
                await asyncio.sleep(steady_s)
                await asyncio.to_thread(replica.start)
                back_s, up = await _until(gw.url, True)
                down_s = time.monotonic() - stopped_at
                await asyncio.sleep(steady_s)
            finally:
                stop.set()
                for thread in threads:
                    await asyncio.to_thread(thread.join, 130)
    failed = [o for o in outcomes if o[0] != "ok"]
    return {
        "callers": callers,
        "searches": len(outcomes),
        "searches_failed": len(failed),
        "failed_statuses": sorted({o[1] for o in failed}),
        "seconds_to_primary_after_stop": round(to_primary_s, 2),
        "seconds_back_on_replica_after_start": round(back_s, 2),
        "seconds_replica_out": round(down_s, 2),
        "fallbacks_counted": up["fallbacks"],
        "replica_error_seen": down["error"],
        "slowest_search_s": round(max((o[2] for o in outcomes), default=0.0), 3),
    }
