"""The one writer of the lexical leg's Tantivy indexes: builds them from the store and follows the feed.

``mnemo lexical follow`` runs it (a process beside the gateways and the drain; the gateways only
read). Per partition it takes the writer lock (:func:`index.lexical.files.writer_lock`), opens the
current index and resumes from the watermark stored beside it, or builds the index from the store
when there is none. Then it follows the change feed (:class:`index.follow.feed_follower.FeedFollower`): each
pass deletes every changed key's document, adds the key's current row when it is still a text row,
commits, and only then writes the new watermark. A pass replayed after a crash does the same work
again and ends in the same index: no row missing, none duplicated.

``mnemo lexical rebuild`` (:meth:`LexicalWriter.rebuild`) builds into a new folder from the store
(the watermark read first, so whatever commits during the build is replayed by the follower), then
swaps it in atomically; readers reopen on their next search.

A build's memory does not grow with the store: it reads :attr:`WriterConfig.build_batch` rows at a
time (the next batch while Tantivy indexes the last), adds them without deleting anything (the
folder is new), and Tantivy writes a segment each time its heap (``RAG_LEXICAL_WRITER_MEMORY``)
fills. At 1M chunks the writer peaked at 276 MiB of RSS (243 MiB private), 1.6 GiB before.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import tantivy

from index.follow.feed_follower import FeedFollower
from index.lexical.files import (
    FORMAT,
    IndexState,
    create_index,
    current_folder,
    document,
    key_text,
    lexical_schema,
    new_folder,
    partition_folder,
    read_state,
    swap_in,
    write_state,
    writer_lock,
)
from index.lexical.metrics import LexicalMetrics
from index.search.access_classes import LEXICAL_ROW_COLUMNS, AccessClass
from index.settings import IngestSettings
from index.store.change_feed import (
    KEY_COLUMNS,
    RowKey,
    Watermark,
    changed_rows,
    current_watermark,
    row_key,
    store_identity,
)
from index.store.partitions import ModelPartition, list_partitions

log = logging.getLogger(__name__)

__all__ = ["LexicalWriter", "PartitionWriter", "WriterConfig"]


@dataclass(frozen=True)
class WriterConfig:
    poll_s: float = 5.0  # safety net: catch up this often even without a notification
    # Rows per keyset read of a build, two batches in memory at a time (one read while the last is
    # indexed): several KiB a row in Python (its lexemes, its document); at 1M chunks the writer
    # peaked 95 MiB lower than with one batch of 20,000 at a time.
    build_batch: int = 5_000
    # Tantivy's indexing memory (one thread: these hosts have 2 cores): RAG_LEXICAL_WRITER_MEMORY.
    heap_bytes: int = IngestSettings.lexical_writer_memory * 2**20

    def __post_init__(self) -> None:
        if self.build_batch < 1 or self.heap_bytes < 16 * 2**20 or self.poll_s <= 0:
            raise ValueError("writer config: build_batch >= 1, heap_bytes >= 16 MiB, poll_s > 0")


@dataclass
class PartitionWriter:
    """One partition's open index, its Tantivy writer and what its last commit holds."""

    partition: ModelPartition
    folder: Path
    index: tantivy.Index
    writer: tantivy.IndexWriter
    committed: IndexState  # what the last commit holds (its watermark file)
    classes: dict[int, AccessClass] = field(default_factory=dict)
    state: str = "ready"  # FeedFollower's partition state

    @classmethod
    def open(cls, folder: Path, partition: ModelPartition, heap_bytes: int) -> PartitionWriter:
        if not (folder / "meta.json").exists():
            create_index(folder)
        index = tantivy.Index(lexical_schema(), path=str(folder), reuse=True)
        committed = read_state(folder) or IndexState(Watermark(0, 0))
        writer = index.writer(heap_bytes, 1)
        return cls(partition, folder, index, writer, committed, dict(committed.classes))

    def apply(self, rows: Sequence[asyncpg.Record]) -> tuple[int, int]:
        """Stage rows read with :data:`LEXICAL_ROW_COLUMNS` after their key: each key's document is
        deleted, and a present row (non-NULL length) added again. Returns (upserts, deletes)."""
        upserts = deletes = 0
        for row in rows:
            key: RowKey = row_key(row)
            # Deletes apply to documents added before them (Tantivy's opstamps): delete, then add.
            self.writer.delete_documents_by_term("key", key_text(key))
            if self._add(row):
                upserts += 1
            else:
                deletes += 1
        return upserts, deletes

    def add(self, rows: Sequence[asyncpg.Record]) -> int:
        """Stage a build's rows (each key once, into an index that holds none of them): the present
        ones are added, nothing is deleted. A delete waits in Tantivy's queue until the commit that
        applies it: one per row of a build held about 1.2 KiB a row until the end (1.2 GiB of the
        writer's 1.6 GiB at 1M chunks). Returns the rows added."""
        return sum(self._add(row) for row in rows)

    def _add(self, row: asyncpg.Record) -> bool:
        """Add the row's document when it is present (a non-NULL length); whether it was."""
        if row["lexical_length"] is None:
            return False
        doc, klass, access = document(row)
        self.writer.add_document(doc)
        self.classes.setdefault(klass, access)
        return True

    def commit(self, state: IndexState) -> IndexState:
        """Commit what was staged, then (never before) write the watermark that describes it."""
        self.writer.commit()
        self.index.reload()
        store = state.store or self.committed.store  # a build names its store; a sync keeps it
        done = IndexState(state.watermark, dict(self.classes), self.index.searcher().num_docs, store)
        write_state(self.folder, done)
        self.committed = done
        return done

    def close(self) -> None:
        """Let Tantivy's merges finish and drop the writer (its lock file goes with it); once."""
        if self.state != "closed":
            self.state = "closed"
            self.writer.wait_merging_threads()


async def _rows_after(
    conn: asyncpg.Connection, partition: ModelPartition, after: RowKey | None, limit: int
) -> list[asyncpg.Record]:
    """The next ``limit`` text rows of the partition after key ``after``, in key order."""
    cols = ", ".join("e." + c for c in KEY_COLUMNS)
    where = "e.modality = 'text'"
    args: list[object] = [partition.model]
    if after is not None:
        marks = ", ".join(f"${i + 2}" for i in range(len(after)))
        where += f" AND ({cols}) > ({marks})"
        args.extend(after)
    return await conn.fetch(
        f"""SELECT {cols}, {LEXICAL_ROW_COLUMNS} FROM {partition.table} e
            WHERE e.model = $1 AND {where} ORDER BY {cols} LIMIT {int(limit)}""",
        *args,
    )


class LexicalWriter(FeedFollower):
    """Every partition's Tantivy index: opened (or built), then kept current from the change feed."""

    label = "lexical writer"
    serves = "nothing (readers fall back to the SQL leg)"
    partitions: dict[str, PartitionWriter]

    def __init__(
        self,
        pool: asyncpg.Pool,
        database_url: str,
        root: Path,
        config: WriterConfig | None = None,
        metrics: LexicalMetrics | None = None,
    ) -> None:
        self.config = config or WriterConfig()
        super().__init__(pool, database_url, self.config.poll_s)
        self.root = root
        self.metrics = metrics or LexicalMetrics()
        self._locks = contextlib.ExitStack()
        self._locked: set[str] = set()

    @property
    def enabled(self) -> bool:
        return True

    def _lock(self, partition: ModelPartition) -> None:
        """Take the partition's writer lock once per writer (held until :meth:`stop`)."""
        if partition.partition not in self._locked:
            self._locks.enter_context(writer_lock(partition_folder(self.root, partition)))
            self._locked.add(partition.partition)

    async def start(self, *, listen: bool = True) -> None:
        """Take the lexical folder's follower lock (a second follower fails here, loudly), then load
        every partition in the background and follow the feed."""
        self._locks.enter_context(writer_lock(self.root))
        await super().start(listen=listen)

    async def load(self, partition: ModelPartition) -> PartitionWriter:
        """Open the partition's current index and resume from its watermark; build it when there is none."""
        self._lock(partition)
        folder = current_folder(self.root, partition)
        state = None if folder is None else read_state(folder)
        if state is None:
            return await self.rebuild(partition)
        async with self.pool.acquire() as conn:
            store = await store_identity(conn)
        if state.store != store:
            # Built from another database (or before identities were recorded): its watermark means
            # nothing here, so it is rebuilt rather than resumed.
            log.warning(
                "lexical writer: %s was built from another store (%r, this is %r); rebuilding",
                partition.partition,
                state.store,
                store,
            )
            return await self.rebuild(partition)
        if state.format != FORMAT:  # documents of another layout: resumed, they would mix with new ones
            log.warning(
                "lexical writer: %s holds format %d documents (this writer writes %d); rebuilding",
                partition.partition,
                state.format,
                FORMAT,
            )
            return await self.rebuild(partition)
        held = await asyncio.to_thread(PartitionWriter.open, folder, partition, self.config.heap_bytes)
        self.partitions[partition.partition] = held
        self._set_state(held, "ready")
        log.info(
            "lexical writer: %s opened at seq %d (%d documents); catching up",
            partition.partition,
            held.committed.watermark.seq,
            held.committed.documents,
        )
        self.notify(partition.model)
        return held

    async def rebuild(
        self, partition: ModelPartition, progress: Callable[[int], None] | None = None
    ) -> PartitionWriter:
        """Build the partition's index from the store into a new folder and swap it in atomically."""
        self._lock(partition)
        start = time.perf_counter()
        folder = new_folder(self.root, partition)
        built = await asyncio.to_thread(PartitionWriter.open, folder, partition, self.config.heap_bytes)
        try:
            await self._build(built, progress)
        except BaseException:
            # A failed or cancelled build leaves nothing behind: the current index stays as it was.
            await asyncio.to_thread(built.close)
            await asyncio.to_thread(shutil.rmtree, folder, True)
            raise
        old = self.partitions.get(partition.partition)
        if old is not None:
            await asyncio.to_thread(old.close)
        previous = swap_in(self.root, partition, folder)
        self.partitions[partition.partition] = built
        self._set_state(built, "ready")
        if previous is not None and previous != folder:
            # Readers still open on it keep their mapped files (unlinked, not gone) until they reopen.
            await asyncio.to_thread(shutil.rmtree, previous, True)
        seconds = time.perf_counter() - start
        self.metrics.load_seconds.labels(partition.partition).set(seconds)
        self.metrics.chunks.labels(partition.partition).set(built.committed.documents)
        log.info(
            "lexical writer: %s built in %.1fs, %d documents, swapped in (%s)",
            partition.partition,
            seconds,
            built.committed.documents,
            folder.name,
        )
        self.notify(partition.model)
        return built

    async def _build(self, built: PartitionWriter, progress: Callable[[int], None] | None) -> None:
        """Index every text row of the store into ``built`` and commit: keyset batches of
        ``build_batch`` rows, the next one read while the last is indexed (two batches at most in
        memory, beside Tantivy's heap)."""
        partition = built.partition
        adding: asyncio.Future[int] | None = None
        async with self.pool.acquire() as conn:
            # Read before any row: whatever commits during the build is replayed by the follower.
            watermark = await current_watermark(conn, partition)
            store = await store_identity(conn)
            after: RowKey | None = None
            try:
                while True:
                    rows = await _rows_after(conn, partition, after, self.config.build_batch)
                    if adding is not None:
                        await adding
                        adding = None
                    if not rows:
                        break
                    adding = asyncio.ensure_future(asyncio.to_thread(built.add, rows))
                    if progress is not None:
                        progress(len(rows))
                    after = row_key(rows[-1])
            finally:  # a read that failed while the last batch was being added: let it end first
                if adding is not None:
                    await adding
        await asyncio.to_thread(built.commit, IndexState(watermark, store=store))

    async def sync(self, models: Iterable[str] | None = None) -> int:
        """Apply, commit and stamp every change after each partition's watermark; returns the keys applied."""
        wanted = None if models is None else set(models)
        # A pass without named models (a poll, a reconnect) also builds partitions first seen since
        # the last: one whose first rows committed before the listener listened has no other cue.
        await self._load_new(
            wanted if wanted is not None else [p.model for p in await list_partitions(self.pool)]
        )
        applied = 0
        for held in list(self.partitions.values()):
            if wanted is None or held.partition.model in wanted:
                applied += await self._sync_partition(held)
        if not self._dirty:
            self._lag_since = None
        return applied

    async def _sync_partition(self, held: PartitionWriter) -> int:
        async with self.pool.acquire() as conn:
            rows, watermark, lags = await changed_rows(
                conn, held.partition, held.committed.watermark, LEXICAL_ROW_COLUMNS
            )
        if not rows:
            if watermark != held.committed.watermark:  # nothing to index: only the watermark moves
                held.committed = dataclasses.replace(held.committed, watermark=watermark)
                await asyncio.to_thread(write_state, held.folder, held.committed)
            return 0
        upserts, deletes = await asyncio.to_thread(held.apply, rows)
        await asyncio.to_thread(held.commit, IndexState(watermark))
        for lag in lags:
            self.metrics.apply_lag.observe(lag)
        self.metrics.changes.labels("upsert").inc(upserts)
        self.metrics.changes.labels("delete").inc(deletes)
        self.metrics.chunks.labels(held.partition.partition).set(held.committed.documents)
        return len(rows)

    async def stop(self) -> None:
        await super().stop()
        for held in self.partitions.values():
            await asyncio.to_thread(held.close)
        self.partitions.clear()
        self._locks.close()
        self._locked.clear()
