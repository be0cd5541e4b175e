"""One worker of ``mnemo gateway --workers N`` (``python -m gateway.run.worker READY_FD``).

Started by :mod:`gateway.run.processes` only: it reads its :class:`~gateway.run.processes.WorkerSpec` pickled
from stdin (the supervisor's own pipe, never a file or a network peer), serves the gateway on the
listening socket it inherited (``WorkerSpec.listen_fd``), writes one byte to ``READY_FD`` once it listens, and stops
gracefully on SIGTERM or SIGINT, or when its supervisor is gone. A stop is bounded the same way
either way (:func:`~gateway.run.processes.stop_bound_s`): the supervisor kills a worker past it, and a
worker whose supervisor is gone has no one to do that, so it ends itself, loudly (:func:`_end_if_late`).
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import pickle
import socket
import sys
import threading

from gateway.base.logs import configure_logging
from gateway.run.processes import WorkerSpec, stop_bound_s
from gateway.web.app import create_app, serve
from inference.eventloop import run
from schema.cli import stop_signal

PARENT_CHECK_S = 1.0  # how soon a worker notices that its supervisor died (was killed)
LATE_STOP_EXIT_CODE = 70  # EX_SOFTWARE: the graceful stop outlasted its bound

log = logging.getLogger(__name__)


async def _watch_parent(parent: int, stop: asyncio.Event) -> None:
    """Set ``stop`` once the supervisor is gone: an orphaned worker would hold the port forever."""
    while not stop.is_set():
        if os.getppid() != parent:
            stop.set()
            return
        await asyncio.sleep(PARENT_CHECK_S)


def _awaiting(task: asyncio.Task[object]) -> list[str]:
    """Where a task waits, outermost first: its coroutine and each one it awaits, down to the last
    (``Task.get_stack`` stops at the first)."""
    where = []
    awaited: object = task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
        if frame is not None:
            where.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
    return where


def _end_if_late(loop: asyncio.AbstractEventLoop, bound_s: float) -> threading.Timer:
    """Past ``bound_s`` of a graceful stop, say what it still waits on, then end the process.

    A thread, not a task: what holds a stop up may be the event loop itself (a blocking call). What
    it prints (every thread's stack, then the loop's pending tasks) is for the operator and the next
    engineer; the tasks are read from another thread, best effort."""

    def end() -> None:
        log.error(
            "gateway worker: its stop took over %.0fs (RAG_SHUTDOWN_TIMEOUT + RAG_SHUTDOWN_CLEANUP_TIMEOUT): ending it",
            bound_s,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        try:
            for task in list(asyncio.all_tasks(loop)):
                print(f"pending task {task.get_name()}:", *_awaiting(task), sep="\n  ", file=sys.stderr)
        except RuntimeError:  # the set changed while it was read
            pass
        sys.stderr.flush()
        os._exit(LATE_STOP_EXIT_CODE)

    timer = threading.Timer(bound_s, end)
    timer.daemon = True
    timer.start()
    return timer


async def _bound_stop(stop: asyncio.Event, bound_s: float) -> None:
    """Once ``stop`` is set, end the process if it is still stopping ``bound_s`` later; cancelled
    (the stop finished) first, it lets the process exit as it would."""
    await stop.wait()
    timer = _end_if_late(asyncio.get_running_loop(), bound_s)
    try:
        await asyncio.Event().wait()
    finally:
        timer.cancel()


async def _serve(spec: WorkerSpec, ready_fd: int) -> None:
    settings = spec.settings
    configure_logging(settings.log_format, spec.log_level)
    app = create_app(settings, metrics_dir=spec.metrics_dir, workers=spec.workers)
    started = asyncio.Event()
    with stop_signal() as stop:
        watcher = asyncio.create_task(_watch_parent(os.getppid(), stop))
        bounded = asyncio.create_task(_bound_stop(stop, stop_bound_s(settings)))
        server = asyncio.create_task(
            serve(
                app,
                settings.host,
                settings.port,
                shutdown_timeout=settings.shutdown_timeout,
                stop=stop,
                started=started,
                sock=socket.socket(fileno=spec.listen_fd),
            )
        )
        listening = asyncio.create_task(started.wait())
        await asyncio.wait({server, listening}, return_when=asyncio.FIRST_COMPLETED)
        if started.is_set():
            os.write(ready_fd, b"1")
        os.close(ready_fd)  # closed without a byte: the supervisor reads that this worker never listened
        try:
            await server  # raises why it could not start
        finally:
            listening.cancel()
            watcher.cancel()
            bounded.cancel()


def main(argv: list[str]) -> int:
    ready_fd = int(argv[0])
    spec = pickle.loads(sys.stdin.buffer.read())
    if not isinstance(spec, WorkerSpec):
        raise SystemExit(
            "gateway.run.worker: stdin did not carry a WorkerSpec (started by gateway.run.processes only)"
        )
    run(_serve(spec, ready_fd))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
