"""The harness the ingestion faults share (:mod:`benchmarks.faults`, :mod:`benchmarks.backfill_fault`):
the records they queue, a fresh database per run, the queue's waits, a clean run's store, and the
comparison of a faulted store against it (records lost, rows written twice, vectors that differ).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

__all__ = [
    "DRAIN_DESCRIPTOR",
    "DRAIN_SECTION",
    "FAULT_INGEST",
    "compare_stores",
    "drain_records",
    "faulted_store",
    "store_snapshot",
]


DRAIN_SECTION = "oh1"
DRAIN_DESCRIPTOR = {"embed": [{"id": "card", "contributors": ["oh22"]}]}


def drain_records(n: int, sentences: list[str] | None = None) -> list[dict[str, Any]]:
    """``n`` records of real sentences (three each, English) in :data:`DRAIN_SECTION`, ids 1..n."""
    if sentences is None:
        from .gateway import load_sentences

        sentences = load_sentences(3 * n)
    return [
        {
            "section_tipo": DRAIN_SECTION,
            "section_id": i,
            "projects": [1],
            "groups": {"card": {"lg-eng": " ".join(sentences[3 * (i - 1) : 3 * i])}},
        }
        for i in range(1, n + 1)
    ]


async def store_snapshot(pool: Any, model: str) -> dict[tuple[Any, ...], tuple[str, str, Any]]:
    """(section, id, component, lang, chunk) -> (source hash, text, vector) for every stored chunk."""
    import numpy as np

    from index.store.partitions import get_partition

    partition = await get_partition(pool, model)
    if partition is None:
        return {}
    rows = await pool.fetch(
        f"SELECT section_tipo, section_id, component_tipo, lang, chunk_index, source_hash, source_text, "
        f"embedding FROM {partition.table}"
    )
    return {
        (r["section_tipo"], r["section_id"], r["component_tipo"], r["lang"], r["chunk_index"]): (
            r["source_hash"],
            r["source_text"],
            np.asarray(getattr(r["embedding"], "to_numpy", lambda e=r["embedding"]: e)(), dtype=np.float32),
        )
        for r in rows
    }


def compare_stores(clean: dict[tuple, tuple], other: dict[tuple, tuple]) -> dict[str, Any]:
    """Records whose chunks differ from the clean run's (missing, extra, other hash or text, vector
    off by more than 1e-4), and the largest vector difference among the chunks that match."""
    import numpy as np

    differing: set[tuple[str, int]] = set()
    worst = 0.0
    for key in clean.keys() | other.keys():
        a, b = clean.get(key), other.get(key)
        if a is None or b is None or a[:2] != b[:2]:
            differing.add(key[:2])
            continue
        diff = float(np.max(np.abs(a[2] - b[2]))) if len(a[2]) else 0.0
        worst = max(worst, diff)
        if diff > 1e-4:
            differing.add(key[:2])
    return {
        "records_lost": len(differing),
        "chunks_clean": len(clean),
        "chunks": len(other),
        "records_differing": sorted(f"{t}/{i}" for t, i in differing),
        "max_vector_difference": worst,
    }


@contextlib.asynccontextmanager
async def faulted_store(
    server_url: str, names: tuple[str, str], client: Any, model: str, records: int, deadline: float
) -> AsyncIterator[tuple[dict[tuple, tuple], str, Any]]:
    """A fault's two databases on ``server_url``: ``names[0]`` drained of :func:`drain_records` with
    no fault (its store, the reference, comes first), then ``names[1]`` with the same records queued
    for the fault (its URL and a pool); both dropped after."""
    from index.ingest.intake import enqueue_records
    from index.settings import IngestSettings

    from .stack import drop_databases

    batch = drain_records(records)
    try:
        _, clean_pool = await _fresh_database(server_url, names[0])
        try:
            clean = await _clean_run(
                clean_pool, client, IngestSettings(**FAULT_INGEST), batch, model, deadline
            )
        finally:
            await clean_pool.close()
        url, pool = await _fresh_database(server_url, names[1])
        try:
            await enqueue_records(pool, batch)
            yield clean, url, pool
        finally:
            await pool.close()
    finally:
        await drop_databases(server_url, *names)


async def _fresh_database(server_url: str, name: str) -> tuple[str, Any]:
    """A new, migrated database ``name`` (dropped first if it exists) of the server at ``server_url``,
    with :data:`DRAIN_DESCRIPTOR` put: its URL and a pool on it."""
    from index.store.sections import SectionStore
    from schema import create_pool

    from .stack import BenchStack

    url = await BenchStack(work_dir=Path(), server_url=server_url).fresh_database(name)
    pool = await create_pool(url, max_size=4)
    await SectionStore(pool).put(DRAIN_SECTION, DRAIN_DESCRIPTOR)
    return url, pool


async def _queue_size(pool: Any) -> int | None:
    try:
        return int(await pool.fetchval("SELECT count(*) FROM rag_index_queue"))
    except Exception:  # the server is down or recovering: unknown for now
        return None


async def _wait_queue_at_most(pool: Any, size: int, deadline: float) -> int | None:
    """Poll until the queue holds at most ``size`` records (bounded by ``deadline``); its size then."""
    loop = asyncio.get_running_loop()
    while loop.time() < deadline:
        left = await _queue_size(pool)
        if left is not None and left <= size:
            return left
        await asyncio.sleep(0.02)
    return await _queue_size(pool)


async def _wait_drained(pool: Any, deadline: float) -> float | None:
    """The loop time when the queue is empty; None if it is not by ``deadline``."""
    left = await _wait_queue_at_most(pool, 0, deadline)
    return asyncio.get_running_loop().time() if left == 0 else None


async def _clean_run(
    pool: Any, client: Any, settings: Any, batch: list[dict[str, Any]], model: str, deadline: float
) -> dict[tuple, tuple]:
    """The reference: ``batch`` drained with no fault, pass after pass; the store it leaves."""
    from index.ingest.drain import drain_once
    from index.ingest.intake import enqueue_records

    await enqueue_records(pool, batch)
    while await _queue_size(pool) and asyncio.get_running_loop().time() < deadline:
        await drain_once(pool, client, settings, text_model=model)
    return await store_snapshot(pool, model)


FAULT_INGEST = {"batch_records": 4, "embed_batch": 16, "outage_pause": 0.2, "drain_interval": 0.1}


async def _wait_for(check: Callable[[], Any], deadline: float, every_s: float = 0.02) -> Any:
    """Poll ``check`` (plain or async) until it returns something truthy (returned) or ``deadline``
    (the loop's clock) passes (None)."""
    loop = asyncio.get_running_loop()
    while loop.time() < deadline:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        await asyncio.sleep(every_s)
    return None
