"""`mnemo backfill` on real PostgreSQL against the session sidecar (issue 23, item 2).

- a section backfilled from the queue holds the same rows and vectors as the same records drained;
- a model change swaps atomically while a search loop runs: every answer is the old model's or the
  new model's complete answer, never empty, never a mix;
- a backfill killed with SIGKILL (a real `mnemo backfill` subprocess) mid-embedding resumes and
  ends with every record exactly once; so does one killed mid-build (the reliability suite's fault,
  compared with a clean drain);
- a maintenance_work_mem too small for the HNSW graph is refused before the build, and the same
  run then finishes with enough memory;
- a JSONL export's bad lines and records go to the rejects report; the good ones are indexed.

No outcome depends on time: the tests wait on database states under a generous overall limit.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import pytest

from benchmarks.backfill_fault import backfill_killed_mid_build
from gateway.actions.context import RETRIEVER_KEY
from index.bulk import shadow
from index.bulk.backfill import (
    BackfillOptions,
    BackfillReport,
    JsonlSource,
    ModelSource,
    QueueSource,
    _open_run,
    embed_and_copy,
    run_backfill,
)
from index.ingest.drain import drain_once
from index.ingest.indexer import Indexer
from index.ingest.intake import enqueue_records
from index.search.dense_leg import dense_search
from index.store.change_feed import KEY_COLUMNS
from index.store.hits import Scope
from index.store.partitions import ensure_partition, get_partition, serving_model
from index.store.sections import SectionStore
from index.store.store import EmbeddingRow, copy_rows
from index.vectors.cache import VectorCache
from index.vectors.partition import CacheConfig
from inference.client import SidecarClient
from tests.conftest import REPO_ROOT
from tests.fixtures.gateway import running_gateway
from tests.ingest_support import ORAL_HISTORY, SETTINGS, TEXT_MODEL, record
from tests.waiting import until

OPTIONS = BackfillOptions(batch_records=4, embed_batch=16)
_ROW = ("component_tipo", "lang", "chunk_index")
_SAME = ("source_hash", "source_text", "lexical_text", "token_count", "projects", "chunk_meta", "parent_key")


async def _rows(pool: asyncpg.Pool, model: str, section: str) -> dict[tuple[Any, ...], asyncpg.Record]:
    partition = await get_partition(pool, model)
    assert partition is not None
    rows = await pool.fetch(
        f"SELECT * FROM {partition.table} WHERE section_tipo = $1 AND modality = 'text'", section
    )
    return {(r["section_id"], *(r[c] for c in _ROW)): r for r in rows}


async def _queue_section(pool: asyncpg.Pool, section: str, ids: range) -> None:
    await SectionStore(pool).put(section, ORAL_HISTORY)
    await enqueue_records(pool, [record(i, section_tipo=section) for i in ids])


async def test_a_section_backfill_gives_the_drains_rows_and_vectors(
    database_url: str, db_pool: asyncpg.Pool, sidecar_url: str
) -> None:
    await _queue_section(db_pool, "oh1", range(1, 9))
    await _queue_section(db_pool, "oh2", range(1, 9))
    async with SidecarClient(sidecar_url) as client:
        drained = await drain_once(db_pool, client, SETTINGS, text_model=TEXT_MODEL, section_tipos=["oh1"])
        assert drained.indexed == 8
        partition = await get_partition(db_pool, TEXT_MODEL)
        assert partition is not None
        cache = VectorCache(db_pool, database_url, CacheConfig(mode="cpu"))
        cached = await cache.load(partition)  # a gateway's FAISS cache, loaded before the backfill
        assert cached.live == drained.rows_written
        async with db_pool.acquire() as conn:
            indexes_before = await shadow.index_specs(conn, partition)
        report = await run_backfill(db_pool, client, QueueSource(["oh2"], TEXT_MODEL, OPTIONS), OPTIONS)
    assert (report.copied, report.rejected, report.completed_in_queue) == (8, 0, 8)
    assert report.rows_kept == drained.rows_written  # oh1's rows, outside the scope, carried over
    assert await db_pool.fetchval("SELECT count(*) FROM rag_index_queue") == 0
    by_drain, by_backfill = await _rows(db_pool, TEXT_MODEL, "oh1"), await _rows(db_pool, TEXT_MODEL, "oh2")
    assert by_drain.keys() == by_backfill.keys() and len(by_drain) == report.rows_written
    for key, row in by_drain.items():
        other = by_backfill[key]
        assert {c: row[c] for c in _SAME} == {c: other[c] for c in _SAME}, key
        np.testing.assert_allclose(row["embedding"].to_numpy(), other["embedding"].to_numpy(), atol=1e-5)
    # The swapped-in table is the partition, under its name, with the live indexes' names and DDL.
    async with db_pool.acquire() as conn:
        after = await shadow.index_specs(conn, partition)
        attached = await conn.fetchval(
            "SELECT count(*) FROM pg_inherits WHERE inhrelid = $1::regclass", partition.table
        )
    assert [(s.live_name, s.ddl) for s in after] == [(s.live_name, s.ddl) for s in indexes_before]
    assert any(s.hnsw for s in after) and attached == 1
    assert await db_pool.fetchval("SELECT to_regclass($1)", shadow.shadow_of(partition).partition) is None
    # The cache learns of the swap through the change feed: it holds exactly the new table's rows.
    await cache.sync()
    table_keys = await db_pool.fetch(f"SELECT {', '.join(KEY_COLUMNS)} FROM {partition.table}")
    assert set(cached.slot_of) == {tuple(r) for r in table_keys}
    assert cached.live == len(table_keys) == drained.rows_written + report.rows_written


async def _answer(
    pool: asyncpg.Pool, client: SidecarClient, query: str, default: str
) -> tuple[str, list[tuple[Any, ...]]]:
    """One search as retrieval does it across a model change: the serving model (``default``
    while none was set) embeds the query and its partition is searched. (model, hit keys in rank
    order)."""
    model = await serving_model(pool) or default
    partition = await get_partition(pool, model)
    assert partition is not None
    vector = np.asarray((await client.embed(model, [query])).embeddings[0], dtype=np.float32)
    async with pool.acquire() as conn:
        hits = await dense_search(conn, partition, vector, Scope(section_tipos=("oh1",)), 10, exact=True)
    return model, [h.key for h in hits]


async def test_a_model_change_swaps_atomically_under_a_search_loop(
    database_url: str, db_pool: asyncpg.Pool, sidecar_url: str
) -> None:
    await _queue_section(db_pool, "oh1", range(1, 13))
    query = "the reservoir water arriving at the village"
    async with SidecarClient(sidecar_url) as client:
        # From the model an unconfigured gateway serves (the sidecar's first) to the other one.
        text_models = [m for m in await client.models() if m.kind == "text"]
        old_model, new_model = text_models[0], text_models[1]
        await drain_once(db_pool, client, SETTINGS, text_model=old_model.id, section_tipos=["oh1"])
        old = await _answer(db_pool, client, query, old_model.id)
        async with running_gateway(database_url, sidecar_url, RAG_TEXT_MODEL="") as gateway:
            retriever = gateway.app[RETRIEVER_KEY]  # no configured text model: it follows the swap
            assert (await retriever.text_model()).id == old_model.id
            assert await gateway.ok("semantic_search", {"query": query, "limit": 5})
            answers: list[tuple[str, list[tuple[Any, ...]]]] = []
            done = asyncio.Event()

            async def search_loop() -> None:
                while not done.is_set():
                    answers.append(await _answer(db_pool, client, query, old_model.id))
                for _ in range(3):  # and a few after the swap
                    answers.append(await _answer(db_pool, client, query, old_model.id))

            loop = asyncio.create_task(search_loop())
            await until("the loop's first answer", lambda: asyncio.sleep(0, bool(answers)))
            try:
                report = await run_backfill(db_pool, client, ModelSource(old_model.id, new_model.id), OPTIONS)
            finally:
                done.set()
                await loop
            new = await _answer(db_pool, client, query, old_model.id)

            async def gateway_moved() -> bool:
                return (await retriever.text_model()).id == new_model.id

            await until("the gateway to serve the new model", gateway_moved)
            hits = await gateway.ok("semantic_search", {"query": query, "limit": 5})
    assert hits and {h["section_tipo"] for h in hits} == {"oh1"}
    assert old[0] == old_model.id and new[0] == new_model.id and old[1] and new[1]
    assert report.copied == 12 and report.rejected == 0
    assert answers[0] == old and answers[-1] == new
    for answer in answers:  # each one whole: the old model's answer or the new one's
        assert answer in (old, new), answer
    flips = [i for i in range(1, len(answers)) if answers[i] != answers[i - 1]]
    assert len(flips) == 1  # one switch, never back
    # The new partition has every chunk of the old, re-embedded (same text, the new model's vectors).
    before, after = await _rows(db_pool, old_model.id, "oh1"), await _rows(db_pool, new_model.id, "oh1")
    assert before.keys() == after.keys()
    assert all(before[k]["source_hash"] == after[k]["source_hash"] for k in before)
    assert all((r["sparse"] is not None) == new_model.sparse for r in after.values())


def _connection_args(database_url: str, sidecar_url: str) -> list[str]:
    """``mnemo backfill``'s flags for the test database, the session sidecar and its text model."""
    return ["--database-url", database_url, "--sidecar-url", sidecar_url, "--text-model", TEXT_MODEL]


async def _mnemo_backfill(
    database_url: str, sidecar_url: str, log: Path, *args: str
) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway.cli",
            "backfill",
            *_connection_args(database_url, sidecar_url),
            *args,
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=out,
        )


async def test_a_killed_backfill_resumes_with_every_record_exactly_once(
    tmp_path: Path, database_url: str, db_pool: asyncpg.Pool, sidecar_url: str
) -> None:
    await _queue_section(db_pool, "oh3", range(1, 25))
    log = tmp_path / "backfill.log"
    proc = await _mnemo_backfill(database_url, sidecar_url, log, "--section", "oh3", "--batch", "2")
    try:

        async def some_copied() -> bool:
            if proc.returncode is not None:
                raise AssertionError(f"backfill ended before the kill: {log.read_text()}")
            return bool(
                await db_pool.fetchval("SELECT count(*) FROM rag_backfill_records WHERE state = 'copied'")
            )

        await until("a first batch in the shadow", some_copied)
        proc.send_signal(signal.SIGKILL)
    finally:
        await proc.wait()
    copied = await db_pool.fetchval("SELECT count(*) FROM rag_backfill_records WHERE state = 'copied'")
    assert 0 < copied < 24, log.read_text()  # killed mid-run
    proc = await _mnemo_backfill(database_url, sidecar_url, log, "--section", "oh3", "--no-progress")
    assert await proc.wait() == 0, log.read_text()
    result = json.loads(await db_pool.fetchval("SELECT report->'result' FROM rag_backfills"))
    assert result["resumed"] and result["copied"] == 24 and result["rejected"] == 0
    rows = await _rows(db_pool, TEXT_MODEL, "oh3")
    per_record = await db_pool.fetch(
        "SELECT section_id, rows_written FROM rag_backfill_records ORDER BY section_id"
    )
    assert [r["section_id"] for r in per_record] == list(range(1, 25))
    for r in per_record:  # each record's rows once: as many as the backfill wrote for it
        assert sum(1 for k in rows if k[0] == r["section_id"]) == r["rows_written"] > 0
    assert len(rows) == result["rows_written"]
    assert await db_pool.fetchval("SELECT count(*) FROM rag_index_queue") == 0


async def test_the_reliability_fault_a_backfill_killed_mid_build_loses_and_duplicates_nothing(
    tmp_path: Path, pg_server: Any, sidecar_url: str
) -> None:
    result = await backfill_killed_mid_build(
        pg_server.url, sidecar_url, tmp_path, text_model=TEXT_MODEL, records=12
    )
    assert result["records_copied_at_kill"] == 12 and result["indexes_built_at_kill"] >= 1  # mid-build
    assert (result["records_lost"], result["duplicate_rows"], result["queue_left"]) == (0, 0, 0)
    assert result["resumed"] is True and result["chunks"] == result["chunks_clean"] > 0


async def _seed_rows(pool: asyncpg.Pool, n: int) -> None:
    """``n`` rows of another section in the live partition (the real writer, seeded vectors)."""
    partition = await ensure_partition(pool, TEXT_MODEL, 384)
    rng = np.random.default_rng(7)
    rows = [
        EmbeddingRow(
            modality="text",
            section_tipo="seed",
            section_id=i,
            component_tipo="rag:summary",
            lang="lg-eng",
            chunk_index=0,
            source_hash=f"h{i}",
            source_text=f"seed {i}",
            lexical_text=f"seed {i}",
            embedding=rng.standard_normal(384).astype(np.float32),
        )
        for i in range(n)
    ]
    async with pool.acquire() as conn:
        await copy_rows(conn, partition, rows)


async def test_a_maintenance_work_mem_too_small_is_refused_and_the_run_then_finishes(
    db_pool: asyncpg.Pool, sidecar_url: str
) -> None:
    await _seed_rows(db_pool, 600)  # 600 rows x ~2.1 KiB of graph: more than 1 MB
    await _queue_section(db_pool, "oh1", range(1, 3))
    small = BackfillOptions(batch_records=4, maintenance_work_mem="1MB")
    async with SidecarClient(sidecar_url) as client:
        with pytest.raises(shadow.MemoryTooSmall, match="maintenance_work_mem") as refused:
            await run_backfill(db_pool, client, QueueSource(["oh1"], TEXT_MODEL, small), small)
        assert "--maintenance-work-mem" in str(refused.value) and "--allow-spill" in str(refused.value)
        state = await db_pool.fetchval("SELECT state FROM rag_backfills")
        assert state == "building"  # the records are in the shadow; only the build is left
        partition = await get_partition(db_pool, TEXT_MODEL)
        assert partition is not None
        assert (
            await db_pool.fetchval(f"SELECT count(*) FROM {partition.table} WHERE section_tipo = 'oh1'") == 0
        )
        enough = BackfillOptions(batch_records=4, maintenance_work_mem="64MB", build_workers=2)
        report = await run_backfill(db_pool, client, QueueSource(["oh1"], TEXT_MODEL, enough), enough)
    assert report.resumed and report.copied == 2 and report.build["rows"] == 600 + report.rows_written
    assert (
        await db_pool.fetchval(f"SELECT count(*) FROM {partition.table} WHERE section_tipo = 'seed'") == 600
    )


async def test_a_run_killed_before_its_kept_rows_were_copied_copies_them_on_the_rerun(
    db_pool: asyncpg.Pool, sidecar_url: str
) -> None:
    """The state a kill leaves between the setup's commit and the copy's (the copy is one
    transaction, so a kill inside it leaves the same): the rerun copies the kept rows."""
    await _seed_rows(db_pool, 30)
    await _queue_section(db_pool, "oh1", range(1, 3))
    source = QueueSource(["oh1"], TEXT_MODEL, OPTIONS)
    async with SidecarClient(sidecar_url) as client:
        model = next(m for m in await client.models() if m.id == TEXT_MODEL)
        partition = await get_partition(db_pool, TEXT_MODEL)
        assert partition is not None
        async with db_pool.acquire() as conn:
            run = await _open_run(conn, source, model, partition, BackfillReport("", TEXT_MODEL, "queue"))
        assert run["target_seq"] is None  # set up, nothing copied yet
        report = await run_backfill(db_pool, client, QueueSource(["oh1"], TEXT_MODEL, OPTIONS), OPTIONS)
    assert report.resumed and report.rows_kept == 30 and report.copied == 2
    assert await db_pool.fetchval(f"SELECT count(*) FROM {partition.table} WHERE section_tipo = 'seed'") == 30


@pytest.mark.ray
@pytest.mark.slow
async def test_a_ray_backfill_on_two_nodes_resumes_and_gives_the_drains_rows(
    database_url: str, db_pool: asyncpg.Pool, sidecar_url: str
) -> None:
    """``mnemo backfill --section --ray``: two writer actors, one per node of a real two-node
    cluster, embed and COPY; a run killed after its first batch committed is resumed by it, and
    the result is the drain's rows and vectors, every record exactly once. Before it, a run asking
    for more writers than the cluster can place stops loudly, naming them, and writes nothing."""
    await _queue_section(db_pool, "oh1", range(1, 13))
    await _queue_section(db_pool, "oh2", range(1, 13))
    async with SidecarClient(sidecar_url) as client:
        drained = await drain_once(db_pool, client, SETTINGS, text_model=TEXT_MODEL, section_tipos=["oh1"])
        assert drained.indexed == 12
        model = next(m for m in await client.models() if m.id == TEXT_MODEL)
        partition = await get_partition(db_pool, TEXT_MODEL)
        assert partition is not None
        # What a run killed after its first batch leaves: the run, its shadow, one committed batch.
        source = QueueSource(["oh2"], TEXT_MODEL, OPTIONS)
        async with db_pool.acquire() as conn:
            run = await _open_run(conn, source, model, partition, BackfillReport("", TEXT_MODEL, "queue"))
            await shadow.copy_out_of_scope(conn, partition, run["backfill_id"])
        indexer = Indexer(db_pool, client, model, shadow.shadow_of(partition), embed_batch=16)
        first = [("oh2", i) for i in range(1, 5)]
        await embed_and_copy(db_pool, source, indexer, run["backfill_id"], first)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.ray_backfill",
        "--",
        "--section",
        "oh2",
        "--batch",
        "2",
        *_connection_args(database_url, sidecar_url),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=str(REPO_ROOT),
    )
    out, err = await proc.communicate()
    text = out.decode()
    ran = json.loads(text.strip().splitlines()[-1])
    assert proc.returncode == 0 and (ran["exit"], ran["nodes"]) == (0, 2), text + err.decode()
    # The writers close their sidecar sessions when Ray Data is done with them (forwarded worker logs).
    assert "Unclosed client session" not in err.decode()
    assert ran["unplaceable"]["exit"] == 3, ran
    assert "did not start 3 writer(s) of 1 CPU(s) each within 2 s" in ran["unplaceable"]["said"], ran
    report = json.loads(text[: text.rindex("\n", 0, len(text.rstrip()))])
    assert report["resumed"] and report["backfill_id"] == run["backfill_id"]
    assert (report["copied"], report["rejected"], report["completed_in_queue"]) == (12, 0, 12)
    # The 8 records left pending (none by the unplaceable run) went through both nodes' writers.
    assert sum(report["records_by_node"].values()) == 8 and len(report["records_by_node"]) == 2
    assert await db_pool.fetchval("SELECT count(*) FROM rag_index_queue") == 0
    by_drain, by_backfill = await _rows(db_pool, TEXT_MODEL, "oh1"), await _rows(db_pool, TEXT_MODEL, "oh2")
    assert by_drain.keys() == by_backfill.keys() and len(by_drain) == report["rows_written"]
    for key, row in by_drain.items():
        other = by_backfill[key]
        assert {c: row[c] for c in _SAME} == {c: other[c] for c in _SAME}, key
        np.testing.assert_allclose(row["embedding"].to_numpy(), other["embedding"].to_numpy(), atol=1e-5)


@pytest.mark.parametrize("seconds", [0.0, -1.0, float("nan"), float("inf")])
def test_a_start_timeout_that_is_not_a_positive_number_of_seconds_is_refused_up_front(seconds: float) -> None:
    # Ray Data reads 0, a negative or NaN as "do not wait": it would silently start on the actors
    # that fit. The backfill refuses it when the step is built, before its run opens a shadow.
    from index.bulk.backfill_ray import RayEmbedStep
    from index.bulk.ray_cluster import check_start_timeout
    from index.settings import SidecarClientSettings

    with pytest.raises(ValueError, match="--ray-start-timeout must be a positive number of seconds"):
        check_start_timeout(seconds)
    with pytest.raises(ValueError, match="--ray-start-timeout"):
        RayEmbedStep("local", "postgresql://unused", SidecarClientSettings(), start_timeout_s=seconds)
    assert check_start_timeout(2.5) == 2.5


def test_the_hnsw_estimate_is_the_vector_plus_the_graph() -> None:
    # 384 x 4 + 8 bytes of vector, 96 + 32 x 16 + ceil(256 / 15) bytes of graph per row.
    assert shadow.hnsw_build_bytes(100_000, 384, "vector") == 100_000 * (1544 + 96 + 512 + 18)
    assert shadow.hnsw_build_bytes(10, 1024, "halfvec", m=8) == 10 * (2056 + 96 + 256 + 19)
    assert shadow.parse_memory("2GB") == 2 * 1024**3 and shadow.parse_memory("64MB") == 64 * 1024**2


async def test_a_jsonl_backfill_reports_rejects_and_indexes_the_rest(
    tmp_path: Path, db_pool: asyncpg.Pool, sidecar_url: str
) -> None:
    await SectionStore(db_pool).put("oh1", ORAL_HISTORY)
    export = tmp_path / "export.jsonl"
    lines = [
        json.dumps(record(1)),
        "{not json",
        json.dumps(record(2, groups={"nope": {"lg-eng": "x"}})),  # a group the section lacks
        json.dumps(record(3)),
    ]
    export.write_text("\n".join(lines) + "\n")
    rejects = tmp_path / "rejects.jsonl"
    options = BackfillOptions(batch_records=4, rejects=rejects)
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text("{not json\n")
    async with SidecarClient(sidecar_url) as client:
        report = await run_backfill(db_pool, client, JsonlSource(export, TEXT_MODEL), options)
        nothing = BackfillOptions(rejects=tmp_path / "bad.rejects.jsonl")
        again = await run_backfill(db_pool, client, JsonlSource(only_bad, TEXT_MODEL), nothing)
    assert again.records == 0 and again.rejects_path and not again.build  # no build, no swap
    assert (report.copied, report.rejected) == (2, 1)
    reported = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert reported[0]["section_id"] == 2 and "request.unknown_group" in reported[0]["reason"]
    assert reported[1]["line"] == 2 and "invalid_record" in reported[1]["reason"]
    assert {k[0] for k in await _rows(db_pool, TEXT_MODEL, "oh1")} == {1, 3}


def test_a_jsonl_source_reads_records_by_offset_and_drops_a_line_that_changed(tmp_path: Path) -> None:
    """Each record is read at its last line's byte offset (no rescan per batch); a line that is no
    longer that record (the export was rewritten meanwhile) is not read as it."""
    export = tmp_path / "export.jsonl"
    lines = [record(1), record(2), {**record(1), "title": "again"}]
    export.write_text("".join(json.dumps(r) + "\n" for r in lines))
    source = JsonlSource(export, TEXT_MODEL)
    assert source._records([("oh1", 1), ("oh1", 2)]) == {("oh1", 1): lines[2], ("oh1", 2): lines[1]}
    export.write_text("".join(json.dumps(r) + "\n" for r in [record(2), record(1), record(3)]))
    assert source._records([("oh1", 1), ("oh1", 2)]) == {}  # same offsets, other records there now
