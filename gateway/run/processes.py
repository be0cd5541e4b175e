"""``mnemo gateway --workers N``: N gateway processes serving one port.

Why processes: a gateway is one asyncio loop, so one process keeps one core busy at most; the JSON,
fusion and ACL work of a request is Python. N workers use N cores, each opening the shared on-disk
state (the database, the lexical engine's files) instead of holding its own copy.

How it runs (gunicorn's model: one listening socket, shared by pre-started workers):

- This supervisor opens the database once (the embedded server started, migrations applied) and
  holds it for the whole run, so workers connect to a server that is already there and a worker
  restart never stops it. It binds and listens on the port itself, so a port in use is one clear
  error before any worker starts.
- Each worker is a fresh interpreter (``python -m gateway.run.worker``) that inherits the listening socket
  and accepts on it: whichever worker is waiting takes the next connection, so an idle worker picks
  up while a busy one works. A worker that dies loses only the requests it had accepted; the
  connections still queued on the shared socket wait for the others (with one socket per worker,
  ``SO_REUSEPORT``, the kernel would reset the dead worker's queue). The worker gets its settings
  through a pipe (secrets stay out of argv and the environment) and reports on another pipe once it
  serves.
- SIGINT or SIGTERM to the supervisor: it closes its own copy of the socket and sends SIGTERM to
  every worker; each stops taking new connections, takes the ones already queued, finishes its
  in-flight requests (``RAG_SHUTDOWN_TIMEOUT``) and exits; the port closes with the last of them. A
  worker still running past that plus ``RAG_SHUTDOWN_CLEANUP_TIMEOUT`` is killed (:func:`stop_bound_s`).
- A worker that fails before it ever served stops the whole start, with its last log lines: what
  breaks one worker's start breaks every worker's, so retrying would only loop. A worker that dies
  later is logged and restarted (with a growing delay when it keeps dying).
- Metrics: ``prometheus_client``'s multi-process mode, as Prometheus users know it from gunicorn.
  Each worker writes its counters, histograms and gauges to files in a fresh folder
  (``PROMETHEUS_MULTIPROC_DIR``, set for the workers only); ``/metrics``, whichever worker answers,
  sums counters and histograms over all workers (a dead worker's counts stay in the totals), and
  gives each gauge one series per worker (label ``pid``). What a collector computes at scrape time
  (the read replica's state, the caches) is the answering worker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import pickle
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from gateway.base.settings import GatewaySettings, child_environment
from schema.cli import stop_signal
from schema.database import open_database

log = logging.getLogger(__name__)

# A worker that lived this long before dying is restarted at once; a quicker death doubles the
# delay (up to the cap), so a worker that crashes at every request cannot spin the host.
STABLE_AFTER_S = 30.0
RESTART_DELAY_MAX_S = 30.0

READY_TIMEOUT_S = 300.0  # a worker's start: migrations are already applied, its app opens pools


def stop_bound_s(settings: GatewaySettings) -> float:
    """How long a worker's graceful stop may take (its in-flight requests, then its app's cleanup):
    past it the supervisor kills the worker, and a worker whose supervisor is gone ends itself
    (:mod:`gateway.run.worker`)."""
    return settings.shutdown_timeout + settings.shutdown_cleanup_timeout


class WorkerStartError(RuntimeError):
    """A worker exited before it listened; the message carries its last log lines."""


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What a worker process needs, sent to it pickled through its stdin."""

    settings: GatewaySettings
    index: int
    log_level: str
    metrics_dir: Path
    listen_fd: int  # the shared listening socket, inherited
    workers: int  # how many workers serve the port (the fairness limiter's share)


def worker_count(requested: int) -> int:
    """``requested`` workers (validated by the settings: 0 or more), or one per core for 0 (the default)."""
    return requested or (os.cpu_count() or 1)


@dataclasses.dataclass
class _Worker:
    index: int
    process: asyncio.subprocess.Process
    started_at: float
    restarts: int = 0


class Supervisor:
    """Starts, watches, restarts and stops the workers of one ``mnemo gateway --workers N``."""

    def __init__(
        self,
        settings: GatewaySettings,
        count: int,
        log_level: str,
        metrics_dir: Path,
        listener: socket.socket,
    ) -> None:
        self.settings = settings
        self.listener = listener
        self.count = count
        self.log_level = log_level
        self.metrics_dir = metrics_dir  # the workers' metric files (prometheus_client's multi-process mode)
        self.workers: dict[int, _Worker] = {}
        self._stopping = False

    async def _spawn(self, index: int) -> _Worker:
        """Start worker ``index`` and wait until it listens (or raise :class:`WorkerStartError`)."""
        loop = asyncio.get_running_loop()
        ready_read, ready_write = os.pipe()
        # Its output is the supervisor's (one log stream, each line whole: a worker writes a line in
        # one call), so an operator reads every worker's access and error lines where it ran.
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway.run.worker",
            str(ready_write),
            stdin=asyncio.subprocess.PIPE,
            env=child_environment(PROMETHEUS_MULTIPROC_DIR=str(self.metrics_dir)),
            pass_fds=(ready_write, self.listener.fileno()),
            # Its own session: a terminal's Ctrl-C reaches the supervisor alone, which stops the
            # workers in order (a worker watches this process and stops when it is gone).
            start_new_session=True,
        )
        os.close(ready_write)
        spec = WorkerSpec(
            self.settings, index, self.log_level, self.metrics_dir, self.listener.fileno(), self.count
        )
        assert process.stdin is not None
        process.stdin.write(pickle.dumps(spec))
        process.stdin.close()
        try:
            ready = await asyncio.wait_for(
                loop.run_in_executor(None, os.read, ready_read, 1), READY_TIMEOUT_S
            )
        except TimeoutError:
            process.kill()
            await process.wait()
            raise WorkerStartError(
                f"gateway worker {index} did not listen within {READY_TIMEOUT_S:.0f}s (its output is above)"
            ) from None
        finally:
            os.close(ready_read)
        if ready != b"1":  # the pipe closed: the worker exited before it listened
            await process.wait()
            raise WorkerStartError(
                f"gateway worker {index} exited with status {process.returncode} before it listened "
                "(its output, the reason, is above)"
            )
        log.info("gateway worker %d listening (pid %d)", index, process.pid, extra={"pid": process.pid})
        return _Worker(index, process, loop.time())

    async def start(self) -> None:
        """Every worker listening, or none (a failed start stops the ones already up)."""
        try:
            for index in range(self.count):
                self.workers[index] = await self._spawn(index)
        except BaseException:
            await self.stop()
            raise

    async def watch(self, stop: asyncio.Event) -> None:
        """Until ``stop``: restart any worker that dies (a growing delay while it keeps dying)."""
        loop = asyncio.get_running_loop()
        stopped = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set():
                waits = {asyncio.create_task(w.process.wait()): w for w in self.workers.values()}
                done, _ = await asyncio.wait({stopped, *waits}, return_when=asyncio.FIRST_COMPLETED)
                for task in waits:
                    task.cancel()
                if stop.is_set():
                    return
                for task in done & waits.keys():
                    await self._restart(waits[task], loop.time())
        finally:
            stopped.cancel()

    async def _restart(self, dead: _Worker, now: float) -> None:
        from prometheus_client import multiprocess

        if self._stopping:
            return

        # Its live gauges go (prometheus_client's own rule) and so do its per-worker ones: a dead
        # worker's last queue depth or cache state is not the service's. Counters stay in the totals.
        multiprocess.mark_process_dead(dead.process.pid, str(self.metrics_dir))
        (self.metrics_dir / f"gauge_all_{dead.process.pid}.db").unlink(missing_ok=True)
        lived = now - dead.started_at
        restarts = 0 if lived >= STABLE_AFTER_S else dead.restarts + 1
        delay = 0.0 if restarts == 0 else min(RESTART_DELAY_MAX_S, 0.5 * 2**restarts)
        log.error(
            "gateway worker %d (pid %d) exited with status %s after %.0fs; restarting it in %.1fs",
            dead.index,
            dead.process.pid,
            dead.process.returncode,
            lived,
            delay,
        )
        await asyncio.sleep(delay)
        worker = await self._spawn(dead.index)
        worker.restarts = restarts
        self.workers[dead.index] = worker

    async def stop(self) -> None:
        """SIGTERM to every worker, then wait for their graceful stop (killed past the bound)."""
        self._stopping = True
        self.listener.close()  # the port closes when the last worker has let go of it
        running = [w.process for w in self.workers.values() if w.process.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        bound = stop_bound_s(self.settings)
        waits = [asyncio.create_task(p.wait()) for p in running]
        if waits:
            _, late = await asyncio.wait(waits, timeout=bound)
            for process in running:
                if process.returncode is None:
                    log.error(
                        "gateway worker pid %d still running %.0fs after SIGTERM: killed", process.pid, bound
                    )
                    process.kill()
            for task in late:
                await task
        for worker in self.workers.values():
            if worker.process.returncode not in (0, None):
                log.warning(
                    "gateway worker %d exited with status %s", worker.index, worker.process.returncode
                )


class ListenError(RuntimeError):
    """The supervisor could not listen on the configured address (in use, not an address of the host)."""


def listen(host: str, port: int, backlog: int = 128) -> socket.socket:
    """The listening socket every worker shares (bound here, before any worker or database starts)."""
    try:
        return socket.create_server((host, port), backlog=backlog)
    except OSError as exc:
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


@contextlib.asynccontextmanager
async def serving_workers(settings: GatewaySettings, count: int, log_level: str) -> AsyncIterator[Supervisor]:
    """The database opened once, then ``count`` workers listening on ``settings.host:port``.

    Yields the running supervisor; on exit every worker is stopped gracefully and the database
    handle released (the embedded server stops when no other process holds it)."""
    listener = listen(settings.host, settings.port)
    async with open_database(settings.database) as db:
        # Workers reach the server this process opened; none starts or migrates its own.
        opened = dataclasses.replace(
            settings, database=dataclasses.replace(settings.database, database_url=db.url)
        )
        # A fresh folder for the workers' metric files, removed after the run: counts from an
        # earlier run must never be summed into this one's.
        with tempfile.TemporaryDirectory(
            prefix="mnemo-gateway-metrics-", ignore_cleanup_errors=True
        ) as metrics:
            supervisor = Supervisor(opened, count, log_level, Path(metrics), listener)
            await supervisor.start()
            try:
                yield supervisor
            finally:
                await supervisor.stop()


async def serve_workers(settings: GatewaySettings, count: int, log_level: str) -> None:
    """Serve with ``count`` workers until SIGINT/SIGTERM, then stop them all gracefully."""
    with stop_signal() as stop:
        async with serving_workers(settings, count, log_level) as supervisor:
            log.info(
                "gateway listening on http://%s:%s with %d workers",
                settings.host,
                settings.port,
                count,
                extra={"host": settings.host, "port": settings.port, "workers": count},
            )
            await supervisor.watch(stop)
            log.info(
                "stopping: every worker finishes its in-flight requests (up to %.0fs)",
                settings.shutdown_timeout,
            )
    log.info("gateway stopped")
