"""``mnemo bench`` and ``mnemo eval``: run the benchmark suites and write one report folder per run.

    mnemo bench                                  # every CPU suite, quick plan (what `make bench` runs)
    mnemo bench --suite gateway --plan full      # one suite, full plan (100k chunks, longer curves, peers)
    mnemo bench --suite scale --plan full --set scale.drain_records=0 --set scale.store_rows=0 \
        --set scale.halfvec_rows=0               # the scale suite's retrieval section alone, at 100k and 1M
    mnemo bench --device cuda                    # GPU mode: batcher + model code in-process (no Ray, no database)
    mnemo eval --dataset DIR [--tune]            # retrieval quality on one BEIR data set, beside references
    mnemo eval --dataset DIR --lexical-engines tantivy   # ... and the Tantivy engine's lexical and hybrid rows

Each suite is made of sections; the plan (``--plan``, :mod:`benchmarks.plan`) says what each one
measures, and ``--set SUITE.FIELD=VALUE`` changes a field (0, or an empty list, skips a section).
These flags are every benchmark's: no module has a command line of its own. Each run writes
``results.json`` (machine, versions, config, every figure), ``REPORT.md`` (headlines beside their
same-run baselines, tables, knees) and one PNG per curve into ``--out``.

``python -m benchmarks.cli bench ...`` runs the same command where ``mnemo`` is not installed (the
GPU mode on a bare CUDA machine, ``benchmarks/gpu_run.sh``); ``python -m benchmarks.cli NAME ...``
runs one of the processes the suites start themselves (:data:`CHILDREN`). This module only
registers the commands; everything heavy loads inside them.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib
import inspect
import logging
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["CHILDREN", "register"]

# The processes the suites start of their own: name -> (module, its entry taking the argument list).
CHILDREN = {
    "flood-client": ("benchmarks.flood_client", "main"),  # a flood's pipelined client (reliability)
    "http-floor": ("benchmarks.http_floor", "main"),  # the least an HTTP service costs (gateway)
    "ray-probe": ("benchmarks.cluster", "probe_main"),  # where a cluster's replicas run (reliability)
    "vector-worker": ("benchmarks.vector_cache", "worker_main"),  # a FAISS cache worker process (scale)
}

log = logging.getLogger(__name__)


def _suites(raw: str, device: str) -> list[str]:
    from .suites import CPU_SUITES

    suite_names = (*CPU_SUITES, "gpu")
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if names == ["all"]:
        return ["gpu"] if device == "cuda" else list(CPU_SUITES)
    unknown = sorted(set(names) - set(suite_names))
    if unknown or not names:
        raise SystemExit(f"mnemo bench: unknown suite {unknown}; choose from {', '.join(suite_names)} or all")
    if device == "cuda" and names != ["gpu"]:
        raise SystemExit(
            "mnemo bench: --device cuda runs the GPU mode (suite gpu) alone; the other suites run the "
            "sidecar on Ray and need PostgreSQL, so run them without --device"
        )
    return names


def _gpu_suite(plan: Any, device: str, work_dir: Path):
    from .gpu import GpuBenchConfig, as_suite, run_gpu_benchmark

    tiny = device == "cpu"  # the real architectures would take hours on a CPU: a smoke run instead
    config = GpuBenchConfig(
        device=device,
        dtypes=("float32",) if tiny else plan.gpu.dtypes,
        lengths=tuple(min(n, 64) for n in plan.gpu.lengths) if tiny else plan.gpu.lengths,
        seconds=min(plan.gpu.seconds, 0.5) if tiny else plan.gpu.seconds,
        tiny=tiny,
        work_dir=work_dir / "gpu-models",
        faiss_vectors=plan.gpu.faiss_vectors,
    )
    suite = as_suite(run_gpu_benchmark(config))
    if tiny:
        suite.notes.insert(0, "CPU smoke run with miniature shapes: use --device cuda for real figures.")
    return suite


def _run(args: argparse.Namespace) -> int:
    from .plan import PLANS, apply_overrides
    from .report import SuiteResult, write_report
    from .stack import open_stack
    from .suites import SUITES

    names = _suites(args.suite, args.device)
    plan = PLANS[args.plan]
    try:
        plan = apply_overrides(plan, args.overrides)
    except ValueError as exc:
        print(f"mnemo bench: {exc}", file=sys.stderr)
        return 2
    if args.dataset:
        import dataclasses

        datasets = tuple(str(d.resolve()) for d in args.dataset)
        plan = dataclasses.replace(plan, quality=dataclasses.replace(plan.quality, datasets=datasets))
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or Path("bench-results") / f"{stamp}-{plan.name}"
    work_dir = (args.work_dir or Path(".mnemo") / "bench").resolve()

    results: list[SuiteResult] = []
    timings: dict[str, float] = {}
    failed = False
    if "gpu" in names:
        started = time.perf_counter()
        results.append(_gpu_suite(plan, args.device, work_dir))
        timings["gpu"] = time.perf_counter() - started
    cpu = [SUITES[n] for n in names if n != "gpu"]
    if cpu:
        with open_stack(
            work_dir,
            database=any(s.database for s in cpu),
            sidecar=any(s.sidecar for s in cpu),
            database_url=args.database_url,
            sidecar_url=args.sidecar_url,
            tiny_models=any(s.tiny_models for s in cpu),
        ) as stack:
            for suite in cpu:
                print(f"mnemo bench: {suite.name}: {suite.what} ...", flush=True)
                started = time.perf_counter()
                try:
                    outcome = suite.run(stack, plan)
                    results.append(asyncio.run(outcome) if inspect.isawaitable(outcome) else outcome)
                except Exception as exc:  # one broken suite must not hide the others' figures
                    log.exception("suite %s failed", suite.name)
                    results.append(SuiteResult(suite.name, skipped=f"FAILED: {type(exc).__name__}: {exc}"))
                    failed = True
                timings[suite.name] = time.perf_counter() - started
                print(f"mnemo bench: {suite.name} done in {timings[suite.name]:.0f} s", flush=True)
    for result in results:
        result.notes.append(f"Suite wall time: {timings.get(result.suite, 0):.0f} s.")
    config = {
        "plan": plan.as_dict(),
        "suites": names,
        "device": args.device,
        "sidecar": args.sidecar_url or "started for this run",
        "database": "external (--database-url)" if args.database_url else "embedded, throwaway",
        "argv": sys.argv[1:],
        "suite_seconds": timings,
    }
    report = write_report(out, results, config)
    text = report.read_text()
    start = text.find("## Headlines")
    end = text.find("\n## ", start + 1)
    print(text[start:end] if start >= 0 else "(no headlines)")
    print(f"report: {report}  (results.json and the plots beside it)")
    return 1 if failed else 0


async def _eval(args: argparse.Namespace) -> int:
    import json

    from gateway.base.settings import load_gateway_settings
    from index.settings import SidecarClientSettings
    from schema.cli import database_settings
    from schema.settings import SettingsError, load_settings

    from .eval import LEXICAL_ENGINES, MODES
    from .quality import metrics_json, render, run_quality_benchmark

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        print(f"mnemo eval: unknown modes {unknown}; choose from {', '.join(MODES)}", file=sys.stderr)
        return 2
    engines = [e.strip() for e in args.lexical_engines.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(LEXICAL_ENGINES))  # the SQL leg is always scored
    if unknown:
        print(
            f"mnemo eval: --lexical-engines: unknown {unknown}; choose from {', '.join(LEXICAL_ENGINES)}",
            file=sys.stderr,
        )
        return 2
    try:
        sidecar = load_settings(SidecarClientSettings, sidecar_url=args.sidecar_url)
        settings = load_gateway_settings(database=database_settings(args), sidecar=sidecar, auth="off")
    except SettingsError as exc:
        print(f"mnemo eval: {exc}", file=sys.stderr)
        return 2
    try:
        result = await run_quality_benchmark(
            args.dataset,
            settings,
            modes=modes,
            references=not args.no_references,
            tune=args.tune,
            keep=args.keep,
            apply=args.apply,
            lexical_engines=engines,
        )
    except LookupError as exc:  # --apply to a section without a descriptor
        print(f"mnemo eval: --apply: {exc}", file=sys.stderr)
        return 2
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(metrics_json(result), indent=2) + "\n")
    return 0


def _register_eval(subparsers: argparse._SubParsersAction) -> None:
    from schema.cli import add_database_flags

    p = subparsers.add_parser(
        "eval",
        help="retrieval quality on a BEIR data set (nDCG@10, recall@100, MRR@10 per mode, with references)",
    )
    add_database_flags(p)
    p.add_argument(
        "--dataset", type=Path, required=True, help="BEIR directory (corpus.jsonl, queries.jsonl, qrels/)"
    )
    p.add_argument("--modes", default="dense,lexical,sparse,hybrid", help="comma-separated modes")
    p.add_argument("--json", type=Path, default=None, help='write {"<mode>": {"ndcg@10", ...}} here')
    p.add_argument(
        "--tune",
        action="store_true",
        help="choose fusion method and weights, reported 2-fold cross-validated (tuned on half the queries)",
    )
    p.add_argument(
        "--apply",
        metavar="SECTION",
        default=None,
        help="tune, then store the choice in SECTION's descriptor (the gateway fuses that section with it)",
    )
    p.add_argument("--no-references", action="store_true", help="skip exact-dense / BM25 / RRF references")
    p.add_argument(
        "--lexical-engines",
        default="",
        metavar="ENGINES",
        help="also score these lexical engines beside the gateway's lexical leg, in the same run: tantivy "
        "(its index built from the eval's store by the lexical writer)",
    )
    p.add_argument("--keep", action="store_true", help="keep the eval section indexed (faster re-runs)")
    p.add_argument("--sidecar-url", default=None, help="inference sidecar URL (env RAG_SIDECAR_URL)")
    p.set_defaults(run=lambda a: asyncio.run(_eval(a)))


def _bench_flags(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of every benchmark run (``mnemo bench``, ``python -m benchmarks.cli bench``)."""
    from .plan import PLANS

    p.add_argument(
        "--suite",
        default="all",
        help="sidecar, ingest, gateway, quality, reliability, scale, gpu (comma-separated), or all (default: every CPU suite)",
    )
    p.add_argument("--plan", choices=tuple(PLANS), default="quick", help="how much each suite measures")
    p.add_argument("--full", dest="plan", action="store_const", const="full", help="the same as --plan full")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SUITE.FIELD=VALUE",
        help="override one plan field, e.g. --set gateway.sizes=1000,5000 (see benchmarks/plan.py)",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="report folder (default bench-results/<UTC time>-<plan>)"
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: GPU mode (the batcher and model code in-process, bge-m3 and SigLIP architectures)",
    )
    p.add_argument("--sidecar-url", default=None, help="drive this running sidecar (it must serve MiniLM)")
    p.add_argument(
        "--database-url",
        default=None,
        help="PostgreSQL server to create scratch databases on (needs CREATEDB)",
    )
    p.add_argument(
        "--dataset", type=Path, action="append", default=None, help="BEIR data set for quality (repeatable)"
    )
    p.add_argument(
        "--work-dir", type=Path, default=None, help="scratch and cached peers (default .mnemo/bench)"
    )
    return p


def register(subparsers: argparse._SubParsersAction) -> None:
    """``mnemo bench`` and ``mnemo eval`` (the CLI root finds this through ``mnemo.commands``)."""
    _register_eval(subparsers)
    p = subparsers.add_parser(
        "bench",
        help="benchmark suites, each figure beside a baseline from the same run (REPORT.md, results.json, PNGs)",
        description=__doc__.split("\n\n")[0],
    )
    _bench_flags(p).set_defaults(run=_run)


def _main(argv: list[str]) -> int:
    if argv[:1] == ["bench"]:
        return _run(
            _bench_flags(argparse.ArgumentParser(prog="python -m benchmarks.cli bench")).parse_args(argv[1:])
        )
    if argv[:1] and argv[0] in CHILDREN:
        module, entry = CHILDREN[argv[0]]
        return getattr(importlib.import_module(module), entry)(argv[1:])
    raise SystemExit(f"usage: python -m benchmarks.cli bench [FLAGS] | {{{','.join(CHILDREN)}}} ARGS")


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
