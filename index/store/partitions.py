"""Per-model partitions of the embeddings store: finding them and provisioning them.

Every model lives in its own partition of ``rag_embeddings`` with an HNSW
index on ``embedding::vector(N)`` (``halfvec(N)`` above 2000 dimensions).
Reads and writes go to the partition table with the same cast so the planner
can use that index; :attr:`ModelPartition.cast` is that cast.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from index.store.executor import Executor


@dataclass(frozen=True)
class ModelPartition:
    model: str
    dimension: int
    vector_type: str  # "vector" | "halfvec"
    partition: str  # table name, safe to quote as an identifier

    @property
    def cast(self) -> str:
        """The SQL type the HNSW index is built on, e.g. ``vector(384)``."""
        return f"{self.vector_type}({self.dimension})"

    @property
    def table(self) -> str:
        """The partition as a quoted SQL identifier."""
        return '"' + self.partition.replace('"', '""') + '"'


_SELECT = "SELECT model, dimension, vector_type, partition_name FROM rag_models"


def _from_row(row: asyncpg.Record) -> ModelPartition:
    return ModelPartition(row["model"], row["dimension"], row["vector_type"], row["partition_name"])


async def get_partition(db: Executor, model: str) -> ModelPartition | None:
    """The model's partition, or None when nothing was ever stored for it."""
    row = await db.fetchrow(_SELECT + " WHERE model = $1", model)
    return None if row is None else _from_row(row)


class Partitions:
    """The store's partitions by model, each read once it exists: a reader's lookup (every search
    names its model's partition) without a round trip per search. A partition is never dropped
    while readers run (a model-change backfill swaps the table inside it), so what was found stays
    true; a model with nothing stored yet is asked again next time."""

    def __init__(self, db: Executor) -> None:
        self.db = db
        self._found: dict[str, ModelPartition] = {}

    async def of(self, model: str) -> ModelPartition | None:
        """``model``'s partition, or None while nothing was ever stored for it."""
        found = self._found.get(model)
        if found is None:
            found = await get_partition(self.db, model)
            if found is not None:
                self._found[model] = found
        return found


async def ensure_partition(db: Executor, model: str, dimension: int) -> ModelPartition:
    """Create the model's partition on first sight; error if it exists with another dimension."""
    await db.fetchval("SELECT rag_provision_model($1, $2)", model, dimension)
    partition = await get_partition(db, model)
    assert partition is not None
    return partition


async def list_partitions(db: Executor) -> list[ModelPartition]:
    return [_from_row(r) for r in await db.fetch(_SELECT + " ORDER BY model")]


async def serving_model(db: Executor, kind: str = "text") -> str | None:
    """The model a model-change backfill made serve ``kind`` queries (``rag_serving_models``, set
    at the swap's commit), or None when none did: then the configured model or the sidecar's first
    serves, as before."""
    return await db.fetchval("SELECT model FROM rag_serving_models WHERE kind = $1", kind)
