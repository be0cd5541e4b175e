"""The indexer end to end on real PostgreSQL and the real sidecar: rows, incremental re-embedding,
self-healing of removed groups and languages, sparse weights, the model's input limit, the demo."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import numpy as np
import pytest

from index.chunking.chunker import chunk
from index.demo import demo_records, load_demo
from index.ingest import queue
from index.ingest.drain import drain_once
from index.ingest.indexer import Indexer
from index.ingest.intake import enqueue_records
from index.models import resolve_model
from index.store.partitions import ensure_partition
from index.store.sections import SectionStore
from index.store.store import SPARSE_DIMENSION
from tests.ingest_support import (
    ORAL_HISTORY,
    SETTINGS,
    SPARSE_MODEL,
    TEXT_MODEL,
    CountingClient,
    queue_rows,
    record,
    text_rows,
)


@pytest.fixture
async def client(sidecar_url: str) -> AsyncIterator[CountingClient]:
    async with CountingClient(sidecar_url) as c:
        yield c


@pytest.fixture
async def pool(db_pool: asyncpg.Pool) -> asyncpg.Pool:
    await SectionStore(db_pool).put("oh1", ORAL_HISTORY)
    return db_pool


async def _index(
    pool: asyncpg.Pool, client: CountingClient, *records: dict[str, Any], model: str = TEXT_MODEL
):
    await enqueue_records(pool, list(records))
    client.embedded.clear()
    report = await drain_once(pool, client, SETTINGS, text_model=model)
    assert report.error is None and report.failed == 0, report
    assert await queue_rows(pool) == []
    return report


def _by_doc(rows: list[Any]) -> dict[tuple[str, str], list[Any]]:
    out: dict[tuple[str, str], list[Any]] = {}
    for r in rows:
        out.setdefault((r["component_tipo"], r["lang"]), []).append(r)
    return out


async def test_a_record_is_chunked_embedded_and_stored_with_its_acl_fields(
    pool: asyncpg.Pool, client: CountingClient
) -> None:
    report = await _index(pool, client, record(1))
    assert (report.indexed, report.model) == (1, TEXT_MODEL)
    docs = _by_doc(await text_rows(pool))
    assert set(docs) == {
        ("rag:summary", "lg-eng"),
        ("rag:summary", "lg-spa"),
        ("rag:transcription", "lg-spa"),
    }
    assert report.chunks_embedded == len(client.embedded) == sum(len(v) for v in docs.values())

    summary = docs[("rag:summary", "lg-spa")][0]
    meta = json.loads(summary["chunk_meta"])
    assert meta["contributors"] == ["oh23", "oh24"] and meta["group"] == "summary"
    assert meta["title"] == "Rosario Vidal: el pantano"
    assert summary["projects"] == [1, 2]
    # Accent-folded lexical text: "pantáno" in the source is stored as "pantano".
    assert "pantáno" in summary["source_text"] and "pantano" in summary["lexical_text"]
    assert "pantáno" not in summary["lexical_text"] and "rosario vidal" in summary["lexical_text"]
    vector = np.asarray(summary["embedding"].to_numpy())
    assert vector.shape == (384,) and abs(float(np.linalg.norm(vector)) - 1.0) < 1e-3
    assert summary["sparse"] is None  # MiniLM has no sparse head

    turns = docs[("rag:transcription", "lg-spa")]
    assert [r["chunk_index"] for r in turns] == list(range(len(turns)))
    metas = [json.loads(r["chunk_meta"]) for r in turns]
    assert all(m["contributors"] == ["rsc36"] for m in metas)
    assert metas[0]["tc_in"] == "00:00:04.000"
    assert any(m["tc_in"] == "00:01:02.000" and m["tc_out"] == "00:02:15.250" for m in metas)
    assert all(0 < r["token_count"] <= 256 for r in turns)
    # What is stored is what the chunker cut, text and hash alike.
    expected = chunk(
        record(1)["groups"]["transcription"]["lg-spa"],
        title="Rosario Vidal: el pantano",
        max_tokens=60,
        min_tokens=10,
        mode="transcription",
    )
    assert [r["source_hash"] for r in turns] == [c.source_hash for c in expected]
    assert [r["source_text"] for r in turns] == [c.text for c in expected]

    # The same record again: nothing embedded, nothing rewritten.
    before = await text_rows(pool)
    report = await _index(pool, client, record(1))
    assert client.embedded == [] and report.rows_written == 0 and report.indexed == 1
    assert [r["updated_at"] for r in await text_rows(pool)] == [r["updated_at"] for r in before]


async def test_editing_one_group_re_embeds_only_its_changed_chunks(
    pool: asyncpg.Pool, client: CountingClient
) -> None:
    await _index(pool, client, record(1), record(2))
    before = {
        (r["section_id"], r["component_tipo"], r["lang"], r["chunk_index"]): r for r in await text_rows(pool)
    }

    edited = record(1)
    edited["groups"]["summary"]["lg-eng"] = "Rosario remembers the day the church bell went under the water."
    report = await _index(pool, client, edited)
    assert len(client.embedded) == 1 and "church bell" in client.embedded[0]
    assert report.rows_written == 1
    after = {
        (r["section_id"], r["component_tipo"], r["lang"], r["chunk_index"]): r for r in await text_rows(pool)
    }
    changed = {k for k in after if after[k]["updated_at"] != before[k]["updated_at"]}
    assert changed == {(1, "rag:summary", "lg-eng", 0)}

    # One transcription turn edited: only the chunks whose text changed are embedded.
    edited["groups"]["transcription"]["lg-spa"] = edited["groups"]["transcription"]["lg-spa"].replace(
        "trasladado a cajas", "trasladado en cajas numeradas"
    )
    old = {
        c.source_hash
        for c in chunk(
            record(1)["groups"]["transcription"]["lg-spa"],
            title="Rosario Vidal: el pantano",
            max_tokens=60,
            min_tokens=10,
            mode="transcription",
        )
    }
    new = chunk(
        edited["groups"]["transcription"]["lg-spa"],
        title="Rosario Vidal: el pantano",
        max_tokens=60,
        min_tokens=10,
        mode="transcription",
    )
    fresh = [c.embed_text for c in new if c.source_hash not in old]
    assert 1 <= len(fresh) < len(new)
    await _index(pool, client, edited)
    assert sorted(client.embedded) == sorted(fresh)


async def test_moved_chunks_reuse_their_vectors(pool: asyncpg.Pool, client: CountingClient) -> None:
    await _index(pool, client, record(1))
    moved = record(1)
    moved["groups"]["transcription"]["lg-spa"] = (
        "[TC_00:00:01.000_TC] Entrevistadora: Empezamos la grabación en su cocina.\n"
        + moved["groups"]["transcription"]["lg-spa"]
    )
    before = {r["source_hash"]: r["embedding"] for r in await text_rows(pool)}
    await _index(pool, client, moved)
    assert len(client.embedded) == 1 and "cocina" in client.embedded[0]
    rows = [r for r in await text_rows(pool) if r["component_tipo"] == "rag:transcription"]
    assert rows[0]["source_text"].startswith("Entrevistadora: Empezamos")
    for r in rows[1:]:  # shifted one place down, same vector as before
        assert r["embedding"] == before[r["source_hash"]]


async def test_removed_groups_languages_and_texts_are_pruned(
    pool: asyncpg.Pool, client: CountingClient
) -> None:
    await _index(pool, client, record(1), record(2))
    smaller = record(1)
    del smaller["groups"]["summary"]["lg-eng"]
    del smaller["groups"]["transcription"]
    report = await _index(pool, client, smaller)
    assert client.embedded == [] and report.rows_deleted > 0
    assert set(_by_doc(await text_rows(pool, section_id=1))) == {("rag:summary", "lg-spa")}
    # All texts empty: valid, indexes to nothing, the old rows go.
    await _index(pool, client, record(1, groups={"summary": {"lg-spa": "  \n "}}))
    assert await text_rows(pool, section_id=1) == []
    assert len(await text_rows(pool, section_id=2)) > 0  # the neighbour is untouched
    # A group the descriptor no longer declares is pruned at the next index.
    await SectionStore(pool).put("oh1", {"embed": ORAL_HISTORY["embed"][1:]})
    await enqueue_records(
        pool, [{**record(2), "groups": {"transcription": record(2)["groups"]["transcription"]}}]
    )
    await SectionStore(pool).put("oh1", {"embed": ORAL_HISTORY["embed"][:1]})
    client.embedded.clear()
    await drain_once(pool, client, SETTINGS, text_model=TEXT_MODEL)
    assert await text_rows(pool, section_id=2) == []


async def test_a_delete_removes_every_row_of_the_record(pool: asyncpg.Pool, client: CountingClient) -> None:
    await _index(pool, client, record(1), record(2))
    await queue.enqueue(pool, [queue.Job("oh1", 1, "delete")])
    report = await drain_once(pool, client, SETTINGS, text_model=TEXT_MODEL)
    assert report.deleted == 1 and report.rows_deleted > 0
    assert await text_rows(pool, section_id=1) == [] and await text_rows(pool, section_id=2) != []


async def test_a_project_change_rewrites_rows_without_embedding(
    pool: asyncpg.Pool, client: CountingClient
) -> None:
    await _index(pool, client, record(1))
    count = len(await text_rows(pool))
    report = await _index(pool, client, record(1, projects=[7]))
    assert client.embedded == [] and report.rows_written == count
    assert {tuple(r["projects"]) for r in await text_rows(pool)} == {(7,)}


async def test_sparse_weights_are_stored_when_the_model_returns_them(
    pool: asyncpg.Pool, client: CountingClient
) -> None:
    await _index(pool, client, record(1), model=SPARSE_MODEL)
    rows = await text_rows(pool, model=SPARSE_MODEL)
    assert rows and all(r["sparse"] is not None for r in rows)
    sparse = rows[0]["sparse"]
    assert sparse.dimensions() == SPARSE_DIMENSION and len(sparse.indices()) > 0
    assert all(v > 0 for v in sparse.values())
    # The dense rows of the other model are a separate partition, untouched.
    assert await text_rows(pool, model=TEXT_MODEL) == []


async def test_chunks_are_refit_to_the_model_input_limit(pool: asyncpg.Pool, client: CountingClient) -> None:
    # CJK: the chunker's estimate (4 characters a token) undercounts MiniLM's tokenizer about
    # fourfold, so the first cut is far over the 256-token limit and must be refit.
    cjk = "水库建成以后村里的人都搬走了。" * 120
    report = await _index(pool, client, record(1, groups={"summary": {"lg-zho": cjk}}))
    rows = await text_rows(pool)
    assert len(rows) > 4 and report.truncated == 0
    assert all(r["token_count"] <= 256 for r in rows)
    assert "".join(r["source_text"] for r in rows) == cjk


async def test_what_cannot_fit_is_embedded_truncated_and_counted(
    sidecar_url: str, pool: asyncpg.Pool
) -> None:
    """The last guard: a chunker that ignores the budget still never earns a 422."""

    def whole(text: str, **kwargs: Any):
        return chunk(text, **{**kwargs, "max_tokens": 100_000, "min_tokens": 0})

    await enqueue_records(pool, [record(1, groups={"summary": {"lg-eng": "word " * 600}})])
    items = await queue.claim_ready(pool, 10, 5, lease=queue.Lease("test", 60))
    async with CountingClient(sidecar_url) as client:
        model = await resolve_model(client, "text", TEXT_MODEL)
        partition = await ensure_partition(pool, model.id, model.dimension or 0)
        indexer = Indexer(pool, client, model, partition, chunk_fn=whole)
        plans = await indexer.prepare(items)
        await indexer.fit(plans)
        await indexer.embed(plans)
        assert plans[0].error is None and indexer.truncations(plans[0]) == 1
        await indexer.load_moved_vectors(plans[0])
        async with pool.acquire() as conn, conn.transaction():
            await indexer.write(conn, plans[0])
    (row,) = await text_rows(pool)
    assert row["token_count"] == 256 and json.loads(row["chunk_meta"])["truncated"] is True


async def test_the_demo_collection_indexes_through_the_intake_path(
    db_pool: asyncpg.Pool, client: CountingClient
) -> None:
    assert await load_demo(db_pool) == len(demo_records()) == 13
    report = await drain_once(db_pool, client, SETTINGS, text_model=TEXT_MODEL)
    assert (report.indexed, report.failed, report.truncated) == (13, 0, 0)
    rows = await text_rows(db_pool)
    assert {(r["section_tipo"], r["section_id"]) for r in rows} == {
        (r["section_tipo"], r["section_id"]) for r in demo_records()
    }
    assert {r["lang"] for r in rows} == {"lg-spa", "lg-eng", "lg-cat", "lg-deu"}
    metas = [json.loads(r["chunk_meta"]) for r in rows]
    assert any(m["page"] == 2 and m["heading_path"][-1] == "Las ánforas" for m in metas)
    assert any(m["tc_in"] == "00:01:02.000" for m in metas)
    # Accent-folded lexical search finds the inventory number and the reservoir.
    hits = await db_pool.fetch(
        "SELECT DISTINCT section_id FROM rag_embeddings WHERE lexical @@ plainto_tsquery('simple', $1)",
        "mac-2231",
    )
    assert {h["section_id"] for h in hits} == {201}
    hits = await db_pool.fetch(
        "SELECT DISTINCT section_id FROM rag_embeddings WHERE lexical @@ to_tsquery('simple', 'cementerio')"
    )
    assert {h["section_id"] for h in hits} == {1}
