"""How much each suite measures: the quick plan (``make bench``) and the full one (``--full``).

The quick plan took 29 min 48 s on this 2-core CPU machine with all six suites (``make bench`` at
cc501bf, 2026-12-07, other work beside it: sidecar 171 s, ingest 15 s, gateway 80 s, quality 553 s,
reliability 463 s, scale 505 s, their sum 1,788 s); before the scale suite, on a quiet machine, it
took 10 min 24 s (after ff27cc2, with quality at 247 s). Small corpora, short curves, no peers, no
tuned row, but every data set in the quality suite, whose embedding of about 4,800 documents with
MiniLM is its longest part (``--suite`` narrows a run).
``mnemo bench --set SUITE.FIELD=VALUE`` overrides any field (``--set gateway.sizes=1000,5000``).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

__all__ = [
    "FULL",
    "PLANS",
    "QUICK",
    "BenchPlan",
    "GatewayPlan",
    "GpuPlan",
    "IngestPlan",
    "QualityPlan",
    "ReliabilityPlan",
    "ScalePlan",
    "SidecarPlan",
    "apply_overrides",
]


@dataclasses.dataclass(frozen=True)
class SidecarPlan:
    concurrencies: tuple[int, ...] = (1, 4, 16, 64)
    sizes: tuple[int, ...] = (1, 32)  # items per request
    seconds_per_cell: float = 2.0
    baseline_seconds: float = 1.0  # each in-process window bracketing a cell
    # Windows of each headline cell (concurrency 16), each followed by baseline windows; with peers,
    # also the (sidecar, infinity) pairs per request size. The spread of their ratios is reported
    # beside each headline: one that crosses its bar needs more of them.
    repeats: int = 3
    # The in-process sweeps' batch sizes (8 and 128, in the full plan, never won in the kept runs).
    sweep_batches: tuple[int, ...] = (16, 32, 64)
    sweep_seconds: float = 1.0  # each sweep window, and each window of the configurations table
    # Texts a window of the strongest configuration runs over: whole passes, so a window lasts at
    # least one pass (256 texts take about 2.5 s on 2 cores; the full plan's).
    sweep_sample: int = 128
    lengths: tuple[int, ...] = (16, 128, 512)  # tokens per text
    length_concurrency: int = 4
    length_request_size: int = 8
    peers: bool = False  # infinity-emb beside the sidecar (its own virtualenv)
    # The Ray-free model service's grid beside the sidecar's (token-budget batcher and executor driven
    # in-process, benchmarks/grid.py): what batching alone costs.
    service: bool = False


@dataclasses.dataclass(frozen=True)
class IngestPlan:
    records: int = 24
    batch_records: tuple[int, ...] = (1, 4, 24)  # RAG_INGEST_BATCH_RECORDS: records per drain step


@dataclasses.dataclass(frozen=True)
class GatewayPlan:
    sizes: tuple[int, ...] = (1_000, 10_000)  # chunks
    embedded: int = 400  # chunks whose vectors the sidecar computes; the rest are mixtures of them
    queries: int = 40
    seconds: float = 3.0  # per measured point (bounded by requests too)
    requests: int = 400
    concurrency: int = 4  # of the size and selectivity curves
    selectivity: tuple[float, ...] = (1.0, 0.1, 0.01)  # share of rows visible to the caller
    load_concurrency: tuple[int, ...] = (1, 8, 32)  # the gateway benchmark's own table, at the largest size
    # RAG_FAISS_CACHE per gateway: the first mode at every size, each at the largest ("off": the SQL path)
    caches: tuple[str, ...] = ("off", "auto")
    # Interleaved (gateway, legs' SQL) window pairs per point, the order swapped each pair: the
    # spread of the pairs' ratios is printed beside each ratio.
    pairs: int = 2
    # One lever A/B in one run at the largest size (benchmarks/levers.py): gateways that differ by
    # settings or source tree, up at once, their windows interleaved with the legs' SQL. Each is
    # "NAME=VAR=VALUE[+VAR=VALUE]" or "NAME=@TREE[+VAR=VALUE]", the first the baseline (empty: skipped).
    levers: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class QualityPlan:
    # "*": every bundled BEIR data set (benchmarks/datasets), so a regression on
    # any of them shows in the one table; names or paths narrow it.
    datasets: tuple[str, ...] = ("*",)
    # The 2-fold cross-validated tuned figure beside the defaults: 15 fusions per query, so the full
    # plan's (the quick plan keeps the bars, each leg and hybrid on every data set).
    tune: bool = False
    # The Tantivy engine's recall of the SQL leg's exact top k per candidate over-fetch
    # (benchmarks/tantivy_recall.py), on every data set's corpus (one chunk a document) with at most
    # this many of its queries (0 skips it); recall_zipf: also the retrieval corpus of this many chunks
    # under the data sets' queries (0: none).
    recall_queries: int = 100
    recall_zipf: int = 0


@dataclasses.dataclass(frozen=True)
class GpuPlan:
    dtypes: tuple[str, ...] = ("bfloat16", "float16")
    lengths: tuple[int, ...] = (128, 512)  # tokens per text
    seconds: float = 4.0  # per measurement
    faiss_vectors: int = 1_000_000  # the FAISS section's flat index (0: skip it); a CPU run uses 2000


@dataclasses.dataclass(frozen=True)
class ReliabilityPlan:
    cases_per_route: int = 48  # hypothesis examples per route (spread over its classes: 3 each)
    seconds: float = 240.0  # deadline per service's fuzz run (and for indexing the corpus)
    gateway_oversize_bytes: int = 8 * 1024 * 1024 + 1  # past RAG_MAX_BODY_BYTES's default
    sidecar_oversize_bytes: int = 8 * 1024 * 1024 + 1  # past the bench sidecar's max_body_bytes
    sigterm_callers: int = 8  # closed-loop callers when the gateway gets SIGTERM (0: skip that fault)
    faults: bool = True  # PostgreSQL stopped hard, the sidecar stopped, a replica killed (False: skip)
    fault_records: int = 48  # records in each drain a fault interrupts
    overload_seconds: float = 3.0  # the sidecar held at twice its capacity (0: skip)
    mixed_callers: int = 64  # concurrent callers mixing every action on the gateway (0: skip)
    mixed_seconds: float = 3.0
    # Callers sending /embed while the worker node of a two-node Ray cluster is killed; the same
    # cluster then shows autoscaling 1 -> 2 -> 1 (0: skip the cluster part)
    cluster_callers: int = 16
    # The Tantivy lexical engine (issue 44): the ACL check again through a 2-worker gateway on it,
    # then this many records saved one by one, each timed until its lexical leg finds it (0: skip
    # both); and `mnemo lexical follow` killed this many times under writes (0: skip).
    tantivy_records: int = 40
    tantivy_kills: int = 5


@dataclasses.dataclass(frozen=True)
class ScalePlan:
    # The drain section: real records (shared BEIR documents) drained by each worker count, once
    # per model (MiniLM, then a tiny random XLM-R so the pipeline rather than the model is measured).
    drain_records: int = 120
    drain_workers: tuple[int, ...] = (1, 2, 4)
    drain_models: tuple[str, ...] = ("all-minilm-l6-v2", "tiny-xlmr-random")
    # The store section: the row path (the drain's writer) against the bulk path (COPY into a
    # shadow, parallel index build, swap), both with every index. Vectors: ``store_bases`` real
    # MiniLM embeddings reused with noise. With fewer row-path rows than bulk rows, those rows
    # are also written into the bulk path's built graph, the baseline at that size (see
    # benchmarks/scale_store.py:measure_store_paths).
    store_rows: int = 10_000
    store_row_rows: int = 10_000
    store_bases: int = 1_000
    store_row_writers: int = 2
    store_build_workers: int = 2
    # The bulk path's built graph: recall@10 against exact at each hnsw.ef_search (the README's value)
    store_recall_queries: int = 30
    store_recall_ef_search: tuple[int, ...] = (40, 100, 200, 400)
    # halfvec against vector (RAG_VECTOR_TYPE): the same rows into both, recall@10 vs exact
    halfvec_rows: int = 10_000
    halfvec_queries: int = 50
    # The retrieval section (benchmarks/search_scale.py), one store per size with real term
    # statistics and vectors: the lexical leg (the SQL leg, the Tantivy engine, Tantivy's bare search) and
    # semantic_search through the gateway per caller count; growth from the first size to the last
    # (empty: skipped).
    retrieval_sizes: tuple[int, ...] = (10_000, 100_000)
    retrieval_callers: tuple[int, ...] = (1, 32)
    retrieval_seconds: float = 10.0  # at most, per closed loop of semantic_search
    # The data sets' queries sent to semantic_search (and the dense probes, the first 40 for recall):
    # each gateway embeds every one once, warming, before a window.
    retrieval_queries: int = 100
    retrieval_dataset_queries: int = 60
    retrieval_generated_queries: int = 20  # of each kind: rare, common, mixed
    # At each retrieval size, the FAISS cache under 32 callers and under a writer (seconds each, 0
    # skips) and its worker processes (read from PostgreSQL against the snapshot mapped; false
    # skips); at the largest, 2 gateway workers against 1 in alternating windows (0 passes skips).
    retrieval_cache_seconds: float = 3.0
    retrieval_mapped_workers: bool = True
    retrieval_worker_passes: int = 2
    retrieval_worker_window_s: float = 5.0
    # At each retrieval size, the cost of a search (benchmarks/search_cost.py): CPU per search by
    # process for an admin and researchers at each caller count, windows of this many seconds (0
    # skips), and a py-spy profile of the gateway's workers over a window of its own (0: none).
    retrieval_cost_seconds: float = 5.0
    retrieval_profile_seconds: float = 5.0
    # A Ray bulk job's batches in flight per actor (benchmarks/ray_dispatch.py): Ray Data's pool (two
    # per actor) against one, ray_batches batches of ray_batch_ms on 2 actors, alternating passes
    # (0 batches skips it).
    ray_batches: int = 40
    ray_batch_ms: float = 100.0
    ray_passes: int = 2
    # Image ingestion (benchmarks/images.py): the bulk image job against the sidecar's /image alone
    # on this many of the bundled coins (repeated), and the job's decode step in pools of 1 to
    # images_workers_max processes (0 images skips it).
    images: int = 96
    images_workers_max: int = 2


@dataclasses.dataclass(frozen=True)
class BenchPlan:
    name: str
    sidecar: SidecarPlan = SidecarPlan()
    ingest: IngestPlan = IngestPlan()
    gateway: GatewayPlan = GatewayPlan()
    quality: QualityPlan = QualityPlan()
    gpu: GpuPlan = GpuPlan()
    reliability: ReliabilityPlan = ReliabilityPlan()
    scale: ScalePlan = ScalePlan()

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


QUICK = BenchPlan("quick")
FULL = BenchPlan(
    "full",
    sidecar=SidecarPlan(
        concurrencies=(1, 2, 4, 8, 16, 32, 64),
        seconds_per_cell=5.0,
        baseline_seconds=2.0,
        repeats=6,
        sweep_batches=(8, 16, 32, 64, 128),
        sweep_seconds=2.0,
        sweep_sample=256,
        lengths=(16, 32, 64, 128, 256, 512),
        peers=True,
    ),
    ingest=IngestPlan(records=300, batch_records=(1, 4, 16, 32, 64, 128)),
    quality=QualityPlan(tune=True, recall_queries=300, recall_zipf=100_000),
    gateway=GatewayPlan(
        sizes=(1_000, 10_000, 100_000),
        embedded=1_000,
        queries=200,
        seconds=10.0,
        requests=3_000,
        pairs=4,
        levers=("asyncio loop=RAG_UVLOOP=off", "uvloop=RAG_UVLOOP=on"),
    ),
    reliability=ReliabilityPlan(
        cases_per_route=320, seconds=1200.0, fault_records=200, overload_seconds=30.0, mixed_seconds=30.0
    ),
    scale=ScalePlan(
        drain_records=1_200,
        store_rows=1_000_000,
        store_row_rows=100_000,
        store_bases=10_000,
        halfvec_rows=100_000,
        halfvec_queries=200,
        retrieval_sizes=(100_000, 1_000_000),
        retrieval_seconds=20.0,
        retrieval_cache_seconds=8.0,
        retrieval_worker_passes=4,
        retrieval_worker_window_s=15.0,
        retrieval_cost_seconds=10.0,
        retrieval_profile_seconds=10.0,
        ray_batches=100,
        ray_batch_ms=200.0,
        ray_passes=3,
        images=384,
        images_workers_max=4,
    ),
)
PLANS = {plan.name: plan for plan in (QUICK, FULL)}


def _parse(value: str, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin is tuple:
        (item, *_) = typing.get_args(hint)
        return tuple(_parse(v.strip(), item) for v in value.split(",") if v.strip())
    if hint is bool:
        if value.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            raise ValueError(f"not a boolean: {value!r}")
        return value.lower() in ("1", "true", "yes", "on")
    return hint(value)


def apply_overrides(plan: BenchPlan, assignments: list[str]) -> BenchPlan:
    """``["gateway.sizes=1000,5000", "sidecar.seconds_per_cell=10"]`` applied to ``plan``."""
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        suite, dot, name = key.strip().partition(".")
        section = getattr(plan, suite, None) if dot and sep else None
        if not dataclasses.is_dataclass(section):
            raise ValueError(f"--set {assignment!r}: expected SUITE.FIELD=VALUE (suites: {_suites()})")
        hints = typing.get_type_hints(type(section))
        if name not in hints:
            fields = ", ".join(f.name for f in dataclasses.fields(section))
            raise ValueError(f"--set {assignment!r}: {suite} has no field {name!r} (fields: {fields})")
        try:
            parsed = _parse(value.strip(), hints[name])
        except ValueError as exc:
            raise ValueError(f"--set {assignment!r}: {exc}") from exc
        plan = dataclasses.replace(plan, **{suite: dataclasses.replace(section, **{name: parsed})})
    return plan


def _suites() -> str:
    return ", ".join(f.name for f in dataclasses.fields(BenchPlan) if f.name != "name")
