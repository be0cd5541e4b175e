"""The database's settings, and the settings mechanism every package declares its ``RAG_*`` variables with.

The mechanism (:func:`setting`, :func:`load_settings`, :class:`SettingsError` ...) is defined once
in ``inference.settings``, a public module of ``inference`` that every layer may import, so the
sidecar reads its settings the same way (that module's docstring says why there); it is re-exported
here for the callers that have always imported it from ``schema.settings``.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import tempfile
from pathlib import Path

from inference.settings import (
    SettingsError,
    configured,
    data_dir_setting,
    declarations,
    load_settings,
    parse_bool,
    setting,
)
from schema.embedded_config import valid_size

__all__ = [
    "VECTOR_TYPES",
    "DatabaseSettings",
    "SettingsError",
    "configured",
    "declarations",
    "load_settings",
    "parse_bool",
    "runtime_folder",
    "setting",
]

VECTOR_TYPES = ("auto", "vector", "halfvec")  # see schema/migrations/0017_vector_type.sql


@dataclasses.dataclass(frozen=True)
class DatabaseSettings:
    """Where the vector store lives."""

    database_url: str | None = setting(
        "RAG_DATABASE_URL",
        None,
        "PostgreSQL URL with pgvector. Unset: Mnemo runs an embedded PostgreSQL 18 + pgvector "
        "under `RAG_DATA_DIR` (zero setup, single host); set it for production.",
    )
    data_dir: Path = data_dir_setting()
    pool_size: int = setting(
        "RAG_DB_POOL_SIZE",
        10,
        "Connections per pool for writes: each gateway worker holds two of this size (writes and the "
        "drain; the budget ledger), beside its two read pools (`RAG_DB_READ_POOL_SIZE`). More allows more "
        "concurrent writes but costs server memory.",
    )
    read_pool_size: int = setting(
        "RAG_DB_READ_POOL_SIZE",
        10,
        "Connections per gateway worker for retrieval reads, and as many for the lexical engine's "
        "re-reads (a search holds up to two reads at once: its dense and lexical legs).",
        tradeoff="How many searches run in the database at once. Fewer lowers PostgreSQL's CPU per search "
        "once the cores are busy (on 2 cores and 32 callers, 4 against 10: about 5% less of PostgreSQL's "
        "CPU, 3-5% more searches/s, at 100k and 1M chunks) but a search then waits for a connection in the "
        "gateway, and p99 rose 20-30%; more helps where reads wait on I/O rather than CPU (a replica "
        "on slow disks, an index larger than memory).",
    )

    read_url: str | None = setting(
        "RAG_DATABASE_READ_URL",
        None,
        "A streaming replica of `RAG_DATABASE_URL` for the gateway's retrieval reads (search, passages, "
        "ask, images). Writes, the queue, sections and admin routes stay on the primary. A replica that "
        "is down or too far behind sends reads to the primary (counted on `/metrics`), never a failed search.",
    )
    read_max_lag: float = setting(
        "RAG_READ_MAX_LAG",
        10.0,
        "Seconds a replica may be behind the primary and still serve reads. Lower: fresher results, more "
        "fallbacks to the primary after a burst of writes.",
    )
    read_check_interval: float = setting(
        "RAG_READ_CHECK_INTERVAL",
        1.0,
        "Seconds between checks of the replica's lag and reachability (a lost connection is noticed at once).",
        tradeoff="Shorter notices a lagging or returning replica sooner, for one more small query per check.",
    )

    vector_type: str = setting(
        "RAG_VECTOR_TYPE",
        "auto",
        "Element type of a new model partition's HNSW index: `auto` (`vector` up to 2000 dimensions, "
        "`halfvec` above), `vector`, or `halfvec` (an index about half the size, for a small recall cost). "
        "Applies when a model's partition is created; an existing partition keeps its type.",
    )

    embedded_shared_buffers: str = setting(
        "RAG_EMBEDDED_SHARED_BUFFERS",
        "auto",
        "The embedded PostgreSQL's `shared_buffers` (unused with `RAG_DATABASE_URL`): `auto`, a quarter of "
        "the host's memory (or its container's limit), between 128MB and 32GB; or a size such as `2GB`. "
        "Applies at the server's next start; `ALTER SYSTEM` overrides it.",
        tradeoff="More keeps more of the HNSW indexes and rows in PostgreSQL's own cache (a dense search at 100k "
        "chunks cost 0.85 ms of CPU at 2GB against 1.47 at PostgreSQL's 128MB); the memory is the server's, not "
        "the other processes' on the host.",
    )

    def validate(self) -> None:
        if not valid_size(self.embedded_shared_buffers):
            raise SettingsError(
                "RAG_EMBEDDED_SHARED_BUFFERS must be auto or a size with its unit (kB, MB, GB, TB), such as "
                f"2GB, not {self.embedded_shared_buffers!r}"
            )
        if self.pool_size < 1:
            raise SettingsError("RAG_DB_POOL_SIZE must be at least 1")
        if self.read_pool_size < 1:
            raise SettingsError("RAG_DB_READ_POOL_SIZE must be at least 1")
        if self.vector_type not in VECTOR_TYPES:
            raise SettingsError(
                f"RAG_VECTOR_TYPE must be one of {', '.join(VECTOR_TYPES)}, not {self.vector_type!r}"
            )
        if not self.read_max_lag >= 0 or not 0 < self.read_check_interval <= 3600:
            raise SettingsError("RAG_READ_MAX_LAG must be >= 0 and RAG_READ_CHECK_INTERVAL in (0, 3600]")


def runtime_folder() -> Path:
    """The user's runtime folder, named in ``XDG_RUNTIME_DIR`` for this process and its children
    (here, with the environment's other readers: not a ``RAG_*`` setting, a library's variable).

    pgserver (:mod:`schema.embedded`) asks platformdirs for it when it is imported (its lock file
    lives there, and its socket when the data folder's path is too long for one). Without
    ``XDG_RUNTIME_DIR`` (a container, a cron job, ``su``, a shell without a login session)
    platformdirs warns on every start, in the middle of ``mnemo up``'s first screen, and falls back
    to ``/run/user/<uid>``, else ``<tmp>/runtime-<uid>``. This names that same folder, so every process (Mnemo's or not) keeps
    one lock file, private as the XDG specification wants it (platformdirs' earlier releases made
    the temporary one 0755; it repairs that too). A variable already set is the user's and is kept.
    """
    configured = os.environ.get("XDG_RUNTIME_DIR")
    if configured:
        return Path(configured)
    uid = os.geteuid()
    folder = Path(f"/run/user/{uid}")
    if not _private_folder(folder, uid):
        folder = Path(tempfile.gettempdir()) / f"runtime-{uid}"
        folder.mkdir(mode=0o700, exist_ok=True)
        if not folder.is_symlink() and folder.is_dir() and folder.stat().st_uid == uid:
            folder.chmod(0o700)
        if not _private_folder(folder, uid):
            raise SettingsError(
                f"{folder} is not a private folder of this user (another user's, or a link): set "
                "XDG_RUNTIME_DIR to one (mode 0700) for the embedded database's lock file"
            )
    os.environ["XDG_RUNTIME_DIR"] = str(folder)
    return folder


def _private_folder(path: Path, uid: int) -> bool:
    """A folder (not a link) of user ``uid`` that nobody else may enter."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and st.st_mode & 0o077 == 0
