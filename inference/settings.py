"""Mnemo's one settings mechanism (every ``RAG_*`` variable), and the sidecar's own settings.

Each settings class is a frozen dataclass whose fields are declared with :func:`setting`: the
environment variable, its default, a one-line meaning and the trade-off (when to change it).
:func:`load_settings` builds an instance from an environment mapping plus explicit overrides (CLI
flags win over the environment, which wins over defaults). Nothing reads ``os.environ`` at import
time. :func:`declarations` reads the declarations back: the configuration reference
(``docs/configuration.md``) and the sample env file are generated from them
(``gateway.base.settings_catalog``, ``mnemo settings docs``).

Why the mechanism lives in ``inference``: every package reads settings, but ``inference`` stands
alone (it imports nothing from ``schema``, ``index`` or ``gateway``), while those may import
``inference``'s public modules. Kept in ``schema``, the sidecar could not use it (it hand-parsed its
own map); a new top-level package would be a sixth layer to ship and install. So it is here, in a
public module of the standard library alone, and ``schema.settings`` re-exports it for its callers.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "Declaration",
    "LoopSettings",
    "ModelFilesSettings",
    "SettingsError",
    "SidecarSettings",
    "configured",
    "data_dir_setting",
    "declarations",
    "load_settings",
    "parse_bool",
    "setting",
    "sidecar_api_key_setting",
]

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class SettingsError(ValueError):
    """A setting has a value that cannot be parsed or is out of range."""


def setting(env: str, default: Any, help: str, *, tradeoff: str | None = None) -> Any:
    """Declare a settings field bound to environment variable ``env``.

    ``help`` says what the setting means; ``tradeoff`` when to change it. Without ``tradeoff``, the
    first sentence of ``help`` is the meaning and the rest the trade-off (the form most declarations
    were written in before the two were separate)."""
    metadata = {"env": env, "help": help, "tradeoff": tradeoff}
    return dataclasses.field(default=default, metadata=metadata)


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
        if not raw.strip():  # Path("") is the working directory: never what an empty value meant
            raise SettingsError(f"{name} is empty: unset it, or name a directory")
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


def configured(var: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the operator set ``var`` (non-empty): for commands whose behaviour depends on a
    setting being given at all, not only on its value (``mnemo up`` starts its own sidecar
    unless one is named)."""
    env = os.environ if environ is None else environ
    return bool(env.get(var))


# -- reading the declarations back ------------------------------------------------------------------

# The end of a help text's first sentence: a full stop after a word, a closing bracket or quote,
# then the next sentence's capital, backtick or bracket ("e.g. a" and "`x.y`" do not end one).
_SENTENCE_END = re.compile(r"(?<=[A-Za-z0-9)\]`'\"])\.\s+(?=[A-Z`(\"])")


@dataclasses.dataclass(frozen=True)
class Declaration:
    """One ``RAG_*`` variable as a settings class declares it, in the words the reference prints."""

    env: str
    owner: str  # "package.module.Class"
    field: str
    type: str
    default: str | None  # as an operator would write it in the environment (None: unset)
    meaning: str
    tradeoff: str

    @property
    def package(self) -> str:
        return self.owner.split(".")[0]


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _type_name(args[0])
    if origin is tuple:
        return "list"
    if annotation is Path:
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def _env_text(value: Any) -> str:
    """``value`` as the environment spells it (the inverse of :func:`_parse`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(part) for part in value)
    return str(value)


def _meaning_and_tradeoff(help_text: str, tradeoff: str | None) -> tuple[str, str]:
    text = help_text.strip()
    if tradeoff is not None:
        return text, tradeoff.strip()
    parts = _SENTENCE_END.split(text, maxsplit=1)
    if len(parts) == 1:
        return text, ""
    return parts[0] + ".", parts[1].strip()


def declarations(cls: type) -> list[Declaration]:
    """Every field of ``cls`` declared with :func:`setting`, in declaration order."""
    hints = typing.get_type_hints(cls)
    out = []
    for field in dataclasses.fields(cls):
        env = field.metadata.get("env")
        if not env:
            continue
        default = None if field.default is dataclasses.MISSING else field.default
        meaning, tradeoff = _meaning_and_tradeoff(field.metadata["help"], field.metadata.get("tradeoff"))
        out.append(
            Declaration(
                env=env,
                owner=f"{cls.__module__}.{cls.__qualname__}",
                field=field.name,
                type=_type_name(hints[field.name]),
                default=None if default is None else _env_text(default),
                meaning=meaning,
                tradeoff=tradeoff,
            )
        )
    return out


# -- declarations more than one settings class binds ------------------------------------------------
# One variable, one declaration: a class that needs a variable another class (in another package)
# also reads binds the same declaration through one of these, so its default and words exist once.


def data_dir_setting() -> Any:
    """``RAG_DATA_DIR``: the database settings' embedded state and the offline model config's
    ``${RAG_DATA_DIR}`` (its tiny models)."""
    return setting(
        "RAG_DATA_DIR",
        Path(".mnemo"),
        "Where embedded state lives, reused across restarts: `pg/` holds the embedded database, `models/` "
        "the offline profile's tiny models.",
        tradeoff="Point it at a persistent disk with room for the embedded database (which `RAG_DATABASE_URL` "
        "replaces).",
    )


def sidecar_api_key_setting() -> Any:
    """``RAG_SIDECAR_API_KEY``: the sidecar requires it, its clients send it."""
    return setting(
        "RAG_SIDECAR_API_KEY",
        None,
        "Bearer key for the sidecar: when set on the sidecar, every route but health requires it, and its "
        "clients (gateway, drain, jobs) send it.",
        tradeoff="Set it as soon as the sidecar's port is reachable from anything but the gateway.",
    )


# -- the sidecar's settings ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SidecarSettings:
    """Process settings for ``mnemo sidecar``: read once at start; CLI flags override the environment."""

    config: Path | None = setting(
        "RAG_SIDECAR_CONFIG",
        None,
        "The model config YAML (models, batching, limits). Unset: the offline profile shipped with "
        "the package (tiny models, no downloads); `inference/models.yaml` is the production one.",
    )
    host: str = setting(
        "RAG_SIDECAR_HOST",
        "127.0.0.1",
        "Interface the sidecar listens on.",
        tradeoff="`0.0.0.0` serves other hosts (a container, a cluster); set `RAG_SIDECAR_API_KEY` then.",
    )
    port: int = setting(
        "RAG_SIDECAR_PORT",
        8001,
        "TCP port of the sidecar.",
        tradeoff="Change it when the port is taken; `RAG_SIDECAR_URL` must follow.",
    )
    api_key: str | None = sidecar_api_key_setting()
    num_cpus: float | None = setting(
        "RAG_SIDECAR_NUM_CPUS",
        None,
        "CPUs the local Ray instance may hand out to replicas. Unset: all cores.",
        tradeoff="Lower it to leave cores to PostgreSQL and the gateway on a shared host.",
    )
    object_store_mb: int = setting(
        "RAG_SIDECAR_OBJECT_STORE_MB",
        256,
        "Size of the local Ray instance's object store, in MiB.",
        tradeoff="Raise it for large image batches (Ray spills to disk when it is full); "
        "it is memory taken from the host.",
    )
    # The ingress's HTTP front (aiohttp) against slow or idle clients.
    request_timeout_s: float = setting(
        "RAG_SIDECAR_REQUEST_TIMEOUT",
        120.0,
        "Seconds the sidecar's HTTP front allows for the rest of a request once its head has arrived, "
        "body upload included (408 request_timeout).",
        tradeoff="Lower frees connections held by slow uploads sooner; too low refuses large image "
        "batches on slow links.",
    )
    keep_alive_timeout_s: int = setting(
        "RAG_SIDECAR_KEEP_ALIVE_TIMEOUT",
        30,
        "Seconds a connection may go without a complete request head after it opened or after its "
        "last answer (an idle client and one sending its headers byte by byte alike).",
        tradeoff="Lower closes idle and trickling connections sooner; clients that pool connections "
        "reconnect more often.",
    )
    ray_address: str | None = setting(
        "RAG_RAY_ADDRESS",
        None,
        "An existing Ray cluster to deploy onto (`ray://host:10001` or `host:6379`). Unset: a local "
        "Ray instance.",
        tradeoff="Set it to spread replicas over a cluster's nodes; `RAG_SIDECAR_NUM_CPUS` and "
        "`RAG_SIDECAR_OBJECT_STORE_MB` are then the cluster's own.",
    )

    def validate(self) -> None:
        if not (self.request_timeout_s > 0 and self.keep_alive_timeout_s > 0):
            raise SettingsError("RAG_SIDECAR_REQUEST_TIMEOUT and RAG_SIDECAR_KEEP_ALIVE_TIMEOUT must be > 0")


LOOP_CHOICES = ("auto", "on", "off")


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    """The event loop of every Mnemo process (``inference.eventloop``)."""

    uvloop: str = setting(
        "RAG_UVLOOP",
        "auto",
        "The event loop of every service: `auto` (uvloop when installed), `on` (uvloop, a start-up "
        "error when missing) or `off` (asyncio's own loop); Ray's workers follow it.",
        tradeoff="`off` rules a suspected loop bug in or out; uvloop is the faster loop (issue 15).",
    )

    @property
    def choice(self) -> str:
        return self.uvloop.strip().lower() or "auto"

    def validate(self) -> None:
        if self.choice not in LOOP_CHOICES:
            raise SettingsError(f"RAG_UVLOOP must be one of {', '.join(LOOP_CHOICES)}, not {self.uvloop!r}")


@dataclasses.dataclass(frozen=True)
class ModelFilesSettings:
    """Where model configs find weights: the variables a config may name as ``${RAG_...}``."""

    models_dir: Path = setting(
        "RAG_MODELS_DIR",
        Path("/models"),
        "Where `inference/models.yaml` finds bge-m3, SigLIP and the reranker (`${RAG_MODELS_DIR}`; "
        "local directories, nothing is downloaded).",
        tradeoff="Point it at the disk holding the weight snapshots (the GPU image mounts `/models`).",
    )
    data_dir: Path = data_dir_setting()
