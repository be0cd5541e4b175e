"""One worker of ``mnemo gateway --workers N`` (``python -m gateway.run.worker READY_FD``).

Started by :mod:`gateway.run.processes` only: it reads its :class:`~gateway.run.processes.WorkerSpec` pickled
from stdin (the supervisor's own pipe, never a file or a network peer), serves the gateway on the
listening socket it inherited (``WorkerSpec.listen_fd``), writes one byte to ``READY_FD`` once it listens, and stops
gracefully on SIGTERM or SIGINT, or when its supervisor is gone.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import sys

from gateway.base.logs import configure_logging
from gateway.run.processes import WorkerSpec
from gateway.web.app import create_app, serve
from inference.eventloop import run
from schema.cli import stop_signal

PARENT_CHECK_S = 1.0  # how soon a worker notices that its supervisor died (was killed)


async def _watch_parent(parent: int, stop: asyncio.Event) -> None:
    """Set ``stop`` once the supervisor is gone: an orphaned worker would hold the port forever."""
    while not stop.is_set():
        if os.getppid() != parent:
            stop.set()
            return
        await asyncio.sleep(PARENT_CHECK_S)


async def _serve(spec: WorkerSpec, ready_fd: int) -> None:
    settings = spec.settings
    configure_logging(settings.log_format, spec.log_level)
    app = create_app(settings, metrics_dir=spec.metrics_dir, workers=spec.workers)
    started = asyncio.Event()
    with stop_signal() as stop:
        watcher = asyncio.create_task(_watch_parent(os.getppid(), stop))
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
