"""The gateway's typed settings, read once at start (environment, then CLI flags).

:class:`GatewaySettings` composes the database and sidecar-client settings
(``settings.database``, ``settings.sidecar``) so one object travels through
the app; :func:`load_gateway_settings` builds all three from one environment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from index.settings import IngestSettings, MediaSettings, SidecarClientSettings
from schema.settings import DatabaseSettings, SettingsError, load_settings, setting

LEGS = ("dense", "lexical", "sparse")
MIN_SECRET_BYTES = 32


def parse_weights(raw: str) -> dict[str, float]:
    """``"dense=1,lexical=0.5"`` -> ``{"dense": 1.0, "lexical": 0.5, "sparse": 1.0}`` (unnamed legs: 1)."""
    weights = dict.fromkeys(LEGS, 1.0)
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in LEGS:
            raise SettingsError(f"RAG_FUSION_WEIGHTS entry {part!r}: use leg=weight with leg in {LEGS}")
        try:
            weight = float(value)
        except ValueError as exc:
            raise SettingsError(f"RAG_FUSION_WEIGHTS entry {part!r}: {value!r} is not a number") from exc
        if not weight >= 0 or weight == float("inf"):
            raise SettingsError(f"RAG_FUSION_WEIGHTS entry {part!r}: weights are finite and >= 0")
        weights[name] = weight
    if not any(weights.values()):
        raise SettingsError("RAG_FUSION_WEIGHTS: at least one leg needs a positive weight")
    return weights


def read_public_key(value: str) -> str:
    """A PEM public key given inline or as a path to a PEM file."""
    if value.lstrip().startswith("-----BEGIN"):
        return value
    path = Path(value).expanduser()
    try:
        return path.read_text()
    except OSError as exc:
        raise SettingsError(f"RAG_JWT_PUBLIC_KEY: cannot read {path}: {exc.strerror}") from exc


@dataclass(frozen=True)
class GatewaySettings:
    """Everything the gateway reads at start. Compose with :func:`load_gateway_settings`."""

    host: str = setting("RAG_GATEWAY_HOST", "127.0.0.1", "Interface the gateway listens on.")
    port: int = setting("RAG_GATEWAY_PORT", 8080, "TCP port of the gateway.")
    enabled: bool = setting(
        "RAG_ENABLED",
        True,
        "Kill switch. Off: every dd_rag_api action declines `rag.disabled` (503) except "
        "`embed_groups`, which answers `{groups: []}`.",
    )
    media_enabled: bool = setting(
        "RAG_MEDIA_ENABLED",
        False,
        "Second switch for the image actions (`similar_objects`, `search_by_text_image`, "
        "`characterize_object`). Off: they decline `rag.media_disabled` (503).",
    )
    auth: str = setting(
        "RAG_AUTH",
        "jwt",
        "`jwt` (bearer tokens) or `off`. `off` treats every caller as an admin: local demos only.",
    )
    jwt_secret: str | None = setting(
        "RAG_JWT_SECRET",
        None,
        "HS256 shared secret (at least 32 bytes; shorter is refused at start).",
    )
    jwt_public_key: str | None = setting(
        "RAG_JWT_PUBLIC_KEY",
        None,
        "RS256 public key: PEM text or a path to a PEM file. Lets an identity provider keep the private key.",
    )
    jwt_audience: str | None = setting(
        "RAG_JWT_AUDIENCE", None, "Required `aud` claim when set (tokens for other services are refused)."
    )
    jwt_issuer: str | None = setting("RAG_JWT_ISSUER", None, "Required `iss` claim when set.")
    jwt_leeway: float = setting(
        "RAG_JWT_LEEWAY", 30.0, "Seconds of clock skew tolerated on `exp`/`nbf`; larger trusts clocks less."
    )
    max_body_bytes: int = setting(
        "RAG_MAX_BODY_BYTES",
        8 * 1024 * 1024,
        "Largest request body accepted (413 beyond). Record batches need room; smaller limits abuse.",
    )
    max_concurrency: int = setting(
        "RAG_GATEWAY_MAX_CONCURRENCY",
        64,
        "Requests served at once; beyond it the gateway answers 429 `service.overloaded` with "
        "`Retry-After` (health, readiness and metrics are never refused).",
    )
    idle_timeout: float = setting(
        "RAG_GATEWAY_IDLE_TIMEOUT",
        75.0,
        "Seconds a connection may stay idle, or take to send a request's line and headers, before it "
        "is closed (aiohttp's keep-alive timer covers both). Keep it above a reverse proxy's upstream "
        "idle timeout.",
    )
    body_timeout: float = setting(
        "RAG_GATEWAY_BODY_TIMEOUT",
        30.0,
        "Seconds a client has to send a request body once its headers arrived (408 `request.timeout`).",
    )
    metrics_token: str | None = setting(
        "RAG_METRICS_TOKEN",
        None,
        "When set, `GET /metrics` needs `Authorization: Bearer <token>` (401 otherwise). Unset: open, "
        "for a scraper on a private network.",
    )
    query_cache_size: int = setting(
        "RAG_QUERY_CACHE_SIZE",
        1024,
        "Query vectors kept in an LRU cache (per caller, model and normalized query: one user's "
        "queries never speed up another's); 0 disables it.",
    )
    hnsw_ef_search: int = setting(
        "RAG_HNSW_EF_SEARCH",
        100,
        "HNSW candidate list per dense query (`hnsw.ef_search`). Higher: better recall, slower queries.",
    )
    hnsw_max_scan_tuples: int = setting(
        "RAG_HNSW_MAX_SCAN_TUPLES",
        20000,
        "Upper bound of tuples an iterative HNSW scan visits when filters reject candidates.",
    )
    rrf_k: int = setting(
        "RAG_RRF_K", 60, "Reciprocal Rank Fusion constant k: larger flattens the advantage of top ranks."
    )
    fusion_weights: str = setting(
        "RAG_FUSION_WEIGHTS",
        "dense=1,lexical=1,sparse=1",
        "Per-leg weights of the weighted RRF (`mnemo eval --tune` suggests values for a data set).",
    )
    lexical_stats_ttl: float = setting(
        "RAG_LEXICAL_STATS_TTL",
        60.0,
        "Seconds the lexical leg caches corpus statistics (document frequencies, lengths). "
        "Longer is cheaper; shorter follows a fast-changing corpus.",
    )
    similar_seed_chunks: int = setting(
        "RAG_SIMILAR_SEED_CHUNKS",
        8,
        "Stored chunks of a seed record `similar_to` searches with (fused). More covers long records.",
    )
    near_duplicate_similarity: float = setting(
        "RAG_NEAR_DUPLICATE_SIMILARITY",
        0.93,
        "Cosine similarity floor of `similar_objects` with `near_duplicate: true`. Higher finds only "
        "the same photograph; lower also re-photographs and die links (model dependent).",
    )
    characterize_top_k: int = setting(
        "RAG_CHARACTERIZE_TOP_K",
        20,
        "Neighbours `characterize_object` aggregates. More smooths the vote; fewer keeps it local.",
    )
    shutdown_timeout: float = setting(
        "RAG_SHUTDOWN_TIMEOUT", 30.0, "Seconds SIGTERM waits for in-flight requests before closing."
    )
    log_format: str = setting("RAG_LOG_FORMAT", "json", "`json` (one object per line) or `text`.")
    database: DatabaseSettings = dataclasses.field(default_factory=DatabaseSettings)
    sidecar: SidecarClientSettings = dataclasses.field(default_factory=SidecarClientSettings)
    ingest: IngestSettings = dataclasses.field(default_factory=IngestSettings)
    media: MediaSettings = dataclasses.field(default_factory=MediaSettings)

    @property
    def weights(self) -> dict[str, float]:
        return parse_weights(self.fusion_weights)

    @property
    def public_key_pem(self) -> str | None:
        return None if self.jwt_public_key is None else read_public_key(self.jwt_public_key)

    def validate(self) -> None:
        if self.auth not in ("jwt", "off"):
            raise SettingsError(f"RAG_AUTH={self.auth!r}: use jwt or off")
        if self.jwt_secret is not None and len(self.jwt_secret.encode()) < MIN_SECRET_BYTES:
            raise SettingsError(
                f"RAG_JWT_SECRET is {len(self.jwt_secret.encode())} bytes; HS256 needs at least "
                f"{MIN_SECRET_BYTES} (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(48))'`)"
            )
        if self.auth == "jwt" and not (self.jwt_secret or self.jwt_public_key):
            raise SettingsError("RAG_AUTH=jwt needs RAG_JWT_SECRET (HS256) or RAG_JWT_PUBLIC_KEY (RS256)")
        if self.jwt_public_key is not None:
            read_public_key(self.jwt_public_key)
        if not 0 < self.port < 65536:
            raise SettingsError("RAG_GATEWAY_PORT must be in 1..65535")
        for name, value, low in (
            ("RAG_MAX_BODY_BYTES", self.max_body_bytes, 1024),
            ("RAG_QUERY_CACHE_SIZE", self.query_cache_size, 0),
            ("RAG_HNSW_EF_SEARCH", self.hnsw_ef_search, 1),
            ("RAG_HNSW_MAX_SCAN_TUPLES", self.hnsw_max_scan_tuples, 1),
            ("RAG_RRF_K", self.rrf_k, 0),
            ("RAG_SIMILAR_SEED_CHUNKS", self.similar_seed_chunks, 1),
            ("RAG_GATEWAY_MAX_CONCURRENCY", self.max_concurrency, 1),
            ("RAG_CHARACTERIZE_TOP_K", self.characterize_top_k, 1),
        ):
            if value < low:
                raise SettingsError(f"{name} must be at least {low}")
        if self.hnsw_ef_search > 1000:
            raise SettingsError("RAG_HNSW_EF_SEARCH must be at most 1000 (pgvector's limit)")
        if not (self.idle_timeout > 0 and self.body_timeout > 0):
            raise SettingsError("RAG_GATEWAY_IDLE_TIMEOUT and RAG_GATEWAY_BODY_TIMEOUT must be > 0")
        if self.metrics_token is not None and len(self.metrics_token) < 16:
            raise SettingsError("RAG_METRICS_TOKEN must be at least 16 characters")
        if self.jwt_leeway < 0 or self.shutdown_timeout < 0 or self.lexical_stats_ttl < 0:
            raise SettingsError("RAG_JWT_LEEWAY, RAG_SHUTDOWN_TIMEOUT, RAG_LEXICAL_STATS_TTL are >= 0")
        if self.log_format not in ("json", "text"):
            raise SettingsError(f"RAG_LOG_FORMAT={self.log_format!r}: use json or text")
        parse_weights(self.fusion_weights)
        if not 0.0 < self.near_duplicate_similarity <= 1.0:
            raise SettingsError("RAG_NEAR_DUPLICATE_SIMILARITY must be in (0, 1]")


def load_gateway_settings(
    environ: Mapping[str, str] | None = None,
    *,
    database: DatabaseSettings | None = None,
    sidecar: SidecarClientSettings | None = None,
    ingest: IngestSettings | None = None,
    media: MediaSettings | None = None,
    **overrides: Any,
) -> GatewaySettings:
    """Gateway settings plus the composed database, sidecar, ingestion and media settings from one
    environment."""
    return load_settings(
        GatewaySettings,
        environ,
        database=database or load_settings(DatabaseSettings, environ),
        sidecar=sidecar or load_settings(SidecarClientSettings, environ),
        ingest=ingest or load_settings(IngestSettings, environ),
        media=media or load_settings(MediaSettings, environ),
        **overrides,
    )


def env_settings_rows() -> list[tuple[str, str, str]]:
    """(env, default, help) of every environment-bound gateway setting (the README table)."""
    rows = []
    for field in dataclasses.fields(GatewaySettings):
        if "env" in field.metadata:
            default = "" if field.default is None else str(field.default)
            rows.append((field.metadata["env"], default, field.metadata["help"]))
    return rows
