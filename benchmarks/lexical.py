"""The lexical leg at scale: the in-memory index against the SQL leg and Tantivy BM25, in one run.

The in-memory index (:mod:`benchmarks.memory_lexical`) is no product engine (the gateway's lexical
leg is the SQL leg or the on-disk Tantivy engine): it is the exact reference baseline these legs,
and :mod:`benchmarks.tantivy_scale`'s bars, are measured against.

``python -m benchmarks.lexical --sizes 100000 --out DIR`` builds, per size, one partition of ``n``
chunks with realistic term statistics (issue 24): every unique sentence of the bundled data sets
(``benchmarks/datasets``: their corpora split into sentences), then text drawn from real word
frequencies (the ``wordfreq`` package's lists for English, Spanish and German, Zipfian by
construction) up to ``n``. No "(copy k)" cycling: a term's posting list is as long as its language
makes it. Every record is in project 1, every 10th also in project 2 and every 100th also in
project 3, so a researcher holding only project 3 sees 1% of the chunks.

Queries: the data sets' own (a sample) plus generated ones over the store's vocabulary: rare terms
(1-3 words of document frequency 1-10), common terms (1-4 words in more than 1% of the chunks) and
mixed (2-12 words, half common). Then, all in the same run, one caller, ``k`` = 40 (the gateway's
over-fetch for ``limit`` 10):

- **SQL leg**: :func:`index.search.lexical_leg.lexical_search` (statistics cached, warm), admin and 1% ACL;
- **index leg**: :meth:`benchmarks.memory_lexical.LexicalIndex.search`, the whole leg (plan, in-memory
  top-k, the re-read of the hits' rows scored in SQL), admin and 1% ACL;
- **index core**: the in-memory part alone (plan + top-k slots), what a search engine returns;
- **Tantivy BM25** (PyPI ``tantivy``) over the same folded texts, the same scored terms as one
  OR query, top ``k`` addresses and scores.

Build times are reported apart (the store's COPY with its GIN index, the index's load from the
store, Tantivy's indexing and commit), with the in-process index's array bytes, the process RSS
growth of its load and Tantivy's index size on disk. Exactness: the index leg's hits and scores
are compared with the SQL leg's for every query. Tantivy quantizes field norms to one byte and
tokenizes on its own, so its scores are not BM25-equal; it is the speed baseline only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .acl_shares import VISIBILITY_PROJECT, projects_of
from .corpus_text import zipf_texts
from .datasets import find_datasets
from .gateway import gateway_read_pool
from .measure import interleaved_windows, p50_p99_ms, rss_bytes, spread, window_ratios
from .report import Headline, SuiteResult, Table, write_report
from .stack import BenchStack, open_stack

__all__ = ["build_corpus", "run_lexical_benchmark"]

MODEL = "bench-lexical-4"
DIM = 4  # the vectors do not matter here; the lexical leg never reads them
SECTION = "lex1"
K = 40
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def real_sentences() -> list[str]:
    """Every unique sentence (4+ words) of the bundled data sets' corpora, in a stable order."""
    seen: dict[str, None] = {}
    for folder in find_datasets(("*",)):
        for line in (folder / "corpus.jsonl").read_text().splitlines():
            doc = json.loads(line)
            for sentence in _SENTENCE.split(" ".join(p for p in (doc.get("title"), doc.get("text")) if p)):
                sentence = sentence.strip()
                if len(sentence.split()) >= 4:
                    seen.setdefault(sentence)
    return list(seen)


def dataset_queries() -> list[str]:
    out: list[str] = []
    for folder in find_datasets(("*",)):
        lines = (folder / "queries.jsonl").read_text().splitlines()
        out.extend(json.loads(line)["text"] for line in lines if line.strip())
    return out


def build_corpus(n: int, seed: int = 0) -> list[str]:
    """``n`` chunk texts: the real sentences first (up to ``n``), then Zipfian text."""
    real = real_sentences()[:n]
    return real + zipf_texts(n - len(real), np.random.default_rng(seed))


VectorsOf = Callable[[int, int], np.ndarray]  # rows start .. stop - 1 -> their unit vectors


async def populate(
    pool: Any,
    texts: Sequence[str],
    *,
    model: str = MODEL,
    dimension: int = DIM,
    vectors: VectorsOf | None = None,
) -> Any:
    """The texts as one record and chunk each, loaded as a backfill does (COPY into a shadow without
    indexes, one index build, a swap): at 1M rows, COPY with the GIN index maintained took over 16
    minutes. Record ``i + 1`` holds chunk ``i``, in the projects :func:`projects_of` gives it.

    Without ``vectors`` every row gets the same constant vector and the HNSW index is dropped (the
    lexical leg never reads it); with them the partition keeps its HNSW index, built on the rows.
    """
    from index.store.partitions import ensure_partition
    from index.store.store import EmbeddingRow
    from index.text import fold

    from .bulk_load import bulk_load

    partition = await ensure_partition(pool, model, dimension)
    meta = {"contributors": ["c1"]}
    constant = np.ones((10_000, dimension), dtype=np.float32)

    def batches() -> Iterator[list[EmbeddingRow]]:
        for start in range(0, len(texts), 10_000):
            stop = min(start + 10_000, len(texts))
            vecs = constant if vectors is None else vectors(start, stop)
            yield [
                EmbeddingRow("text", SECTION, i + 1, "rag:doc", "lg-nolan", 0, f"h{i}", texts[i], fold(texts[i]),
                             vecs[i - start], projects=projects_of(i + 1), chunk_meta=meta)
                for i in range(start, stop)
            ]  # fmt: skip

    async with pool.acquire() as conn:
        if vectors is None:
            await conn.execute(f'DROP INDEX IF EXISTS "{partition.partition}_hnsw"')  # no dense leg here
        await bulk_load(conn, partition, batches(), build_workers=2)
        await conn.execute(f"ANALYZE {partition.table}")
    return partition


def _generated_queries(lexicon: Any, rng: random.Random, each: int) -> dict[str, list[str]]:
    """Rare, common and mixed queries over the store's vocabulary (by live document frequency)."""
    terms = [t for t in lexicon.postings if t.isalpha() and len(t) > 2]
    df = {t: lexicon.df(t, None) for t in terms}
    n = lexicon.live
    rare = [t for t in terms if 1 <= df[t] <= 10]
    common = [t for t in terms if df[t] > 0.01 * n]
    rng.shuffle(rare)
    return {
        "rare": [" ".join(rng.sample(rare, rng.randint(1, 3))) for _ in range(each)],
        "common": [" ".join(rng.sample(common, rng.randint(1, 4))) for _ in range(each)],
        "mixed": [
            " ".join(rng.sample(common, w // 2) + rng.sample(rare, w - w // 2))
            for w in (rng.randint(2, 12) for _ in range(each))
        ],
    }


def _tantivy_build(texts: Sequence[str], path: Path) -> tuple[Any, Any, float]:
    import tantivy

    builder = tantivy.SchemaBuilder()
    builder.add_text_field("text", stored=False)
    builder.add_integer_field("chunk", stored=True)  # which text: how a hit finds its row
    schema = builder.build()
    start = time.perf_counter()
    index = tantivy.Index(schema, path=str(path))
    writer = index.writer(heap_size=256 * 2**20, num_threads=1)
    for i, text in enumerate(texts):
        writer.add_document(tantivy.Document(text=text, chunk=i))
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    return index, schema, time.perf_counter() - start


def _disk_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


async def _timed(fn: Callable[[str], Awaitable[Any]], queries: Sequence[str]) -> list[float]:
    for q in queries[:5]:
        await fn(q)  # warm-up
    times = []
    for q in queries:
        t = time.perf_counter()
        await fn(q)
        times.append(time.perf_counter() - t)
    return times


async def _one_size(url: str, n: int, n_dataset_queries: int, each: int) -> dict[str, Any]:
    pool = await gateway_read_pool(url)
    try:
        texts = build_corpus(n)
        start = time.perf_counter()
        partition = await populate(pool, texts)
        return await measure_lexical(
            pool, url, partition, texts, time.perf_counter() - start, n_dataset_queries, each
        )
    finally:
        await pool.close()


class _IndexLegs:
    """The lexical legs over one partition, in ``scope`` unless told another: the SQL leg, the
    in-memory baseline's leg (its re-read included, as the retired ``RAG_LEXICAL_INDEX=memory`` ran
    it) and the baseline's core alone (planning and top-k, no re-read)."""

    def __init__(self, pool: Any, partition: Any, index: Any, lexicon: Any, scope: Any) -> None:
        from index.search.bm25 import CorpusStats

        self.pool, self.partition, self.index, self.lexicon, self.scope = (
            pool,
            partition,
            index,
            lexicon,
            scope,
        )
        self.stats = CorpusStats(ttl=3600.0)

    async def sql(self, q: str, scope: Any = None) -> Any:
        from index.search.lexical_leg import lexical_search

        scope = self.scope if scope is None else scope
        return await lexical_search(self.pool, self.partition, q, scope, K, stats=self.stats)

    async def indexed(self, q: str, scope: Any = None) -> Any:
        scope = self.scope if scope is None else scope
        async with self.pool.acquire() as conn:
            hits = await self.index.search(conn, self.partition, q, scope, K)
        assert hits is not None, "the index declined a search it should serve"
        return hits

    async def core(self, q: str) -> Any:
        async with self.pool.acquire() as conn:
            plan = await self.index.plan(conn, self.lexicon, q, None)
        return None if plan is None else self.lexicon.top(plan, None, (), K)


class _TantivyLegs:
    """Tantivy BM25 over the same folded texts and scored terms (one OR query): bare, and kept exact
    beside PostgreSQL the way the index leg is (its hits' keys re-read, with every key changed since
    the watermark, through the scope's SQL: the index leg's re-read)."""

    def __init__(self, built: tuple[Any, Any], terms_of: dict[str, list[str]], index: Any, lexicon: Any,
                 partition: Any, pool: Any, scope: Any) -> None:  # fmt: skip
        t_index, self.schema = built
        self.searcher = t_index.searcher()
        self.terms_of, self.index, self.lexicon, self.partition, self.pool = (
            terms_of,
            index,
            lexicon,
            partition,
            pool,
        )
        self.scope = scope
        # Populate put text i in record i + 1: a Tantivy hit's stored chunk number finds its key.
        self.key_of_text = {key[1] - 1: key for key in lexicon.key_of if key is not None}
        self.reread_rows = 0  # rows the re-read of Tantivy's hits returned: 0 would mean wrong keys

    def hits(self, q: str, k: int) -> Any:
        import tantivy

        terms = self.terms_of[q]
        if not terms:
            return []
        query = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(self.schema, "text", t)) for t in terms]
        )
        return self.searcher.search(query, k).hits

    async def bare(self, q: str) -> Any:
        return self.hits(q, K)

    async def kept_exact(self, q: str) -> Any:
        from index.search.lexical_reread import reread_candidates

        hits = self.hits(q, K + 8)  # the index leg's first fetch (limit + 8)
        if not hits:
            return []
        keys = [self.key_of_text[self.searcher.doc(address)["chunk"][0]] for _, address in hits]
        async with self.pool.acquire() as conn:
            plan = await self.index.plan(conn, self.lexicon, q, None)
            if plan is None:
                return []
            scores = np.asarray([score for score, _ in hits])
            rows, _ = await reread_candidates(
                conn, self.partition, plan, self.scope, keys, scores.tolist(), self.lexicon.watermark
            )
        self.reread_rows += len(rows)
        return rows


async def _mismatches(queries: Sequence[str], indexed: Any, sql: Any) -> int:
    """Queries whose index-leg hits differ from the SQL leg's (keys, or scores beyond 1e-9)."""
    mismatches = 0
    for q in queries:
        a, b = await indexed(q), await sql(q)
        same = [h.key for h in a] == [h.key for h in b] and np.allclose(
            [h.score for h in a], [h.score for h in b], rtol=1e-9
        )
        mismatches += not same
    return mismatches


def _by_set(sets: dict[str, list[str]], times: Sequence[float]) -> dict[str, Any]:
    """p50/p99 over all and per query set; ``times`` holds one or more passes over the sets' queries."""
    set_of = [label for label, qs in sets.items() for _ in qs]
    labels = set_of * (len(times) // len(set_of))
    per_set = {label: [t for t, s in zip(times, labels, strict=True) if s == label] for label in sets}
    return {"all": p50_p99_ms(times), **{label: p50_p99_ms(ts) for label, ts in per_set.items()}}


# The headline ratios of the fast legs: value over baseline, per interleaved window.
WINDOW_RATIOS = (("index core", "tantivy"), ("index", "tantivy + re-read"), ("index", "tantivy"))


async def _latencies(
    sets: dict[str, list[str]], legs: dict[str, Any], sql: Any, narrow: Any, windows: int
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Every leg's latency per query set, and the fast legs' window ratios. The SQL leg runs once; the
    fast legs, whose ratios are the headlines, in interleaved windows (one slow spell of the machine
    would otherwise fall on one leg's block: 1.6x to 3.1x in three runs of one store)."""
    queries = [q for qs in sets.values() for q in qs]
    latency: dict[str, dict[str, Any]] = {"sql": _by_set(sets, await _timed(sql, queries))}
    windowed = await interleaved_windows(legs, queries, windows)
    for name, per_window in windowed.items():
        latency[name] = _by_set(sets, [t for w in per_window for t in w])
    ratios = {f"{v} / {b}": window_ratios(windowed[v], windowed[b]) for v, b in WINDOW_RATIOS}
    latency["sql 1% ACL"] = {"all": p50_p99_ms(await _timed(lambda q: sql(q, narrow), queries))}
    latency["index 1% ACL"] = {"all": p50_p99_ms(await _timed(lambda q: legs["index"](q, narrow), queries))}
    return latency, ratios


async def _query_sets(
    pool: Any, lexicon: Any, n_dataset_queries: int, each: int
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The query sets (the data sets' queries, shuffled, then the generated rare, common and mixed
    ones) and each query's scored terms, parsed as the legs do (cached by query_terms afterwards)."""
    from index.search.bm25 import query_terms, scored_terms

    rng = random.Random(7)
    from_data = dataset_queries()
    rng.shuffle(from_data)
    sets = {"datasets": from_data[:n_dataset_queries], **_generated_queries(lexicon, rng, each)}
    terms_of = {q: list(scored_terms(await query_terms(pool, q))) for qs in sets.values() for q in qs}
    return sets, terms_of


def _footprint(
    lexicon: Any, built_s: dict[str, float], rss_growth: int, tantivy_bytes: int
) -> dict[str, Any]:
    """Build times (the store's and Tantivy's in ``built_s``, the index's load) and memory."""
    return {
        "build_s": {
            "store COPY + GIN": built_s["store COPY + GIN"],
            "index load": lexicon.load_seconds,
            "tantivy": built_s["tantivy"],
        },
        "memory": {
            "index_array_mib": lexicon.nbytes / 2**20,
            "index_rss_growth_mib": rss_growth / 2**20,
            "postings": lexicon.posting_count,
            "terms": len(lexicon.postings),
            "tantivy_disk_mib": tantivy_bytes / 2**20,
        },
    }


async def measure_lexical(
    pool: Any,
    url: str,
    partition: Any,
    texts: Sequence[str],
    store_s: float,
    n_dataset_queries: int,
    each: int,
    windows: int = 3,
) -> dict[str, Any]:
    """Every leg over one store :func:`populate` built from ``texts`` in ``store_s`` seconds.

    ``pool``: a read pool like the gateway's (:func:`benchmarks.gateway.gateway_read_pool`), so the
    index leg's re-read runs as in the gateway. The SQL leg runs once over the queries; the others
    in ``windows`` interleaved windows (:func:`benchmarks.measure.interleaved_windows`), each
    headline ratio with the spread of its windows' ratios.
    """
    from gateway.access.acl import pushdown
    from gateway.access.auth import Principal
    from index.store.hits import Scope
    from index.text import fold

    from .memory_lexical import LexicalConfig, LexicalIndex

    n = len(texts)
    real = min(n, len(real_sentences()))
    tantivy_dir = Path(tempfile.mkdtemp(prefix="mnemo-bench-tantivy-"))
    try:
        rss = rss_bytes()
        index = LexicalIndex(pool, url, LexicalConfig())
        lexicon = await index.load(partition)
        rss_growth = rss_bytes() - rss
        t_index, schema, tantivy_s = await asyncio.to_thread(
            _tantivy_build, [fold(t) for t in texts], tantivy_dir
        )
        tantivy_bytes = await asyncio.to_thread(_disk_bytes, tantivy_dir)

        sets, terms_of = await _query_sets(pool, lexicon, n_dataset_queries, each)
        queries = [q for qs in sets.values() for q in qs]
        admin = Scope()
        narrow = Scope(acl=pushdown(Principal("r", frozenset({VISIBILITY_PROJECT["1%"]}), {SECTION: 1})))
        engine = _TantivyLegs((t_index, schema), terms_of, index, lexicon, partition, pool, admin)
        ours = _IndexLegs(pool, partition, index, lexicon, admin)
        # Exactness first (this also warms the SQL leg's statistics and the query-term cache).
        mismatches = await _mismatches(queries, ours.indexed, ours.sql)
        fast = {"index": ours.indexed, "index core": ours.core, "tantivy": engine.bare,
                "tantivy + re-read": engine.kept_exact}  # fmt: skip
        latency, window_p50_ratios = await _latencies(sets, fast, ours.sql, narrow, windows)
        await index.stop()
        return {
            "chunks": n,
            "real_sentences": real,
            "zipf_chunks": n - real,
            "queries": {label: len(qs) for label, qs in sets.items()},
            "index_vs_sql_mismatches": mismatches,
            "tantivy_reread_rows": engine.reread_rows,
            **_footprint(
                lexicon, {"store COPY + GIN": store_s, "tantivy": tantivy_s}, rss_growth, tantivy_bytes
            ),
            "latency": latency,
            "windows": windows,
            "window_p50_ratios": window_p50_ratios,
        }
    finally:
        shutil.rmtree(tantivy_dir, ignore_errors=True)


async def run_lexical_benchmark(
    stack: BenchStack, sizes: Sequence[int], *, dataset_queries_n: int, each: int
) -> dict[str, Any]:
    """Every size on its own fresh database of the stack's PostgreSQL; a JSON-able dict."""
    results = []
    for n in sizes:
        url = await stack.fresh_database(f"lexical_{n}")
        results.append(await _one_size(url, n, dataset_queries_n, each))
    return {"sizes": results}


_BASELINE_NAMES = {"tantivy": "Tantivy BM25", "tantivy + re-read": "Tantivy BM25 + the same re-read"}


def _against(
    n: str,
    latency: dict[str, Any],
    window_ratios_of: dict[str, list[float]],
    name: str,
    value: str,
    baseline: str,
    bar: float | None,
) -> Headline:
    """Leg ``value``'s pooled p50 against ``baseline``'s, with its windows' ratios as the spread
    (runs before the windows have none)."""
    ratios = window_ratios_of.get(f"{value} / {baseline}")
    return Headline(
        f"{n}: {name}",
        latency[value]["all"]["p50_ms"],
        "ms",
        _BASELINE_NAMES[baseline],
        latency[baseline]["all"]["p50_ms"],
        higher_is_better=False,
        bar=bar,
        spread=spread(ratios) if ratios else None,
    )


def as_suite(result: dict[str, Any]) -> SuiteResult:
    headlines: list[Headline] = []
    latency_rows, build_rows = [], []
    for r in result["sizes"]:
        n = f"{r['chunks']:,}"
        lat = r["latency"]
        for leg, cells in lat.items():
            for label, cell in cells.items():
                latency_rows.append([n, leg, label, cell["p50_ms"], cell["p99_ms"]])
        build_rows.append([n, r["build_s"]["store COPY + GIN"], r["build_s"]["index load"], r["build_s"]["tantivy"],
                           r["memory"]["index_array_mib"], r["memory"]["index_rss_growth_mib"],
                           r["memory"]["tantivy_disk_mib"], r["memory"]["postings"],
                           r["index_vs_sql_mismatches"]])  # fmt: skip
        ratios = r.get("window_p50_ratios", {})
        headlines.append(
            _against(n, lat, ratios, "lexical leg p50 (index, whole leg)", "index", "tantivy", bar=3.0)
        )
        headlines.append(_against(n, lat, ratios, "lexical p50 (index core, in memory)", "index core", "tantivy",
                                  bar=3.0))  # fmt: skip
        if "tantivy + re-read" in lat:  # like for like: an engine beside PostgreSQL kept exact the same way
            headlines.append(_against(n, lat, ratios, "lexical leg p50 (index, whole leg)", "index",
                                      "tantivy + re-read", bar=3.0))  # fmt: skip
        headlines.append(Headline(f"{n}: lexical leg p50 (index)", lat["index"]["all"]["p50_ms"], "ms",
                                  "SQL leg", lat["sql"]["all"]["p50_ms"], higher_is_better=False))  # fmt: skip
        headlines.append(Headline(f"{n}: lexical leg p99 (index)", lat["index"]["all"]["p99_ms"], "ms",
                                  "SQL leg", lat["sql"]["all"]["p99_ms"], higher_is_better=False))  # fmt: skip
    tables = [
        Table(
            "Lexical latency, 1 caller, k = 40 (ms)", ["chunks", "leg", "queries", "p50", "p99"], latency_rows
        ),
        Table(
            "Build, memory, exactness",
            [
                "chunks",
                "store COPY+GIN s",
                "index load s",
                "Tantivy build s",
                "index arrays MiB",
                "index RSS growth MiB",
                "Tantivy disk MiB",
                "postings",
                "index != SQL queries",
            ],
            build_rows,
        ),
    ]
    notes = [
        "index: the whole leg (query plan from the in-memory statistics, in-memory top-k, one SQL re-read of "
        "the hits' rows with their BM25 scored by the SQL leg's expression). index core: the in-memory part "
        "alone, comparable to Tantivy's search (addresses and scores, no stored rows).",
        "Tantivy: same folded texts, same scored query terms as one OR (Should) query, 1 indexing thread; its "
        "field norms are quantized to a byte and its tokenizer is its own, so its scores are not BM25-equal.",
        "Tantivy + re-read: Tantivy beside PostgreSQL kept as exact as the index leg: its top k + 8 hits' stored "
        "chunk numbers, then the index leg's own re-read of those keys plus every key changed since the "
        "watermark, through the scope's SQL (what any engine beside the store pays to never be stale).",
        "1% ACL: a researcher holding a project that 1% of the records carry.",
        "index, index core, Tantivy and Tantivy + re-read ran in interleaved windows (every query on every leg "
        "back to back, the order alternating); a ratio is the pooled p50 over the baseline's, its spread the "
        "windows' own p50 ratios. The SQL leg ran once, alone.",
    ]
    return SuiteResult(suite="lexical", headlines=headlines, tables=tables, figures=result, notes=notes)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lexical", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100000", help="chunks per run, comma-separated (a scale run: 1000000)")
    p.add_argument("--dataset-queries", type=int, default=150, help="queries sampled from the data sets")
    p.add_argument(
        "--generated", type=int, default=50, help="generated queries per kind (rare, common, mixed)"
    )
    p.add_argument("--database-url", default=None, help="a PostgreSQL server to use (default: embedded)")
    p.add_argument("--out", type=Path, required=True, help="report folder (results.json, REPORT.md)")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    with (
        tempfile.TemporaryDirectory(prefix="mnemo-bench-lexical-") as work,
        open_stack(Path(work), database=True, sidecar=False, database_url=args.database_url) as stack,
    ):
        result = asyncio.run(
            run_lexical_benchmark(stack, sizes, dataset_queries_n=args.dataset_queries, each=args.generated)
        )
    report = write_report(args.out, [as_suite(result)], {"suite": "lexical", "sizes": sizes})
    print(report.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
