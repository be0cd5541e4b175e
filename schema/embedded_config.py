"""The embedded PostgreSQL's own configuration: the server settings Mnemo sizes for its host.

PostgreSQL's ``shared_buffers`` defaults to 128 MB, sized for the smallest machine it may run on. A
dense search walks its partition's HNSW index (about 2 KiB a row: 195 MiB at 100k chunks, 1.9 GiB at
1M) and reads its candidates' rows; every page outside ``shared_buffers`` is copied in from the
kernel's page cache, evicting another, at each visit. At 100k chunks the dense statement cost 1.47 ms
of CPU at 128 MB and 0.85 ms at 2 GB, the same queries (issue 56, ``docs/scale.md``). So the
embedded server gets the common starting point of PostgreSQL's tuning guides, a quarter of the
host's memory (``RAG_EMBEDDED_SHARED_BUFFERS=auto``), or the size named.

Mnemo writes its settings to ``mnemo.conf`` in the data folder at every start, before the server
starts (so a changed value applies at the next start, without a restart of its own), and
``postgresql.conf`` includes that file once. ``ALTER SYSTEM`` (``postgresql.auto.conf``, read after
both) still overrides it: the operator's word is the last.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["CONFIG_FILE", "host_memory_bytes", "shared_buffers_size", "valid_size", "write_server_config"]

CONFIG_FILE = "mnemo.conf"
_INCLUDE = f"include_if_exists = '{CONFIG_FILE}'"
AUTO_SHARE = 0.25  # of the host's memory: PostgreSQL's documented starting point for a dedicated server
_MIN_BYTES = 128 << 20  # PostgreSQL's own default: auto never goes below it
_MAX_AUTO_BYTES = 32 << 30  # beyond this the kernel's page cache serves as well (PostgreSQL's docs)
_SIZE = re.compile(r"([1-9][0-9]*)(kB|MB|GB|TB)")
_CGROUP_LIMIT = Path("/sys/fs/cgroup/memory.max")


def valid_size(value: str) -> bool:
    """``auto`` or a PostgreSQL memory size with its unit (``512MB``, ``6GB``)."""
    return value == "auto" or _SIZE.fullmatch(value) is not None


def host_memory_bytes() -> int:
    """The memory this host gives its processes: the physical memory, or the container's limit
    (cgroup v2 ``memory.max``) when that is lower."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = _CGROUP_LIMIT.read_text().strip()
    except OSError:
        return physical
    return min(physical, int(limit)) if limit.isdigit() else physical


def shared_buffers_size(value: str, memory_bytes: int | None = None) -> str:
    """The ``shared_buffers`` the embedded server gets for ``RAG_EMBEDDED_SHARED_BUFFERS``: the size
    named, or for ``auto`` a quarter of ``memory_bytes`` (the host's, by default) in whole MB,
    between PostgreSQL's default (128 MB) and 32 GB."""
    if not valid_size(value):
        raise ValueError(f"shared_buffers must be auto or a size such as 512MB or 6GB, not {value!r}")
    if value != "auto":
        return value
    memory = host_memory_bytes() if memory_bytes is None else memory_bytes
    share = min(max(int(memory * AUTO_SHARE), _MIN_BYTES), _MAX_AUTO_BYTES)
    return f"{share >> 20}MB"


def write_server_config(pgdata: Path, settings: dict[str, str]) -> None:
    """Write ``settings`` to the data folder's ``mnemo.conf`` and make ``postgresql.conf`` include
    it (once). Files keep the data folder's owner: the server may run as another user."""
    config = pgdata / CONFIG_FILE
    lines = ["# Written by Mnemo at each start of the embedded server (schema/embedded_config.py).",
             "# Change RAG_EMBEDDED_* rather than this file; ALTER SYSTEM overrides both."]  # fmt: skip
    lines += [f"{name} = '{value}'" for name, value in sorted(settings.items())]
    config.write_text("\n".join(lines) + "\n")
    main = pgdata / "postgresql.conf"
    text = main.read_text()
    if _INCLUDE not in text.splitlines():
        main.write_text(text + ("" if text.endswith("\n") else "\n") + _INCLUDE + "\n")
    owner = pgdata.stat()
    if os.geteuid() == 0 and owner.st_uid != 0:
        os.chown(config, owner.st_uid, owner.st_gid)
