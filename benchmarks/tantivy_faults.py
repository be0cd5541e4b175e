"""The Tantivy lexical engine's reliability figures (issue 44), for the reliability suite.

:func:`tantivy_gateway`: ``mnemo lexical follow`` and ``mnemo gateway --workers 2`` on
``RAG_LEXICAL_INDEX=tantivy`` over a loaded store (the suite runs its ACL probe through it, with
:func:`engine_searches` saying how many lexical searches the engine itself served).

:func:`freshness`, through that gateway: records saved one by one through ``POST /v1/records`` (the
gateway's intake and drain). From each save's commit (its change rows' ``changed_at``, taken inside the
drain's transaction, so a little before the commit: the figure errs long) two times: until a
``semantic_search`` through the gateway returns the record with the lexical leg among the legs
that found it (``explain``), and until the writer's committed index holds it (the index's
watermark file passed the record's change). The first is what a caller sees (the engine re-reads
every change past the watermark, so it finds a saved row before the writer applied it); the second
is the writer's own lag.

:func:`writer_killed`: a partition written to without pause while ``mnemo lexical follow`` is killed
with SIGKILL several times, restarted after each kill; after the last, a follower catches up to the
store and the index is compared with PostgreSQL: rows missing from it, rows in it twice, rows in it
that the store no longer holds.

Both are bounded: a record count, a kill count, a deadline per wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .fault_store import _wait_for
from .gateway import api_request
from .measure import metric_samples, percentile

__all__ = [
    "TantivyGateway",
    "engine_searches",
    "freshness",
    "index_keys",
    "lexical_follower",
    "lexicon_word",
    "tantivy_gateway",
    "writer_killed",
]

FRESHNESS_BAR_S = 2.0  # issue 44: found by the lexical leg within 2 s (p95)
KILL_MODEL = "bench-tantivy-kill"  # a partition of its own, 4-d constant vectors (no dense leg read)
_WORDS = ("reservoir", "valley", "silver", "coins", "mill", "amphora", "chariot", "farm", "river", "bridge")


def lexicon_word(rng: random.Random, length: int = 10) -> str:
    """A made-up word of letters only: one lexeme that no other text of the run holds."""
    return "".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(length))


def lexical_follower(
    database_url: str, root: Path, log: Path
) -> contextlib.AbstractAsyncContextManager[asyncio.subprocess.Process]:
    """``mnemo lexical follow`` into ``root`` in a subprocess, logging to ``log``; SIGTERM after
    (a caller may kill it first)."""
    from .processes import mnemo_process

    return mnemo_process(["lexical", "follow", "--database-url", database_url, "--dir", str(root)], log)


def index_keys(root: Path, partition: Any) -> list[tuple[Any, ...]]:
    """Every document's row key in the partition's current committed index (one per document)."""
    import tantivy

    from index.lexical.files import current_folder, key_of

    folder = current_folder(root, partition)
    if folder is None:
        return []
    searcher = tantivy.Index.open(str(folder)).searcher()
    hits = searcher.search(tantivy.Query.all_query(), max(searcher.num_docs, 1)).hits
    return [key_of(searcher.doc(address)["key"][0]) for _score, address in hits]


def _indexed_seq(root: Path, partition: Any) -> int:
    """The change number the partition's committed index holds everything up to (0: none yet)."""
    from index.lexical.files import current_folder, read_state

    folder = current_folder(root, partition)
    state = None if folder is None else read_state(folder)
    return 0 if state is None else state.watermark.seq


async def _until(what: str, check: Callable[[], Any], wait_s: float, every_s: float = 0.02) -> Any:
    """:func:`benchmarks.fault_store._wait_for` for ``wait_s``; past it a TimeoutError naming ``what``."""
    found = await _wait_for(check, asyncio.get_running_loop().time() + wait_s, every_s)
    if not found:
        raise TimeoutError(f"{what}: not within {wait_s:.0f} s")
    return found


def _quantiles(seconds: list[float]) -> dict[str, float]:
    return {
        "p50_s": round(percentile(seconds, 50), 3),
        "p95_s": round(percentile(seconds, 95), 3),
        "max_s": round(max(seconds), 3),
    }


# -- freshness -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TantivyGateway:
    """A running ``mnemo gateway`` on the Tantivy engine, its index folder and the text partition."""

    url: str
    root: Path
    partition: Any  # index.store.partitions.ModelPartition
    workers: int


@contextlib.asynccontextmanager
async def tantivy_gateway(
    database_url: str,
    sidecar_url: str,
    secret: str,
    work_dir: Path,
    *,
    text_model: str,
    workers: int = 2,
    wait_s: float = 120.0,
) -> AsyncIterator[TantivyGateway]:
    """``mnemo lexical follow`` and ``mnemo gateway --workers N`` on ``RAG_LEXICAL_INDEX=tantivy``
    over a store that holds ``text_model``'s partition; yielded once the follower's first build is
    committed (the engine serves from then on)."""
    from index.store.partitions import get_partition
    from schema import create_pool

    from .gateway import gateway_process

    root = work_dir / f"tantivy-{secrets.token_hex(4)}"
    pool = await create_pool(database_url, max_size=1)
    try:
        partition = await get_partition(pool, text_model)
    finally:
        await pool.close()
    if partition is None:
        raise RuntimeError(f"the store holds no partition of {text_model}: load the corpus first")
    async with (
        lexical_follower(database_url, root, work_dir / "tantivy-follow.log"),
        gateway_process(
            database_url,
            sidecar_url,
            secret,
            work_dir / "tantivy-gateway.log",
            text_model=text_model,
            RAG_GATEWAY_WORKERS=str(workers),
            RAG_LEXICAL_INDEX="tantivy",
            RAG_LEXICAL_DIR=str(root),
        ) as gateway,
    ):
        await _until("the follower's first build", lambda: _indexed_seq(root, partition), wait_s)
        yield TantivyGateway(gateway.url, root, partition, workers)


async def freshness(
    gateway: TantivyGateway,
    database_url: str,
    admin: str,
    *,
    records: int = 40,
    section_tipo: str = "rsc1",
    wait_s: float = 30.0,
) -> dict[str, Any]:
    """Records saved one by one through the gateway's intake, each timed from its commit until the
    gateway's lexical leg returns it and until the writer's committed index holds it.

    ``section_tipo`` must have a descriptor with a ``card`` group (the suite's corpus has one); the
    records get ids from 2000 and project 1.
    """
    import aiohttp

    from schema import create_pool

    rng = random.Random(44)
    pool = await create_pool(database_url, max_size=2)
    found_s: list[float] = []
    indexed_s: list[float] = []
    try:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {admin}"}) as session:
            save = _Save(session, gateway.url, pool, gateway.root, gateway.partition, section_tipo, wait_s)
            for n in range(records):
                word = lexicon_word(rng)
                found, indexed = await save.timed(
                    2000 + n, word, f"{rng.choice(_WORDS)} {word} {rng.choice(_WORDS)}"
                )
                found_s.append(found)
                indexed_s.append(indexed)
    finally:
        await pool.close()
    return {
        "records": records,
        "workers": gateway.workers,
        "bar_s": FRESHNESS_BAR_S,
        "found": _quantiles(found_s),
        "indexed": _quantiles(indexed_s),
        "engine_searches": await engine_searches(gateway.url, admin),
    }


class _Save:
    """One record saved through the gateway's intake, then timed from its commit until the gateway's
    lexical leg returns it and until the writer's committed index holds it."""

    def __init__(self, session: Any, url: str, pool: Any, root: Path, partition: Any, section_tipo: str,
                 wait_s: float) -> None:  # fmt: skip
        self.session, self.url, self.pool, self.root = session, url, pool, root
        self.partition, self.section_tipo, self.wait_s = partition, section_tipo, wait_s

    async def timed(self, section_id: int, word: str, text: str) -> tuple[float, float]:
        record = {"section_tipo": self.section_tipo, "section_id": section_id, "projects": [1],
                  "groups": {"card": {"lg-eng": text}}}  # fmt: skip
        async with self.session.post(self.url + "/v1/records", json=record) as r:
            if r.status >= 300:
                raise RuntimeError(f"POST /v1/records: {r.status} {(await r.text())[:200]}")
        change = await _until(f"record {section_id} drained", lambda: self._change(section_id), self.wait_s)
        at, seq = float(change["at"]), int(change["seq"])
        found = _until(
            f"record {section_id} found lexically", lambda: self._found(section_id, word), self.wait_s, 0.05
        )
        indexed = _until(f"record {section_id} in the index", lambda: _indexed_seq(self.root, self.partition) >= seq,
                         self.wait_s)  # fmt: skip
        return await asyncio.gather(_timed_from(at, found), _timed_from(at, indexed))  # type: ignore[return-value]

    async def _change(self, section_id: int) -> Any:
        """The record's latest change number and when it was written (None before its commit)."""
        return await self.pool.fetchrow(
            "SELECT max(seq) AS seq, extract(epoch FROM max(changed_at)) AS at FROM rag_embedding_changes "
            "WHERE model = $1 AND section_tipo = $2 AND section_id = $3 HAVING count(*) > 0",
            self.partition.model,
            self.section_tipo,
            section_id,
        )

    async def _found(self, section_id: int, word: str) -> bool:
        """Whether ``semantic_search`` for the record's own word returns it, found by the lexical leg."""
        body = api_request(
            "semantic_search", query=word, section_tipo=self.section_tipo, limit=5, explain=True
        )
        async with self.session.post(self.url + "/api/v1/json", json=body) as r:
            data = (await r.json()).get("data") or []
        return any(h.get("section_id") == section_id and "lexical" in h.get("legs", {}) for h in data)


async def _timed_from(epoch: float, wait: Awaitable[Any]) -> float:
    """Seconds from ``epoch`` (the database's clock, this host's) until ``wait`` is done."""
    await wait
    return max(0.0, time.time() - epoch)


async def engine_searches(url: str, token: str) -> dict[str, int]:
    """The gateway's ``mnemo_lexical_searches_total`` by outcome, every worker's (``/metrics``):
    ``hit`` the engine served, the others the SQL leg."""
    out: Counter[str] = Counter()
    for sample in await metric_samples(url, "mnemo_lexical_searches", token):
        if sample.name.endswith("_total"):
            out[sample.labels["result"]] += int(sample.value)
    return dict(out)


# -- the writer killed ------------------------------------------------------------------------------


async def _write_forever(
    pool: Any, partition: Any, rng: random.Random, records: int, written: Counter[str]
) -> None:
    """Replace or delete a random record's rows, one transaction each, until cancelled."""
    from index.store.store import EmbeddingRow, delete_record, upsert_rows
    from index.text import fold

    vector = np.ones(4, dtype=np.float32)
    while True:
        section_id = rng.randint(1, records)
        async with pool.acquire() as conn, conn.transaction():
            if rng.random() < 0.2:
                await delete_record(conn, ("kill1", section_id))
                written["deletes"] += 1
            else:
                await conn.execute(
                    f"DELETE FROM {partition.table} WHERE section_tipo = 'kill1' AND section_id = $1",
                    section_id,
                )
                rows = []
                for i in range(rng.randint(1, 4)):
                    text = " ".join(rng.choice(_WORDS) for _ in range(6)) + f" {lexicon_word(rng, 6)}"
                    rows.append(EmbeddingRow("text", "kill1", section_id, "rag:card", "lg-eng", i,
                                             f"h{section_id}-{i}-{rng.random()}", text, fold(text), vector,
                                             projects=[rng.choice((1, 2))], chunk_meta={"contributors": ["c1"]}))  # fmt: skip
                await upsert_rows(conn, partition, rows)
                written["upserts"] += 1
        await asyncio.sleep(0.005)


async def _store_head(pool: Any) -> int:
    return int(
        await pool.fetchval(
            "SELECT coalesce(max(seq), 0) FROM rag_embedding_changes WHERE model = $1", KILL_MODEL
        )
    )


async def writer_killed(database_url: str, work_dir: Path, *, kills: int = 5, records: int = 200,
                        wait_s: float = 60.0) -> dict[str, Any]:  # fmt: skip
    """``mnemo lexical follow`` killed with SIGKILL ``kills`` times under a stream of writes (each
    kill after it committed at least once since its start, at a random moment), then caught up:
    rows missing from the index, duplicated in it, or stale in it against PostgreSQL."""
    from index.store.change_feed import KEY_COLUMNS
    from index.store.partitions import ensure_partition
    from schema import create_pool

    root = work_dir / f"tantivy-kill-{secrets.token_hex(4)}"
    log = work_dir / "tantivy-kill-follow.log"
    rng = random.Random(45)
    pool = await create_pool(database_url, max_size=4)
    written: Counter[str] = Counter()
    landed = []
    try:
        partition = await ensure_partition(pool, KILL_MODEL, 4)
        writes = asyncio.create_task(_write_forever(pool, partition, rng, records, written))
        try:
            await asyncio.sleep(1.0)  # rows before the first build
            for _ in range(kills):
                async with lexical_follower(database_url, root, log) as follow:
                    start_seq = _indexed_seq(root, partition)

                    def committed(since: int = start_seq) -> bool:  # reopened, and a commit since
                        return _indexed_seq(root, partition) > since

                    await _until("the follower's first commit after its start", committed, wait_s)
                    await asyncio.sleep(rng.uniform(0.05, 1.0))
                    behind = await _store_head(pool) - _indexed_seq(root, partition)
                    follow.kill()
                    code = await follow.wait()
                    landed.append({"exit": code, "changes_behind_at_kill": behind})
                    if writes.done():
                        writes.result()  # the write stream broke: say why
        finally:
            writes.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writes
        head = await _store_head(pool)
        started = time.monotonic()
        async with lexical_follower(database_url, root, log):
            await _until(
                "the restarted follower catching up", lambda: _indexed_seq(root, partition) >= head, wait_s
            )
        catch_up_s = time.monotonic() - started
        cols = ", ".join(KEY_COLUMNS)
        store = {tuple(r) for r in await pool.fetch(
            f"SELECT {cols} FROM {partition.table} WHERE model = $1 AND modality = 'text'", KILL_MODEL)}  # fmt: skip
        in_index = Counter(index_keys(root, partition))
    finally:
        await pool.close()
    return {
        "kills": len(landed),
        "killed_by_sigkill": sum(1 for k in landed if k["exit"] == -9),
        "kills_with_changes_pending": sum(1 for k in landed if k["changes_behind_at_kill"] > 0),
        "writes": dict(written),
        "store_rows": len(store),
        "index_documents": sum(in_index.values()),
        "missing": len(store - set(in_index)),
        "duplicated": sum(n - 1 for n in in_index.values() if n > 1),
        "stale": len(set(in_index) - store),
        "catch_up_s": round(catch_up_s, 2),
        "at_kill": landed,
    }
