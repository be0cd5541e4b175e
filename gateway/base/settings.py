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


PROVIDERS = ("extractive", "openai")


@dataclass(frozen=True)
class AskSettings:
    """How ``ask`` grounds, reranks, expands and generates, and what may leave the host."""

    context_token_budget: int = setting(
        "RAG_CONTEXT_TOKEN_BUDGET",
        3000,
        "Tokens of passage text handed to the generator (at least one passage is always kept). "
        "More context can answer more, but costs latency and dilutes the prompt.",
    )
    grounding_min_similarity: float = setting(
        "RAG_GROUNDING_MIN_SIMILARITY",
        0.2,
        "Cosine similarity a dense passage needs to ground an answer; below it on every passage, `ask` "
        "refuses without a model call. Model-dependent: 0.2 suits all-MiniLM-L6-v2, bge-m3 wants ~0.45.",
    )
    rerank_default: bool = setting(
        "RAG_ASK_RERANK",
        True,
        "Rerank `ask` candidates with the sidecar's cross-encoder unless the request says `rerank: false`.",
        tradeoff="Off saves a sidecar call per `ask`, for a less precise passage order.",
    )
    rerank_depth: int = setting(
        "RAG_RERANK_DEPTH",
        0,
        "Fused candidates the cross-encoder reorders before the cut to `limit` (0: just the `limit` "
        "best, so reranking changes the order, never the set). Deeper lets a good cross-encoder "
        "promote candidates; with a weak one it lets noise in.",
    )
    rerank_timeout: float = setting(
        "RAG_RERANK_TIMEOUT",
        5.0,
        "Seconds a rerank may take; slower or failing, the fused order is used (`reranked: false`).",
        tradeoff="Lower bounds `ask`'s latency under a slow sidecar, for more answers in fused order.",
    )
    expand_neighbours: int = setting(
        "RAG_EXPAND_NEIGHBOURS",
        1,
        "Chunks taken on each side of a passage by `expand: neighbours`.",
        tradeoff="More gives each passage more of its surroundings, for more of the token budget.",
    )
    expand_parent_chunks: int = setting(
        "RAG_EXPAND_PARENT_CHUNKS",
        12,
        "Most chunks `expand: parent` gathers from a passage's parent section (nearest first).",
        tradeoff="More gathers more of a long section, for more of the token budget.",
    )
    provider: str = setting(
        "RAG_LLM_PROVIDER",
        "extractive",
        "`extractive` (offline: sentence selection with the text model, no language model) or `openai` "
        "(any OpenAI-compatible chat-completions server at `RAG_LLM_ENDPOINT`).",
        tradeoff="`openai` writes answers with a language model; `extractive` needs none and sends nothing off the host.",
    )
    llm_endpoint: str | None = setting(
        "RAG_LLM_ENDPOINT",
        None,
        "Base URL of the OpenAI-compatible server (`.../v1`); `/chat/completions` is appended.",
        tradeoff="Set it with `RAG_LLM_PROVIDER=openai`; a host that is not local makes generation external egress.",
    )
    llm_model: str | None = setting(
        "RAG_LLM_MODEL",
        None,
        "Model name sent to the chat-completions server.",
        tradeoff="Name what the server serves: a larger model answers better, slower and at more cost.",
    )
    llm_api_key: str | None = setting(
        "RAG_LLM_API_KEY",
        None,
        "Bearer key for the chat-completions server (unset: no Authorization).",
        tradeoff="Set it for a server that requires a key; keep it out of files under version control.",
    )
    llm_temperature: float = setting(
        "RAG_LLM_TEMPERATURE",
        0.1,
        "Sampling temperature: low keeps answers close to the passages.",
        tradeoff="Higher varies the wording more and strays further from the passages.",
    )
    llm_timeout: float = setting(
        "RAG_LLM_TIMEOUT",
        60.0,
        "Seconds a generation may take before `rag.generation_failed`; streaming applies it per chunk.",
        tradeoff="Lower fails sooner on a stalled server; too low cuts off a slow model's long answers.",
    )
    llm_max_output_tokens: int = setting(
        "RAG_LLM_MAX_OUTPUT_TOKENS",
        512,
        "Upper bound of generated tokens (`max_tokens`).",
        tradeoff="More allows longer answers, for latency and cost per call.",
    )
    llm_system_prompt: str | None = setting(
        "RAG_LLM_SYSTEM_PROMPT",
        None,
        "System prompt when the section descriptor has none (unset: the built-in grounded-citation prompt).",
        tradeoff="Set it to change the tone or citation style of every section that has no prompt of its own.",
    )
    llm_locality: str = setting(
        "RAG_LLM_LOCALITY",
        "auto",
        "`auto` (loopback and `RAG_LOCAL_PROVIDER_HOSTS` are local, anything else external), `local` or "
        "`external`: say `external` for a loopback proxy or tunnel to a hosted API.",
        tradeoff="`external` makes the egress rules apply to a local address that forwards elsewhere.",
    )
    extractive_sentences: int = setting(
        "RAG_EXTRACTIVE_SENTENCES",
        3,
        "Sentences the extractive provider puts in an answer.",
        tradeoff="More covers more of the passages, for a longer, less focused answer.",
    )
    allow_external_default: bool = setting(
        "RAG_ALLOW_EXTERNAL_PROVIDER_DEFAULT",
        False,
        "Whether passages may be sent to an external (non-local) generator. Off: only sections whose "
        "descriptor says `egress.allow_external: true` may leave the host.",
    )
    forbidden_sections: tuple[str, ...] = setting(
        "RAG_EXTERNAL_PROVIDER_FORBIDDEN_SECTIONS",
        (),
        "Comma-separated sections whose text never goes to an external generator, including text they "
        "contribute to another section's group document.",
        tradeoff="List the sections whose text must never leave the host, whatever their descriptors say.",
    )
    local_hosts: tuple[str, ...] = setting(
        "RAG_LOCAL_PROVIDER_HOSTS",
        (),
        "Comma-separated generator hosts treated as local besides loopback (an in-house vLLM server).",
    )

    def validate(self) -> None:
        if self.provider not in PROVIDERS:
            raise SettingsError(f"RAG_LLM_PROVIDER={self.provider!r}: use one of {', '.join(PROVIDERS)}")
        if self.provider == "openai" and not (self.llm_endpoint and self.llm_model):
            raise SettingsError("RAG_LLM_PROVIDER=openai needs RAG_LLM_ENDPOINT and RAG_LLM_MODEL")
        if self.llm_locality not in ("auto", "local", "external"):
            raise SettingsError(f"RAG_LLM_LOCALITY={self.llm_locality!r}: use auto, local or external")
        if self.llm_endpoint is not None and not self.llm_endpoint.startswith(("http://", "https://")):
            raise SettingsError("RAG_LLM_ENDPOINT must be an http(s) URL")
        for name, value, low in (
            ("RAG_CONTEXT_TOKEN_BUDGET", self.context_token_budget, 1),
            ("RAG_RERANK_DEPTH", self.rerank_depth, 0),
            ("RAG_EXPAND_NEIGHBOURS", self.expand_neighbours, 0),
            ("RAG_EXPAND_PARENT_CHUNKS", self.expand_parent_chunks, 1),
            ("RAG_LLM_MAX_OUTPUT_TOKENS", self.llm_max_output_tokens, 1),
            ("RAG_EXTRACTIVE_SENTENCES", self.extractive_sentences, 1),
        ):
            if value < low:
                raise SettingsError(f"{name} must be at least {low}")
        if self.rerank_timeout <= 0 or self.llm_timeout <= 0:
            raise SettingsError("RAG_RERANK_TIMEOUT and RAG_LLM_TIMEOUT must be positive")
        if not 0 <= self.llm_temperature <= 2:
            raise SettingsError("RAG_LLM_TEMPERATURE must be in [0, 2]")


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
        if self.jwt_leeway < 0 or self.shutdown_timeout < 0 or self.lexical_stats_ttl < 0:
            raise SettingsError("RAG_JWT_LEEWAY, RAG_SHUTDOWN_TIMEOUT, RAG_LEXICAL_STATS_TTL are >= 0")
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
