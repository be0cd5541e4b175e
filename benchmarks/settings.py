"""What the benchmarks take from the environment, read here only.

The stack's own settings (``RAG_DATABASE_URL``, ``RAG_SIDECAR_URL``, ``RAG_TEXT_MODEL``) come
through the same settings classes the services use; subprocesses a benchmark starts (a gateway,
a peer server) inherit this process's environment plus explicit overrides.
"""

from __future__ import annotations

import os

from index.settings import SidecarClientSettings
from schema.settings import DatabaseSettings, load_settings

__all__ = ["child_environment", "configured_database_url", "configured_sidecar", "configured_text_model"]


def child_environment(**overrides: str) -> dict[str, str]:
    """The environment for a subprocess: this process's, with ``overrides`` on top."""
    return {**os.environ, **overrides}


def configured_database_url(flag: str | None = None) -> str | None:
    """``--database-url``, else ``RAG_DATABASE_URL``, else None (a throw-away embedded server)."""
    return load_settings(DatabaseSettings, database_url=flag).database_url


def configured_sidecar(flag: str | None = None) -> SidecarClientSettings:
    """The sidecar client settings: ``--sidecar-url`` over ``RAG_SIDECAR_URL`` over the default."""
    return load_settings(SidecarClientSettings, sidecar_url=flag)


def configured_text_model(flag: str | None = None) -> str | None:
    """``--text-model``, else ``RAG_TEXT_MODEL``, else None (the sidecar's first text model)."""
    return load_settings(SidecarClientSettings, text_model=flag).text_model
