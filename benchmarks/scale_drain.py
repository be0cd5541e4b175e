"""The scale suite's drain section: N drain workers (:func:`index.ingest.drain.drain_parallel`, what
``mnemo drain --workers N`` runs) against each stage alone at the same concurrency on the same work:
the embed stage (the texts sent again to ``/embed`` by N callers in the drain's request size) and the
store stage (the rows written again by N connections with the drain's writer). The pipeline's
efficiency is the slower stage's time over the drain's; 1.0 would be perfect overlap.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from index.ingest.drain import DrainWorker, drain_parallel
from index.ingest.intake import enqueue_records
from index.models import resolve_model
from index.settings import IngestSettings
from index.store import store
from index.store.partitions import ensure_partition
from index.store.sections import SectionStore
from schema import create_pool

from .datasets import dataset_dir
from .eval import load_beir
from .ingest import RecordingClient, embed_alone
from .scale_store import write_records

__all__ = ["SECTION", "measure_drain_workers", "real_records"]

SECTION = "scale_drain"
# Corpora whose documents become records, largest first (CACM and MED are real abstracts; XQuAD
# paragraphs are real Spanish and German prose).
CORPORA = ("cacm", "med", "xquad-es", "xquad-de", "adi")


def real_records(n: int) -> list[dict[str, Any]]:
    """``n`` records, one per document of the bundled corpora (cycled, with new ids, past their 4,799)."""
    documents: list[str] = []
    for name in CORPORA:
        documents.extend(
            f"{title}. {text}" if title else text
            for title, text in load_beir(dataset_dir(name)).corpus.values()
        )
    documents = [d for d in documents if d.strip()]
    return [
        {
            "section_tipo": SECTION,
            "section_id": i + 1,
            "projects": [1 + i % 3],
            "groups": {"doc": {"lg-nolan": documents[i % len(documents)]}},
        }
        for i in range(n)
    ]


DESCRIPTOR = {
    "embed": [{"id": "doc", "contributors": ["text"], "chunk": {"max_tokens": 200, "min_tokens": 50}}]
}


async def _one_run(
    database_url: str,
    sidecar_url: str,
    model: str,
    records: list[dict[str, Any]],
    workers: int,
    settings: IngestSettings,
) -> dict[str, Any]:
    pool = await create_pool(database_url, max_size=2 * workers + 2)
    try:
        await SectionStore(pool).put(SECTION, DESCRIPTOR)
        async with RecordingClient(sidecar_url, timeout=300) as client:
            served = await resolve_model(client, "text", model)
            partition = await ensure_partition(pool, served.id, served.dimension or 0)
            await client.embed(served.id, ["warm-up"] * settings.embed_batch, truncate=True)
            for start in range(0, len(records), settings.max_records_per_request):
                await enqueue_records(pool, records[start : start + settings.max_records_per_request])

            client.recording = True
            drain_workers = [DrainWorker(pool, settings, index=i) for i in range(workers)]
            for w in drain_workers:
                await w.__aenter__()
            try:
                started = time.perf_counter()
                report = await drain_parallel(pool, client, settings, drain_workers, text_model=served.id)
                drain_s = time.perf_counter() - started
            finally:
                for w in drain_workers:
                    await w.__aexit__(None, None, None)
            client.recording = False
            if report.indexed != len(records) or report.failed or report.unavailable:
                errors = await pool.fetch(
                    "SELECT last_error, count(*) AS n FROM rag_index_queue WHERE last_error IS NOT NULL "
                    "GROUP BY last_error ORDER BY n DESC LIMIT 3"
                )
                raise RuntimeError(
                    f"the drain with {workers} workers did not index every record: {report.as_dict()}; "
                    f"errors: {[(r['last_error'], r['n']) for r in errors]}"
                )
            texts = list(client.embedded)
            embed = len(texts) / await embed_alone(client, served.id, texts, settings.embed_batch, workers)

        by_record = list((await store.read_rows(pool, partition, "text", SECTION)).values())
        target = await ensure_partition(pool, f"scale-store-ceiling-{workers}", served.dimension or 0)
        rows = sum(len(r) for r in by_record)
        # rows/s of the drain's writer (HNSW maintained) from as many connections, into an empty partition
        written = rows / await write_records(pool, target, by_record, workers, prune=False)
        # Each stage's time for this run's work when it runs alone: the drain can be no faster than
        # the slower of the two, so that one bounds it (the units differ: chunks embedded, rows written).
        alone = {"embed": report.chunks_embedded / embed, "store": rows / written}
        bound = max(alone, key=alone.__getitem__)
        return {
            "workers": workers,
            "records": len(records),
            "chunks": report.chunks_embedded,
            "rows": rows,
            "drain_seconds": round(drain_s, 3),
            "drain_chunks_per_s": report.chunks_embedded / drain_s,
            "embed_ceiling_chunks_per_s": embed,
            "store_ceiling_rows_per_s": written,
            "embed_alone_seconds": round(alone["embed"], 3),
            "store_alone_seconds": round(alone["store"], 3),
            "bounding_stage": bound,
            "efficiency": alone[bound] / drain_s,
            "phase_seconds": {k: round(v, 3) for k, v in report.seconds.items()},
        }
    finally:
        await pool.close()


async def measure_drain_workers(
    fresh_database: Any,
    sidecar_url: str,
    models: Sequence[str],
    *,
    records: int,
    workers: Sequence[int],
) -> dict[str, list[dict[str, Any]]]:
    """Per model, one run per worker count, each on a fresh database (``await fresh_database(name)``
    returns its URL): the drain and its two stage ceilings."""
    collection = real_records(records)
    settings = IngestSettings()
    out: dict[str, list[dict[str, Any]]] = {}
    for model in models:
        runs = []
        for n in workers:
            url = await fresh_database(f"scale_drain_{len(out)}_{n}")
            runs.append(await _one_run(url, sidecar_url, model, collection, n, settings))
            print(f"scale drain: {model} workers={n}: {json.dumps(runs[-1])}", flush=True)
        out[model] = runs
    return out
