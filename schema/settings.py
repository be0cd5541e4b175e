"""Typed settings read once at start from the environment (prefix ``RAG_``) and CLI flags.

Each settings class is a frozen dataclass whose fields are declared with
:func:`setting`, naming the environment variable and what the value trades off.
:func:`load_settings` builds an instance from an environment mapping plus
explicit overrides (CLI flags win over the environment, which wins over
defaults). Nothing reads ``os.environ`` at import time.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class SettingsError(ValueError):
    """A setting has a value that cannot be parsed or is out of range."""


def setting(env: str, default: Any, help: str) -> Any:
    """Declare a settings field bound to environment variable ``env``."""
    return dataclasses.field(default=default, metadata={"env": env, "help": help})


def parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean (use true/false)")


def _parse(name: str, raw: str, annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if raw.strip() == "":
            return None
        return _parse(name, raw, args[0])
    if annotation is bool:
        return parse_bool(name, raw)
    if annotation is int:
        try:
            return int(raw)
        except ValueError as exc:
            raise SettingsError(f"{name}={raw!r} is not an integer") from exc
    if annotation is float:
        try:
            return float(raw)
        except ValueError as exc:
            raise SettingsError(f"{name}={raw!r} is not a number") from exc
    if annotation is Path:
        return Path(raw).expanduser()
    if origin is tuple:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    return raw


def load_settings(cls: type[T], environ: Mapping[str, str] | None = None, **overrides: Any) -> T:
    """Build ``cls`` from ``environ`` (default: the process environment) and overrides.

    Overrides whose value is ``None`` are ignored, so argparse defaults of
    ``None`` mean "not given on the command line".
    """
    env = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if overrides.get(field.name) is not None:
            values[field.name] = overrides[field.name]
            continue
        var = field.metadata.get("env")
        if var and var in env:
            values[field.name] = _parse(var, env[var], hints[field.name])
    unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    if unknown:
        raise SettingsError(f"unknown settings for {cls.__name__}: {sorted(unknown)}")
    instance = cls(**values)
    validate = getattr(instance, "validate", None)
    if callable(validate):
        validate()
    return instance


def describe_settings(cls: type) -> list[tuple[str, str, str]]:
    """(env var, default, help) for every field: the README's settings table comes from here."""
    rows = []
    for field in dataclasses.fields(cls):
        default = field.default if field.default is not dataclasses.MISSING else ""
        rows.append((field.metadata["env"], "" if default is None else str(default), field.metadata["help"]))
    return rows


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
    data_dir: Path = setting(
        "RAG_DATA_DIR",
        Path(".mnemo"),
        "Where embedded state lives (`pg/` holds the embedded database). Reused across restarts.",
    )
    pool_size: int = setting(
        "RAG_DB_POOL_SIZE",
        10,
        "Connections per pool. The gateway holds two (writes and the drain; retrieval reads), so up to twice "
        "this. More allows more concurrent queries but costs server memory.",
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
    )

    vector_type: str = setting(
        "RAG_VECTOR_TYPE",
        "auto",
        "Element type of a new model partition's HNSW index: `auto` (`vector` up to 2000 dimensions, "
        "`halfvec` above), `vector`, or `halfvec` (an index about half the size, for a small recall cost). "
        "Applies when a model's partition is created; an existing partition keeps its type.",
    )

    def validate(self) -> None:
        if self.pool_size < 1:
            raise SettingsError("RAG_DB_POOL_SIZE must be at least 1")
        if self.vector_type not in VECTOR_TYPES:
            raise SettingsError(
                f"RAG_VECTOR_TYPE must be one of {', '.join(VECTOR_TYPES)}, not {self.vector_type!r}"
            )
        if not self.read_max_lag >= 0 or not 0 < self.read_check_interval <= 3600:
            raise SettingsError("RAG_READ_MAX_LAG must be >= 0 and RAG_READ_CHECK_INTERVAL in (0, 3600]")


def configured(var: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the operator set ``var`` (non-empty): for commands whose behaviour depends on a
    setting being given at all, not only on its value (``mnemo up`` starts its own sidecar
    unless one is named)."""
    env = os.environ if environ is None else environ
    return bool(env.get(var))
