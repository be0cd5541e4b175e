"""The session settings the read legs run under, and how a query gets them.

Each leg's settings are either its connection session's own (a gateway's read pool opens every
session with :func:`read_session_settings`) or ``SET LOCAL`` around the query
(:func:`fetch_with_local_settings`), so a pool that already holds them pays no round trip.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import asyncpg

from schema import session_settings

__all__ = [
    "CUSTOM_PLANS",
    "EXACT_SCAN",
    "PLANNED_ONCE",
    "fetch_with_local_settings",
    "hnsw_scan_settings",
    "read_session_settings",
]

# A generic plan of a leg's statement (what PostgreSQL switches to after five runs of one prepared
# statement) cannot see the ACL's values: it estimates `projects && $n` at 1% and leaves the HNSW
# index for a bitmap scan of every row plus a sort (300 ms instead of 3 on 10k chunks at 100%
# visibility); nor can it see how few keys a cache's re-read joins. Each is planned with its values.
CUSTOM_PLANS: Mapping[str, str] = MappingProxyType({"plan_cache_mode": "force_custom_plan"})
# The lexical engine's re-read (index.search.lexical_reread), on a pool of its own whose sessions hold
# this: planned once per session instead of at every search (its planning was 0.43 ms of a 0.8-ms
# statement at 1M chunks). Its generic plan is its custom one: the candidates' keys are looked up
# one by one whatever their count, and the change feed's two range scans keep their indexes
# (index.store.change_feed.pending_sql says how). No parallel workers: a generic plan's estimates
# for a few dozen rows started two (4 ms of wall time, 0.7 of CPU, against 0.2 without).
PLANNED_ONCE: Mapping[str, str] = MappingProxyType(
    {"plan_cache_mode": "force_generic_plan", "max_parallel_workers_per_gather": "0"}
)
# The dense leg's exact search: no index scan, so no HNSW; the scope's rows are read (through a
# bitmap of its indexes where it has one) and sorted by distance.
EXACT_SCAN: Mapping[str, str] = MappingProxyType({"enable_indexscan": "off"})


def hnsw_scan_settings(ef_search: int, max_scan_tuples: int, limit: int = 0) -> dict[str, str]:
    """The dense leg's pgvector scan settings for a top-``limit`` (``ef_search`` at least ``limit``,
    at most pgvector's 1000). ``relaxed_order`` lets the scan go on past rows the ACL filters out."""
    return {
        "hnsw.iterative_scan": "relaxed_order",
        "hnsw.ef_search": str(min(1000, max(int(ef_search), int(limit)))),
        "hnsw.max_scan_tuples": str(int(max_scan_tuples)),
    }


def read_session_settings(ef_search: int, max_scan_tuples: int) -> dict[str, str]:
    """What a pool of retrieval reads opens its sessions with (``create_pool(session=...)``): every
    leg's settings at their configured values, so that no leg pays a ``SET LOCAL`` for them."""
    return {**CUSTOM_PLANS, **hnsw_scan_settings(ef_search, max_scan_tuples)}


async def fetch_with_local_settings(
    conn: asyncpg.Connection, settings: Mapping[str, str], query: str, params: Sequence[Any]
) -> list[asyncpg.Record]:
    """``query`` under ``settings`` ({name: value}), which end with it.

    Settings the connection's session already holds (:func:`schema.session_settings`) are not set
    again; when that is all of them the query runs alone, one round trip (issue 27). Otherwise it
    runs in a read-only transaction of its own after ``SET LOCAL`` of the rest: BEGIN and the
    settings in one round trip (a simple-protocol batch), then the query, then COMMIT. Inside a
    caller's transaction, a savepoint.
    """
    held = session_settings(conn)
    needed = [f"SET LOCAL {name} = {value}" for name, value in settings.items() if held.get(name) != value]
    if not needed:
        return await conn.fetch(query, *params)
    if conn.is_in_transaction():
        async with conn.transaction():
            await conn.execute("; ".join(needed))
            return await conn.fetch(query, *params)
    await conn.execute("; ".join(["BEGIN READ ONLY", *needed]))
    try:
        rows = await conn.fetch(query, *params)
    except BaseException:
        with contextlib.suppress(Exception):  # else the pool's release rolls it back
            if not conn.is_closed() and conn.is_in_transaction():
                await conn.execute("ROLLBACK")
        raise
    await conn.execute("COMMIT")
    return rows
