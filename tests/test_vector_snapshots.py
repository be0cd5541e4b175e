"""The CPU vector cache mapped from snapshots on disk (RAG_FAISS_CACHE=mmap) answers exactly as the
SQL leg does, sees what changed after its snapshot, picks up a snapshot swapped in, and shares the
file's pages with another process (real PostgreSQL, real files, a second real process)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.access.auth import Principal
from index.follow.swap_folders import current_folder
from index.store.change_feed import Watermark
from index.store.hits import Scope
from index.store.partitions import ModelPartition
from index.store.store import delete_record
from index.vectors.files import KEYS_FILE, STATE_FILE, VECTORS_FILE
from index.vectors.mapped_cache import MappedVectorCache
from index.vectors.mapped_flat import MappedFlatIndex
from index.vectors.packed_scopes import PackedScopes
from index.vectors.partition import CacheConfig
from index.vectors.slot_keys import SnapshotKeys
from index.vectors.snapshot_build import SnapshotBuilder
from index.vectors.writer import VectorWriter
from tests.test_vector_cache import (
    DIM,
    SECTIONS,
    _cached,
    _exact,
    _populate,
    _same,
    _scope,
    _write,
    principals,
    scopes,
)

WRITER_CONFIG = CacheConfig(max_bytes=2**62, cpu_broad_scan_max=0)


def test_a_snapshot_merged_from_runs_holds_every_row_in_key_order(tmp_path) -> None:
    """Batches in the store's key order (section_id numerically) become a snapshot in the encoded
    keys' order (bytewise: 12 before 2), merged a few rows of each run at a time."""
    partition = ModelPartition("m", 3, "vector", "p")
    keys = [("oh1", i, "c", "lg-eng", "", chunk) for i in range(1, 40) for chunk in (0, 1)]
    vectors = np.random.default_rng(0).standard_normal((len(keys), 3)).astype(np.float32)
    folder = tmp_path / "v-1"
    folder.mkdir()
    builder = SnapshotBuilder(folder, partition, merge_rows=5)
    for start in range(0, len(keys), 11):
        builder.add(keys[start : start + 11], vectors[start : start + 11])
    state = builder.finish(Watermark(7, 3), "a/store")
    assert (state.rows, state.watermark, sorted(p.name for p in folder.iterdir())) == (
        len(keys), Watermark(7, 3), sorted([KEYS_FILE, VECTORS_FILE, STATE_FILE])
    )  # fmt: skip
    stored = np.load(folder / KEYS_FILE)
    assert list(stored) == sorted(stored) and len(set(stored)) == len(keys)
    mapped = SnapshotKeys(stored)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    written = np.fromfile(folder / VECTORS_FILE, dtype=np.float32).reshape(-1, 3)
    for key, vector in zip(keys, unit, strict=True):
        assert np.allclose(written[mapped.find(key)], vector)


async def _changes(pool, partition, seed: int) -> None:
    """New records, rewritten ones and deleted ones, after the snapshot."""
    rng = random.Random(seed)
    for record in rng.sample(range(1, 140), 15):  # 121.. are new
        await _write(pool, partition, rng, record)
    async with pool.acquire() as conn:
        for record in rng.sample(range(1, 121), 5):
            await delete_record(conn, (SECTIONS[record % 3], record))


@pytest.fixture
async def mapped(db_pool, database_url, tmp_path):
    """A snapshot of 120 records, then changes the reader applies on top of the mapped file."""
    partition = await _populate(db_pool, 120)
    # Read 37 rows at a time: the snapshot is merged from runs whose keys interleave (the store
    # orders section 12 after 2, a snapshot before it).
    writer = VectorWriter(db_pool, database_url, tmp_path, config=replace(WRITER_CONFIG, load_batch=37))
    await writer.rebuild(partition)
    await writer.stop()
    await _changes(db_pool, partition, 11)
    reader = MappedVectorCache(db_pool, database_url, CacheConfig(mode="mmap", snapshot_root=tmp_path))
    await reader.load(partition)
    # Before the reader applies them, the changes are already in its answers (re-read as pending keys).
    q = np.random.default_rng(2).standard_normal(DIM).astype(np.float32)
    _same(
        await _cached(reader, db_pool, partition, q, Scope(), 20),
        await _exact(db_pool, partition, q, Scope(), 20),
    )
    assert await reader.sync() > 0
    yield db_pool, partition, reader, tmp_path
    await reader.stop()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(principal=principals, raw=scopes, seed=st.integers(0, 2**31), k=st.sampled_from([1, 5, 20, 60]))
async def test_mapped_cache_equals_exact_sql_under_random_scopes(mapped, principal, raw, seed, k) -> None:
    pool, partition, cache, _ = mapped
    pc = cache.partitions[partition.partition]
    assert isinstance(pc.index, MappedFlatIndex) and pc.state == "ready"
    q = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    scope = _scope(principal, raw)
    exact = await _exact(pool, partition, q, scope, k)
    packing = cache.packed
    _same(await _cached(cache, pool, partition, q, scope, k), exact)
    cache.packed = PackedScopes(0, 0)  # and through the bitmap over every (mapped and private) slot
    try:
        _same(await _cached(cache, pool, partition, q, scope, k), exact)
    finally:
        cache.packed = packing


async def test_missing_snapshot_is_left_to_pgvector_and_counted(db_pool, database_url, tmp_path) -> None:
    partition = await _populate(db_pool, 5)
    cache = MappedVectorCache(db_pool, database_url, CacheConfig(mode="mmap", snapshot_root=tmp_path))
    await cache.load(partition)
    assert cache.partitions[partition.partition].state == "missing"
    async with db_pool.acquire() as conn:
        assert await cache.search(conn, partition, np.ones(DIM, np.float32), Scope(), 5) is None
    assert cache.metrics.searches.labels("missing")._value.get() == 1
    writer = VectorWriter(db_pool, database_url, tmp_path)
    await writer.rebuild(partition)
    await writer.stop()
    await cache.sync()  # the first snapshot is mapped at the next sync
    assert cache.partitions[partition.partition].state == "ready"
    await cache.stop()


async def folder_status(group: str, database_url: str, root: Path) -> dict:
    """`mnemo <group> status --json`'s partitions, from a real process."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", group, "status", "--json", "--database-url", database_url,
        "--dir", str(root), stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await process.communicate()
    assert process.returncode == 0
    return json.loads(out)["partitions"]


async def test_a_snapshot_of_another_store_is_not_mapped_and_is_rebuilt(
    db_pool, database_url, tmp_path
) -> None:
    """A snapshot's watermark numbers its own store's changes: one left from a reset database (or
    another deployment's folder) would pass for caught up and serve its vectors. Readers leave it to
    pgvector, the writer rebuilds it instead of resuming from it."""
    partition = await _populate(db_pool, 5)
    writer = VectorWriter(db_pool, database_url, tmp_path)
    await writer.rebuild(partition)
    await writer.stop()
    folder = current_folder(tmp_path, partition)
    assert folder is not None
    raw = json.loads((folder / STATE_FILE).read_text())
    assert raw["store"]  # this store's identity, written with the snapshot
    (folder / STATE_FILE).write_text(json.dumps({**raw, "store": "another/store"}))
    cache = MappedVectorCache(db_pool, database_url, CacheConfig(mode="mmap", snapshot_root=tmp_path))
    await cache.load(partition)
    assert cache.partitions[partition.partition].state == "foreign"
    async with db_pool.acquire() as conn:
        assert await cache.search(conn, partition, np.ones(DIM, np.float32), Scope(), 5) is None
        assert (await cache.snapshots(conn, [partition], 10_000))[partition.partition]["state"] == "foreign"
    await cache.sync()  # the same foreign folder: not mapped again
    assert cache.partitions[partition.partition].state == "foreign"
    assert (await folder_status("vectors", database_url, tmp_path))[partition.partition]["state"] == "foreign"
    writer = VectorWriter(db_pool, database_url, tmp_path)
    await writer.load(partition)
    await writer.stop()
    rebuilt = current_folder(tmp_path, partition)
    assert rebuilt is not None and rebuilt != folder
    await cache.sync()
    assert cache.partitions[partition.partition].state == "ready"
    assert (await folder_status("vectors", database_url, tmp_path))[partition.partition]["state"] == "ready"
    q = np.random.default_rng(3).standard_normal(DIM).astype(np.float32)
    _same(
        await _cached(cache, db_pool, partition, q, Scope(), 5),
        await _exact(db_pool, partition, q, Scope(), 5),
    )
    await cache.stop()


async def test_writer_past_its_threshold_swaps_a_snapshot_that_readers_map(mapped, database_url) -> None:
    pool, partition, cache, root = mapped
    before = cache.partitions[partition.partition].folder
    writer = VectorWriter(pool, database_url, root, snapshot_changes=1)
    await writer.load(partition)  # maps the snapshot the fixture wrote, then catches up
    assert writer.partitions[partition.partition].folder == before
    await writer.sync()  # the fixture's changes pass the threshold: a new snapshot, swapped in
    after = current_folder(root, partition)
    assert after is not None and after != before and not before.exists()
    await writer.stop()
    await cache.sync()
    pc = cache.partitions[partition.partition]
    assert pc.folder == after and pc.slot_of.overlay == {}  # a fresh mapping: nothing private to apply
    assert pc.live == await pool.fetchval(f"SELECT count(*) FROM {partition.table}")
    principal = Principal("p", frozenset({1, 2}), {"oh1": 1, "rsc1": 1}, admin=False)
    for seed in range(5):
        q = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
        for scope in (Scope(exclude_record=("rsc1", 1)), _scope(principal, ((SECTIONS[0],), None, 4))):
            _same(
                await _cached(cache, pool, partition, q, scope, 10),
                await _exact(pool, partition, q, scope, 10),
            )


def _mapping(path: Path) -> dict[str, int]:
    """This process's smaps fields (kB) for its mapping of ``path``."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.endswith(str(path)):
            fields = {}
            for row in lines[i + 1 :]:
                name, _, rest = row.partition(":")
                if not rest.strip().endswith("kB"):
                    break
                fields[name] = int(rest.split()[0])
            return fields
    raise AssertionError(f"{path} is not mapped")


async def test_two_processes_share_the_snapshot_pages(mapped) -> None:
    _pool, partition, cache, root = mapped
    vectors = current_folder(root, partition) / VECTORS_FILE
    code = textwrap.dedent(f"""
        import sys
        import numpy as np
        v = np.memmap({str(vectors)!r}, dtype=np.float32, mode="c")
        print(float(v.sum()), flush=True)  # touches every page
        sys.stdin.read()
        """)
    # Another worker: maps the same file, reads every page, and holds the mapping until told.
    other = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    try:
        other_sum = float((await other.stdout.readline()).decode())
        pc = cache.partitions[partition.partition]
        base = pc.index._base
        float(base.sum())  # this process reads every page too
        pages = _mapping(vectors)
        # Pages this process never wrote are the page cache's, held by both processes; the pages
        # the fixture's updates rewrote are this process's own copies (copy-on-write).
        assert pages["Shared_Clean"] > 0 and pages["Private_Dirty"] > 0
        assert pages["Shared_Clean"] + pages["Private_Dirty"] == pages["Rss"]
        # Nothing was written through to the file the other process (and the writer) sees.
        on_disk = np.fromfile(vectors, dtype=np.float32).reshape(base.shape)
        assert not np.array_equal(on_disk, np.asarray(base))
        assert other_sum == pytest.approx(float(on_disk.sum()), rel=1e-5)
    finally:
        other.stdin.close()
        await other.wait()


def test_snapshot_keys_find_every_key_and_record_whatever_their_texts() -> None:
    """Binary search over encoded keys: texts that JSON escapes, records whose ids share a prefix
    (1, 10, 100), and keys or records that are absent."""
    from index.vectors.slot_keys import KeyOf, RecordSlots, SlotOf, SnapshotKeys, encode_keys

    keys = [
        (section, record, component, lang, "", chunk)
        for section in ("oh1", 'q"uote', "ñandú", "a\\b")
        for record in (1, 10, 100, -1)
        for component, lang in (("rag:card", "lg-spa"), ("oh22", "lg-€"))
        for chunk in (0, 1)
    ]
    encoded = encode_keys(keys)
    order = np.argsort(encoded, kind="stable")
    base = SnapshotKeys(encoded[order])
    slot_of, key_of, records = SlotOf(base), KeyOf(base), RecordSlots(base)
    for slot, i in enumerate(order):
        assert slot_of[keys[i]] == slot and key_of[slot] == keys[i]
    for section in ("oh1", 'q"uote', "ñandú", "a\\b"):
        for record in (1, 10, 100, -1):
            assert {key_of[s] for s in records.get((section, record))} == {
                k for k in keys if k[:2] == (section, record)
            }
    assert ("oh1", 2, "rag:card", "lg-spa", "", 0) not in slot_of
    assert records.get(("oh1", 1000)) is None
    del slot_of[keys[0]]
    assert keys[0] not in slot_of and len(slot_of) == len(keys) - 1
