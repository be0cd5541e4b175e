"""Settings for reaching the inference sidecar, shared by ingestion, the gateway and eval."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from index.media_urls import AllowedBase, MediaNotAllowed, parse_allowed_base
from inference.settings import sidecar_api_key_setting
from schema.settings import SettingsError, setting

if TYPE_CHECKING:
    from inference.client import SidecarClient


@dataclass(frozen=True)
class SidecarClientSettings:
    """How ingestion, the gateway and the jobs reach the inference sidecar, and which of its models they use."""

    sidecar_url: str = setting(
        "RAG_SIDECAR_URL",
        "http://127.0.0.1:8001",
        "Base URL of the inference sidecar (`mnemo sidecar`). Every component that embeds uses it.",
    )
    sidecar_api_key: str | None = sidecar_api_key_setting()
    text_model: str | None = setting(
        "RAG_TEXT_MODEL",
        None,
        "Text model id for `/embed`. Unset: the first `text` model the sidecar lists.",
    )
    image_model: str | None = setting(
        "RAG_IMAGE_MODEL",
        None,
        "Joint image/text model id for `/image` and `/text`. Unset: the first `image_text` model listed.",
    )
    rerank_model: str | None = setting(
        "RAG_RERANK_MODEL",
        None,
        "Cross-encoder id for `/rerank`. Unset: the first `rerank` model listed (none: no reranking).",
    )
    sidecar_timeout: float = setting(
        "RAG_SIDECAR_TIMEOUT",
        30.0,
        "Seconds per sidecar request. Lower fails over sooner under load; higher waits out long batches.",
    )

    def validate(self) -> None:
        if self.sidecar_timeout <= 0:
            raise SettingsError("RAG_SIDECAR_TIMEOUT must be positive")

    def client(self, **overrides: Any) -> SidecarClient:
        """A :class:`~inference.client.SidecarClient` for these settings (``overrides`` such as
        ``max_retries`` pass through): the one place that maps settings to the client."""
        from inference.client import SidecarClient

        options = {"api_key": self.sidecar_api_key, "timeout": self.sidecar_timeout, **overrides}
        return SidecarClient(self.sidecar_url, **options)


@dataclass(frozen=True)
class IngestSettings:
    """How the ingestion queue is drained (by `mnemo drain` and the gateway's background loop)."""

    drain_interval: float = setting(
        "RAG_INGEST_DRAIN_INTERVAL",
        2.0,
        "Seconds between drain passes of the background loop. Lower indexes sooner; every pass is "
        "one cheap query when the queue is empty. New records also wake the gateway's loop at once.",
    )
    drain_enabled: bool = setting(
        "RAG_INGEST_DRAIN",
        True,
        "Run the drain loop inside the gateway. Off: run `mnemo drain` (cron or a service) instead.",
    )
    max_attempts: int = setting(
        "RAG_INGEST_MAX_ATTEMPTS",
        5,
        "Failures before a record is parked with its last error (`mnemo queue retry` unparks it). "
        "Sidecar outages never count.",
    )
    backoff_cap: float = setting(
        "RAG_INGEST_BACKOFF_CAP",
        1800.0,
        "Upper bound in seconds of the 2^attempts-minutes retry delay of a failing record.",
        tradeoff="Lower retries a failing record sooner, for more load from records that keep failing.",
    )
    outage_pause: float = setting(
        "RAG_INGEST_OUTAGE_PAUSE",
        15.0,
        "Seconds the drain loop pauses after the sidecar is unreachable before it tries again.",
        tradeoff="Shorter resumes sooner once the sidecar is back, for more failed attempts while it is down.",
    )
    batch_records: int = setting(
        "RAG_INGEST_BATCH_RECORDS",
        32,
        "Records claimed per drain step; their changed chunks share embedding requests. Larger "
        "batches embed more efficiently but hold more text in memory.",
    )
    embed_batch: int = setting(
        "RAG_INGEST_EMBED_BATCH",
        128,
        "Chunks per embedding call of the drain (the client splits them into parallel requests "
        "of its own batch size). Larger calls keep the sidecar busier.",
    )
    drain_workers: int = setting(
        "RAG_INGEST_DRAIN_WORKERS",
        1,
        "Drain workers in one process (`mnemo drain`, or the gateway's drain loop; `mnemo drain "
        "--workers N` overrides). Workers in any number of processes and hosts share the queue "
        "through leases; more of them keep a multi-replica sidecar busy.",
    )
    lease_seconds: float = setting(
        "RAG_INGEST_LEASE_SECONDS",
        60.0,
        "How long a worker's claim on a queued record holds without renewal. A live worker renews "
        "every third of it; a killed worker's records are taken over by another once it passes. "
        "Shorter recovers sooner; it must exceed the longest stall of a live worker's event loop.",
    )
    max_records_per_request: int = setting(
        "RAG_INGEST_MAX_RECORDS",
        1000,
        "Most records one `POST /v1/records` body (or one ingest batch) may hold; more is a 413.",
    )
    lexical_dir: Path | None = setting(
        "RAG_LEXICAL_DIR",
        None,
        "Where the lexical leg's Tantivy indexes live (one folder per model partition), written by "
        "`mnemo lexical follow` and read by every gateway process with `RAG_LEXICAL_INDEX=auto` (the "
        "default) or `tantivy`. "
        "Unset: `lexical/` under `RAG_DATA_DIR`. Local disk: every reader memory-maps it.",
    )
    lexical_writer_memory: int = setting(
        "RAG_LEXICAL_WRITER_MEMORY",
        32,
        "MiB of Tantivy's indexing memory in the lexical writer (`mnemo lexical follow` and `rebuild`): "
        "the bound of what a build holds, whatever the store's size. A build reads the store 5,000 rows "
        "at a time (the next while the last is indexed) and writes a segment each time this fills; its "
        "private memory peaks near this plus about 100 MiB (rows, libraries) once the heap has filled "
        "(about 50k chunks at 32). Its RSS also counts the pages of the segments Tantivy merges "
        "meanwhile (mapped files: the page cache's, shared and reclaimable: at 1M chunks a rebuild "
        "capped at 160 MiB by a memory cgroup ran as fast as one uncapped).",
        tradeoff="Larger writes fewer, larger segments (fewer merges, searches over fewer segments) for "
        "more memory. At 1M chunks (2026-12-07): 32 MiB ended in 9 segments, 131-136 MiB private, "
        "60-66 s, Tantivy's bare search 0.30 ms of CPU; 128 MiB in 4 segments, 242 MiB private, 67 s, "
        "0.23 ms. At least 16.",
    )
    lexical_max_behind: int = setting(
        "RAG_LEXICAL_MAX_BEHIND",
        10_000,
        "Changes a partition's lexical index may be behind the store and still serve: past it the "
        "gateways leave the partition to the SQL leg, and `/readyz`, the console and `mnemo lexical "
        "status` call it `behind` (its writer is stopped or cannot keep up).",
        tradeoff="Every search re-reads each change after the index's watermark: higher keeps the "
        "index serving through a longer writer outage for slower searches meanwhile; lower hands the "
        "partition to the SQL leg sooner.",
    )

    vector_dir: Path | None = setting(
        "RAG_VECTOR_DIR",
        None,
        "Where the CPU vector cache's snapshots live (one folder per model partition), written by "
        "`mnemo vectors follow` and mapped by every gateway process with `RAG_FAISS_CACHE=mmap`. "
        "Unset: `vectors/` under `RAG_DATA_DIR`. Local disk: every reader memory-maps it.",
    )
    vector_snapshot_changes: int = setting(
        "RAG_VECTOR_SNAPSHOT_CHANGES",
        10_000,
        "Keys `mnemo vectors follow` applies from the change feed before it writes a partition's "
        "snapshot anew (every reader applies the changes since the last snapshot in its own memory).",
        tradeoff="Lower keeps each worker's private memory smaller and its catch-up shorter, for more "
        "full rewrites of the snapshot (a 1M x 384 partition is 1.5 GiB).",
    )

    def lexical_root(self, data_dir: Path) -> Path:
        """The lexical folder: ``RAG_LEXICAL_DIR``, else ``lexical`` under the data folder."""
        return self.lexical_dir if self.lexical_dir is not None else data_dir / "lexical"

    def vector_root(self, data_dir: Path) -> Path:
        """The vector snapshots' folder: ``RAG_VECTOR_DIR``, else ``vectors`` under the data folder."""
        return self.vector_dir if self.vector_dir is not None else data_dir / "vectors"

    def validate(self) -> None:
        if self.drain_interval <= 0:
            raise SettingsError("RAG_INGEST_DRAIN_INTERVAL must be positive")
        if self.max_attempts < 1:
            raise SettingsError("RAG_INGEST_MAX_ATTEMPTS must be at least 1")
        if self.backoff_cap < 60:
            raise SettingsError("RAG_INGEST_BACKOFF_CAP must be at least 60 seconds")
        if self.outage_pause <= 0:
            raise SettingsError("RAG_INGEST_OUTAGE_PAUSE must be positive")
        if self.vector_snapshot_changes < 1:
            raise SettingsError("RAG_VECTOR_SNAPSHOT_CHANGES must be at least 1")
        if self.lexical_max_behind < 0:
            raise SettingsError("RAG_LEXICAL_MAX_BEHIND must be 0 or more")
        if self.lexical_writer_memory < 16:
            raise SettingsError("RAG_LEXICAL_WRITER_MEMORY must be at least 16 (MiB)")
        if self.lease_seconds < 1:
            raise SettingsError("RAG_INGEST_LEASE_SECONDS must be at least 1 second")
        for name, value in (
            ("RAG_INGEST_BATCH_RECORDS", self.batch_records),
            ("RAG_INGEST_EMBED_BATCH", self.embed_batch),
            ("RAG_INGEST_DRAIN_WORKERS", self.drain_workers),
            ("RAG_INGEST_MAX_RECORDS", self.max_records_per_request),
        ):
            if value < 1:
                raise SettingsError(f"{name} must be at least 1")


@dataclass(frozen=True)
class MediaSettings:
    """Where record images may come from and how they are prepared (intake, drain, bulk job)."""

    media_root: str | None = setting(
        "RAG_MEDIA_ROOT",
        None,
        "Mounted media directory. A record image may name a `path` under it; paths that resolve "
        "outside it are refused. Unset: path images are refused.",
    )
    media_base_url: str | None = setting(
        "RAG_MEDIA_BASE_URL",
        None,
        "Comma-separated http(s) URL prefixes that admit a record image `url` (the archive's media "
        "server), judged on the parsed URL: same scheme, host and port; no userinfo, fragment, dot "
        "segment, encoded slash or double encoding; the decoded path under the prefix's path on a "
        "segment boundary (see index/media_urls.py). Unset: URL images are refused, so the drain "
        "never fetches arbitrary hosts.",
    )
    image_max_px: int = setting(
        "RAG_IMAGE_MAX_PX",
        512,
        "Longest side an image is downsized to before embedding. The image models see 224-384 px, "
        "so larger only costs bandwidth; smaller loses detail on crops.",
    )
    thumbnail_px: int = setting(
        "RAG_THUMBNAIL_PX",
        192,
        "Longest side of the thumbnails Mnemo makes when the archive gives no `thumb_url`.",
        tradeoff="Larger looks sharper in result lists, for more bytes stored and sent per thumbnail.",
    )
    image_max_pixels: int = setting(
        "RAG_IMAGE_MAX_PIXELS",
        40_000_000,
        "Largest image (width x height, read from the header before decoding) accepted; "
        "decompression bombs stop here.",
        tradeoff="Raise it for very large scans, for more memory per decode; lower refuses more images.",
    )
    image_max_bytes: int = setting(
        "RAG_IMAGE_MAX_BYTES",
        20 * 1024 * 1024,
        "Largest encoded image file accepted (base64-decoded, read from disk or fetched).",
    )

    @property
    def allowed_bases(self) -> tuple[AllowedBase, ...]:
        """``RAG_MEDIA_BASE_URL``'s entries, parsed (:meth:`validate` has checked each one)."""
        return tuple(parse_allowed_base(entry) for entry in self._base_entries())

    def _base_entries(self) -> list[str]:
        return [u.strip() for u in (self.media_base_url or "").split(",") if u.strip()]

    def validate(self) -> None:
        if self.image_max_px < 32 or self.thumbnail_px < 16:
            raise SettingsError("RAG_IMAGE_MAX_PX must be >= 32 and RAG_THUMBNAIL_PX >= 16")
        if self.image_max_pixels < 1 or self.image_max_bytes < 1:
            raise SettingsError("RAG_IMAGE_MAX_PIXELS and RAG_IMAGE_MAX_BYTES must be positive")
        for entry in self._base_entries():
            try:
                parse_allowed_base(entry)
            except MediaNotAllowed as exc:
                raise SettingsError(
                    f"RAG_MEDIA_BASE_URL entry {entry!r}: {exc}; use http(s)://host[:port]/path/ prefixes"
                ) from None
