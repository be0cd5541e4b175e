"""The ingestion benchmark runs end to end on the real sidecar and reports coherent figures."""

from __future__ import annotations

import math
from pathlib import Path

import asyncpg

from benchmarks.ingest import RecordingClient, as_suite, make_records, run_ingest_benchmark
from benchmarks.report import write_report
from index.chunking.chunker import chunk
from index.settings import IngestSettings
from tests.ingest_support import TEXT_MODEL


def test_the_synthetic_collection_is_deterministic_and_structured() -> None:
    a, b = make_records(9, seed=3), make_records(9, seed=3)
    assert a == b and a != make_records(9, seed=4)
    assert {r["section_tipo"] for r in a} == {"oh1", "numisdata4", "mus1"}
    transcription = a[0]["groups"]["transcription"]
    (text,) = transcription.values()
    assert "[TC_00:00:" in text and len(chunk(text, mode="transcription")) >= 4
    (fulltext,) = a[2]["groups"]["fulltext"].values()
    assert "[h1]" in fulltext and "[page-n-1]" in fulltext


async def test_the_benchmark_measures_a_small_collection(
    db_pool: asyncpg.Pool, sidecar_url: str, tmp_path: Path
) -> None:
    async with RecordingClient(sidecar_url) as client:
        result = await run_ingest_benchmark(
            db_pool, client, records=9, text_model=TEXT_MODEL, settings=IngestSettings(embed_batch=32)
        )
    assert result["records"] == 9 and result["chunks_embedded"] == result["embed_only_chunks"] > 9
    assert result["rows_written"] == result["chunks_embedded"] and result["truncated"] == 0
    # Every phase was timed; what the rates and shares come to is the benchmark's figure.
    assert math.isfinite(result["records_per_s"]) and math.isfinite(result["chunks_per_s"])
    assert math.isfinite(result["embed_share"]) and math.isfinite(result["write_share"])
    assert set(result["phase_share"]) == {"chunk", "tokenize", "embed", "write"}
    assert (result["reindex_chunks_embedded"], result["reindex_rows_written"]) == (0, 0)
    writes = result["write_baseline"]
    assert writes["rows"] == result["rows_written"]
    assert all(math.isfinite(writes[f"{shape}{index}_rows_per_s"]) for shape in ("multirow", "row_at_a_time")
               for index in ("", "_no_hnsw"))  # fmt: skip
    assert math.isfinite(writes["multirow_speedup_ceiling"]) and math.isfinite(
        writes["hnsw_share_of_multirow"]
    )
    report = write_report(tmp_path, [as_suite(result)], {"records": 9})
    text = report.read_text()
    assert "ingest chunks/s" in text and "Writes: statement shape vs the HNSW insert" in text
