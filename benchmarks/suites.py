"""The suites ``mnemo bench`` runs, each turning one part's measurements into a :class:`SuiteResult`.

A suite is ``fn(stack, plan) -> SuiteResult`` (async, or plain when it runs its own event loops). The measuring is done by each part's own
module (``benchmarks.sidecar``, ``.ingest``, ``.gateway``, ``.quality``, ``.gpu``); the adapters here
pick the plan's parameters, run them against the shared :class:`~benchmarks.stack.BenchStack`, and
add the headlines (each beside its same-run baseline), tables and curves the report shows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .datasets import find_datasets
from .plan import BenchPlan
from .report import Bars, Curve, Headline, SuiteResult, Table
from .stack import BENCH_MODEL, BenchStack
from .tables import Column, HeadlineRow, headings, rows

__all__ = ["CPU_SUITES", "SUITES", "Suite"]

EMBED_ONLY = "embed-only baseline (same texts, /embed alone)"
# One ingest run, with its records per drain step ("batch").
BY_BATCH = (
    Column("records/step", "{batch}"),
    Column("records/s", "{records_per_s}"),
    Column("chunks/s", "{chunks_per_s}"),
    Column("embed-only chunks/s", "{embed_only_chunks_per_s}"),
    Column("ratio", "{pipeline_efficiency}"),
    Column("embed share", "{embed_share}"),
    Column("write share", "{write_share}"),
)


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    # async, or plain when the suite drives its own event loops (it then runs on the main thread)
    run: Callable[[BenchStack, BenchPlan], SuiteResult | Awaitable[SuiteResult]]
    database: bool
    sidecar: bool
    what: str
    tiny_models: bool = False  # the run's sidecar also serves tiny random models (benchmarks.stack)


# -- ingest ---------------------------------------------------------------------------------------------


async def ingest_suite(stack: BenchStack, plan: BenchPlan) -> SuiteResult:
    """End-to-end ingestion at each records-per-step batch size; headlines from the default size."""
    from index.settings import IngestSettings
    from schema import create_pool

    from .ingest import RecordingClient, as_suite, run_ingest_benchmark

    assert stack.sidecar_url is not None
    runs: dict[int, dict[str, Any]] = {}
    for batch in plan.ingest.batch_records:
        url = await stack.fresh_database("bench_ingest")
        pool = await create_pool(url, max_size=4)
        try:
            async with RecordingClient(stack.sidecar_url, timeout=120) as client:
                runs[batch] = await run_ingest_benchmark(
                    pool,
                    client,
                    records=plan.ingest.records,
                    text_model=BENCH_MODEL,
                    settings=IngestSettings(batch_records=batch),
                )
        finally:
            await pool.close()
    default = IngestSettings().batch_records
    headline_batch = default if default in runs else max(runs)
    suite = as_suite(runs[headline_batch])
    suite.notes.insert(0, f"Headlines at {headline_batch} records per drain step (RAG_INGEST_BATCH_RECORDS).")
    sizes = sorted(runs)
    series = {"ingest (chunk, embed, write)": [(b, runs[b]["chunks_per_s"]) for b in sizes],
              EMBED_ONLY: [(b, runs[b]["embed_only_chunks_per_s"]) for b in sizes]}  # fmt: skip
    suite.curves.append(Curve("Ingestion throughput vs batch size", "records per drain step (RAG_INGEST_BATCH_RECORDS)",
                              "chunks/s", series, log_x=True, baselines=(EMBED_ONLY,)))  # fmt: skip
    suite.tables.append(
        Table(
            "Ingestion by batch size",
            headings(BY_BATCH),
            rows(BY_BATCH, ({**runs[b], "batch": b} for b in sizes)),
        )
    )
    suite.figures["by_batch_records"] = {str(b): runs[b] for b in sizes}
    return suite


# -- quality --------------------------------------------------------------------------------------------


QUALITY_ROWS = (
    ("dense", "modes", "dense"),
    ("lexical", "modes", "lexical"),
    ("sparse", "modes", "sparse"),
    ("hybrid", "modes", "hybrid"),
    ("hybrid, tuned (2-fold CV)", "tuned", None),
    ("ref: exact dense", "references", "exact_dense"),
    ("ref: BM25 (bm25s)", "references", "bm25"),
    ("ref: plain RRF", "references", "rrf"),
)


def _quality_row(result: dict[str, Any], where: str, key: str | None) -> dict[str, float] | None:
    if where == "tuned":
        return result.get("tuned", {}).get("metrics")
    return result.get(where, {}).get(key)


async def quality_suite(stack: BenchStack, plan: BenchPlan) -> SuiteResult:
    """Every data set: each leg, hybrid, tuned (cross-validated) and the references, one table, one plot."""
    from gateway.base.settings import load_gateway_settings
    from index.settings import SidecarClientSettings
    from schema import load_settings

    from .eval import METRICS
    from .quality import run_quality_benchmark

    directories = find_datasets(plan.quality.datasets)
    notes: list[str] = []
    assert stack.sidecar_url is not None
    sidecar = load_settings(SidecarClientSettings, sidecar_url=stack.sidecar_url, text_model=BENCH_MODEL)
    settings = load_gateway_settings(sidecar=sidecar, auth="off")
    headlines: list[Headline] = []
    results = {}
    for directory in directories:
        url = await stack.fresh_database("bench_quality")
        result = await run_quality_benchmark(directory, settings, database_url=url, tune=plan.quality.tune)
        results[result["dataset"]] = result
        headlines += _quality_headlines(result)
        notes.append(
            f"{result['dataset']}: {result['documents']} documents, {result['queries']} queries, model "
            f"{result['model']}; ingest {result['timing_s']['ingest']} s, queries {result['timing_s']['queries']} s."
        )
    names = list(results)
    rows: list[list[Any]] = []
    series: dict[str, list[float | None]] = {}
    for label, where, key in QUALITY_ROWS:
        per_set = [_quality_row(results[n], where, key) for n in names]
        if not any(per_set):
            continue
        series[label] = [None if m is None else m["ndcg@10"] for m in per_set]
        rows += [[n, label, *(m[k] for k in METRICS)] for n, m in zip(names, per_set, strict=True) if m]
    rows.sort(key=lambda r: names.index(r[0]))  # grouped by data set, modes in QUALITY_ROWS order
    notes.append(
        "Bars: dense within 0.01 nDCG@10 of exact dense search; lexical at least 95% of BM25 (bm25s); "
        "hybrid at least plain RRF of those references minus 0.005, and at least the best single leg "
        "minus 0.03. The tuned row is cross-validated: weights chosen on half the queries, scored on "
        "the other half, both ways."
    )
    suite = SuiteResult(
        "quality",
        headlines=headlines,
        tables=[
            Table(
                "Retrieval quality per data set and mode, with same-run references",
                ["data set", "mode", *METRICS],
                rows,
            )
        ],
        bars=[
            Bars(
                "nDCG@10 per data set",
                "nDCG@10",
                names,
                series,
                baselines=tuple(label for label in series if label.startswith("ref:")),
            )
        ],
        figures={"datasets": results},
        notes=notes,
    )
    if plan.quality.recall_queries:
        from .tantivy_recall import add_recall_result, run_recall

        recall = await run_recall(stack, directories, plan.quality.recall_queries, plan.quality.recall_zipf)
        add_recall_result(suite, recall)
    return suite


def _quality_headlines(result: dict[str, Any]) -> list[Headline]:
    """Each mode beside its reference, the bar (:data:`benchmarks.quality.REFERENCE_BARS`) as a ratio."""
    from .quality import REFERENCE_BARS

    refs, modes, name = result.get("references", {}), result["modes"], result["dataset"]
    out = []
    for mode, ref, label, _, target in REFERENCE_BARS:
        if mode in modes and ref in refs:
            base = refs[ref]["ndcg@10"]
            out.append(
                Headline(
                    f"{mode} nDCG@10 ({name})",
                    modes[mode]["ndcg@10"],
                    "",
                    label,
                    base,
                    bar=round(target(base) / base, 4) if base > 0 else None,
                )
            )
    return out


# -- the registry ---------------------------------------------------------------------------------------


def sidecar_suite(stack: BenchStack, plan: BenchPlan) -> SuiteResult:
    from .suite_sidecar import run_suite

    return run_suite(stack, plan.sidecar)


async def gateway_suite(stack: BenchStack, plan: BenchPlan) -> SuiteResult:
    from .suite_gateway import run_suite

    return await run_suite(stack, plan.gateway)


async def reliability_suite(stack: BenchStack, plan: BenchPlan) -> SuiteResult:
    from .suite_reliability import run_suite

    return await run_suite(stack, plan.reliability)


# -- scale ----------------------------------------------------------------------------------------------


async def scale_suite(stack: BenchStack, plan: BenchPlan) -> SuiteResult:
    """Its sections, each skipped when its plan says 0 (or an empty list): drain workers against the
    slowest stage alone; the row path against the bulk path; halfvec; retrieval at scale (every leg
    and semantic_search per store size, and their growth); a Ray job's batches in flight; images."""
    from inference.client import SidecarClient

    from .scale_drain import measure_drain_workers
    from .scale_store import embed_bases, measure_halfvec, measure_store_paths, project_reembed

    assert stack.sidecar_url is not None
    scale = plan.scale
    suite = SuiteResult("scale")
    if scale.drain_records:
        runs = await measure_drain_workers(
            stack.fresh_database, stack.sidecar_url, scale.drain_models, records=scale.drain_records,
            workers=scale.drain_workers,
        )  # fmt: skip
        suite = scale_drain_result(runs)
    if scale.store_rows or scale.halfvec_rows:
        async with SidecarClient(stack.sidecar_url, timeout=300) as client:
            corpus = await embed_bases(client, BENCH_MODEL, scale.store_bases)
    if scale.store_rows:
        store = await measure_store_paths(
            await stack.fresh_database("bench_scale_store"), corpus, rows=scale.store_rows, row_rows=scale.store_row_rows,
            row_writers=scale.store_row_writers, build_workers=scale.store_build_workers,
            recall_queries=scale.store_recall_queries, recall_ef_search=scale.store_recall_ef_search,
        )  # fmt: skip
        add_store_result(suite, store, project_reembed(store))
    if scale.halfvec_rows:
        half = await measure_halfvec(
            await stack.fresh_database("bench_scale_halfvec"), corpus, rows=scale.halfvec_rows,
            queries=scale.halfvec_queries, build_workers=scale.store_build_workers,
        )  # fmt: skip
        add_halfvec_result(suite, half)
    if scale.retrieval_sizes:
        from .search_scale import as_suite as retrieval_suite
        from .search_scale import run_search_scale

        retrieval = retrieval_suite(await run_search_scale(stack, scale))
        suite.headlines.extend(retrieval.headlines)
        suite.tables.extend(retrieval.tables)
        suite.notes.extend(retrieval.notes)
        suite.figures["retrieval"] = retrieval.figures
    if scale.ray_batches:
        from .ray_dispatch import add_dispatch_result, measure_dispatch

        add_dispatch_result(suite, await measure_dispatch(
            batches=scale.ray_batches, work_s=scale.ray_batch_ms / 1000, passes=scale.ray_passes
        ))  # fmt: skip
    if scale.images:
        from .images import add_images_result, measure_images

        add_images_result(suite, await measure_images(stack, scale.images, scale.images_workers_max))
    return suite


def add_halfvec_result(suite: SuiteResult, half: dict[str, Any]) -> None:
    """halfvec against vector: the index size as a headline, recall and build time in a table."""
    vec, hv = half["vector"], half["halfvec"]
    suite.headlines.append(Headline(f"halfvec HNSW size, {half['rows']:,} rows", hv["hnsw_bytes"] / 2**20, "MiB",
                                    "vector HNSW, same rows", vec["hnsw_bytes"] / 2**20, higher_is_better=False))  # fmt: skip
    title = f"RAG_VECTOR_TYPE: halfvec vs vector ({half['rows']:,} rows, {half['queries']} queries, ef_search {half['ef_search']})"
    suite.tables.append(
        Table(
            title, headings(HALFVEC), rows(HALFVEC, ({**vec, "index": "vector"}, {**hv, "index": "halfvec"}))
        )
    )
    suite.figures["halfvec"] = half


def _mib(key: str) -> Callable[[Mapping[str, Any]], int]:
    return lambda r: round(r[key] / 2**20)


# One index type of the halfvec section, with its "index" name.
HALFVEC = (
    Column("index", "{index}"),
    Column("HNSW (MiB)", lambda r: round(r["hnsw_bytes"] / 2**20, 1)),
    Column("build (s)", lambda r: round(r["build_seconds"], 2)),
    Column("recall@10 vs exact", lambda r: round(r["recall_at_10"], 4)),
)
# One write path of the store, with its "path" name and its "phases" described.
STORE_PATHS = (
    Column("path", "{path}"),
    Column("rows", "{rows}"),
    Column("seconds", lambda r: round(r["seconds"], 1)),
    Column("rows/s", lambda r: round(r["rows_per_s"])),
    Column("phases (s)", "{phases}"),
    Column("bound", "{bound}"),
    Column("PostgreSQL peak RSS (MiB)", _mib("postgres_peak_rss_bytes")),
    Column("HNSW (MiB)", _mib("hnsw_bytes")),
    Column("total (MiB)", _mib("total_bytes")),
)


def add_store_result(suite: SuiteResult, store: dict[str, Any], projection: dict[str, Any]) -> None:
    """The store paths as a headline (bulk rows/s against the row path's), a table and the projection."""
    row, bulk, at_size = store["row_path"], store["bulk_path"], store["row_path_at_size"]
    baseline = (
        f"row path (the drain's writer), {at_size['rows']:,} rows into the built {bulk['rows']:,}-row graph"
        if at_size
        else f"row path (the drain's writer), {row['rows']:,} rows"
    )
    suite.headlines.append(
        Headline(
            f"bulk path rows/s, {bulk['rows']:,} rows x {store['dimension']}, indexes included",
            bulk["rows_per_s"],
            "rows/s",
            baseline + ", indexes included",
            (at_size or row)["rows_per_s"],
            bar=8.0,
        )
    )
    row_paths = (("row path, empty graph", row), (f"row path, into the {bulk['rows']:,}-row graph", at_size))
    paths = [
        *({**r, "path": name, "phases": "one upsert transaction per record", "bound": "HNSW insert per row"}
          for name, r in row_paths if r is not None),
        {**bulk, "path": "bulk path", "phases": ", ".join(f"{k} {v}" for k, v in bulk["phase_seconds"].items())},
    ]  # fmt: skip
    suite.tables.append(
        Table("Store paths (same run, same vectors)", headings(STORE_PATHS), rows(STORE_PATHS, paths))
    )
    recall = store["recall_by_ef_search"]
    if recall["recall_at_10"]:
        suite.tables.append(
            Table(
                f"HNSW recall@10 against exact on the bulk path's {recall['rows']:,}-row graph "
                f"({recall['queries']} queries, iterative scan, unfiltered)",
                ["hnsw.ef_search", "recall@10"],
                [[ef, round(r, 4)] for ef, r in recall["recall_at_10"].items()],
            )
        )
    suite.notes += _store_notes(store, projection)
    suite.figures["store"] = store
    suite.figures["projection"] = projection


def _store_notes(store: dict[str, Any], projection: dict[str, Any]) -> list[str]:
    """Why the row path's baseline is taken at the built graph's size (when it was), and the
    projection of a full re-embedding from this run's bulk path."""
    row, bulk, at_size = store["row_path"], store["bulk_path"], store["row_path_at_size"]
    notes = []
    if at_size:
        notes.append(
            f"The row path writes {row['rows']:,} rows, the bulk path {bulk['rows']:,}. An HNSW insert "
            "gets dearer as the graph grows, so the speedup is taken against the same "
            f"{at_size['rows']:,} rows written into the bulk path's built graph "
            f"({at_size['rows_per_s']:,.0f} rows/s there against {row['rows_per_s']:,.0f} into an empty "
            f"one; {store['speedup_against_empty_graph']:.2f}x against the latter). The sizes in that "
            "row are the whole partition's."
        )
    stages = projection["stage_seconds"]
    notes.append(
        f"Projection, on paper: re-embedding {projection['chunks']:,} chunks of {projection['dimension']} "
        f"dimensions on one {projection['gpu']} takes about {projection['wall_seconds'] / 3600:.1f} h "
        f"(embed {stages['embed'] / 60:.0f} min at an assumed MFU of {projection['assumed_mfu']}, COPY "
        f"{stages['copy'] / 60:.0f} min overlapping it, HNSW build {stages['build'] / 60:.0f} min after), "
        f"bound by {projection['bound']}; the build needs about "
        f"{projection['hnsw_memory_bytes'] / 2**30:.0f} GiB of maintenance_work_mem. "
        "Scaled from this run's bulk path (see benchmarks/scale_store.py:project_reembed)."
    )
    return notes


# One drain run, with its "model".
DRAIN = (
    Column("model", "{model}"),
    Column("workers", "{workers}"),
    Column("chunks", "{chunks}"),
    Column("drain chunks/s", lambda r: round(r["drain_chunks_per_s"], 1)),
    Column("rows", "{rows}"),
    Column("drain s", "{drain_seconds}"),
    Column("embed alone s", "{embed_alone_seconds}"),
    Column("store alone s", "{store_alone_seconds}"),
    Column("bound", "{bounding_stage}"),
    Column("bound s / drain s", lambda r: round(r["efficiency"], 3)),
)
# A model's run at the most workers: the drain against its slower stage alone (bar: 0.9 of it).
DRAIN_HEADLINE = HeadlineRow(
    "drain time vs the {bounding_stage} stage alone, {model}, {workers} workers", "{drain_seconds}", "s",
    "{bounding_stage} stage alone, same work, {workers} callers", lambda r: r[f"{r['bounding_stage']}_alone_seconds"],
    bar=1 / 0.9, higher_is_better=False,
)  # fmt: skip


def scale_drain_result(runs: dict[str, list[dict[str, Any]]]) -> SuiteResult:
    """The drain runs as headlines (each model at its best worker count), a table and a curve."""
    suite = SuiteResult("scale")
    for model, per_workers in runs.items():
        best = max(per_workers, key=lambda r: r["workers"])  # the most saturating count measured
        suite.headlines.append(DRAIN_HEADLINE.read({**best, "model": model}))
    cells = [{**r, "model": model} for model, per_workers in runs.items() for r in per_workers]
    suite.tables.append(Table("Drain workers vs each stage alone (same run, same concurrency)", headings(DRAIN),
                              rows(DRAIN, cells)))  # fmt: skip
    series = {model: [(r["workers"], r["drain_chunks_per_s"]) for r in per] for model, per in runs.items()}
    suite.curves.append(Curve("Drain throughput by worker count", "workers", "chunks/s", series))
    suite.figures["drain"] = runs
    suite.notes.append(
        "Each drain run starts on a fresh database; 'embed alone' re-sends that run's texts to /embed in "
        "the drain's request size from as many callers as workers; 'store alone' re-writes its rows with "
        "the drain's writer (one transaction per record, HNSW maintained) from as many connections."
    )
    return suite


SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        Suite("sidecar", sidecar_suite, False, True, "sidecar vs the same model in-process at batch 32"),
        Suite("ingest", ingest_suite, True, True, "ingestion vs /embed alone, by batch size"),
        Suite(
            "gateway",
            gateway_suite,
            True,
            True,
            "semantic_search vs the legs' SQL, by size, filter and FAISS cache",
        ),
        Suite(
            "quality", quality_suite, True, True, "nDCG@10 / recall@100 / MRR@10 vs BM25, exact dense, RRF"
        ),
        Suite(
            "reliability",
            reliability_suite,
            True,
            True,
            "fuzzing both /openapi.json, forged tokens, ACL leaks, hostile images: counts with goal 0",
            tiny_models=True,
        ),
        Suite(
            "scale",
            scale_suite,
            True,
            True,
            "drain workers vs the slowest stage alone; bulk backfill path vs the drain's row path",
            tiny_models=True,
        ),
    )
}
CPU_SUITES = tuple(SUITES)
