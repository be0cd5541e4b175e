"""The cost of a search (issue 56), a cell of the scale suite's retrieval section at every size:
the CPU one ``semantic_search`` costs, by process, against the floors of its two legs.

- **Through the gateway** (``mnemo gateway --workers 2``, Tantivy lexical engine): for an admin
  and for researchers who see 10% and 1% of the store, at 1 and at 32 callers, a window of the raw
  keep-alive client (:func:`benchmarks.flood_client.closed_loop_searches`, a write and a read per
  search) between two snapshots of every process's CPU time: milliseconds per search in the gateway
  workers, the PostgreSQL backends, the sidecar, the load client and the rest of the machine. Its
  requests/s and p50/p99 beside.
- **The floors, same run, same queries**: the dense leg's statement run directly on one
  connection (:func:`index.search.dense_leg.dense_search` under the gateway's session settings: the
  backend's CPU plus this client's), and Tantivy's bare search (one OR query of the query's lexemes
  over the same index, its top candidates, nothing re-read or re-scored).
- **A profile** of the gateway's workers under the admin's 32 callers (``py-spy record
  --subprocesses``, a window of its own, so the sampling costs no measured window), folded into the
  share of samples in each function (self) and under each frame (inclusive); the raw stacks are kept
  beside the report when the run keeps its files.

CPU, not latency, is the figure: a neighbour on a shared machine moves it far less, and it says
how many callers the same cores serve.
"""

from __future__ import annotations

import asyncio
import collections
import re
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from .acl_shares import VISIBILITY_PROJECT
from .flood import warm
from .flood_client import closed_loop_searches
from .gateway import gateway_process, gateway_read_pool
from .gateway_workers import process_groups
from .lexical import SECTION
from .measure import cpu_by_process, cpu_used

__all__ = ["VISIBILITIES", "measure_search_cost", "summarize_profile"]

VISIBILITIES = ("admin", "10%", "1%")  # who searches: an admin, researchers who see that share
WORKERS = 2
FLOOR_PASSES = 3  # each floor runs every query this many times (CPU times are coarse: 10 ms ticks)
PROFILE_TOP = 25  # functions kept from the profile, by self and by inclusive share
PY_SPY_WAIT_S = 60.0  # py-spy's start (it reads the tree's processes) and its writing of the file
# Process groups whose CPU a search costs (the load client and the rest of the machine are reported
# beside, not counted: a client on another host costs the service nothing).
SERVED_BY = ("gateway", "postgresql", "sidecar")


async def measure_search_cost(
    database_url: str, sidecar_url: str, model: str, queries: Sequence[str], probes: np.ndarray,
    partition: Any, lexical_dir: Path, workdir: Path, *, callers: Sequence[int], seconds: float, profile_s: float, limit: int,
    source: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The cells, the floors and the profile above for one store (built from ``queries``' corpus,
    its Tantivy index under ``lexical_dir``); ``probes`` are ``queries`` embedded, in order. Each
    window runs ``seconds`` per visibility and caller count; the profile ``profile_s`` (0: none).
    ``source``: a source tree to run the gateway from (a worktree of another commit: a before/after
    on the same store, :func:`benchmarks.gateway.gateway_process`)."""
    from gateway.access.auth import issue_token

    secret = secrets.token_urlsafe(48)
    researcher = "researcher"
    tokens = {"admin": issue_token(secret=secret, sub="bench", projects=None, admin=True)} | {
        share: issue_token(secret=secret, sub=researcher, projects=[VISIBILITY_PROJECT[share]], perms={SECTION: 1})
        for share in VISIBILITIES[1:]
    }  # fmt: skip
    env = {
        "RAG_LEXICAL_INDEX": "tantivy",
        "RAG_LEXICAL_DIR": str(lexical_dir),
        "RAG_GATEWAY_WORKERS": str(WORKERS),
    }
    async with gateway_process(
        database_url, sidecar_url, secret, workdir / "gateway-search-cost.log", text_model=model,
        source=source, load_testers=[researcher], **env,
    ) as gateway:  # fmt: skip
        # Every worker's query-vector cache (one per caller and query text) and lexical reader warm,
        # for every caller a cell measures: a researcher's first search of a query would embed it.
        for who in VISIBILITIES:
            await warm(gateway.url, tokens[who], queries)
        group = process_groups({"gateway": gateway.process.pid}, plain=True)
        cells = {
            _cell_name(who, n): await _cell(gateway.url, tokens[who], queries, n, seconds, limit, group)
            for who in VISIBILITIES
            for n in callers
        }
        profile = (
            await _profile(
                gateway.url,
                tokens["admin"],
                queries,
                gateway.process.pid,
                max(callers),
                profile_s,
                limit,
                workdir,
            )
            if profile_s > 0
            else None
        )
    floors = {
        "dense SQL": await _dense_floor(database_url, partition, probes, limit),
        "tantivy bare": await _tantivy_floor(database_url, partition, queries, lexical_dir, limit),
    }
    admin = cells[_cell_name("admin", max(callers))]["cpu_ms"]
    floor_ms = sum(f["cpu_ms"] for f in floors.values())
    return {
        "workers": WORKERS,
        "callers": max(callers),
        "seconds": seconds,
        "cells": cells,
        "floors": floors,
        "admin_over_floors": admin["served"] / floor_ms if floor_ms else float("nan"),
        **({"profile": profile} if profile else {}),
    }


def _cell_name(who: str, callers: int) -> str:
    return f"{who}, {callers} caller{'s' * (callers > 1)}"


async def _cell(
    url: str, token: str, queries: Sequence[str], callers: int, seconds: float, limit: int, group: Any
) -> dict[str, Any]:
    before = cpu_by_process()
    result = await closed_loop_searches(url, token, queries, callers=callers, seconds=seconds, limit=limit)
    used = cpu_used(before, cpu_by_process(), group)
    per_search = {name: s * 1e3 / max(1, result.requests) for name, s in sorted(used.items())}
    per_search["served"] = sum(per_search.get(name, 0.0) for name in SERVED_BY)
    return {
        "requests": result.requests,
        "requests_per_s": result.requests_per_s,
        "p50_ms": result.latency.median * 1e3,
        "p99_ms": result.latency.p99 * 1e3,
        "cpu_ms": per_search,
    }


async def _dense_floor(database_url: str, partition: Any, probes: np.ndarray, limit: int) -> dict[str, float]:
    """The admin's dense leg as one statement on one connection of a pool like the gateway's (its
    session already holds the scan settings, so one round trip): the backend's CPU and this
    process's per search."""
    from gateway.base.settings import load_gateway_settings
    from gateway.retrieval.legs import over_fetch
    from index.search.dense_leg import dense_search
    from index.store.hits import Scope

    settings = load_gateway_settings({}, auth="off")
    pool = await gateway_read_pool(database_url)
    try:
        async with pool.acquire() as conn:
            backend = psutil.Process(await conn.fetchval("SELECT pg_backend_pid()"))

            async def search(q: np.ndarray) -> Any:
                return await dense_search(conn, partition, q, Scope(), over_fetch(limit),
                                          ef_search=settings.hnsw_ef_search, max_scan_tuples=settings.hnsw_max_scan_tuples)  # fmt: skip

            for q in probes[:5]:
                await search(q)  # pages and the statement's plan warm
            return await _cpu_per_call(search, list(probes) * FLOOR_PASSES, backend)
    finally:
        await pool.close()


async def _tantivy_floor(
    database_url: str, partition: Any, queries: Sequence[str], lexical_dir: Path, limit: int
) -> dict[str, float]:
    """Tantivy's bare search over the gateway's own index: the query's lexemes (PostgreSQL's, as the
    engine asks for them; not timed) as one OR query on the ``lex`` field, as many candidates as the
    engine takes for the lexical leg, nothing re-read or re-scored."""
    import asyncpg
    import tantivy

    from gateway.retrieval.legs import over_fetch
    from index.follow.swap_folders import current_folder
    from index.lexical.engine import TantivyConfig
    from index.search.bm25 import query_terms, scored_terms

    folder = current_folder(lexical_dir, partition)
    if folder is None:
        raise RuntimeError(f"no Tantivy index under {lexical_dir} for {partition.partition}")
    conn = await asyncpg.connect(database_url)
    try:
        terms = [list(scored_terms(await query_terms(conn, q))) for q in queries]
    finally:
        await conn.close()
    index = tantivy.Index.open(str(folder))
    schema, searcher = index.schema, index.searcher()
    fetch = TantivyConfig().candidates(over_fetch(limit))
    built = [
        tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(schema, "lex", t)) for t in ts]
        )
        for ts in terms
        if ts
    ]

    async def search(query: Any) -> Any:
        return searcher.search(query, fetch, count=False).hits

    for query in built[:5]:
        await search(query)
    return await _cpu_per_call(search, built * FLOOR_PASSES, None)


async def _cpu_per_call(call: Any, args: Sequence[Any], backend: psutil.Process | None) -> dict[str, float]:
    """CPU milliseconds per ``await call(arg)``: this process's and, given, a PostgreSQL backend's."""
    backend_before = sum(backend.cpu_times()[:2]) if backend is not None else 0.0
    here_before = time.process_time()
    for arg in args:
        await call(arg)
    here = (time.process_time() - here_before) * 1e3 / len(args)
    server = (sum(backend.cpu_times()[:2]) - backend_before) * 1e3 / len(args) if backend is not None else 0.0
    return {"calls": len(args), "cpu_ms": here + server, "client_ms": here, "backend_ms": server}


async def _profile(
    url: str,
    token: str,
    queries: Sequence[str],
    pid: int,
    callers: int,
    seconds: float,
    limit: int,
    workdir: Path,
) -> dict[str, Any]:
    """``py-spy record`` over the gateway's process tree while ``callers`` admins search; the folded
    stacks summarized (:func:`summarize_profile`) and kept at ``workdir/gateway-profile.txt``."""
    spy = _py_spy()
    out = workdir / "gateway-profile.txt"
    proc = await asyncio.create_subprocess_exec(
        spy, "record", "--pid", str(pid), "--subprocesses", "--rate", "200",
        "--format", "raw", "--nonblocking", "--output", str(out),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    # The window is the load's, not a duration py-spy counts from its own start: on a loaded machine
    # a fixed duration could lapse before the first search (0 samples). Load starts once py-spy says
    # it samples, and py-spy stops (Ctrl-C, which writes the file) once the load has stopped.
    said = await _sampling_started(proc)
    await closed_loop_searches(url, token, queries, callers=callers, seconds=seconds, limit=limit)
    if proc.returncode is None:
        proc.send_signal(signal.SIGINT)
    rest, err = await asyncio.wait_for(proc.communicate(), timeout=PY_SPY_WAIT_S)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(
            f"py-spy record failed ({proc.returncode}): {(said + rest + err).decode(errors='replace')[-2000:]}"
        )
    return {"file": out.name, **summarize_profile(out.read_text().splitlines())}


async def _sampling_started(proc: asyncio.subprocess.Process) -> bytes:
    """Wait for py-spy's ``Sampling process`` line on its stdout (its readiness), returning what it
    printed; loud if it exits or stays silent for ``PY_SPY_WAIT_S``."""
    assert proc.stdout is not None
    said = b""
    while b"Sampling process" not in said:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=PY_SPY_WAIT_S)
        if not line:
            _, err = await proc.communicate()
            said += err
            raise RuntimeError(
                f"py-spy record exited ({proc.returncode}) before sampling: {said.decode(errors='replace')}"
            )
        said += line
    return said


def _py_spy() -> str:
    """The py-spy executable (the bench extra installs it beside this interpreter); loud if absent."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise RuntimeError("the search-cost profile needs py-spy (pip install '.[bench]')")
    return spy


_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def summarize_profile(lines: Sequence[str], top: int = PROFILE_TOP) -> dict[str, Any]:
    """Folded stacks (``frame;frame;... count``, outermost first, as ``py-spy record --format raw``
    writes them) as shares of all samples: each function's self share (the innermost frame) and
    inclusive share (anywhere on the stack, counted once per sample), the first ``top`` of each.
    A frame is named ``function (file)`` with the file under its last ``site-packages`` or
    repository folder, without the line, so one function's lines add up."""
    self_samples: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame_name(f) for f in stack.split(";") if not f.startswith("process ")]
        if not frames:
            continue
        total += n
        self_samples[frames[-1]] += n
        for name in set(frames):
            inclusive[name] += n

    def shares(counter: Mapping[str, int]) -> list[tuple[str, float]]:
        return [(name, n / total) for name, n in counter.most_common(top)]

    return {"samples": total, "self": shares(self_samples), "inclusive": shares(inclusive)} if total else {
        "samples": 0, "self": [], "inclusive": []}  # fmt: skip


def _frame_name(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    path = match["file"]
    for marker in ("site-packages/", "/gateway/", "/index/", "/inference/", "/schema/", "/benchmarks/"):
        if marker in path:
            cut = path.rindex(marker) + (len(marker) if marker == "site-packages/" else 1)
            path = path[cut:]
            break
    return f"{match['function']} ({path})"


# Issue 56's bars at 1M chunks, 32 callers, 2 workers: the CPU a search costs across the processes
# that serve it and the gateway's share of it; the searches per second against 2026-12-05's 190/s
# on this kind of machine (benchmarks/results/2026-12-05/tantivy-scale-1m-format4) and p99; the
# whole search against the sum of its legs' floors, same run.
CPU_BAR_MS, GATEWAY_CPU_BAR_MS, P99_BAR_MS, FLOORS_BAR = 4.0, 1.2, 120.0, 2.0
REFERENCE_RPS, RPS_BAR = 190.0, 2.5
COST_SIZE = 1_000_000  # the bars are stated at this size; smaller sizes report without them


def cost_tables(sizes: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Per size and cell, CPU ms per search by process with throughput and latency; the floors."""
    from .report import Table

    measured = [s for s in sizes if s.get("search_cost")]
    if not measured:
        return []
    groups = sorted(
        {g for s in measured for c in s["search_cost"]["cells"].values() for g in c["cpu_ms"]} - {"served"}
    )
    cells = [
        [f"{s['chunks']:,}", name, c["requests_per_s"], c["p50_ms"], c["p99_ms"], c["cpu_ms"]["served"],
         *(c["cpu_ms"].get(g, 0.0) for g in groups)]
        for s in measured for name, c in s["search_cost"]["cells"].items()
    ]  # fmt: skip
    floors = [
        [f"{s['chunks']:,}", name, f["cpu_ms"], f["backend_ms"], f["client_ms"], f["calls"]]
        for s in measured for name, f in s["search_cost"]["floors"].items()
    ]  # fmt: skip
    profile = [
        [f"{s['chunks']:,}", kind, name, share]
        for s in measured if s["search_cost"].get("profile")
        for kind in ("inclusive", "self") for name, share in s["search_cost"]["profile"][kind]
    ]  # fmt: skip
    tables = [
        Table(f"The cost of a search: CPU ms per semantic_search by process ({WORKERS} gateway workers, Tantivy)",
              ["chunks", "caller", "req/s", "p50 ms", "p99 ms", "served CPU ms (gateway + postgresql + sidecar)",
               *(f"{g} ms" for g in groups)], cells),
        Table("The floors: the admin's dense statement on one connection, Tantivy's bare search",
              ["chunks", "floor", "CPU ms per call", "PostgreSQL backend ms", "client ms", "calls"], floors),
    ]  # fmt: skip
    if profile:
        tables.append(Table("Where the gateway's CPU goes (py-spy, admin, the most callers): share of samples",
                            ["chunks", "share", "frame", "of samples"], profile))  # fmt: skip
    return tables


def cost_headlines(sizes: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Issue 56's bars at the largest size when it is 1M chunks or more (the figures are in the
    tables at every size)."""
    from .report import Headline

    largest = sizes[-1] if sizes else {}
    cost = largest.get("search_cost")
    if not cost or largest["chunks"] < COST_SIZE:
        return []
    n = f"{largest['chunks']:,}"
    callers = cost["callers"]
    cell = cost["cells"][_cell_name("admin", callers)]
    floors = sum(f["cpu_ms"] for f in cost["floors"].values())
    return [
        Headline(f"{n}: CPU ms per search, admin, {callers} callers (gateway + PostgreSQL + sidecar)",
                 cell["cpu_ms"]["served"], "ms", "issue 56's bar", CPU_BAR_MS, higher_is_better=False, bar=1.0),
        Headline(f"{n}: the gateway's CPU ms per search, admin, {callers} callers", cell["cpu_ms"].get("gateway", 0.0),
                 "ms", "issue 56's bar", GATEWAY_CPU_BAR_MS, higher_is_better=False, bar=1.0),
        Headline(f"{n}: semantic_search req/s, {WORKERS} workers, {callers} callers", cell["requests_per_s"],
                 "req/s", "2026-12-05 on this kind of machine", REFERENCE_RPS, bar=RPS_BAR),
        Headline(f"{n}: semantic_search p99, {WORKERS} workers, {callers} callers", cell["p99_ms"], "ms",
                 "issue 56's bar", P99_BAR_MS, higher_is_better=False, bar=1.0),
        Headline(f"{n}: a search's CPU against its legs' floors (dense SQL + Tantivy bare, same run)",
                 cell["cpu_ms"]["served"], "ms", "the floors' sum", floors, higher_is_better=False, bar=FLOORS_BAR),
    ]  # fmt: skip
