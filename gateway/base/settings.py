"""The gateway's typed settings, read once at start (environment, then CLI flags).

:class:`GatewaySettings` composes the database and sidecar-client settings
(``settings.database``, ``settings.sidecar``) so one object travels through
the app; :func:`load_gateway_settings` builds all three from one environment.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.base.ask_settings import AskSettings
from gateway.base.budget_settings import BudgetSettings
from index.lexical.engine import MODES as TANTIVY_LEXICAL_MODES
from index.settings import IngestSettings, MediaSettings, SidecarClientSettings
from schema.settings import DatabaseSettings, SettingsError, load_settings, setting

LEXICAL_INDEX_MODES = (*TANTIVY_LEXICAL_MODES, "off")  # `memory` was retired: see validate
LEGS = ("dense", "lexical", "sparse")
FAISS_MODES = ("off", "auto", "cpu", "cuda", "mmap")
FUSION_METHODS = ("dbsf", "minmax", "rrf")
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
class McpSettings:
    """``mnemo mcp``: who the MCP server acts as, and where its HTTP transport listens."""

    token: str | None = setting(
        "RAG_MCP_TOKEN",
        None,
        "Bearer JWT fixing the MCP server's principal for its lifetime (verified like the gateway's; "
        "missing or invalid refuses to start). Ignored with `RAG_AUTH=off` (admin).",
    )
    host: str = setting(
        "RAG_MCP_HOST",
        "127.0.0.1",
        "Interface of `mnemo mcp --transport http`.",
        tradeoff="`0.0.0.0` serves other hosts; every caller then acts as `RAG_MCP_TOKEN`'s principal.",
    )
    port: int = setting("RAG_MCP_PORT", 8090, "TCP port of `mnemo mcp --transport http`.")


@dataclass(frozen=True)
class GatewaySettings:
    """Everything the gateway reads at start. Compose with :func:`load_gateway_settings`."""

    host: str = setting(
        "RAG_GATEWAY_HOST",
        "127.0.0.1",
        "Interface the gateway listens on.",
        tradeoff="`0.0.0.0` serves other hosts (behind a reverse proxy or a load balancer).",
    )
    port: int = setting(
        "RAG_GATEWAY_PORT", 8080, "TCP port of the gateway.", tradeoff="Change it when the port is taken."
    )
    enabled: bool = setting(
        "RAG_ENABLED",
        True,
        "Kill switch. Off: every dd_rag_api action and `POST /v1/embeddings` decline `rag.disabled` "
        "(503), except `embed_groups`, which answers `{groups: []}`.",
    )
    media_enabled: bool = setting(
        "RAG_MEDIA_ENABLED",
        False,
        "Second switch for the image actions (`similar_objects`, `search_by_text_image`, "
        "`characterize_object`). Off: they decline `rag.media_disabled` (503).",
    )
    console_enabled: bool = setting(
        "RAG_CONSOLE_ENABLED",
        True,
        "Serves the console (`/console`) and the API docs (`/docs`). Off: both answer 404; the API "
        "itself is unchanged (the console has no privilege of its own).",
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
        tradeoff="Set it, or `RAG_JWT_PUBLIC_KEY`, for `RAG_AUTH=jwt`; whoever holds a shared secret can issue tokens.",
    )
    jwt_public_key: str | None = setting(
        "RAG_JWT_PUBLIC_KEY",
        None,
        "RS256 public key: PEM text or a path to a PEM file. Lets an identity provider keep the private key.",
    )
    jwt_audience: str | None = setting(
        "RAG_JWT_AUDIENCE",
        None,
        "Required `aud` claim when set (tokens for other services are refused).",
        tradeoff="Set it when one identity provider issues tokens for several services.",
    )
    jwt_issuer: str | None = setting(
        "RAG_JWT_ISSUER",
        None,
        "Required `iss` claim when set.",
        tradeoff="Set it to refuse tokens from any other identity provider.",
    )
    jwt_leeway: float = setting(
        "RAG_JWT_LEEWAY",
        30.0,
        "Seconds of clock skew tolerated on `exp`/`nbf`; larger trusts clocks less.",
        tradeoff="Larger accepts tokens from hosts with skewed clocks, and expired tokens for that much longer.",
    )
    max_body_bytes: int = setting(
        "RAG_MAX_BODY_BYTES",
        8 * 1024 * 1024,
        "Largest request body accepted (413 beyond). Record batches need room; smaller limits abuse.",
    )
    workers: int = setting(
        "RAG_GATEWAY_WORKERS",
        0,
        "Gateway processes sharing the port (`mnemo gateway --workers`, `mnemo up`); 0 is one per core, "
        "1 serves in the command's own process.",
        tradeoff="Each worker is one event loop on one core, sharing the database and on-disk indexes; "
        "what a worker builds in its heap (the FAISS cache on CPU or GPU) is built once per worker, so "
        "fewer workers where that cache is large and memory is short.",
    )
    max_concurrency: int = setting(
        "RAG_GATEWAY_MAX_CONCURRENCY",
        64,
        "Requests served at once; beyond it the gateway answers 429 `service.overloaded` with "
        "`Retry-After` (health, readiness and metrics are never refused).",
        tradeoff="Higher queues more work in the gateway and the database (longer waits under load); lower sheds load sooner.",
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
        tradeoff="Lower frees connections held by slow uploads sooner; too low refuses large record batches on slow links.",
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
        tradeoff="Larger saves sidecar calls on repeated queries, for the memory of each cached vector.",
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
        tradeoff="Higher keeps recall under selective filters, for slower worst-case queries.",
    )
    dense_exact_max_rows: int = setting(
        "RAG_DENSE_EXACT_MAX_ROWS",
        20000,
        "A scoped dense search (an ACL, a section) whose rows the planner reads through an index and "
        "estimates at most this many is answered exactly (those rows read and sorted) instead of by an "
        "HNSW scan that filters: at 1M chunks and 1% visibility, 22.5 ms at recall 1.0 against 115 ms at "
        "0.73 (the planner put that scope at 10,066 rows). Decided per partition and scope, once a minute; "
        "0: always HNSW.",
    )
    rrf_k: int = setting(
        "RAG_RRF_K",
        60,
        "Reciprocal Rank Fusion constant k: larger flattens the advantage of top ranks.",
        tradeoff="Lower favours each leg's top hits; higher lets agreement across the legs count more.",
    )
    fusion: str = setting(
        "RAG_FUSION",
        "dbsf",
        "How the legs are fused. `dbsf`: each leg's scores normalized by their own mean +/- 3 sigma, "
        "summed with the weights, so a leg sure of its best hit outweighs a leg whose scores are all "
        "alike; `minmax`: the same with min-max normalization; `rrf`: weighted Reciprocal Rank Fusion "
        "(ranks only). A section's descriptor may override it (`mnemo eval --apply`).",
    )
    fusion_weights: str = setting(
        "RAG_FUSION_WEIGHTS",
        "dense=1,lexical=1,sparse=1",
        "Per-leg weights of the fusion (`mnemo eval --tune` reports cross-validated values for a data set).",
        tradeoff="Raise a leg's weight where it proves better on your queries (`mnemo eval --tune` measures it).",
    )
    lexical_stats_ttl: float = setting(
        "RAG_LEXICAL_STATS_TTL",
        60.0,
        "Seconds the lexical leg caches corpus statistics (document frequencies, lengths). "
        "Longer is cheaper; shorter follows a fast-changing corpus.",
    )
    lexical_index: str = setting(
        "RAG_LEXICAL_INDEX",
        "auto",
        "Where the lexical leg searches: `auto` (the default: the Tantivy index of a partition under "
        "`RAG_LEXICAL_DIR` once `mnemo lexical follow` has built it and while it keeps up, picked up "
        "without a restart; the SQL leg for every other partition; nothing needs to exist at start), "
        "`off` (always BM25 in SQL over the GIN index), or `tantivy` (as `auto`, said explicitly: a "
        "missing index folder is logged as a warning at start). Tantivy selects candidates, PostgreSQL "
        "re-reads and scores them as the SQL leg, with the current ACL. A partition without an index or "
        "behind, image rows and an unprovable answer go to the SQL leg, counted in "
        "`mnemo_lexical_searches` and shown in `/readyz`. `memory` (an in-memory index) was retired.",
        tradeoff="`auto` needs the writer (`mnemo lexical follow`, which `mnemo up` starts) to be fast; "
        "without it, it is the SQL leg. `off` skips even the check of the index folder.",
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
    faiss_cache: str = setting(
        "RAG_FAISS_CACHE",
        "auto",
        "FAISS vector cache in the gateway's process: `auto` (on a GPU with `faiss-gpu`, each partition "
        "that fits `RAG_FAISS_MAX_BYTES`; off on CPU, where the flat scan measured slower than HNSW), "
        "`cpu` (force it on CPU), `cuda` (refuses to start without a GPU), `mmap` (CPU, every worker maps the "
        "snapshots `mnemo vectors follow` writes under `RAG_VECTOR_DIR` instead of loading the store; a "
        "partition without one is left to pgvector), or `off`. On: exact dense search at any ACL selectivity and exact re-scoring, "
        "for the memory of every vector and a load at start (pgvector serves meanwhile).",
    )
    faiss_max_bytes: int = setting(
        "RAG_FAISS_MAX_BYTES",
        2 * 1024**3,
        "Memory the FAISS cache may hold (all partitions; fp32 = 4 bytes x dimension per vector, plus "
        "the fp16/fp32 GPU copy on CUDA). A partition that does not fit is logged, counted and left "
        "to pgvector.",
    )
    faiss_cpu_broad_scan_max: int = setting(
        "RAG_FAISS_CPU_BROAD_SCAN_MAX",
        50_000,
        "On CPU, an unfiltered search (an admin, no section or group) over a partition with more vectors "
        "than this goes to pgvector's HNSW, which beats a flat scan there; filtered searches stay on the "
        "cache at any size. 0: the cache serves every search.",
        tradeoff="Raise it where the flat scan measures faster than HNSW on your CPU.",
    )
    faiss_packed_scope_rows: int = setting(
        "RAG_FAISS_PACKED_SCOPE_ROWS",
        20_000,
        "A filtered search whose scope permits at most this many cached vectors runs over a contiguous "
        "copy of just those vectors, kept until the next change is applied (at 1M vectors a 1% scope: "
        "5.1 ms against 15.2 through the bitmap over every slot, at recall 1.0). 0: every scope uses the bitmap.",
        tradeoff="Higher packs larger scopes (faster filtered searches), for more memory and more copies to rebuild after changes.",
    )
    faiss_packed_bytes: int = setting(
        "RAG_FAISS_PACKED_BYTES",
        256 * 1024**2,
        "Memory the packed scope copies may hold together, beside `RAG_FAISS_MAX_BYTES` (least recently "
        "used dropped first; a 1% scope of 1M vectors at 384 dimensions is 15 MiB).",
        tradeoff="More keeps more scopes packed, for memory beside the cache's own.",
    )
    faiss_threads: int = setting(
        "RAG_FAISS_THREADS",
        1,
        "CPU threads per FAISS cache search (FAISS's OpenMP and numpy's BLAS in this process); 0 keeps "
        "the libraries' default (every core). Concurrent requests already use the cores: more threads "
        "per search only spin against the database on a small machine.",
    )
    shutdown_timeout: float = setting(
        "RAG_SHUTDOWN_TIMEOUT",
        30.0,
        "Seconds SIGTERM waits for in-flight requests before closing.",
        tradeoff="Longer lets slow requests (`ask`) finish during a deploy, for slower restarts.",
    )
    shutdown_cleanup_timeout: float = setting(
        "RAG_SHUTDOWN_CLEANUP_TIMEOUT",
        15.0,
        "Seconds a stopping gateway worker's cleanup (pools, caches, the drain's leases given back) may "
        "take after RAG_SHUTDOWN_TIMEOUT; past both, its supervisor kills it, or an orphaned worker ends itself.",
        tradeoff="Shorter bounds a stop that the database holds up, at the risk of cutting a slow cleanup short.",
    )
    log_format: str = setting("RAG_LOG_FORMAT", "json", "`json` (one object per line) or `text`.")
    database: DatabaseSettings = dataclasses.field(default_factory=DatabaseSettings)
    sidecar: SidecarClientSettings = dataclasses.field(default_factory=SidecarClientSettings)
    ingest: IngestSettings = dataclasses.field(default_factory=IngestSettings)
    media: MediaSettings = dataclasses.field(default_factory=MediaSettings)
    ask: AskSettings = dataclasses.field(default_factory=AskSettings)
    budgets: BudgetSettings = dataclasses.field(default_factory=BudgetSettings)

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
            ("RAG_DENSE_EXACT_MAX_ROWS", self.dense_exact_max_rows, 0),
            ("RAG_RRF_K", self.rrf_k, 0),
            ("RAG_SIMILAR_SEED_CHUNKS", self.similar_seed_chunks, 1),
            ("RAG_GATEWAY_MAX_CONCURRENCY", self.max_concurrency, 1),
            ("RAG_GATEWAY_WORKERS", self.workers, 0),
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
        timeouts = (
            self.jwt_leeway,
            self.shutdown_timeout,
            self.shutdown_cleanup_timeout,
            self.lexical_stats_ttl,
        )
        if min(timeouts) < 0:
            raise SettingsError(
                "RAG_JWT_LEEWAY, RAG_SHUTDOWN_TIMEOUT, RAG_SHUTDOWN_CLEANUP_TIMEOUT and RAG_LEXICAL_STATS_TTL"
                " are >= 0"
            )
        if self.log_format not in ("json", "text"):
            raise SettingsError(f"RAG_LOG_FORMAT={self.log_format!r}: use json or text")
        parse_weights(self.fusion_weights)
        if not 0.0 < self.near_duplicate_similarity <= 1.0:
            raise SettingsError("RAG_NEAR_DUPLICATE_SIMILARITY must be in (0, 1]")
        if self.faiss_threads < 0:
            raise SettingsError("RAG_FAISS_THREADS must be >= 0")
        if self.faiss_cache not in FAISS_MODES:
            raise SettingsError(f"RAG_FAISS_CACHE={self.faiss_cache!r}: use one of {', '.join(FAISS_MODES)}")
        if min(self.faiss_max_bytes, self.faiss_cpu_broad_scan_max, self.faiss_packed_scope_rows) < 0:
            raise SettingsError(
                "RAG_FAISS_MAX_BYTES, RAG_FAISS_CPU_BROAD_SCAN_MAX and RAG_FAISS_PACKED_SCOPE_ROWS must be >= 0"
            )
        if self.faiss_packed_bytes < 0:
            raise SettingsError("RAG_FAISS_PACKED_BYTES must be >= 0")
        if self.lexical_index == "memory":  # retired: one lexical engine beside the SQL leg, not two
            raise SettingsError(
                "RAG_LEXICAL_INDEX=memory: the in-memory lexical index was retired; use auto (the default) "
                "or tantivy, the on-disk index that `mnemo lexical follow` writes (see docs/scale.md), or off"
            )
        if self.lexical_index not in LEXICAL_INDEX_MODES:
            raise SettingsError(
                f"RAG_LEXICAL_INDEX={self.lexical_index!r}: use one of {', '.join(LEXICAL_INDEX_MODES)}"
            )
        if self.fusion not in FUSION_METHODS:
            raise SettingsError(f"RAG_FUSION={self.fusion!r}: use one of {', '.join(FUSION_METHODS)}")


def load_gateway_settings(
    environ: Mapping[str, str] | None = None,
    *,
    database: DatabaseSettings | None = None,
    sidecar: SidecarClientSettings | None = None,
    ingest: IngestSettings | None = None,
    media: MediaSettings | None = None,
    ask: AskSettings | None = None,
    budgets: BudgetSettings | None = None,
    **overrides: Any,
) -> GatewaySettings:
    """Gateway settings plus the composed database, sidecar, ingestion, media and ask settings from one
    environment."""
    return load_settings(
        GatewaySettings,
        environ,
        database=database or load_settings(DatabaseSettings, environ),
        sidecar=sidecar or load_settings(SidecarClientSettings, environ),
        ingest=ingest or load_settings(IngestSettings, environ),
        media=media or load_settings(MediaSettings, environ),
        ask=ask or load_settings(AskSettings, environ),
        budgets=budgets or load_settings(BudgetSettings, environ),
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


def child_environment(**extra: str) -> dict[str, str]:
    """This process's environment plus ``extra``, for the processes the gateway's commands start: a
    worker's ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client reads it from the environment only), the
    lexical writer's ``RAG_DATABASE_URL`` (kept out of argv)."""
    return {**os.environ, **extra}
