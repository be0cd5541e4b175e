"""The gateway suite's report: its points (:func:`benchmarks.suite_gateway.run_suite`, one per corpus
size) as headlines, tables and curves, the headlines and columns declared as rows
(:mod:`benchmarks.tables`).

A column added to :data:`LATENCY` shows in every table of the gateway beside its baselines; a
headline is a :class:`~benchmarks.tables.HeadlineRow` read from the point it describes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .levers import levers_table
from .plan import GatewayPlan
from .report import Curve, Headline, SuiteResult, Table, format_span
from .tables import Column, HeadlineRow, headings, rows

__all__ = ["HEADLINE_MIN_CHUNKS", "P50_BAR", "as_suite"]

SQL = "the legs' SQL (dense + lexical, concurrent)"
DENSE_SQL = "dense leg SQL alone"
SQL_LABEL = "SQL"  # the baseline's series in the latency plots
P50_BAR = 1.3  # semantic_search p50 at one caller over the legs' SQL (issue 27)
# Sizes below this get no p50 headline: at 1k chunks the SQL takes under 1 ms and the fixed HTTP
# hop is the ratio; the point stays in the tables and curves.
HEADLINE_MIN_CHUNKS = 10_000

# Read from one measured pair (a point at one caller count) with its "chunks" and cache "tag".
P50 = HeadlineRow(
    "semantic_search p50, {chunks:,} chunks, 1 caller ({tag})", "{gateway[p50]}", "ms", SQL, "{sql[p50]}",
    bar=P50_BAR, higher_is_better=False, spread="{p50_ratio_spread}",
)  # fmt: skip
THROUGHPUT = HeadlineRow(
    "semantic_search throughput, {chunks:,} chunks, {concurrency} callers ({tag})", "{gateway[rps]}", "req/s",
    SQL, "{sql[rps]}", bar=0.7, spread="{rps_ratio_spread}",
)  # fmt: skip
# Read from the largest size's 100%-visible selectivity point: the non-admin dense leg (SQL path)
# beside the admin's, in interleaved pairs.
NON_ADMIN_DENSE = HeadlineRow(
    "non-admin dense leg p50 at 100% visibility, {chunks:,} chunks", "{dense_sql[p50]}", "ms", "admin dense leg",
    "{admin_dense_sql[p50]}", bar=1.2, higher_is_better=False, spread="{admin_dense_ratio_spread}",
)  # fmt: skip

# The gateway beside its baselines at one point; every table below ends with these columns.
LATENCY = (
    Column("gw p50 ms", "{gateway[p50]}"),
    Column("gw p95 ms", "{gateway[p95]}"),
    Column("gw req/s", "{gateway[rps]}"),
    Column("gw CPU ms/req", "{gateway[cpu_ms]}"),
    Column("legs SQL p50 ms", "{sql[p50]}"),
    Column("legs SQL req/s", "{sql[rps]}"),
    Column("dense SQL p50 ms", "{dense_sql[p50]}"),
    Column("dense SQL req/s", "{dense_sql[rps]}"),
    Column("p50 ratio", "{p50_ratio}"),
    Column("spread", lambda p: format_span(p["p50_ratio_spread"])),
    Column("req/s ratio", "{rps_ratio}"),
    Column("spread ", lambda p: format_span(p["rps_ratio_spread"])),
    Column("p50 ratio (dense alone)", "{p50_ratio_dense}"),
)
BY_SIZE = (
    Column("chunks", "{chunks}"),
    Column("load s", "{load_s}"),
    Column("REINDEX s", "{reindex_s}"),
    Column("index MB", "{index_mb}"),
    Column("table MB", "{table_mb}"),
    *LATENCY,
)
BY_SIZE_ONE_CALLER = (Column("chunks", "{chunks}"), *LATENCY)
BY_SELECTIVITY = (
    Column("FAISS cache", "{cache}"),
    Column("% visible", lambda p: 100 * p["visible"]),
    Column("hits/query", "{mean_hits}"),
    *LATENCY,
)
BY_CONCURRENCY = (Column("FAISS cache", "{cache}"), Column("callers", "{concurrency}"), *LATENCY)
# A pair that ran the HTTP floor's window (one caller, and the most callers), with its "chunks" and "cache".
FLOOR = (
    Column("chunks", "{chunks}"),
    Column("FAISS cache", "{cache}"),
    Column("callers", "{concurrency}"),
    Column("floor p50 ms", "{floor[p50]}"),
    Column("legs SQL p50 ms", "{sql[p50]}"),
    Column("gw p50 ms", "{gateway[p50]}"),
    Column("floor/SQL p50", "{floor_p50_ratio}"),
    Column("spread", lambda c: format_span(c["floor_p50_ratio_spread"])),
    Column("gw/SQL p50", "{p50_ratio}"),
    Column("gw/floor p50", "{p50_over_floor}"),
    Column("floor CPU ms/req", "{floor[cpu_ms]}"),
    Column("gw CPU ms/req", "{gateway[cpu_ms]}"),
    Column("floor/SQL req/s", "{floor_rps_ratio}"),
    Column("spread ", lambda c: format_span(c["floor_rps_ratio_spread"])),
    Column("gw/SQL req/s", "{rps_ratio}"),
)
# The largest size's gateway per cache mode: its first pass (each query embedded by the sidecar on
# the way) and each leg's mean time over everything it served (its /metrics).
INSIDE = (
    Column("FAISS cache", "{cache}"),
    Column("first pass p50 ms", "{first_pass[p50]}"),
    Column("first pass p95 ms", "{first_pass[p95]}"),
    Column("dense leg mean ms", lambda m: m["leg_mean_ms"].get("dense")),
    Column("lexical leg mean ms", lambda m: m["leg_mean_ms"].get("lexical")),
)


def _one_caller(measured: Mapping[str, Any]) -> dict[str, Any]:
    """The point's (or cache mode's) pair at one caller."""
    return next(p for p in measured["by_concurrency"] if p["concurrency"] == 1)


def _cache_tag(cache: str) -> str:
    return "FAISS cache off" if cache == "off" else f"FAISS cache {cache}"


def _headlines(plan: GatewayPlan, points: list[dict[str, Any]]) -> list[Headline]:
    """The p50 at one caller at every size from :data:`HEADLINE_MIN_CHUNKS` (in the first cache
    mode, the only one the smaller sizes run), then per cache mode at the largest its p50 and its
    throughput at the most callers, and the non-admin dense leg."""
    largest = points[-1]
    out = [
        P50.read({**_one_caller(p), "chunks": p["chunks"], "tag": _cache_tag(plan.caches[0])})
        for p in points[:-1]
        if p["chunks"] >= HEADLINE_MIN_CHUNKS
    ]
    for cache, measured in largest["caches"].items():
        at = {"chunks": largest["chunks"], "tag": _cache_tag(cache)}
        out += [
            P50.read({**_one_caller(measured), **at}),
            THROUGHPUT.read({**measured["by_concurrency"][-1], **at}),
        ]
    full = next((p for p in largest["by_selectivity"] if p["visible"] == 1.0), None)
    if full is not None:
        out.append(NON_ADMIN_DENSE.read({**full, "chunks": largest["chunks"]}))
    return out


def _series(points: list[dict[str, Any]], x: str) -> dict[str, list[tuple[float, float]]]:
    return {
        f"{who} {q}": [(p[x] * (100 if x == "visible" else 1), p[key][q]) for p in points]
        for who, key in (("gateway", "gateway"), (SQL_LABEL, "sql"))
        for q in ("p50", "p95")
    }


def _curves(points: list[dict[str, Any]]) -> list[Curve]:
    largest = points[-1]
    at = f"({largest['chunks']:,} chunks)"
    percentiles = (f"{SQL_LABEL} p50", f"{SQL_LABEL} p95")
    selectivity = sorted(largest["by_selectivity"], key=lambda p: p["visible"])
    build = {
        "COPY, index maintained": [(p["chunks"], p["load_s"]) for p in points],
        "REINDEX from scratch": [(p["chunks"], p["reindex_s"]) for p in points],
    }
    throughput = {
        **{
            f"gateway, cache {cache}": [(p["concurrency"], p["gateway"]["rps"]) for p in m["by_concurrency"]]
            for cache, m in largest["caches"].items()
        },
        SQL: [(p["concurrency"], p["sql"]["rps"]) for p in largest["by_concurrency"]],
        DENSE_SQL: [(p["concurrency"], p["dense_sql"]["rps"]) for p in largest["by_concurrency"]],
    }
    return [
        Curve("Gateway latency vs corpus size", "chunks", "latency (ms)", _series(points, "chunks"), log_x=True,
              kind="cost", baselines=percentiles),
        Curve("HNSW build time vs corpus size", "chunks", "seconds", build, log_x=True, kind="cost"),
        Curve(f"Gateway latency vs filter selectivity {at}", "% of records visible to the caller", "latency (ms)",
              _series(selectivity, "visible"), log_x=True, kind="cost", baselines=percentiles),
        Curve(f"Gateway throughput vs concurrency {at}", "concurrent callers", "requests/s", throughput, log_x=True,
              baselines=(SQL, DENSE_SQL)),
    ]  # fmt: skip


def _tables(plan: GatewayPlan, points: list[dict[str, Any]]) -> list[Table]:
    largest = points[-1]
    caches = largest["caches"].items()
    floor = [
        {**c, "chunks": p["chunks"], "cache": cache}
        for p in points
        for cache, m in p["caches"].items()
        for c in m["by_concurrency"]
        if "floor" in c
    ]
    tables = [
        Table(f"By corpus size, 1 caller (FAISS cache {plan.caches[0]})", headings(BY_SIZE_ONE_CALLER),
              rows(BY_SIZE_ONE_CALLER, ({**_one_caller(p), "chunks": p["chunks"]} for p in points))),
        Table(f"By corpus size ({plan.concurrency} callers, FAISS cache {plan.caches[0]})", headings(BY_SIZE),
              rows(BY_SIZE, points)),
        Table(f"By filter selectivity ({largest['chunks']:,} chunks, {plan.concurrency} callers)",
              headings(BY_SELECTIVITY),
              rows(BY_SELECTIVITY, ({**p, "cache": cache} for cache, m in caches for p in m["by_selectivity"]))),
        Table(f"By concurrency ({largest['chunks']:,} chunks)", headings(BY_CONCURRENCY),
              rows(BY_CONCURRENCY, ({**p, "cache": cache} for cache, m in caches for p in m["by_concurrency"]))),
    ]  # fmt: skip
    if floor:
        title = "The HTTP floor beside the goal cells (an aiohttp server running only the legs' SQL)"
        tables.append(Table(title, headings(FLOOR), rows(FLOOR, floor)))
    if "levers" in largest:
        tables.append(levers_table(largest["levers"], largest["chunks"]))
    inside = [{**m, "cache": cache} for cache, m in caches if "first_pass" in m]
    if inside:
        title = f"Inside the gateway ({largest['chunks']:,} chunks): its first pass, and each leg's mean"
        tables.append(Table(title, headings(INSIDE), rows(INSIDE, inside)))
    return tables


def _notes(plan: GatewayPlan, setup: Mapping[str, Any], limit: int) -> list[str]:
    return [
        f"Model {setup['model']}; {setup['embedded']} chunk vectors from the sidecar, the rest seeded mixtures "
        f"of them; {setup['queries']} queries (vectors cached by the gateway after one warm pass); limit {limit}, "
        f"each leg over-fetching {max(limit * 4, 20)}.",
        "gateway = HTTP + JWT + dense and lexical legs + fusion + ACL gate + JSON; legs SQL = the dense and "
        "lexical legs' queries run concurrently on two connections, as the gateway runs them (same vectors, same "
        "ACL push-down, a read pool like the gateway's); dense SQL = the dense leg's query alone, the baseline of "
        "earlier reports.",
        "FAISS cache: each gateway runs with that RAG_FAISS_CACHE (measured once the cache has loaded); 'off' is "
        "the SQL path, which a partition over RAG_FAISS_MAX_BYTES also takes. The SQL baselines never use the "
        "cache, so with it on the dense leg's share of the ratio is the cache's gain.",
        f"Interleaved windows: each point runs {plan.pairs} pairs of windows, gateway then legs' SQL, then "
        "the other way round; a ratio is the median p50 (or mean req/s) over the other's, and its spread the "
        "pairs' own ratios, min to max. The dense leg alone runs once, after them.",
        "gw CPU ms/req: the gateway process's CPU time (user + system, psutil) over its windows divided by the "
        "requests they served (median over the windows): the gateway's own cost, which a busy neighbour moves "
        "far less than a latency.",
        "HTTP floor (benchmarks/http_floor.py): an aiohttp server in its own process, on the gateway's event "
        'loop, whose one route runs the legs\' SQL for the query numbered in the body and answers {"ok": true} '
        "(no auth, fusion, gate or hits). Its window runs in each pair of the one-caller and most-callers points "
        "(gateway, SQL, floor; then floor, SQL, gateway). floor/SQL is what the HTTP hop alone costs, which no "
        "change to the gateway's code removes while it is an aiohttp service; gw/floor is the gateway's code "
        "over it.",
        "Selectivity: the caller's projects cover that share of the records (every chunk of a record shares "
        f"its projects); hits/query is what the gateway returned for limit {limit}.",
    ]


def as_suite(
    plan: GatewayPlan, points: list[dict[str, Any]], setup: dict[str, Any], *, limit: int
) -> SuiteResult:
    """The suite's report from its points (smallest corpus first), its setup (model, vectors,
    queries), which it keeps as the figures, and the limit its searches asked for."""
    return SuiteResult(
        "gateway",
        headlines=_headlines(plan, points),
        tables=_tables(plan, points),
        curves=_curves(points),
        figures={**setup, "points": points},
        notes=_notes(plan, setup, limit),
    )
