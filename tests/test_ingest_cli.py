"""The ingestion commands as an operator runs them (`mnemo ...` subprocesses) and reconcile."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import asyncpg

from index.ingest import queue
from index.ingest.drain import drain_once
from index.ingest.intake import enqueue_records
from index.ingest.reconcile import parse_archive_listing, reconcile_section
from index.store.sections import SectionStore
from tests.conftest import REPO_ROOT
from tests.ingest_support import (
    ORAL_HISTORY,
    SETTINGS,
    TEXT_MODEL,
    CountingClient,
    closed_port_url,
    record,
)

MNEMO = str(REPO_ROOT / ".venv" / "bin" / "mnemo")


def mnemo(*args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MNEMO, "--log-level", "WARNING", *args, "--database-url", database_url],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO_ROOT,
    )


def test_backfill_drain_stats_and_retry_from_the_command_line(
    tmp_path: Path, database_url: str, sidecar_url: str
) -> None:
    descriptor = tmp_path / "oh1.json"
    descriptor.write_text(json.dumps(ORAL_HISTORY))
    assert mnemo("sections", "put", "oh1", str(descriptor), database_url=database_url).returncode == 0
    got = mnemo("sections", "get", "oh1", database_url=database_url)
    assert got.returncode == 0 and json.loads(got.stdout)["embed"][1]["id"] == "transcription"

    lines = [
        json.dumps(record(1)),
        json.dumps({**record(2), "section_id": "two"}),
        "",
        json.dumps(record(3)),
        "{not json",
        json.dumps({**record(4), "groups": {"cards": {"lg-eng": "x"}}}),
        json.dumps(record(5)),
    ]
    backfill = tmp_path / "records.jsonl"
    backfill.write_text("\n".join(lines) + "\n")
    done = mnemo("ingest", "records", str(backfill), "--batch", "2", database_url=database_url)
    assert done.returncode == 1, done.stderr  # some lines were rejected
    assert "6 records read, 3 queued, 3 rejected" in done.stdout
    assert "line 2: request.invalid_record: section_id:" in done.stdout
    assert "line 5: request.invalid_json" in done.stdout
    assert "line 6: request.unknown_group: groups.cards:" in done.stdout
    assert "ingest" in done.stderr and "6/6" in done.stderr  # the progress bar

    stats = mnemo("queue", "stats", "--json", database_url=database_url)
    assert json.loads(stats.stdout)["pending"] == 3

    down = mnemo("drain", "--once", "--sidecar-url", closed_port_url(), database_url=database_url)
    assert down.returncode == 75 and "sidecar unavailable" in down.stderr
    stats = json.loads(mnemo("queue", "stats", "--json", database_url=database_url).stdout)
    assert (stats["pending"], stats["waiting_on_sidecar"], stats["failed"]) == (3, 3, 0)

    drained = mnemo(
        "drain", "--once", "--sidecar-url", sidecar_url, "--text-model", TEXT_MODEL, database_url=database_url
    )
    assert drained.returncode == 0, drained.stderr
    assert "drained: 3 indexed, 0 deleted, 0 failed" in drained.stdout
    assert json.loads(mnemo("queue", "stats", "--json", database_url=database_url).stdout)["pending"] == 0

    listed = mnemo("queue", "list", database_url=database_url)
    assert listed.returncode == 0 and listed.stdout == ""

    ids = tmp_path / "ids.txt"
    ids.write_text("# archive ids of oh1\n1\n3\n9\n")
    reconciled = mnemo("reconcile", "oh1", str(ids), database_url=database_url)
    assert reconciled.returncode == 0, reconciled.stderr
    report = json.loads(reconciled.stdout)
    assert (report["delete_enqueued"], report["missing"]) == ([5], [9])


async def test_queue_retry_from_the_command_line(database_url: str, db_pool: asyncpg.Pool) -> None:
    await queue.enqueue(db_pool, [queue.Job("oh1", 1, "index", {}), queue.Job("oh1", 2, "index", {})])
    await db_pool.execute("UPDATE rag_index_queue SET attempts = 5, last_error = 'boom'")
    listed = mnemo("queue", "list", "--failed", database_url=database_url)
    assert "failed   oh1/1 index v1 attempts=5  boom" in listed.stdout
    retried = mnemo("queue", "retry", "--id", "2", database_url=database_url)
    assert retried.returncode == 0 and "1 records made ready again" in retried.stdout
    stats = await queue.stats(db_pool, 5)
    assert (stats.failed, stats.ready) == (1, 1)


def test_archive_listings_parse_ids_and_records() -> None:
    assert parse_archive_listing("[1, 2, 3]") == ([1, 2, 3], [])
    assert parse_archive_listing('# ids\n4\n\n{"section_id": 5}\n') == ([4], [{"section_id": 5}])
    for bad in ("1\nfive\n", "[true]", '["7"]'):
        try:
            parse_archive_listing(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was accepted")


async def test_reconcile_queues_the_corrections_for_the_drift(
    db_pool: asyncpg.Pool, sidecar_url: str
) -> None:
    await SectionStore(db_pool).put("oh1", ORAL_HISTORY)
    await enqueue_records(db_pool, [record(i) for i in (1, 2, 3)])
    async with CountingClient(sidecar_url) as client:
        assert (await drain_once(db_pool, client, SETTINGS, text_model=TEXT_MODEL)).indexed == 3
        await enqueue_records(db_pool, [record(6)])  # queued, not yet indexed: not missing

        # The archive holds 2, 3, 4, 5 and 6 (5 sent in full); 1 was deleted there.
        report = await reconcile_section(db_pool, "oh1", [2, 3, 4, 6], [record(5)])
        assert (report.archive, report.stored) == (5, 3)
        assert (report.delete_enqueued, report.index_enqueued, report.missing) == ([1], [5], [4])
        again = await reconcile_section(db_pool, "oh1", [2, 3, 4, 6], [])
        assert (again.delete_enqueued, again.missing) == ([], [4])  # the delete and 5 are already queued

        report = await drain_once(db_pool, client, SETTINGS, text_model=TEXT_MODEL)
        assert (report.deleted, report.indexed) == (1, 2)
    stored = {r["section_id"] for r in await db_pool.fetch("SELECT section_id FROM rag_embeddings")}
    assert stored == {2, 3, 5, 6}
