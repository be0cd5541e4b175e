"""A real streaming replica of the embedded PostgreSQL, on one machine.

``RAG_DATABASE_READ_URL`` sends the gateway's retrieval reads to a replica. To try that (and test it)
without a second host, :class:`StreamingReplica` clones a running :class:`EmbeddedPostgres` with its
own ``pg_basebackup`` (``-R``: ``standby.signal`` plus ``primary_conninfo``, WAL streamed) and runs
the copy as a hot standby on its own Unix socket. It can be stopped and started again, as an operator
would restart a replica. As root, the server binaries refuse to run, so the commands run as the
unprivileged system user that ``pgserver`` itself runs the primary as.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path
from types import TracebackType

from .embedded import EmbeddedDatabaseError, EmbeddedPostgres

__all__ = ["StreamingReplica"]

_PGSERVER_SYSTEM_USER = "pgserver"  # pgserver's own choice when it runs as root


def _bin(name: str) -> str:
    import pgserver

    return str(Path(pgserver.__file__).parent / "pginstall" / "bin" / name)


class StreamingReplica:
    """A hot standby of ``primary`` under ``root`` (data in ``root/data``, socket in ``root/socket``)."""

    def __init__(self, primary: EmbeddedPostgres, root: Path, *, port: int = 5433) -> None:
        self.primary = primary
        self.root = Path(root).resolve()
        self.data_dir = self.root / "data"
        self.socket_dir = self.root / "socket"
        self.port = port
        self._user = _PGSERVER_SYSTEM_USER if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@/postgres?host={self.socket_dir}&port={self.port}"

    def url_for(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={self.socket_dir}&port={self.port}"

    def create(self) -> StreamingReplica:
        """Base-backup the primary (fast checkpoint, WAL streamed) and start the standby."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        if self._user is not None:  # the standby's files belong to the user that runs it
            entry = pwd.getpwnam(self._user)
            for path in (self.root, self.socket_dir):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        socket = self.primary.url.split("host=", 1)[1].split("&", 1)[0]
        self._run(_bin("pg_basebackup"), "-h", socket, "-U", "postgres", "-D", str(self.data_dir),
                  "-R", "-X", "stream", "-c", "fast")  # fmt: skip
        self.start()
        return self

    def start(self) -> None:
        options = f"-c listen_addresses='' -k {self.socket_dir} -p {self.port} -c hot_standby=on"
        log = self.root / "replica.log"
        self._run(
            _bin("pg_ctl"), "-D", str(self.data_dir), "-l", str(log), "-w", "-t", "60", "-o", options, "start"
        )

    def stop(self) -> None:
        """Stop the standby (``-m fast``: its sessions are cut, as when a replica goes down)."""
        self._run(_bin("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, *command: str) -> None:
        result = subprocess.run(
            command, user=self._user, capture_output=True, text=True, timeout=120, check=False
        )
        if result.returncode != 0:
            raise EmbeddedDatabaseError(
                f"{Path(command[0]).name} failed ({result.returncode}): {result.stderr.strip()[-2000:]}"
            )

    def __enter__(self) -> StreamingReplica:
        return self.create()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.destroy()
