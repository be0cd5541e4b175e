"""Rows become hits exactly as the dataclass would build them, and ``chunk_meta`` is decoded only when read.

The legs turn every row into a :class:`ChunkHit` through a fast path (issue 15: ~80 rows per search were
11% of the gateway's samples under load): fields set at once, columns read by position, the jsonb
``chunk_meta`` kept as text until something reads it (an admin's search never does).
"""

from __future__ import annotations

import json
import pickle

import asyncpg
import numpy as np
import pytest

from index.search.bm25 import CorpusStats
from index.search.dense_leg import dense_search
from index.search.lexical_leg import lexical_search
from index.store.hits import ChunkHit, JsonMeta, Scope
from index.store.neighbours import document_window
from index.store.partitions import ensure_partition
from index.store.store import EmbeddingRow, copy_rows

DIM = 8
MODEL = "hit-rows-8"
METAS = [
    {"contributors": ["c1", "oh1/c2"], "title": "Ánfora ática", "heading_path": ["A", "B"], "page": 3},
    {"title": "", "heading_path": [], "tc_in": "00:01:02", "tc_out": "00:01:09"},
    {},
]


async def _load(pool: asyncpg.Pool):  # type: ignore[no-untyped-def]
    partition = await ensure_partition(pool, MODEL, DIM)
    rng = np.random.default_rng(5)
    rows = [
        EmbeddingRow("text", "oh1", i // 3 + 1, "rag:card" if i % 2 else "oh25", "lg-spa", i % 3, f"h{i}",
                     f"amphora number {i} red figure", f"amphora number {i} red figure",
                     rng.standard_normal(DIM).astype(np.float32), parent_key=None if i % 2 else f"p{i}",
                     projects=[1, 2] if i % 2 else [], chunk_meta=METAS[i % 3])
        for i in range(12)
    ]  # fmt: skip
    async with pool.acquire() as conn:
        await copy_rows(conn, partition, rows)
    return partition, {(*r.record, r.component_tipo, r.lang, r.chunk_index): r for r in rows}


def _expected(row: EmbeddingRow, score: float) -> ChunkHit:
    return ChunkHit(
        section_tipo=row.section_tipo, section_id=row.section_id, component_tipo=row.component_tipo,
        lang=row.lang, chunk_index=row.chunk_index, text=row.source_text, meta=row.chunk_meta,
        projects=tuple(row.projects), parent_key=row.parent_key, score=score,
    )  # fmt: skip


async def test_leg_rows_are_the_hits_the_constructor_builds(db_pool: asyncpg.Pool) -> None:
    partition, stored = await _load(db_pool)
    async with db_pool.acquire() as conn:
        dense = await dense_search(conn, partition, np.ones(DIM, np.float32), Scope(), 20)
        lexical = await lexical_search(conn, partition, "amphora figure", Scope(), 20, stats=CorpusStats())
        window = await document_window(conn, partition, dense[0].key, 2, 2)
    assert len(dense) == len(lexical) == 12 and window
    for hit in [*dense, *lexical, *window]:
        expected = _expected(stored[hit.key], hit.score)
        assert hit == expected  # (repr aside: jsonb orders the keys its own way)
        assert hit.key == expected.key and hit.record == expected.record
        assert dict(hit.meta) == expected.meta and type(hit.projects) is tuple
        assert hit.vector is None
        assert pickle.loads(pickle.dumps(hit)) == expected


async def test_meta_is_decoded_only_when_something_reads_it(db_pool: asyncpg.Pool) -> None:
    partition, stored = await _load(db_pool)
    async with db_pool.acquire() as conn:
        hits = await dense_search(conn, partition, np.ones(DIM, np.float32), Scope(), 20)
    assert all(isinstance(h.meta, JsonMeta) and not h.meta.decoded for h in hits)
    group = next(h for h in hits if h.key == ("oh1", 2, "rag:card", "lg-spa", 0))  # row 3: METAS[0]
    assert group.meta.get("contributors") == ["c1", "oh1/c2"] == stored[group.key].chunk_meta["contributors"]
    assert group.meta.decoded and sum(h.meta.decoded for h in hits) == 1


def test_json_meta_reads_as_its_object() -> None:
    meta = JsonMeta('{"title": "x", "page": 2}')
    assert meta == {"title": "x", "page": 2} and {"title": "x", "page": 2} == meta
    assert meta.get("page") == 2 and meta.get("missing") is None and "title" in meta
    assert len(meta) == 2 and list(meta) == ["title", "page"] and dict(meta) == {"title": "x", "page": 2}
    assert JsonMeta("[1, 2]") == {} and JsonMeta("null").get("contributors") is None  # fails closed
    broken = JsonMeta("{not json")  # nothing is decoded before a read
    with pytest.raises(json.JSONDecodeError):
        broken.get("title")
