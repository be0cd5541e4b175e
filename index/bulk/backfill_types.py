"""What a backfill (:mod:`index.bulk.backfill`) is made of: its options, its report, its conflict error,
the sources' protocol and a batch's outcome. Apart from the run so that the sources
(:mod:`index.bulk.backfill_sources`), the embed step (:mod:`index.bulk.backfill_copy`) and ``--ray``'s writers
(:mod:`index.bulk.backfill_ray`) share them without importing the run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import asyncpg

from index.ingest.indexer import Indexer
from index.store.store import EmbeddingRow, RecordKey
from inference.client import ModelInfo, SidecarClient

__all__ = ["BackfillConflict", "BackfillOptions", "BackfillReport", "Embedded", "Progress", "Source"]


class BackfillConflict(RuntimeError):
    """Another unfinished backfill holds the target model (rerun that one, or abandon it)."""


@dataclass(frozen=True)
class BackfillOptions:
    batch_records: int = 64  # records per embed + COPY transaction
    embed_batch: int = 64  # texts per /embed call
    lease_seconds: float = 60.0  # the queue source's lease, renewed every third of it
    max_attempts: int = 5  # queue source: a record that fails spends an attempt, as in the drain
    backoff_cap: float = 1800.0
    build_workers: int | None = None  # max_parallel_maintenance_workers for the index build
    maintenance_work_mem: str | None = None  # for the index build session
    allow_spill: bool = False
    rejects: Path | None = None  # default backfill-<id>.rejects.jsonl


@dataclass
class BackfillReport:
    backfill_id: str
    model: str
    source: str
    resumed: bool = False
    records: int = 0
    copied: int = 0
    rejected: int = 0
    rows_written: int = 0
    rows_kept: int = 0  # live rows outside the scope, copied into the shadow
    completed_in_queue: int = 0
    left_in_queue: int = 0
    records_caught_up: int = 0
    keys_stamped: int = 0
    build: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    rejects_path: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Embedded:
    """A batch's outcome: rows per record (an empty list is a record with no text), rejects with
    their reasons, and the queue version each record was embedded at (queue source)."""

    rows: dict[RecordKey, list[EmbeddingRow]] = field(default_factory=dict)
    rejects: dict[RecordKey, str] = field(default_factory=dict)
    versions: dict[RecordKey, int] = field(default_factory=dict)


class Source(Protocol):
    kind: str

    def detail(self) -> dict[str, Any]: ...

    async def target(self, pool: asyncpg.Pool, client: SidecarClient) -> ModelInfo: ...

    async def scope(self, conn: asyncpg.Connection, backfill_id: str) -> list[dict[str, Any]]:
        """Register the scope's records as pending; returns line rejects (no record key)."""
        ...

    async def embed(self, pool: asyncpg.Pool, indexer: Indexer, keys: Sequence[RecordKey]) -> Embedded: ...


Progress = Callable[[int, int], None]  # (records done, records in scope)
