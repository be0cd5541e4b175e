"""``mnemo backfill --ray ADDRESS``: the backfill's embed-and-COPY step as a Ray Data job.

Only step 3 of :mod:`index.bulk.backfill` moves to the cluster. Scope, shadow, index build and swap stay
on the driver, and so does the durability: each batch's rows and its records' ``copied`` state
commit in one transaction, so a job killed anywhere (driver, writer, node) resumes from the
committed batches when the same command runs again.

The job: the driver reads the pending record keys, then

1. ``ray.data.from_items`` spreads them over the cluster in batches of ``--batch`` records;
2. ``map_batches(BackfillWriter)`` runs ``writers`` actors. The job waits (``start_timeout_s``)
   until every one of them is placed and started (else the writer beside the driver, up first,
   could take every batch of a short run while the others start). Each one holds, for its life, a
   PostgreSQL pool, a sidecar client and an :class:`index.ingest.indexer.Indexer`; per batch it reads
   and chunks the records in the actor (as the drain does), embeds them through the sidecar, and
   writes them with binary COPY (:func:`index.bulk.backfill_copy.embed_and_copy`). So chunking, embedding
   calls and COPY all run on as many processes, on as many nodes, as there are writers;
3. the driver streams the writers' per-batch counts into the progress bar.

Embedding goes through the sidecar (``RAG_SIDECAR_URL``): a Ray Serve deployment that scales on
the cluster's GPUs by itself, with the batching the drain already uses. Every node must reach the
database at ``RAG_DATABASE_URL`` and the sidecar at its URL, have Mnemo installed, and, for
``--jsonl``, read the export at the same path.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field

import asyncpg
import numpy as np

from index.bulk.backfill_copy import embed_and_copy, records_done
from index.bulk.backfill_types import BackfillOptions, Progress, Source
from index.bulk.ray_cluster import (
    ACTOR_START_TIMEOUT_S,
    actor_pool,
    check_start_timeout,
    connect,
    is_actor_start_timeout,
    start_actors_first,
)
from index.ingest.indexer import Indexer
from index.settings import SidecarClientSettings
from index.store.partitions import ModelPartition
from inference.client import ModelInfo

__all__ = ["BackfillWriter", "RayEmbedStep", "RayStepError"]

log = logging.getLogger(__name__)


class RayStepError(RuntimeError):
    """The Ray job stopped (a writer failed past its retries, or the cluster went away)."""


class BackfillWriter:
    """Ray Data actor: embeds and COPYs batches of pending records for one backfill."""

    def __init__(
        self,
        database_url: str,
        sidecar: SidecarClientSettings,
        source: Source,
        model: ModelInfo,
        shadow_partition: ModelPartition,
        backfill_id: str,
        embed_batch: int,
    ) -> None:
        import ray

        from schema.database import create_pool

        # One event loop per actor, for its pool and client: Ray Data calls the actor synchronously.
        self.loop = asyncio.new_event_loop()
        self.pool = self.loop.run_until_complete(create_pool(database_url, max_size=2))
        self.client = sidecar.client()
        self.indexer = Indexer(self.pool, self.client, model, shadow_partition, embed_batch=embed_batch)
        self.source = source
        self.backfill_id = backfill_id
        self.node = ray.get_runtime_context().get_node_id()

    def __del__(self) -> None:
        """Ray Data drops its last reference when the job is done with the actor: the sidecar session
        and the pool's connections are closed, not cut with the process (PostgreSQL would log each
        as an unexpected EOF, and aiohttp warns of the unclosed session)."""
        loop = getattr(self, "loop", None)
        if loop is None or loop.is_closed():
            return
        try:
            loop.run_until_complete(self._close())
        finally:
            loop.close()

    async def _close(self) -> None:
        if hasattr(self, "client"):
            await self.client.close()
        if hasattr(self, "pool"):
            await self.pool.close()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        keys = [(str(t), int(i)) for t, i in zip(batch["section_tipo"], batch["section_id"], strict=True)]
        rows = self.loop.run_until_complete(
            embed_and_copy(self.pool, self.source, self.indexer, self.backfill_id, keys)
        )
        return {
            "records": np.array([len(keys)]),
            "rows": np.array([rows]),
            "node": np.array([self.node], dtype=object),
        }


@dataclass
class RayEmbedStep:
    """:class:`index.bulk.backfill_copy.EmbedStep` on the Ray cluster at ``address`` (``"local"`` starts
    one here). ``writers`` actors of ``cpus_per_writer`` CPUs each embed and COPY in parallel.
    After a run, ``records_by_node`` says how many records each node's writers wrote."""

    address: str
    database_url: str
    sidecar: SidecarClientSettings
    writers: int = 2
    cpus_per_writer: float = 1.0
    start_timeout_s: float = ACTOR_START_TIMEOUT_S
    records_by_node: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.writers < 1:
            raise ValueError(f"--ray-writers must be at least 1, got {self.writers}")
        if self.cpus_per_writer <= 0:
            raise ValueError(f"CPUs per writer must be positive, got {self.cpus_per_writer}")
        check_start_timeout(self.start_timeout_s)  # before the run opens its shadow, not in the job

    async def __call__(
        self,
        pool: asyncpg.Pool,
        source: Source,
        indexer: Indexer,
        backfill_id: str,
        options: BackfillOptions,
        progress: Progress,
    ) -> None:
        done, total = await records_done(pool, backfill_id)
        progress(done, total)
        pending = await pool.fetch(
            """SELECT section_tipo, section_id FROM rag_backfill_records
               WHERE backfill_id = $1 AND state = 'pending' ORDER BY section_tipo, section_id""",
            backfill_id,
        )
        if not pending:
            return
        items = [{"section_tipo": r["section_tipo"], "section_id": r["section_id"]} for r in pending]
        writer_args = {
            "database_url": self.database_url,
            "sidecar": self.sidecar,
            "source": source,
            "model": indexer.model,
            "shadow_partition": indexer.partition,
            "backfill_id": backfill_id,
            "embed_batch": indexer.embed_batch,
        }
        loop = asyncio.get_running_loop()

        def run_job() -> None:
            nonlocal done
            import ray

            connect(self.address)
            ds = ray.data.from_items(items).map_batches(
                BackfillWriter,
                batch_size=options.batch_records,
                compute=actor_pool(self.writers),
                num_cpus=self.cpus_per_writer,
                fn_constructor_kwargs=writer_args,
            )
            start_actors_first(ds, self.start_timeout_s)
            for out in ds.iter_batches(batch_size=None, batch_format="numpy"):
                for records, node in zip(out["records"], out["node"], strict=True):
                    self.records_by_node[str(node)] += int(records)
                    done += int(records)
                loop.call_soon_threadsafe(progress, done, total)

        try:
            # The job blocks its thread; the driver's loop keeps renewing the queue source's leases.
            await asyncio.to_thread(run_job)
        except Exception as exc:
            if is_actor_start_timeout(exc):
                raise RayStepError(
                    f"the cluster did not start {self.writers} writer(s) of {self.cpus_per_writer:g} "
                    f"CPU(s) each within {self.start_timeout_s:g} s (`ray status` shows its free "
                    "CPUs); no batch was written: lower --ray-writers, add nodes or raise "
                    "--ray-start-timeout, then run the same command again"
                ) from exc
            raise RayStepError(
                f"the Ray embed-and-COPY job failed ({type(exc).__name__}: {exc}); the batches it "
                "committed are kept: run the same command again to resume"
            ) from exc
