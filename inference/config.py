"""The sidecar's model configuration (YAML) and process settings (environment + flags).

A config file lists the models to serve and the request limits::

    limits: {max_body_bytes: 67108864, max_image_bytes: 20971520, max_image_pixels: 40000000,
             replica_wait_s: 1.5}
    models:
      - id: bge-m3
        kind: text                 # text | image_text | rerank
        weights: ${RAG_MODELS_DIR}/bge-m3
        pooling: cls
        sparse: true
        ...

``weights`` is a local directory, ``package:<module>/<subdir>`` (a directory shipped inside an installed
Python package), or a hub id already in the local Hugging Face cache. ``build: <recipe>`` makes a tiny
seeded model at that path on first start (offline profile and tests only; the id must say so). Nothing
is ever downloaded: a model whose weights are missing is a :class:`ModelWeightsMissing` naming the path.

``${RAG_MODELS_DIR}`` and ``${RAG_DATA_DIR}`` expand to the settings of
:class:`~inference.settings.ModelFilesSettings`: the environment's value, else the default declared
there, so a config file carries no second default (``${VAR:-default}`` is refused) and names no
variable the settings catalog does not declare.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml

from .eventloop import ray_environment
from .settings import ModelFilesSettings, SettingsError, declarations, load_settings

__all__ = [
    "ConfigError",
    "Limits",
    "ModelSpec",
    "ModelWeightsMissing",
    "SidecarConfig",
    "load_config",
    "resolve_weights",
]

Kind = Literal["text", "image_text", "rerank"]
AUTOSCALING_KEYS = frozenset(
    {"min_replicas", "max_replicas", "target_ongoing_requests", "upscale_delay_s", "downscale_delay_s"}
)
KINDS = ("text", "image_text", "rerank")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}")


class ConfigError(ValueError):
    """The sidecar config is malformed or inconsistent."""


class ModelWeightsMissing(ConfigError):
    """A configured model's weights are not where the config says."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """Request limits shared by every route (TEI-style: refuse instead of queueing without bound)."""

    max_body_bytes: int = 64 * 1024 * 1024
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    # How long the ingress waits for a model replica to take a call. Serve's router otherwise holds
    # a call until a replica is free, and with the only replica gone that is until its replacement
    # has loaded and warmed up (12-39 s measured): past this wait the call answers 503 not_ready
    # with Retry-After, so a client retries or fails over within its own timeout.
    replica_wait_s: float = 1.5

    def validate(self) -> None:
        wait = self.replica_wait_s
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 < wait < math.inf:
            raise ConfigError(f"limits: replica_wait_s must be a number of seconds > 0, not {wait!r}")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One served model: where its weights are, how to run it, how to batch it, what it may use."""

    id: str
    kind: Kind
    weights: str
    build: str | None = None  # tiny recipe built at `weights` when missing (offline/test models only)
    backend: Literal["transformers", "open_clip"] = "transformers"  # image_text: which library loads it
    seed: int = 0
    pooling: Literal["cls", "mean"] = "cls"
    sparse: bool = False  # bge-m3 lexical weights (needs sparse_linear.pt next to the weights)
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    max_input_tokens: int | None = None  # default: what the tokenizer/model allow
    max_batch_size: int = 32  # items per forward pass
    max_batch_tokens: int = 16384  # padded tokens per forward pass
    max_client_batch: int = 128  # inputs per request (413 above)
    max_queued_items: int = 512  # admitted, unfinished items per replica (429 above)
    batch_wait_ms: float = 2.0  # how long a lone request waits for company
    # A forward pass's fixed cost in padded tokens, weighed against padding when a wave is cut into
    # batches (a CPU pays for padding, so short texts run apart from long ones). None: measured at
    # warm-up on the device the model runs on (tens of tokens on a CPU; on a GPU padding is nearly
    # free, the figure comes out large and batches stay full).
    batch_overhead_tokens: float | None = None
    # /embed bundles in flight from the ingress to this model's replicas (default 2 per replica):
    # requests arriving meanwhile travel together in the next bundle. 0: one Ray call per request.
    coalesce_in_flight: int | None = None
    replicas: int = 1
    # On a cluster: at most this many of the model's replicas per node (1 spreads them, so a lost
    # node takes one of them). Serve's deployment option of the same name.
    max_replicas_per_node: int | None = None
    # Serve's autoscaling on ongoing requests per replica, in place of a fixed ``replicas``: keys
    # min_replicas, max_replicas, target_ongoing_requests, upscale_delay_s, downscale_delay_s.
    autoscaling: dict[str, float] | None = None
    num_cpus: float = 0.5
    num_gpus: float = 0.0
    torch_threads: int | None = None
    text_max_length: int | None = None  # image_text: the text tower's padded length (max_length padding)

    def validate(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.id):
            raise ConfigError(f"model id {self.id!r}: use letters, digits, '.', '_' and '-'")
        if self.kind not in KINDS:
            raise ConfigError(f"model {self.id!r}: kind must be one of {KINDS}, not {self.kind!r}")
        if self.pooling not in ("cls", "mean"):
            raise ConfigError(f"model {self.id!r}: pooling must be cls or mean")
        if self.backend not in ("transformers", "open_clip"):
            raise ConfigError(f"model {self.id!r}: backend must be transformers or open_clip")
        if self.backend == "open_clip" and self.kind != "image_text":
            raise ConfigError(f"model {self.id!r}: the open_clip backend serves image_text models only")
        if self.sparse and self.kind != "text":
            raise ConfigError(f"model {self.id!r}: sparse weights exist only for text models")
        for name in (
            "max_batch_size",
            "max_batch_tokens",
            "max_client_batch",
            "max_queued_items",
            "replicas",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"model {self.id!r}: {name} must be at least 1")
        if self.max_queued_items < max(self.max_client_batch, self.max_batch_size):
            # Otherwise a full request could never be admitted, or batches could never fill.
            raise ConfigError(
                f"model {self.id!r}: max_queued_items ({self.max_queued_items}) must be at least "
                f"max_client_batch and max_batch_size"
            )
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ConfigError(f"model {self.id!r}: num_cpus/num_gpus cannot be negative")
        overhead = self.batch_overhead_tokens
        if overhead is not None and (
            isinstance(overhead, bool)
            or not isinstance(overhead, int | float)
            or not 0 <= overhead < math.inf
        ):
            raise ConfigError(
                f"model {self.id!r}: batch_overhead_tokens must be a number of tokens, 0 or more "
                f"(or left out, to measure it at warm-up), not {overhead!r}"
            )
        if self.coalesce_in_flight is not None and self.coalesce_in_flight < 0:
            raise ConfigError(f"model {self.id!r}: coalesce_in_flight cannot be negative (0 turns it off)")
        if self.max_replicas_per_node is not None and (
            isinstance(self.max_replicas_per_node, bool)
            or not isinstance(self.max_replicas_per_node, int)
            or self.max_replicas_per_node < 1
        ):
            raise ConfigError(f"model {self.id!r}: max_replicas_per_node must be a whole number >= 1")
        if self.autoscaling is not None:
            self._validate_autoscaling(self.autoscaling)

    def _validate_autoscaling(self, scaling: Any) -> None:
        where = f"model {self.id!r}: autoscaling"
        if not isinstance(scaling, Mapping):
            raise ConfigError(f"{where} must be a mapping of {sorted(AUTOSCALING_KEYS)}")
        unknown = set(scaling) - AUTOSCALING_KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(AUTOSCALING_KEYS)})")
        for key, value in scaling.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise ConfigError(f"{where}: {key} must be a number >= 0, not {value!r}")
        low, high = scaling.get("min_replicas", 1), scaling.get("max_replicas", 1)
        if not (isinstance(low, int) and isinstance(high, int) and 0 <= low <= high and high >= 1):
            raise ConfigError(
                f"{where}: needs whole min_replicas <= max_replicas (max >= 1), not {low}/{high}"
            )

    @property
    def most_replicas(self) -> int:
        """The replicas the model may run: ``replicas``, or autoscaling's ``max_replicas``."""
        return self.replicas if self.autoscaling is None else int(self.autoscaling.get("max_replicas", 1))

    @property
    def bundles_in_flight(self) -> int:
        """``coalesce_in_flight`` resolved: two per replica keep each busy while the next travels."""
        return 2 * self.most_replicas if self.coalesce_in_flight is None else self.coalesce_in_flight

    def public(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SidecarConfig:
    """Every model the sidecar serves, plus the request limits."""

    models: tuple[ModelSpec, ...]
    limits: Limits = Limits()
    source: str = "<inline>"

    def model(self, model_id: str) -> ModelSpec:
        for spec in self.models:
            if spec.id == model_id:
                return spec
        raise KeyError(model_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "limits": dataclasses.asdict(self.limits),
            "models": [spec.public() for spec in self.models],
        }


def file_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a config's ``${RAG_...}`` references expand to: each variable of
    :class:`~inference.settings.ModelFilesSettings`, from ``environ`` or its declared default."""
    values = load_settings(ModelFilesSettings, environ)
    return {d.env: str(getattr(values, d.field)) for d in declarations(ModelFilesSettings)}


def _expand(value: Any, variables: Mapping[str, str], source: str) -> Any:
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name, inline_default = match.group(1), match.group(2)
            if inline_default is not None:
                raise ConfigError(
                    f"{source}: write ${{{name}}}, not ${{{name}{inline_default}}}: its default is the one "
                    f"declared in inference.settings (see docs/configuration.md)"
                )
            if name not in variables:
                raise ConfigError(
                    f"{source}: ${{{name}}} is not a variable a model config may name "
                    f"(declared: {', '.join(sorted(variables))})"
                )
            return variables[name]

        return _ENV_REF.sub(substitute, value)
    if isinstance(value, list):
        return [_expand(v, variables, source) for v in value]
    if isinstance(value, dict):
        return {k: _expand(v, variables, source) for k, v in value.items()}
    return value


def _build_dataclass(cls: type, raw: Mapping[str, Any], where: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(raw) - names
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(names)})")
    try:
        return cls(**raw)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def config_from_dict(
    data: Mapping[str, Any], *, source: str = "<inline>", environ: Mapping[str, str] | None = None
) -> SidecarConfig:
    """Validate a parsed config (``${RAG_...}`` references expanded from ``environ``, else their defaults)."""
    try:
        variables = file_variables(environ)
    except SettingsError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    data = _expand(dict(data), variables, source)
    if not isinstance(data.get("models"), list) or not data["models"]:
        raise ConfigError(f"{source}: 'models' must be a non-empty list")
    specs = []
    for i, raw in enumerate(data["models"]):
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: models[{i}] must be a mapping")
        spec = _build_dataclass(ModelSpec, raw, f"{source}: models[{i}]")
        spec.validate()
        specs.append(spec)
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{source}: duplicate model ids in {ids}")
    limits = _build_dataclass(Limits, data.get("limits") or {}, f"{source}: limits")
    limits.validate()
    unknown = set(data) - {"models", "limits"}
    if unknown:
        raise ConfigError(f"{source}: unknown top-level keys {sorted(unknown)}")
    return SidecarConfig(models=tuple(specs), limits=limits, source=source)


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> SidecarConfig:
    """Read and validate a sidecar config file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"sidecar config not found: {path}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with 'models'")
    return config_from_dict(data, source=str(path), environ=environ)


def resolve_weights(spec: ModelSpec) -> Path:
    """The local directory holding ``spec``'s weights (building a configured tiny model); never downloads.

    Raises :class:`ModelWeightsMissing` naming the path (or package, or hub id) when absent.
    """
    location = spec.weights
    if spec.build:  # a configured tiny stand-in: built once at its path, then loaded like real weights
        from .tiny import build_tiny_model

        return build_tiny_model(spec.build, Path(location).expanduser(), seed=spec.seed)
    if location.startswith("package:"):
        module, _, subdir = location[len("package:") :].partition("/")
        found = importlib.util.find_spec(module)
        if found is None or not found.submodule_search_locations:
            raise ModelWeightsMissing(
                f"model {spec.id!r}: Python package {module!r} holding its weights is not installed"
            )
        path = Path(next(iter(found.submodule_search_locations))) / subdir
        if not path.is_dir():
            raise ModelWeightsMissing(f"model {spec.id!r}: weights not found at {path}")
        return path
    path = Path(location).expanduser()
    if path.is_dir():
        return path
    if not path.is_absolute() and re.fullmatch(r"[\w.-]+/[\w.-]+", location):
        # A hub id: only what is already in the local cache.
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(location, local_files_only=True))
        except Exception as exc:
            raise ModelWeightsMissing(
                f"model {spec.id!r}: {location!r} is neither a directory nor a hub id in the local cache"
            ) from exc
    raise ModelWeightsMissing(f"model {spec.id!r}: weights not found at {path.resolve()}")


def carry_loop_setting_to_ray() -> None:
    """Ray installs uvloop in its workers (the sidecar's HTTP front among them) unless
    ``RAY_USE_UVLOOP`` is false, read from the environment they inherit at ``ray.init``:
    ``RAG_UVLOOP`` decides it, so one setting turns uvloop off in every Mnemo process."""
    os.environ.update(ray_environment())


def opt_out_of_ray_usage_stats() -> None:
    """Ray reads its usage-stats switch from the environment at ``ray.init``: an offline sidecar
    never phones home, unless the operator has set the variable themselves."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
