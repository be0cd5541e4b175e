"""Faults injected into real services for the reliability suite.

:func:`drain_worker_killed`: one of three ``mnemo drain`` processes sharing a queue is killed with
SIGKILL while it holds leased records; the others take them over once the leases expire. Records
lost and rows written twice are counted against a clean run's store.

:func:`sigterm_under_load`: a ``mnemo gateway`` subprocess serving ``semantic_search`` to several
closed-loop callers (half with a connection per request, half kept alive) is sent SIGTERM. Requests
already read must finish with 200; others must be refused cleanly (connection refused, or a coded
retryable 503 with ``Retry-After``), never reset or dropped after being sent, never answered 500. Bounded: a fixed number of callers, a fixed load window, an exit deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import signal
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .fault_store import (
    FAULT_INGEST,
    _queue_size,
    _wait_drained,
    _wait_for,
    _wait_queue_at_most,
    compare_stores,
    faulted_store,
    store_snapshot,
)

__all__ = [
    "api_call",
    "drain_processes",
    "drain_worker_killed",
    "sigterm_gateway",
    "sigterm_under_load",
]


def api_call(conn: http.client.HTTPConnection, token: str, body: bytes) -> tuple[str, int]:
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
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        return f"broken:{type(exc).__name__}", 0  # accepted, then dropped: the failure this fault counts
    if response.status == 200:
        return "ok", 200
    try:
        error = json.loads(payload).get("error", {})
        coded = isinstance(error.get("code"), str) and error.get("retryable") is True
    except (ValueError, AttributeError):
        coded = False
    retry_after = response.getheader("Retry-After") is not None
    return ("coded" if coded and retry_after and response.status in (429, 503) else "broken"), response.status


async def sigterm_under_load(
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
    from .gateway import api_request

    body = json.dumps(api_request("semantic_search", query="reservoir families")).encode()
    signalled = threading.Event()
    stop = threading.Event()
    outcomes: list[tuple[bool, str, int]] = []  # (sent after SIGTERM, outcome, status)
    broken_errors: Counter = Counter()  # "exception (caller kind)" -> count
    lock = threading.Lock()

    parts = urlsplit(url)

    def caller(keep_alive: bool) -> None:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        try:
            while not stop.is_set():
                after = signalled.is_set()
                outcome, status = api_call(conn, token, body)
                if not keep_alive:
                    conn.close()
                if outcome.startswith("broken:"):
                    kind = "kept alive" if keep_alive else "fresh"
                    with lock:
                        broken_errors[f"{outcome.removeprefix('broken:')} ({kind})"] += 1
                    outcome = "broken"
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
        "broken_errors": dict(broken_errors),
    }


# -- PostgreSQL stopped hard in the middle of a drain -------------------------------------------


async def _interrupted_drain(
    server_url: str,
    names: tuple[str, str],
    client: Any,
    model: str,
    records: int,
    deadline: float,
    interrupt: Callable[[Any], Awaitable[dict[str, Any]]],
) -> dict[str, Any]:
    """A clean drain of ``records`` into database ``names[0]``, then the same drain into ``names[1]``
    by a :class:`~index.ingest.drain.DrainLoop`, interrupted by ``interrupt(drain)`` (a fault: stop, wait,
    start; it returns figures of its own) once about a third is indexed; the stores are compared."""
    from index.ingest.drain import DrainLoop
    from index.settings import IngestSettings

    settings = IngestSettings(**FAULT_INGEST)
    loop = asyncio.get_running_loop()
    async with faulted_store(server_url, names, client, model, records, deadline) as (clean, _, pool):
        drain = DrainLoop(pool, client, settings, text_model=model)
        stop = asyncio.Event()
        try:
            runner = asyncio.create_task(drain.supervise(stop))
            left_at_stop = await _wait_queue_at_most(pool, records - records // 3, deadline)
            stopped_at = loop.time()
            extra = await interrupt(drain)
            started_at = loop.time()
            drained_at = await _wait_drained(pool, deadline)
            stop.set()
            await asyncio.wait_for(runner, 60)
            after = await store_snapshot(pool, model)
            queue_left = await _queue_size(pool)
            parked = await pool.fetchval(
                "SELECT count(*) FROM rag_index_queue WHERE attempts >= $1", settings.max_attempts
            )
        finally:
            stop.set()
    return {
        "records": records,
        "queued_when_stopped": left_at_stop,
        "seconds_down": round(started_at - stopped_at, 2),
        **compare_stores(clean, after),
        "queue_left": queue_left,
        "parked": parked,
        "drain_crashes": drain.crashes,
        # records an interrupted pass had claimed, given back by the worker's next pass
        "claims_given_back": drain.claims_given_back,
        # from the restart to an empty queue; None: not drained by the deadline
        "recovery_s": None if drained_at is None else round(drained_at - started_at, 2),
        **extra,
    }


async def postgres_stopped_mid_drain(
    sidecar_url: str,
    work_dir: Path,
    *,
    text_model: str,
    records: int = 48,
    down_s: float = 1.0,
    deadline_s: float = 300.0,
) -> dict[str, Any]:
    """A drain of ``records`` on a PostgreSQL of its own, stopped with ``pg_ctl stop -m immediate``
    once about a third is indexed and started again ``down_s`` later; the store after the drain
    resumes is compared with a clean run's. Bounded by ``deadline_s``."""
    import shutil

    from inference.client import SidecarClient
    from schema import EmbeddedPostgres

    root = work_dir / "pg-fault"
    shutil.rmtree(root, ignore_errors=True)
    server = EmbeddedPostgres(root / "data")
    server.start()

    async def interrupt(drain: Any) -> dict[str, Any]:
        await asyncio.to_thread(server.halt)
        await asyncio.sleep(down_s)
        await asyncio.to_thread(server.start)  # waits out crash recovery
        return {}

    deadline = asyncio.get_running_loop().time() + deadline_s
    try:
        async with SidecarClient(sidecar_url) as client:
            names = ("clean_run", "stopped_run")
            return await _interrupted_drain(
                server.url, names, client, text_model, records, deadline, interrupt
            )
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


# -- the sidecar stopped and started during ingestion -------------------------------------------


class _RestartableSidecar:
    """The sidecar API (Ray-free: :mod:`inference.local_server`) for one model on a fixed loopback
    port. :meth:`stop` closes the server and unloads the model; :meth:`start` serves again at once
    and reloads the model behind it (``503 not_ready`` until warm), as a restarted sidecar does."""

    def __init__(self, spec: Any, limits: Any, port: int) -> None:
        self.spec, self.limits, self.port = spec, limits, port
        self.runner: Any = None
        self.service: Any = None
        self.warming: asyncio.Task | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        from aiohttp import web

        from inference.api import LocalBackend, SidecarAPI
        from inference.config import SidecarConfig
        from inference.local_server import create_app
        from inference.service import ModelService

        self.service = await asyncio.to_thread(ModelService, self.spec, self.limits)
        config = SidecarConfig(models=(self.spec,), limits=self.limits, source="benchmarks.faults")
        api = SidecarAPI(config, {self.spec.id: LocalBackend(self.service)})
        self.runner = web.AppRunner(create_app(api), access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        self.warming = asyncio.create_task(self.service.warm_up_async())

    async def stop(self) -> None:
        if self.warming is not None:
            await self.warming
        await self.runner.cleanup()
        await self.service.close()


async def sidecar_stopped_mid_drain(
    server_url: str,
    spec: Any,
    limits: Any,
    *,
    records: int = 48,
    down_s: float = 1.0,
    deadline_s: float = 300.0,
) -> dict[str, Any]:
    """A drain of ``records`` whose sidecar (one model, see :class:`_RestartableSidecar`) is stopped
    once about a third is indexed and started again ``down_s`` later; the store after the drain
    resumes is compared with a clean run's through the same sidecar. Databases on ``server_url``
    (created, then dropped). Bounded by ``deadline_s``."""
    from inference.client import SidecarClient
    from inference.net import free_port

    sidecar = _RestartableSidecar(spec, limits, free_port())
    await sidecar.start()
    names = ("sidecar_clean_run", "sidecar_stopped_run")

    async def interrupt(drain: Any) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        stopped_at = loop.time()
        await sidecar.stop()
        states = set()
        while loop.time() < stopped_at + down_s:
            states.add(drain.status()["state"])
            await asyncio.sleep(0.05)
        left = await _queue_size(drain.pool)
        await sidecar.start()
        return {"queued_when_restarted": left, "drain_states_while_down": sorted(states)}

    deadline = asyncio.get_running_loop().time() + deadline_s
    try:
        await sidecar.warming
        async with SidecarClient(sidecar.url, max_retries=2, timeout=30) as client:
            return await _interrupted_drain(server_url, names, client, spec.id, records, deadline, interrupt)
    finally:
        await sidecar.stop()


# -- a drain worker killed with SIGKILL mid-batch -----------------------------------------------


@contextlib.asynccontextmanager
async def drain_processes(
    database_url: str, sidecar_url: str, log_dir: Path, n: int, *, text_model: str, **env: str
) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """``n`` ``mnemo drain`` loops in subprocesses (``env``: more ``RAG_*`` settings for them), each
    logging to ``log_dir/drain-<i>.log``; the ones still running are stopped with SIGTERM after."""
    from inference.net import stop_process

    from .processes import start_mnemo

    argv = ["--log-level", "INFO", "drain", "--database-url", database_url]
    argv += ["--sidecar-url", sidecar_url, "--text-model", text_model]
    procs: list[asyncio.subprocess.Process] = []
    try:
        for i in range(n):
            procs.append(await start_mnemo(argv, log_dir / f"drain-{i}.log", **env))
        yield procs
    finally:
        await asyncio.gather(*(stop_process(proc) for proc in procs))


async def leased_by(pool: Any, pid: int) -> set[int]:
    """Section ids of the queued records that the drain workers of process ``pid`` hold leases on
    (a worker id is ``role@host:pid#index-tag``)."""
    rows = await pool.fetch("SELECT section_id FROM rag_index_queue WHERE lease_owner LIKE $1", f"%:{pid}#%")
    return {r["section_id"] for r in rows}


async def drain_worker_killed(
    server_url: str,
    sidecar_url: str,
    log_dir: Path,
    *,
    text_model: str,
    records: int = 48,
    workers: int = 3,
    lease_s: float = 3.0,
    deadline_s: float = 300.0,
) -> dict[str, Any]:
    """``workers`` ``mnemo drain`` processes share a queue of ``records``; the first is killed with
    SIGKILL once about a third is indexed, while it holds leased records. Its leases expire after ``lease_s`` and the others take
    its records over. Figures: records lost (their chunks differ from a clean run's: missing, other
    text or vector), duplicate rows (rows written twice, so their ``updated_at`` moved, or not in
    the clean run), the seconds from the kill until the last orphaned record is indexed. Databases
    on ``server_url`` (created, then dropped). Bounded by ``deadline_s``."""
    from inference.client import SidecarClient

    # Batches of 2: a pipelined worker holds up to two of them, so it holds records through most
    # of even a short drain, and the kill lands mid-batch.
    env = {"RAG_INGEST_LEASE_SECONDS": str(lease_s), "RAG_INGEST_BATCH_RECORDS": "2"}
    deadline = asyncio.get_running_loop().time() + deadline_s
    names = ("workers_clean_run", "workers_killed_run")
    async with (
        SidecarClient(sidecar_url) as client,
        faulted_store(server_url, names, client, text_model, records, deadline) as (clean, url, pool),
    ):
        async with drain_processes(url, sidecar_url, log_dir, workers, text_model=text_model, **env) as procs:
            killed = await _kill_mid_drain(pool, procs, records, deadline, log_dir)
        after = await store_snapshot(pool, text_model)
        rewritten = await _rows_rewritten(pool, text_model)
        queue_left = await _queue_size(pool)
    return {
        "records": records,
        "workers": workers,
        "lease_s": lease_s,
        "queued_at_kill": killed["queued_at_kill"],
        "orphaned_records": killed["orphaned_records"],
        "duplicate_rows": rewritten + len(after.keys() - clean.keys()),
        **compare_stores(clean, after),
        "queue_left": queue_left,
        "surviving_workers": killed["surviving_workers"],
        "orphans_indexed_s": killed["orphans_indexed_s"],
        "drained_s": killed["drained_s"],
    }


async def _kill_mid_drain(
    pool: Any, procs: list[Any], records: int, deadline: float, log_dir: Path
) -> dict[str, Any]:
    """SIGKILL of the first drain process once about a third of ``records`` is indexed while it
    holds leased records; then the waits for its orphaned records and for an empty queue, timed
    from the kill. Run while the processes are up (the survivors are counted at the end)."""
    loop = asyncio.get_running_loop()
    victim = procs[0]

    async def mid_work() -> bool:  # about a third indexed, and the victim holds records
        left = await _queue_size(pool)
        return left is not None and left <= records - records // 3 and bool(await leased_by(pool, victim.pid))

    if not await _wait_for(mid_work, deadline):
        raise RuntimeError(f"the first drain process held no lease mid-drain; see {log_dir}/drain-0.log")
    victim.kill()  # SIGKILL: no handler, no release, its leases stay until they expire
    await victim.wait()
    killed_at = loop.time()
    orphans = await leased_by(pool, victim.pid)
    queued_at_kill = await _queue_size(pool)

    async def orphans_indexed() -> bool:
        rows = await pool.fetch(
            "SELECT section_id FROM rag_index_queue WHERE section_id = ANY($1::bigint[])", list(orphans)
        )
        return not rows

    indexed = await _wait_for(orphans_indexed, deadline)
    orphans_indexed_at = loop.time() if indexed else None
    drained_at = await _wait_drained(pool, deadline)
    return {
        "queued_at_kill": queued_at_kill,
        "orphaned_records": len(orphans),
        "surviving_workers": sum(p.returncode is None for p in procs[1:]),
        # from the kill until every record the killed process held is indexed (lease expiry included)
        "orphans_indexed_s": None if orphans_indexed_at is None else round(orphans_indexed_at - killed_at, 2),
        "drained_s": None if drained_at is None else round(drained_at - killed_at, 2),
    }


async def _rows_rewritten(pool: Any, model: str) -> int:
    """Rows of ``model``'s partition written more than once (their ``updated_at`` moved)."""
    from index.store.partitions import get_partition

    partition = await get_partition(pool, model)
    if partition is None:
        return 0
    return await pool.fetchval(f"SELECT count(*) FROM {partition.table} WHERE updated_at <> created_at")
