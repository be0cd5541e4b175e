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
from .tables import Column, headings, rows

__all__ = ["GROWTH_BAR", "ONE_PERCENT_BAR", "RECALL_BAR", "scale_report"]

GROWTH_BAR = 1.5  # issue 24: semantic_search p50 at 1M within 1.5x of itself at 100k
RECALL_BAR = 0.95  # issue 24: dense recall@10 against exact at every visibility
ONE_PERCENT_BAR = 2.0  # issue 24: a 1%-visibility researcher's dense leg within 2x of the admin's

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
        {**c, "chunks": f"{size['chunks']:,}", "mode": mode, "name": name, "ready_s": run["ready_s"]}
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
    ]
    if growth:
        title = "semantic_search growth, same run (largest size / smallest)"
        tables.append(Table(title, headings(GROWTH), rows(GROWTH, growth)))
    headlines = growth_headlines + _one_percent_headlines(result["sizes"][-1])
    return SuiteResult(
        suite="retrieval at scale",
        headlines=lexical.headlines + recall_headlines + cache_headlines + headlines,
        tables=lexical.tables + tables,
        figures=result,
        notes=[*lexical.notes, *NOTES],
    )
