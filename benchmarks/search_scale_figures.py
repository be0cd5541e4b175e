"""The retrieval-at-scale section's report (:mod:`benchmarks.search_scale`): the lexical section's
report, ``semantic_search`` per size and gateway configuration, its growth from the smallest size to
the largest, dense recall per visibility, and the dense leg with the FAISS cache; the tables'
columns declared as rows (:mod:`benchmarks.tables`), each read from the cell it describes.

A new column is a row added to its tuple; a new table of cells, a tuple and one ``Table`` line.
"""

from __future__ import annotations

from typing import Any

from .lexical import lexical_report
from .measure import ratio, spread
from .report import Headline, SuiteResult, Table
from .search_cost import cost_headlines, cost_tables
from .tables import Column, headings, rows
from .vector_cache import MAPPED_MODES

__all__ = ["GROWTH_BAR", "ONE_PERCENT_BAR", "RECALL_BAR", "scale_report"]

GROWTH_BAR = 1.5  # issue 24: semantic_search p50 at 1M within 1.5x of itself at 100k
RECALL_BAR = 0.95  # issue 24: dense recall@10 against exact at every visibility
ONE_PERCENT_BAR = 2.0  # issue 24: a 1%-visibility researcher's dense leg within 2x of the admin's
# Issue 44's bars at the largest size: a Tantivy gateway ready within 5 s, a second worker adding at
# most 200 MiB (PSS), semantic_search p99 within 50 ms on two workers, two workers serving 1.3x one.
READY_BAR_S, WORKER_GROWTH_BAR_MIB, SEARCH_P99_BAR_MS, WORKERS_BAR = 5.0, 200.0, 50.0, 1.3
# issue 57: a writer's rebuild peak at the largest size within 1.3x of itself at the smallest, and
# `mnemo lexical rebuild` at most 600 MiB at 1M chunks.
REBUILD_GROWTH_BAR, REBUILD_BUDGET_MIB = 1.3, 600.0

# One caller's cell of semantic_search, with its "chunks" (formatted), gateway "mode", caller "name"
# and the gateway's "ready_s".
SEARCH_CELLS = (
    Column("chunks", "{chunks}"),
    Column("gateway (lexical index, cache)", "{mode}"),
    Column("caller", "{name}"),
    Column("requests", "{requests}"),
    Column("p50 ms", "{p50_ms}"),
    Column("p99 ms", "{p99_ms}"),
    Column("req/s", "{requests_per_s}"),
    Column("gateway CPU ms/req", "{cpu_ms_per_request}"),
    Column("gateway ready s", "{ready_s}"),
    Column("gateway PSS MiB", "{pss_mib}"),
)
# Per size and writer: the store's Tantivy index and vector snapshot as `mnemo lexical rebuild` and
# `mnemo vectors rebuild` wrote them, each writer's peaks (RSS, and its private memory alone).
REBUILD = (
    Column("chunks", "{chunks}"),
    Column("writer", "{writer}"),
    Column("rebuild s", "{s}"),
    Column("writer peak RSS MiB", "{writer_peak_rss_mib}"),
    Column("peak private MiB", "{writer_peak_private_mib}"),
    Column("MiB on disk", "{disk_mib}"),
)
# Per size: the FAISS cache under 32 callers (the 100% researcher's dense leg) and under a writer.
UNDER_LOAD = (
    Column("chunks", "{chunks}"),
    Column("32 callers p50 ms, cache on", "{callers_32[cache on][p50_ms]}"),
    Column("cache off", "{callers_32[cache off][p50_ms]}"),
    Column("q/s, cache on", "{callers_32[cache on][qps]}"),
    Column("cache off ", "{callers_32[cache off][qps]}"),
    Column("commit->applied p50 s", "{sync[commit_lag_p50_s]}"),
    Column("commit->applied p99 s", "{sync[commit_lag_p99_s]}"),
    Column("write->applied p99 s", "{sync[lag_p99_s]}"),
    Column("rows written", "{sync[rows_written]}"),
)
# Per size, way of holding the cache and worker: what a further worker process costs.
MAPPED = (
    Column("chunks", "{chunks}"),
    Column("cache", "{mode}"),
    Column("worker", "{worker}"),
    Column("ready s", "{ready_s}"),
    Column("RSS growth MiB", lambda w: w["rss_growth"] / 2**20),
    Column("USS MiB", lambda w: w["uss"] / 2**20),
    Column("USS growth MiB", lambda w: w["uss_growth"] / 2**20),
    Column("search p50 ms, unfiltered", "{latency_ms[unfiltered]}"),
    Column("ACL 10%", "{latency_ms[ACL 10%]}"),
)
# The largest size's gateways: one worker and two, alternating windows of the most callers.
WORKERS = (
    Column("gateway", "{name}"),
    Column("req/s (median)", "{rps}"),
    Column("p50 ms (median)", "{p50_ms}"),
    Column("cores used (median of the windows)", "{cores}"),
)
# One cell at the largest size ("large") against itself at the smallest ("small").
GROWTH = (
    Column("gateway (lexical index, cache)", "{mode}"),
    Column("caller", "{name}"),
    Column("small p50", "{small[p50_ms]}"),
    Column("large p50", "{large[p50_ms]}"),
    Column("p50 growth", lambda g: ratio(g["large"]["p50_ms"], g["small"]["p50_ms"])),
    Column("small p99", "{small[p99_ms]}"),
    Column("large p99", "{large[p99_ms]}"),
    Column("p99 growth", lambda g: ratio(g["large"]["p99_ms"], g["small"]["p99_ms"])),
)
NOTES = (
    "semantic_search: a mnemo gateway subprocess with default settings but RAG_LEXICAL_INDEX (and "
    "RAG_FAISS_CACHE=cpu where the configuration names the cache); with RAG_LEXICAL_INDEX=tantivy it reads "
    "the store's Tantivy index, built before the gateways started as `mnemo lexical rebuild` builds it; "
    "the data sets' queries, each sent once before the loops so its vector is cached (no sidecar in the "
    "loops); hybrid retrieval (dense + lexical), fusion, ACL, JSON over HTTP on 127.0.0.1.",
    "gateway ready s: from the process's start until its lexical engine served every partition (the "
    "Tantivy engine opens a partition's index at its first search: one is sent) and its cache had loaded.",
    "FAISS cache on CPU: the gateway's cache settings; an admin's unfiltered search over more than "
    "RAG_FAISS_CPU_BROAD_SCAN_MAX vectors goes to pgvector's HNSW (its served share says so), a scope of at "
    "most RAG_FAISS_PACKED_SCOPE_ROWS vectors is searched over a packed copy of its vectors.",
    "The store: one record per chunk, every record in project 1, every 10th also in project 2, every "
    "100th also in project 3 (the researchers who see 100%, 10% and 1%).",
    "gateway PSS MiB: the gateway's processes once their loops ran; mapped index pages the workers share "
    "count once, so 'tantivy, 2 workers' less 'tantivy' is what a second worker costs.",
    "The FAISS cache under load: 32 callers of the 100% researcher's dense leg with the cache and without; "
    "sync lag while a writer rewrites records (transactions of 32, each record written back as it was under "
    "a new source hash): commit->applied from each transaction's commit to the first cache update whose "
    "watermark covers it, write->applied from each row's write inside it.",
    "Cache workers (benchmarks/vector_cache.py): 'store' reads every vector from PostgreSQL "
    "(RAG_FAISS_CACHE=cpu), 'mmap' maps the snapshot `mnemo vectors rebuild` wrote; worker 2 loads while "
    "worker 1 holds its cache. RSS growth counts mapped pages too (held once by the page cache); USS is "
    "what the worker alone holds. Search p50: the cache's whole dense search (the scan, the SQL re-read), "
    "20 queries after 3 warm-ups, the unfiltered one over every vector.",
    "The writers' rebuilds: `mnemo lexical rebuild` and `mnemo vectors rebuild` as processes, their memory "
    "sampled every 0.5 s. Peak RSS counts the pages of the files a writer maps (the Tantivy segments it "
    "merges: the page cache's, shared, reclaimed under pressure); peak private is its anonymous memory "
    "alone (RssAnon), what RAG_LEXICAL_WRITER_MEMORY bounds for the lexical writer.",
)


def _growth(sizes: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Headline]]:
    """Each semantic_search cell at the largest size beside itself at the smallest (same run), and
    the admin's as headlines."""
    if len(sizes) < 2:
        return [], []
    small, large = sizes[0], sizes[-1]
    label = f"{large['chunks']:,} vs {small['chunks']:,}"
    cells, headlines = [], []
    for mode, run in large["semantic_search"].items():
        for name, cell in run["cells"].items():
            base = small["semantic_search"].get(mode, {}).get("cells", {}).get(name)
            if base is None:  # a configuration the smaller size did not run
                continue
            cells.append({"mode": mode, "name": name, "small": base, "large": cell})
            if name.startswith("admin"):
                headlines.append(Headline(
                    f"semantic_search p50 growth {label} (lexical index {mode}, {name})", cell["p50_ms"], "ms",
                    f"itself at {small['chunks']:,} chunks", base["p50_ms"], higher_is_better=False,
                    bar=GROWTH_BAR if mode != "off" else None,
                ))  # fmt: skip
    return cells, headlines


def _recall_rows(sizes: list[dict[str, Any]]) -> tuple[list[list[Any]], list[Headline]]:
    """Every size's recall per visibility and ef_search; headlines at the largest size and the
    gateway's default ef_search (bar: 0.95 of exact)."""
    from gateway.base.settings import GatewaySettings

    default_ef = GatewaySettings().hnsw_ef_search
    rows, headlines = [], []
    for size in sizes:
        for label, by_ef in size.get("dense_recall", {}).items():
            for ef, cell in by_ef.items():
                rows.append([f"{size['chunks']:,}", label, int(ef), cell["recall_at_10"], cell["p50_ms"]])
    largest = sizes[-1]
    for label, by_ef in largest.get("dense_recall", {}).items():
        cell = by_ef.get(default_ef, by_ef.get(str(default_ef)))
        if cell is not None and label != "admin":
            headlines.append(Headline(
                f"{largest['chunks']:,}: dense recall@10 at {label} visibility (HNSW, ef_search {default_ef})",
                cell["recall_at_10"], "", "exact search", 1.0, bar=RECALL_BAR,
            ))  # fmt: skip
    return rows, headlines


def _cache_rows(sizes: list[dict[str, Any]]) -> tuple[list[Table], list[Headline]]:
    """The dense leg with the FAISS cache per size and visibility, the 1%-against-admin goal cell
    with and without it, and the cache's load; headlines at the largest size."""
    per_visibility, goal, load = [], [], []
    for size in sizes:
        cache = size.get("dense_cache")
        if not cache:
            continue
        n = f"{size['chunks']:,}"
        for label, cell in cache["per_visibility"].items():
            per_visibility.append([n, label, cell["recall_at_10"], cell["p50_ms"], cell["served_by_cache"]])
        for config, cell in cache["one_percent_vs_admin"].items():
            goal.append([n, config, cell["admin_p50_ms"], cell["one_percent_p50_ms"],
                         ratio(cell["one_percent_p50_ms"], cell["admin_p50_ms"]),
                         ", ".join(f"{r:.2f}" for r in cell["window_ratios"])])  # fmt: skip
        load.append([n, cache["vectors"], cache["load_s"], cache["index_mib"], cache["rss_growth_mib"],
                     cache["packed_scopes"]["count"], cache["packed_scopes"]["bytes"] / 2**20])  # fmt: skip
    headlines: list[Headline] = []
    largest = sizes[-1]
    cache = largest.get("dense_cache")
    if cache:
        n = f"{largest['chunks']:,}"
        for label, cell in cache["per_visibility"].items():
            if label != "admin":
                headlines.append(Headline(
                    f"{n}: dense recall@10 at {label} visibility (FAISS cache on CPU)", cell["recall_at_10"], "",
                    "exact search", 1.0, bar=RECALL_BAR,
                ))  # fmt: skip
        visibility = cache["per_visibility"]
        if "100%" in visibility:  # a researcher who sees everything: the ACL push-down's own cost
            headlines.append(Headline(
                f"{n}: dense leg p50 at 100% visibility (FAISS cache on CPU)", visibility["100%"]["p50_ms"], "ms",
                "admin, same probes", visibility["admin"]["p50_ms"], higher_is_better=False, bar=1.2,
            ))  # fmt: skip
        for config, cell in cache["one_percent_vs_admin"].items():
            ratios = cell["window_ratios"]
            headlines.append(Headline(
                f"{n}: dense leg p50, 1% ACL researcher ({config})", cell["one_percent_p50_ms"], "ms",
                "admin, same queries", cell["admin_p50_ms"], higher_is_better=False, bar=ONE_PERCENT_BAR,
                spread=spread(ratios),
            ))  # fmt: skip
    tables = [
        Table("Dense leg with the FAISS cache on CPU (as the gateway runs it)",
              ["chunks", "visibility", "recall@10", "p50 ms", "served by the cache"], per_visibility),
        Table("Dense leg, 1% ACL researcher against admin (interleaved windows)",
              ["chunks", "gateway", "admin p50 ms", "1% p50 ms", "ratio", "windows' ratios"], goal),
        Table("FAISS cache on CPU: load and memory",
              ["chunks", "vectors", "load s", "index MiB", "RSS growth MiB", "packed scopes", "packed MiB"], load),
    ]  # fmt: skip
    return (tables if per_visibility else []), headlines


def _one_percent_headlines(largest: dict[str, Any]) -> list[Headline]:
    """The 1% researcher's semantic_search against the admin's at the largest size, per gateway
    configuration with the lexical index on."""
    out = []
    for mode, run in largest["semantic_search"].items():
        cells_of = run["cells"]
        if mode != "off" and "admin, 1 caller" in cells_of:
            out.append(Headline(
                f"{largest['chunks']:,}: semantic_search p50, 1% ACL researcher (lexical index {mode}, 1 caller)",
                cells_of["1% ACL, 1 caller"]["p50_ms"], "ms", "admin, same store", cells_of["admin, 1 caller"]["p50_ms"],
                higher_is_better=False, bar=ONE_PERCENT_BAR,
            ))  # fmt: skip
    return out


def scale_report(result: dict[str, Any], *, limit: int) -> SuiteResult:
    """The lexical section's report plus semantic_search per size and mode (``limit`` its searches'
    limit), and the growth."""
    lexical = lexical_report([s["lexical"] for s in result["sizes"]])
    cells = [
        {
            **c,
            "chunks": f"{size['chunks']:,}",
            "mode": mode,
            "name": name,
            "ready_s": run["ready_s"],
            "pss_mib": run.get("memory", {}).get("pss_mib"),
        }
        for size in result["sizes"]
        for mode, run in size["semantic_search"].items()
        for name, c in run["cells"].items()
    ]
    growth, growth_headlines = _growth(result["sizes"])
    recall_rows, recall_headlines = _recall_rows(result["sizes"])
    cache_tables, cache_headlines = _cache_rows(result["sizes"])
    tables = [
        Table(
            f"semantic_search through the gateway, limit {limit}",
            headings(SEARCH_CELLS),
            rows(SEARCH_CELLS, cells),
        ),
        Table(
            "Dense recall@10 vs exact search (pgvector: the dense leg as the gateway runs it without the cache)",
            ["chunks", "visibility", "hnsw.ef_search", "recall@10", "p50 ms"],
            recall_rows,
        ),
        *cache_tables,
        *_operations_tables(result["sizes"]),
        *cost_tables(result["sizes"]),
    ]
    if growth:
        title = "semantic_search growth, same run (largest size / smallest)"
        tables.append(Table(title, headings(GROWTH), rows(GROWTH, growth)))
    headlines = (
        growth_headlines
        + _one_percent_headlines(result["sizes"][-1])
        + _issue_44(result["sizes"])
        + _rebuild_headlines(result["sizes"])
        + cost_headlines(result["sizes"])
    )
    return SuiteResult(
        suite="retrieval at scale",
        headlines=lexical.headlines + recall_headlines + cache_headlines + headlines,
        tables=lexical.tables + tables,
        figures=result,
        notes=[*lexical.notes, *NOTES],
    )


def _rebuild_headlines(sizes: list[dict[str, Any]]) -> list[Headline]:
    """Each writer's rebuild peaks (RSS, private memory) at the largest size against themselves at
    the smallest (same run), and the lexical writer's RSS at 1M chunks or more against its budget."""
    built = [s for s in sizes if s.get("lexical_rebuild")]
    if not built:
        return []
    small, large = built[0], built[-1]
    out = []
    for writer in ("lexical", "vectors"):
        if len(built) > 1 and small.get(f"{writer}_rebuild") and large.get(f"{writer}_rebuild"):
            for figure, what in (
                ("writer_peak_rss_mib", "peak RSS"),
                ("writer_peak_private_mib", "peak private memory"),
            ):
                out.append(Headline(
                    f"mnemo {writer} rebuild {what}, {large['chunks']:,} vs {small['chunks']:,} chunks",
                    large[f"{writer}_rebuild"][figure], "MiB", f"itself at {small['chunks']:,} chunks",
                    small[f"{writer}_rebuild"][figure], higher_is_better=False, bar=REBUILD_GROWTH_BAR,
                ))  # fmt: skip
    if large["chunks"] >= 1_000_000:
        out.append(Headline(
            f"{large['chunks']:,}: mnemo lexical rebuild peak RSS", large["lexical_rebuild"]["writer_peak_rss_mib"],
            "MiB", f"the budget ({REBUILD_BUDGET_MIB:.0f} MiB)", REBUILD_BUDGET_MIB, higher_is_better=False, bar=1.0,
        ))  # fmt: skip
    return out


def _operations_tables(sizes: list[dict[str, Any]]) -> list[Table]:
    """The Tantivy rebuild per size, the cache under load and its workers, the largest size's
    gateway workers (each when measured)."""

    def at(size: dict[str, Any], key: str) -> Any:
        return {**size[key], "chunks": f"{size['chunks']:,}"} if size.get(key) else None

    rebuilds = [{**r, "writer": writer} for s in sizes for writer in ("lexical", "vectors")
                if (r := at(s, f"{writer}_rebuild"))]  # fmt: skip
    loaded = [
        {**c, "chunks": f"{s['chunks']:,}"} for s in sizes if "sync" in (c := s.get("dense_cache") or {})
    ]
    mapped = [{**w, "chunks": f"{s['chunks']:,}", "mode": mode, "worker": i + 1}
              for s in sizes if s.get("mapped_workers") for mode in MAPPED_MODES
              for i, w in enumerate(s["mapped_workers"][mode])]  # fmt: skip
    tables = [Table(title, headings(columns), rows(columns, items)) for title, columns, items in (
        ("The writers' rebuilds (`mnemo lexical rebuild`, `mnemo vectors rebuild`)", REBUILD, rebuilds),
        ("The FAISS cache on CPU under 32 callers and under a writer", UNDER_LOAD, loaded),
        ("FAISS cache workers: read from PostgreSQL against the snapshot mapped", MAPPED, mapped),
    ) if items]  # fmt: skip
    workers = sizes[-1].get("workers")
    if workers:
        cells = [{"name": n, "rps": workers["requests_per_s"][n], "p50_ms": workers["p50_ms"][n],
                  "cores": ", ".join(f"{g} {c}" for g, c in workers["cores"][n].items() if c >= 0.01)}
                 for n in workers["requests_per_s"]]  # fmt: skip
        title = (f"Gateway workers ({sizes[-1]['chunks']:,} chunks, {workers['callers']} callers, "
                 f"{len(workers['passes'])} alternating passes of {workers['window_s']:g} s)")  # fmt: skip
        tables.append(Table(title, headings(WORKERS), rows(WORKERS, cells)))
    return tables


def _issue_44(sizes: list[dict[str, Any]]) -> list[Headline]:
    """Issue 44's bars at the largest size, each from what this run measured there; and the cache's
    figures under load (32 callers, a further worker)."""
    largest = sizes[-1]
    n, search = f"{largest['chunks']:,}", largest["semantic_search"]
    out = [Headline(f"{n}: gateway ready (lexical index {mode})", search[mode]["ready_s"], "s", "issue 44's bar",
                    READY_BAR_S, higher_is_better=False, bar=1.0)
           for mode in ("tantivy", "tantivy, 2 workers") if mode in search]  # fmt: skip
    if {"tantivy", "tantivy, 2 workers"} <= set(search) and "memory" in search["tantivy"]:
        growth = search["tantivy, 2 workers"]["memory"]["pss_mib"] - search["tantivy"]["memory"]["pss_mib"]
        out.append(Headline(f"{n}: PSS a second gateway worker adds", growth, "MiB", "issue 44's bar",
                            WORKER_GROWTH_BAR_MIB, higher_is_better=False, bar=1.0))  # fmt: skip
    for name, cell in search.get("tantivy, 2 workers", {}).get("cells", {}).items():
        if name.startswith("admin"):
            out.append(Headline(f"{n}: semantic_search p99 (lexical index tantivy, 2 workers, {name})",
                                cell["p99_ms"], "ms", "issue 44's bar", SEARCH_P99_BAR_MS, higher_is_better=False,
                                bar=1.0))  # fmt: skip
    workers = largest.get("workers")
    if workers:
        one, many = workers["requests_per_s"].values()
        out.append(Headline(f"{n}: semantic_search req/s, {workers['workers']} gateway workers, {workers['callers']} "
                            "callers", many, "req/s", "1 worker, same store, alternating windows", one,
                            bar=WORKERS_BAR, spread=tuple(workers["throughput_ratio_spread"])))  # fmt: skip
    cache = largest.get("dense_cache") or {}
    if "callers_32" in cache:
        on, off = cache["callers_32"]["cache on"], cache["callers_32"]["cache off"]
        out.append(Headline(f"{n}: dense leg queries/s at 32 callers, FAISS cache on", on["qps"], "q/s",
                            "cache off (pgvector)", off["qps"], bar=1.0))  # fmt: skip
    mapped = largest.get("mapped_workers")
    if mapped:
        store, mmap = mapped["store"][1], mapped["mmap"][1]
        out += [Headline(f"{n}: second cache worker ready, snapshot mapped", mmap["ready_s"], "s",
                         "loaded from PostgreSQL", store["ready_s"], higher_is_better=False),
                Headline(f"{n}: second cache worker's private memory growth, snapshot mapped",
                         mmap["uss_growth"] / 2**20, "MiB", "loaded from PostgreSQL", store["uss_growth"] / 2**20,
                         higher_is_better=False)]  # fmt: skip
    return out
