"""The lexical leg at scale, the retrieval section's lexical cells (:func:`measure_lexical`): the
Tantivy engine (the gateway's leg on the store's index) against the SQL leg and Tantivy's own bare
search, on a corpus with realistic term statistics (:func:`build_corpus`: the bundled data sets'
sentences, then Zipfian text in their languages) whose records give researchers 100%, 10% and 1%
visibility. The engine's hits carry the SQL leg's scores by construction; its candidates are
Tantivy's own ranking, so its answer is judged against the SQL leg's (recall@k). Tantivy's bare
search (its own tokenizer, byte-quantized norms) is the speed baseline only. benchmarks/README.md
says what each cell is.
"""

from __future__ import annotations

import asyncio
import random
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .acl_shares import VISIBILITY_PROJECT, projects_of
from .corpus_text import zipf_texts
from .datasets import document_text, find_datasets, read_jsonl
from .measure import folder_mib, interleaved_windows, p50_p99_ms, spread, window_ratios
from .report import Headline, SuiteResult, Table

__all__ = ["build_corpus", "corpus_row", "lexical_report", "measure_lexical", "populate"]

MODEL = "bench-lexical-4"
DIM = 4  # the vectors do not matter here; the lexical leg never reads them
SECTION = "lex1"
K = 40
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def real_sentences() -> list[str]:
    """Every unique sentence (4+ words) of the bundled data sets' corpora, in a stable order."""
    seen: dict[str, None] = {}
    for folder in find_datasets(("*",)):
        for doc in read_jsonl(folder, "corpus.jsonl"):
            for sentence in _SENTENCE.split(document_text(doc)):
                sentence = sentence.strip()
                if len(sentence.split()) >= 4:
                    seen.setdefault(sentence)
    return list(seen)


def dataset_queries() -> list[str]:
    """Every query of the bundled data sets."""
    return [q["text"] for folder in find_datasets(("*",)) for q in read_jsonl(folder, "queries.jsonl")]


def build_corpus(n: int, seed: int = 0) -> list[str]:
    """``n`` chunk texts: the real sentences first (up to ``n``), then Zipfian text."""
    real = real_sentences()[:n]
    return real + zipf_texts(n - len(real), np.random.default_rng(seed))


VectorsOf = Callable[[int, int], np.ndarray]  # rows start .. stop - 1 -> their unit vectors


def corpus_row(i: int, text: str, vector: np.ndarray, source_hash: str | None = None) -> Any:
    """Chunk ``i`` of the corpus as its row: record ``i + 1`` alone, in the projects
    :func:`benchmarks.acl_shares.projects_of` gives it."""
    from index.store.store import EmbeddingRow
    from index.text import fold

    return EmbeddingRow("text", SECTION, i + 1, "rag:doc", "lg-nolan", 0, source_hash or f"h{i}", text, fold(text),
                        vector, projects=projects_of(i + 1), chunk_meta={"contributors": ["c1"]})  # fmt: skip


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

    from .bulk_load import bulk_load

    partition = await ensure_partition(pool, model, dimension)
    constant = np.ones((10_000, dimension), dtype=np.float32)

    def batches() -> Iterator[list[Any]]:
        for start in range(0, len(texts), 10_000):
            stop = min(start + 10_000, len(texts))
            vecs = constant if vectors is None else vectors(start, stop)
            yield [corpus_row(i, texts[i], vecs[i - start]) for i in range(start, stop)]

    async with pool.acquire() as conn:
        if vectors is None:
            await conn.execute(f'DROP INDEX IF EXISTS "{partition.partition}_hnsw"')  # no dense leg here
        await bulk_load(conn, partition, batches(), build_workers=2)
        await conn.execute(f"ANALYZE {partition.table}")
    return partition


def visibility_scopes() -> dict[str, Any]:
    """The admin's scope (nothing filtered) and, per visibility of a store :func:`populate` built,
    the scope of a researcher who sees that share of its records."""
    from gateway.access.acl import pushdown
    from gateway.access.auth import Principal
    from index.store.hits import Scope

    return {"admin": Scope()} | {
        share: Scope(acl=pushdown(Principal("r", frozenset({project}), {SECTION: 1})))
        for share, project in VISIBILITY_PROJECT.items()
    }


def _generated_queries(texts: Sequence[str], rng: random.Random, each: int) -> dict[str, list[str]]:
    """Rare, common and mixed queries over the corpus's words (by the number of chunks holding each)."""
    from index.text import fold

    df = Counter(w for t in texts for w in set(re.findall(r"[^\W\d_]{3,}", fold(t))))
    words = sorted(df)
    rare = [w for w in words if df[w] <= 10]
    common = [w for w in words if df[w] > 0.01 * len(texts)]
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
    schema = builder.build()
    start = time.perf_counter()
    index = tantivy.Index(schema, path=str(path))
    writer = index.writer(heap_size=256 * 2**20, num_threads=1)
    for text in texts:
        writer.add_document(tantivy.Document(text=text))
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    return index, schema, time.perf_counter() - start


async def _timed(fn: Callable[[str], Awaitable[Any]], queries: Sequence[str]) -> list[float]:
    for q in queries[:5]:
        await fn(q)  # warm-up
    times = []
    for q in queries:
        t = time.perf_counter()
        await fn(q)
        times.append(time.perf_counter() - t)
    return times


class _Legs:
    """The lexical legs over one partition: the SQL leg and the Tantivy engine in a scope, and
    Tantivy's bare search over the same folded texts and scored terms (one OR query)."""

    def __init__(self, pool: Any, partition: Any, engine: Any, bare: tuple[Any, Any], terms_of: dict) -> None:
        from index.search.bm25 import CorpusStats

        self.pool, self.partition, self.engine, self.terms_of = pool, partition, engine, terms_of
        self.stats = CorpusStats(ttl=3600.0)
        index, self.schema = bare
        self.searcher = index.searcher()

    async def sql(self, q: str, scope: Any) -> Any:
        from index.search.lexical_leg import lexical_search

        return await lexical_search(self.pool, self.partition, q, scope, K, stats=self.stats)

    async def tantivy(self, q: str, scope: Any) -> Any:
        async with self.pool.acquire() as conn:
            hits = await self.engine.search(conn, self.partition, q, scope, K)
        if hits is None:
            raise RuntimeError("the Tantivy engine declined a search of the store it was built from")
        return hits

    async def bare(self, q: str) -> Any:
        import tantivy

        terms = self.terms_of[q]
        if not terms:
            return []
        query = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(self.schema, "text", t)) for t in terms]
        )
        return self.searcher.search(query, K).hits


async def _against_sql(queries: Sequence[str], legs: _Legs, scope: Any) -> dict[str, float]:
    """The engine's hits against the SQL leg's: queries that differ (keys, or scores beyond 1e-9),
    and recall@k (the share of the SQL leg's top k the engine returns)."""
    differ = found = wanted = 0
    for q in queries:
        a, b = await legs.tantivy(q, scope), await legs.sql(q, scope)
        same = [h.key for h in a] == [h.key for h in b] and np.allclose(
            [h.score for h in a], [h.score for h in b], rtol=1e-9
        )
        differ += not same
        found += len({h.key for h in a} & {h.key for h in b})
        wanted += len(b)
    return {"queries_differ": differ, "recall_at_k": found / max(wanted, 1)}


def _by_set(sets: dict[str, list[str]], times: Sequence[float]) -> dict[str, Any]:
    """p50/p99 over all and per query set; ``times`` holds one or more passes over the sets' queries."""
    set_of = [label for label, qs in sets.items() for _ in qs]
    labels = set_of * (len(times) // len(set_of))
    per_set = {label: [t for t, s in zip(times, labels, strict=True) if s == label] for label in sets}
    return {"all": p50_p99_ms(times), **{label: p50_p99_ms(ts) for label, ts in per_set.items()}}


# The headline ratios of the windowed legs: value over baseline, per interleaved window.
WINDOW_RATIOS = (("tantivy", "tantivy bare"), ("tantivy 1% ACL", "tantivy"))


async def measure_lexical(
    pool: Any, partition: Any, texts: Sequence[str], index_root: Path, n_dataset_queries: int, each: int,
    windows: int = 3,
) -> dict[str, Any]:  # fmt: skip
    """Every leg over one store :func:`populate` built from ``texts``, the Tantivy engine reading
    the store's index under ``index_root`` (written before, as ``mnemo lexical rebuild`` does).

    ``pool``: a read pool like the gateway's (:func:`benchmarks.gateway.gateway_read_pool`), so the
    engine's re-read runs as in the gateway. The SQL leg runs once over the queries per scope; the
    engine (admin and 1% ACL) and the bare search in ``windows`` interleaved windows
    (:func:`benchmarks.measure.interleaved_windows`: every query on every leg back to back, the
    order alternating, so a slow spell of the machine cannot land on one leg's block), each
    headline ratio with the spread of its windows' ratios.
    """
    from index.lexical.engine import TantivyConfig, TantivyLexical
    from index.search.bm25 import query_terms, scored_terms
    from index.text import fold

    n = len(texts)
    real = min(n, len(real_sentences()))
    rng = random.Random(7)
    from_data = dataset_queries()
    rng.shuffle(from_data)
    sets = {"datasets": from_data[:n_dataset_queries], **_generated_queries(texts, rng, each)}
    queries = [q for qs in sets.values() for q in qs]
    terms_of = {q: list(scored_terms(await query_terms(pool, q))) for q in queries}
    bare_dir = Path(tempfile.mkdtemp(prefix="mnemo-bench-tantivy-"))
    try:
        built = await asyncio.to_thread(_tantivy_build, [fold(t) for t in texts], bare_dir)
        engine = TantivyLexical(index_root, TantivyConfig(stats_ttl_s=3600))
        legs = _Legs(pool, partition, engine, built[:2], terms_of)
        scopes = visibility_scopes()
        admin, narrow = scopes["admin"], scopes["1%"]
        # Against the SQL leg first (this also warms its statistics and the query-term cache).
        exactness = await _against_sql(queries, legs, admin)
        latency = {
            "sql": _by_set(sets, await _timed(lambda q: legs.sql(q, admin), queries)),
            "sql 1% ACL": {"all": p50_p99_ms(await _timed(lambda q: legs.sql(q, narrow), queries))},
        }
        windowed = await interleaved_windows(
            {"tantivy": lambda q: legs.tantivy(q, admin), "tantivy 1% ACL": lambda q: legs.tantivy(q, narrow),
             "tantivy bare": legs.bare},
            queries, windows,
        )  # fmt: skip
        for name, per_window in windowed.items():
            latency[name] = _by_set(sets, [t for w in per_window for t in w])
        return {
            "chunks": n,
            "real_sentences": real,
            "zipf_chunks": n - real,
            "queries": {label: len(qs) for label, qs in sets.items()},
            "tantivy_vs_sql": exactness,
            "tantivy_bare": {"build_s": built[2], "disk_mib": folder_mib(bare_dir)},
            "latency": latency,
            "windows": windows,
            "window_p50_ratios": {f"{v} / {b}": window_ratios(windowed[v], windowed[b]) for v, b in WINDOW_RATIOS},
        }  # fmt: skip
    finally:
        shutil.rmtree(bare_dir, ignore_errors=True)


LEXICAL_P99_BAR_MS = 25.0  # issue 44: the Tantivy leg's p99
_NAMES = {"sql": "SQL leg", "tantivy": "Tantivy engine", "tantivy bare": "Tantivy's bare search",
          "tantivy 1% ACL": "Tantivy engine, 1% ACL"}  # fmt: skip


def _against(n: str, lat: dict[str, Any], ratios: dict[str, list[float]], value: str, baseline: str,
             stat: str = "p50_ms") -> Headline:  # fmt: skip
    """Leg ``value``'s pooled ``stat`` against ``baseline``'s, with its windows' ratios as the spread."""
    windowed = ratios.get(f"{value} / {baseline}") if stat == "p50_ms" else None
    return Headline(
        f"{n}: lexical leg {stat[:3]} ({_NAMES[value]})", lat[value]["all"][stat], "ms", _NAMES[baseline],
        lat[baseline]["all"][stat], higher_is_better=False, spread=spread(windowed) if windowed else None,
    )  # fmt: skip


def lexical_report(sizes: Sequence[dict[str, Any]]) -> SuiteResult:
    """The lexical cells of every store size: headlines, the latency table, build and exactness."""
    headlines: list[Headline] = []
    latency_rows, other_rows = [], []
    for r in sizes:
        n, lat = f"{r['chunks']:,}", r["latency"]
        latency_rows += [[n, leg, label, c["p50_ms"], c["p99_ms"]] for leg, cells in lat.items()
                         for label, c in cells.items()]  # fmt: skip
        exact, bare = r["tantivy_vs_sql"], r["tantivy_bare"]
        other_rows.append(
            [n, bare["build_s"], bare["disk_mib"], exact["recall_at_k"], exact["queries_differ"]]
        )
        ratios = r.get("window_p50_ratios", {})
        headlines += [
            _against(n, lat, ratios, "tantivy", "sql"),
            _against(n, lat, ratios, "tantivy", "sql", "p99_ms"),
            _against(n, lat, ratios, "tantivy", "tantivy bare"),
            _against(n, lat, ratios, "tantivy 1% ACL", "tantivy"),
            *(Headline(f"{n}: lexical leg p99 ({_NAMES[leg]})", lat[leg]["all"]["p99_ms"], "ms",
                       "issue 44's bar", LEXICAL_P99_BAR_MS, higher_is_better=False, bar=1.0)
              for leg in ("tantivy", "tantivy 1% ACL")),
        ]  # fmt: skip
    tables = [
        Table("Lexical latency, 1 caller, k = 40 (ms)", ["chunks", "leg", "queries", "p50", "p99"], latency_rows),
        Table("Tantivy: the bare index, and the engine against the SQL leg",
              ["chunks", "bare build s", "bare disk MiB", "engine recall@k vs SQL", "queries that differ"],
              other_rows),
    ]  # fmt: skip
    notes = [
        "Tantivy engine: the gateway's lexical leg on the store's index (plan from the index's statistics, "
        "Tantivy's candidates, one SQL re-read of their rows scored by the SQL leg's expression, every key "
        "changed since the watermark included). Tantivy bare: Tantivy's own search over the same folded "
        "texts, same scored query terms as one OR (Should) query, 1 indexing thread; its field norms are "
        "quantized to a byte and its tokenizer is its own, so its scores are not BM25-equal.",
        "1% ACL: a researcher holding a project that 1% of the records carry.",
        "The Tantivy engine (admin and 1% ACL) and the bare search ran in interleaved windows (every query "
        "on every leg back to back, the order alternating); a ratio is the pooled p50 over the baseline's, "
        "its spread the windows' own p50 ratios. The SQL leg ran once per scope, alone.",
    ]
    return SuiteResult(suite="lexical", headlines=headlines, tables=tables, notes=notes)
