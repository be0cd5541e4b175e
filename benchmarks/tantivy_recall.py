"""How often Tantivy's own BM25, over PostgreSQL's lexemes, selects the SQL leg's exact top k: the
quality suite's recall section (``quality.recall_queries``). The engine's hits are the SQL leg's rows
with the SQL leg's scores; what can differ is which rows: Tantivy ranks its ``overfetch * k``
candidates by its own BM25 (statistics over the whole index, lengths quantized to a byte, k1 1.2
against the SQL leg's 1.5), and a row it ranks below them is missed. benchmarks/README.md says how
it is run.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .datasets import document_text, read_jsonl
from .gateway import gateway_read_pool
from .lexical import build_corpus, dataset_queries, populate, visibility_scopes
from .measure import p50_p99_ms
from .report import Headline, SuiteResult, Table
from .stack import BenchStack

__all__ = ["add_recall_result", "run_recall"]

OVERFETCH = (1, 2, 4, 8)
KS = (10, 40)  # the limit asked of the gateway, and the lexical leg's over-fetch for it (max(4 * 10, 20))


async def _dataset(stack: BenchStack, folder: Path, max_queries: int) -> dict[str, Any]:
    texts = [document_text(d) for d in read_jsonl(folder, "corpus.jsonl")]
    queries = [q["text"] for q in read_jsonl(folder, "queries.jsonl")]
    return await _measure(stack, folder.name, texts, queries[:max_queries])


async def _measure(stack: BenchStack, name: str, texts: list[str], queries: list[str]) -> dict[str, Any]:
    from index.lexical.engine import TantivyConfig, TantivyLexical
    from index.lexical.writer import LexicalWriter
    from index.search.bm25 import CorpusStats, query_terms, scored_terms
    from index.search.lexical_leg import lexical_search

    url = await stack.fresh_database(f"recall_{name.replace('-', '_')}")
    pool = await gateway_read_pool(url)
    scopes = {name: scope for name, scope in visibility_scopes().items() if name in ("admin", "1%")}
    try:
        partition = await populate(pool, texts, model=f"recall-{name}")
        with tempfile.TemporaryDirectory(prefix="mnemo-tantivy-recall-") as root:
            writer = LexicalWriter(pool, url, Path(root))
            await writer.rebuild(partition)
            await writer.stop()
            stats = CorpusStats(ttl=3600)  # the SQL leg's; each engine counts its own from its index
            engines = {
                f: TantivyLexical(Path(root), TantivyConfig(overfetch=f, stats_ttl_s=3600)) for f in OVERFETCH
            }
            rows: dict[str, Any] = {}
            times: dict[str, list[float]] = {}
            order = random.Random(1)
            for scope_name, scope in scopes.items():
                for k in KS:
                    found = {f: 0 for f in OVERFETCH}
                    exact = {f: 0 for f in OVERFETCH}
                    wanted = asked = 0
                    async with pool.acquire() as conn:
                        for query in queries:
                            # The SQL leg's statistics counted first, untimed, so it does not pay the
                            # query's document frequencies (the engines count theirs from the index).
                            terms = list(scored_terms(await query_terms(conn, query)))
                            await stats.idf(conn, partition, terms, scope.section_tipos)
                            # Every leg once per query, in a shuffled order (none always runs first).
                            legs: dict[str, Any] = {"sql": None, **{f"x{f}": e for f, e in engines.items()}}
                            answers: dict[str, list[Any]] = {}
                            for leg in order.sample(list(legs), len(legs)):
                                start = time.perf_counter()
                                if legs[leg] is None:
                                    hits = await lexical_search(conn, partition, query, scope, k, stats=stats)
                                else:
                                    hits = await legs[leg].search(conn, partition, query, scope, k)
                                times.setdefault(leg, []).append(time.perf_counter() - start)
                                assert hits is not None, f"{leg} should serve a loaded partition"
                                answers[leg] = [h.key for h in hits]
                            truth = answers["sql"]
                            if not truth:
                                continue
                            asked += 1
                            wanted += len(truth)
                            for f in OVERFETCH:
                                found[f] += len(set(answers[f"x{f}"]) & set(truth))
                                exact[f] += answers[f"x{f}"] == truth
                    rows[f"{scope_name}@{k}"] = {
                        "queries": asked,
                        "recall": {f: found[f] / max(wanted, 1) for f in OVERFETCH},
                        "exact": {f: exact[f] / max(asked, 1) for f in OVERFETCH},
                    }
        latency = {leg: p50_p99_ms(t) for leg, t in times.items()}
        return {"chunks": len(texts), "queries": len(queries), "rows": rows, "latency": latency}
    finally:
        await pool.close()


async def run_recall(
    stack: BenchStack, folders: Sequence[Path], max_queries: int, zipf: int
) -> dict[str, Any]:
    """Each data set's corpus and queries; with ``zipf``, also :func:`benchmarks.lexical.build_corpus`
    of that many chunks (the data sets' sentences, then Zipfian text) under the data sets' queries."""
    result = {folder.name: await _dataset(stack, folder, max_queries) for folder in folders}
    if zipf:
        queries = random.Random(0).sample(dataset_queries(), max_queries)
        result[f"zipf-{zipf}"] = await _measure(stack, f"zipf_{zipf}", build_corpus(zipf), queries)
    return result


def add_recall_result(suite: SuiteResult, result: dict[str, Any]) -> None:
    """The lowest recall at the engine's default over-fetch as a headline, the tables, the figures."""
    from index.lexical.engine import TantivyConfig

    head = ["data set", "chunks", "scope@k", "queries"]
    head += [f"recall x{f}" for f in OVERFETCH] + [f"exact x{f}" for f in OVERFETCH]
    body = [
        [name, data["chunks"], cell, row["queries"]]
        + [row["recall"][f] for f in OVERFETCH] + [row["exact"][f] for f in OVERFETCH]
        for name, data in result.items() for cell, row in data["rows"].items()
        if row["queries"]  # a scope that sees none of the chunks any query matches has no row
    ]  # fmt: skip
    legs = ["sql", *(f"x{f}" for f in OVERFETCH)]
    timing = [[name, data["chunks"], *(f"{data['latency'][leg]['p50_ms']:.2f} / {data['latency'][leg]['p99_ms']:.2f}"
                                       for leg in legs)] for name, data in result.items()]  # fmt: skip
    default = TantivyConfig().overfetch
    worst = min((row["recall"][default] for data in result.values() for row in data["rows"].values() if row["queries"]),
                default=float("nan"))  # fmt: skip
    suite.headlines.append(Headline(f"lowest lexical recall@k, Tantivy engine (candidates x{default})", worst, "",
                                    "the SQL leg (exact)", 1.0))  # fmt: skip
    suite.tables += [
        Table("The Tantivy engine's recall of the SQL leg's exact top k, per candidate over-fetch", head, body),
        Table("Lexical leg latency, p50 / p99 ms (every scope and k; one caller; legs shuffled per query)",
              ["data set", "chunks", "SQL leg", *(f"tantivy x{f}" for f in OVERFETCH)], timing),
    ]  # fmt: skip
    suite.notes.append(
        "Recall@k of the Tantivy engine's top k against the SQL leg's exact BM25 top k, per candidate over-fetch "
        f"(x1: k candidates; the engine's default is x{default}). exact: the share of queries whose top k is the "
        "SQL leg's, in order. Every hit's score is the SQL leg's by construction."
    )
    suite.figures["tantivy_recall"] = result
