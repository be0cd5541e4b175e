"""``mnemo gateway --workers 2``: real worker processes on one port, against a database created empty.

Each test starts the command as an operator would (``RAG_DATABASE_URL`` at a fresh database, no
sidecar needed for what it asks) and drives it over real sockets: requests spread over the workers
and counted in one ``/metrics``, SIGTERM finishing the requests in flight on every worker, a killed
worker restarted, a worker that cannot listen stopping the start with its reason, and workers that
stop on their own when their supervisor is killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gateway.base.budget_settings import BudgetSettings
from inference.net import free_port, wait_ready
from tests.conftest import REPO_ROOT
from tests.fixtures.gateway import ADMIN, RAW_SEARCH, SECRET, TEXT_MODEL, ledger_used, token

WORKERS = 2
_PID = re.compile(r'pid="(\d+)"')
LATE_STOP = "its stop took over"  # what a worker prints when it ends itself (gateway.run.worker)
EMBED_GROUPS = json.dumps(
    {"dd_api": "dd_rag_api", "action": "embed_groups", "options": {"section_tipo": "oh1"}}
).encode()


def _start(database_url: str, tmp_path: Path, port: int, **settings: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env |= {
        "RAG_DATABASE_URL": database_url,
        "RAG_DATA_DIR": str(tmp_path / "state"),
        "RAG_JWT_SECRET": SECRET,
        "RAG_SIDECAR_URL": f"http://127.0.0.1:{free_port()}",  # none unless given: nothing else embeds
        "RAG_LOG_FORMAT": "text",
        **settings,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "gateway", "--port", str(port), "--workers", str(WORKERS)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.read().decode()


def _worker_pids(url: str) -> set[int]:
    """The workers whose gauges ``/metrics`` reports (one ``pid`` series per live worker)."""
    return {int(pid) for pid in _PID.findall(_get(f"{url}/metrics"))}


def _until(what: str, check, proc: subprocess.Popen[str], bound_s: float = 180.0):
    """Poll ``check`` until it returns a truthy value (a hang guard, not a performance bound)."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"the gateway exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {bound_s:.0f}s")


def _children(proc: subprocess.Popen[str]) -> set[int]:
    return {child.pid for child in psutil.Process(proc.pid).children()}


def _finish(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> tuple[int, str]:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.returncode is None:
            proc.kill()
    return proc.returncode, out


def _started(proc: subprocess.Popen[str], url: str) -> None:
    """Wait until every worker listens; the gateway's output printed if it does not."""
    try:
        wait_ready(url, 180, path="/healthz", exit_code=proc.poll)
        _until("every worker listening", lambda: len(_worker_pids(url)) == WORKERS, proc)
    except BaseException:
        code, out = _finish(proc)
        print(f"the gateway's output (exit {code}):\n{out}")
        raise


@pytest.fixture
def gateway_workers(empty_database_url: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    port = free_port()
    proc = _start(empty_database_url, tmp_path, port)
    url = f"http://127.0.0.1:{port}"
    _started(proc, url)
    try:
        yield proc, url
    finally:
        _finish(proc)


def test_workers_share_one_port_and_one_metrics_view_and_a_killed_one_comes_back(
    gateway_workers: tuple[subprocess.Popen[str], str],
) -> None:
    proc, url = gateway_workers
    workers = _worker_pids(url)
    assert workers == _children(proc), "the supervisor's children are the workers /metrics reports"

    for _ in range(40):  # a new connection each: the kernel spreads them over the listening workers
        _get(f"{url}/openapi.json")
    exposition = _get(f"{url}/metrics")
    assert 'mnemo_gateway_requests_total{action="/openapi.json",outcome="ok"} 40.0' in exposition, (
        "counters are summed over every worker"
    )

    victim = min(workers)
    os.kill(victim, signal.SIGKILL)

    def replacement() -> set[int] | None:
        pids = _worker_pids(url)
        return pids if len(pids) == WORKERS and victim not in pids else None

    replaced = _until("a replacement worker, the dead one's gauges gone", replacement, proc)
    assert replaced - workers and replaced == _children(proc)
    exposition = _get(f"{url}/metrics")
    assert 'mnemo_gateway_requests_total{action="/openapi.json",outcome="ok"} 40.0' in exposition, (
        "a dead worker's counts stay in the totals"
    )
    code, out = _finish(proc)
    assert code == 0, out
    assert f"pid {victim}) exited with status -9" in out and "restarting it" in out, out
    assert not (replaced & {p.pid for p in psutil.process_iter()}), "every worker stopped with the supervisor"


def _open_request(port: int) -> socket.socket:
    """A request whose body is still on its way: in flight on whichever worker accepted it."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = (
        "POST /api/v1/json HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {ADMIN}\r\nContent-Length: {len(EMBED_GROUPS)}\r\n\r\n"
    ).encode()
    conn.sendall(head + EMBED_GROUPS[:10])
    return conn


def _answer(conn: socket.socket) -> tuple[int, dict]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"the connection closed without an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    while len(body) < length:
        chunk = conn.recv(65536)
        assert chunk, "the connection closed mid-answer"
        body += chunk
    return int(head.split()[1]), json.loads(body)


def _holders(proc: subprocess.Popen[str], port: int) -> dict[int, int]:
    """Worker pid -> the client connections to ``port`` it has accepted."""
    holders: dict[int, int] = {}
    for pid in _children(proc):
        for conn in psutil.Process(pid).net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_ESTABLISHED:
                holders[pid] = holders.get(pid, 0) + 1
    return holders


def _accepted(proc: subprocess.Popen[str], port: int, count: int) -> dict[int, int] | None:
    holders = _holders(proc, port)
    return holders if sum(holders.values()) == count else None


def test_sigterm_finishes_the_requests_in_flight_on_every_worker(
    gateway_workers: tuple[subprocess.Popen[str], str],
) -> None:
    proc, url = gateway_workers
    port = int(url.rsplit(":", 1)[1])
    # Requests opened one at a time until each worker holds some: whichever worker is waiting
    # accepts the next connection, so the split is the scheduler's (bounded: a worker that never
    # accepts would be a defect of the shared socket).
    conns: list[socket.socket] = []
    holders: dict[int, int] = {}
    while len(holders) < WORKERS and len(conns) < 200:
        conns.append(_open_request(port))
        holders = _until("the request accepted", lambda: _accepted(proc, port, len(conns)), proc)
    assert len(holders) == WORKERS, f"one worker accepted all {len(conns)} connections: {holders}"
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)  # the workers are stopping: no new connection, in-flight requests still awaited
    for conn in conns:
        conn.sendall(EMBED_GROUPS[10:])
    answers = [_answer(conn) for conn in conns]
    assert all(status == 200 and body["ok"] for status, body in answers), answers
    code, out = _finish(proc)
    assert code == 0, out
    assert "gateway stopped" in out


def test_a_port_in_use_is_one_clear_error_before_anything_starts(
    empty_database_url: str, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _start(empty_database_url, tmp_path, port)
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    assert f"mnemo gateway: cannot listen on 127.0.0.1:{port}: Address already in use" in out, out
    assert "worker" not in out, "no worker was started"


def _kill_the_supervisor(proc: subprocess.Popen[str], workers: list[psutil.Process]) -> str:
    """SIGKILL the supervisor, wait for every worker to go (a hang guard), and return the output of
    all of them (the workers have let go of the pipe by then)."""
    proc.kill()
    proc.wait()
    gone, alive = psutil.wait_procs(workers, timeout=120)
    out, _ = proc.communicate(timeout=60)
    assert not alive, f"workers outlived their supervisor: {alive}\n{out}"
    assert len(gone) == WORKERS
    return out


class LateStopWarning(UserWarning):
    """A worker ended itself at its stop's bound: reported in the run's summary, not an error (the
    suite's warnings are), since the product bounds such a stop; its output names what held it."""


@pytest.mark.filterwarnings("default::tests.test_gateway_workers.LateStopWarning")
def test_workers_stop_by_themselves_when_the_supervisor_is_killed(
    gateway_workers: tuple[subprocess.Popen[str], str],
) -> None:
    proc, _ = gateway_workers
    out = _kill_the_supervisor(proc, [psutil.Process(pid) for pid in _children(proc)])
    if LATE_STOP in out:  # bounded (the next test), but a graceful stop should not need the bound
        warnings.warn(
            LateStopWarning(f"a worker's stop outlasted its bound; what it waited on:\n{out}"), stacklevel=1
        )


async def test_an_orphaned_worker_whose_stop_hangs_ends_itself_saying_on_what(
    empty_database_url: str, tmp_path: Path
) -> None:
    """A worker's stop is bounded even with no supervisor left to kill it: here the database holds
    the drain's last statement (its registry row's delete waits on a table lock this test takes), so
    each orphaned worker's cleanup cannot finish; past RAG_SHUTDOWN_TIMEOUT + RAG_SHUTDOWN_CLEANUP_TIMEOUT it ends
    itself and prints what it was waiting on."""
    import asyncpg

    port, shutdown, cleanup = free_port(), 1, 2
    proc = _start(
        empty_database_url,
        tmp_path,
        port,
        RAG_SHUTDOWN_TIMEOUT=str(shutdown),
        RAG_SHUTDOWN_CLEANUP_TIMEOUT=str(cleanup),
    )
    _started(proc, f"http://127.0.0.1:{port}")
    workers = [psutil.Process(pid) for pid in _children(proc)]
    holder = await asyncpg.connect(empty_database_url)
    try:
        # Each worker's drain registered (a registration the lock held up would be cancelled whole).
        drains = "SELECT count(*) FROM rag_drain_workers WHERE role = 'gateway'"
        for _ in range(1200):  # a hang guard of about two minutes
            if await holder.fetchval(drains) == WORKERS:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"the workers' drains never registered\n{_finish(proc)[1]}")
        async with holder.transaction():
            await holder.execute("LOCK TABLE rag_drain_workers IN ACCESS EXCLUSIVE MODE")
            out = await asyncio.to_thread(_kill_the_supervisor, proc, workers)
    finally:
        await holder.close()
    assert out.count(f"{LATE_STOP} {shutdown + cleanup}s") == WORKERS, out
    assert out.count("pending task mnemo-drain:") == WORKERS, out
    assert "drain_registry.py" in out, out  # the statement it waited on: the registry row's delete


def _search(url: str, bearer: str) -> tuple[int, str]:
    """One semantic_search on a new connection (the kernel spreads them over the workers): its
    status, and its body when it is not a 200."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{url}/api/v1/json",
        data=RAW_SEARCH,
        headers={"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, ""
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode(errors="replace")


def _counted(database_url: str, principal: str) -> int:
    """The ledger's query_embeddings for ``principal``, every window summed."""
    return asyncio.run(ledger_used(database_url, principal)).get("query_embeddings", 0)


def test_workers_killed_holding_budget_leases_leave_the_ledger_ahead_never_behind(
    corpus_database_url: str, sidecar_url: str, tmp_path: Path
) -> None:
    """An admin (no limit) is counted by lease (``RAG_BUDGET_LEASE``): each worker writes the ledger
    once for its first search and once per lease after. Every process SIGKILLed with leases held
    (idle leases kept: ``RAG_BUDGET_LEASE_IDLE`` an hour) gives nothing back, so the ledger stays
    ahead of what was served, by less than a lease per worker, and is never behind it."""
    lease = BudgetSettings().lease
    principal = f"lease-kill-{uuid.uuid4().hex[:6]}"
    bearer = token(principal, admin=True, projects=None)
    port = free_port()
    proc = _start(
        corpus_database_url, tmp_path, port,
        RAG_SIDECAR_URL=sidecar_url, RAG_TEXT_MODEL=TEXT_MODEL, RAG_FAISS_CACHE="off",
        RAG_BUDGET_LEASE_IDLE="3600",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    _started(proc, url)
    try:
        searches = lease + 4
        served, refused = 0, []
        while served < searches and len(refused) < searches:
            status, body = _search(url, bearer)
            if status == 200:
                served += 1
            else:  # a call that failed gave its unit back; only the sidecar's retryable 503 may happen
                refused.append((status, body))
        assert served == searches, refused
        assert all(status == 503 and json.loads(body)["error"]["retryable"] for status, body in refused), (
            refused
        )
        held = _counted(corpus_database_url, principal)
        # A worker's count equals what it served only after 0, 1 or 1 + k * lease searches; two
        # workers cannot split lease + 4 that way, so some lease has units unused now.
        assert searches < held <= searches + WORKERS * (lease - 1), (searches, held)
        processes = [psutil.Process(pid) for pid in _children(proc)]
        for worker in processes:
            worker.kill()
        proc.kill()
        proc.wait()
        _, alive = psutil.wait_procs(processes, timeout=60)
        assert not alive, alive
    finally:
        _finish(proc)
    assert _counted(corpus_database_url, principal) == held, "a killed worker gave nothing back"
