"""Ingestion commands: ``mnemo drain``, ``mnemo ingest``, ``mnemo backfill``, ``mnemo queue``,
``mnemo sections``, ``mnemo reconcile``.

Registration stays light: the database driver, the sidecar client and the
indexer load only inside the command that runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from inference.eventloop import command, run
from schema.cli import add_database_flags, database_settings, stop_signal

from . import lexical_cli
from .ray_cluster import ACTOR_START_TIMEOUT_S

# `mnemo drain --once` exit status when the sidecar is unreachable (EX_TEMPFAIL: try again later).
EXIT_SIDECAR_UNAVAILABLE = 75


def _add_ray_start_timeout(p: argparse.ArgumentParser, actors: str) -> None:
    p.add_argument(
        "--ray-start-timeout",
        type=float,
        default=ACTOR_START_TIMEOUT_S,
        metavar="SECONDS",
        help=f"--ray: how long to wait for every {actors} actor to start before the first batch "
        f"(default {ACTOR_START_TIMEOUT_S:g})",
    )


def _add_sidecar_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sidecar-url", default=None, help="inference sidecar URL (env RAG_SIDECAR_URL)")
    parser.add_argument("--text-model", default=None, help="text model id (env RAG_TEXT_MODEL)")


def _ingest_settings(args: argparse.Namespace) -> Any:
    from schema.settings import load_settings

    from .settings import IngestSettings

    return load_settings(
        IngestSettings,
        drain_interval=getattr(args, "interval", None),
        drain_workers=getattr(args, "workers", None),
    )


def _media_settings() -> Any:
    from schema.settings import load_settings

    from .settings import MediaSettings

    return load_settings(MediaSettings)


@contextlib.asynccontextmanager
async def _database(args: argparse.Namespace) -> AsyncIterator[Any]:
    from schema.database import open_database

    async with open_database(database_settings(args)) as db:
        yield db.pool


@contextlib.asynccontextmanager
async def _sidecar(args: argparse.Namespace) -> AsyncIterator[tuple[Any, Any]]:
    from schema.settings import load_settings

    from .settings import SidecarClientSettings

    settings = load_settings(SidecarClientSettings, sidecar_url=args.sidecar_url, text_model=args.text_model)
    async with settings.client() as client:
        yield client, settings


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str, ensure_ascii=False))


# -- mnemo drain -------------------------------------------------------------------


async def _drain(args: argparse.Namespace) -> int:
    from .drain import DrainLoop

    settings = _ingest_settings(args)
    async with _database(args) as pool, _sidecar(args) as (client, sidecar):
        loop = DrainLoop(
            pool,
            client,
            settings,
            text_model=sidecar.text_model,
            image_model=sidecar.image_model,
            media=_media_settings(),
        )
        if args.once:
            report = await loop.drain()
            _print_report(report)
            if report.unavailable:
                print(f"sidecar unavailable at {sidecar.sidecar_url}: records stay queued", file=sys.stderr)
                return EXIT_SIDECAR_UNAVAILABLE
            return 0
        with stop_signal() as stop:
            runner = asyncio.create_task(loop.run(stop))
            print(
                f"draining with {settings.drain_workers} worker(s), a pass every "
                f"{settings.drain_interval:g}s; Ctrl-C stops",
                flush=True,
            )
            await runner
    return 0


def _print_report(report: Any) -> None:
    seconds = ", ".join(f"{k} {v:.2f}s" for k, v in sorted(report.seconds.items()))
    print(
        f"drained: {report.indexed} indexed, {report.deleted} deleted, {report.failed} failed "
        f"({report.parked} parked), {report.superseded} re-pushed meanwhile; "
        f"{report.chunks_embedded} chunks embedded, {report.rows_written} rows written, "
        f"{report.rows_deleted} rows deleted, {report.truncated} truncated"
        + (f", {report.lost_leases} taken over by another worker" if report.lost_leases else "")
        + (f" [{seconds}]" if seconds else ""),
        flush=True,
    )


# -- mnemo ingest ------------------------------------------------------------------


def _ingest_records_command(args: argparse.Namespace) -> int:
    path: Path = args.file
    if not path.is_file():
        print(f"no such file: {path}", file=sys.stderr)
        return 2
    with path.open("rb") as fh:
        total = sum(1 for line in fh if line.strip())
    return run(_ingest_records(args, path, total))


async def _ingest_records(args: argparse.Namespace, path: Path, total: int) -> int:
    from tqdm import tqdm

    from inference.strict_json import JsonRejected, loads_strict

    from .intake import enqueue_valid

    queued = 0
    rejected: list[str] = []
    async with _database(args) as pool:
        with (
            path.open(encoding="utf-8") as fh,
            tqdm(total=total, unit="rec", desc="ingest", disable=args.no_progress) as bar,
        ):
            batch: list[Any] = []
            lines: list[int] = []

            async def flush() -> None:
                nonlocal queued
                if not batch:
                    return
                n, bad = await enqueue_valid(pool, batch)
                queued += n
                rejected.extend(f"line {lines[i]}: {e.code}: {e}" for i, e in bad)
                bar.update(len(batch))
                batch.clear()
                lines.clear()

            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    # The same parser and limits as POST /v1/records (NUL and lone surrogates
                    # included, which PostgreSQL would refuse for the whole batch).
                    batch.append(loads_strict(line.encode("utf-8"), forbid_nul=True))
                    lines.append(number)
                except JsonRejected as exc:
                    code = "request.invalid_text" if exc.reason == "invalid_text" else "request.invalid_json"
                    rejected.append(f"line {number}: {code}: {exc}")
                    bar.update(1)
                if len(batch) >= args.batch:
                    await flush()
            await flush()
        print(f"{total} records read, {queued} queued, {len(rejected)} rejected", flush=True)
        for message in rejected[:20]:
            print("  " + message, flush=True)
        if len(rejected) > 20:
            print(f"  ... and {len(rejected) - 20} more", flush=True)
        if args.drain:
            from .drain import drain_once

            async with _sidecar(args) as (client, sidecar):
                report = await drain_once(pool, client, _ingest_settings(args), text_model=sidecar.text_model)
                _print_report(report)
                if report.unavailable:
                    return EXIT_SIDECAR_UNAVAILABLE
    return 1 if rejected else 0


def _projects(raw: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in (raw or "").split(",") if p.strip())


def _ingest_images_command(args: argparse.Namespace) -> int:
    source: Path = args.source
    if not source.exists():
        print(f"no such file or directory: {source}", file=sys.stderr)
        return 2
    return run(_ingest_images(args, source))


async def _ingest_images(args: argparse.Namespace, source: Path) -> int:
    from tqdm import tqdm

    from schema.settings import load_settings

    from .image_jobs import JobError, JobOptions
    from .settings import MediaSettings

    media = load_settings(MediaSettings)
    options = JobOptions(
        section_tipo=args.section,
        component=args.component,
        start_id=args.start_id,
        projects=_projects(args.projects),
        workers=args.workers,
        batch_size=args.batch_size,
        prefetch=args.prefetch,
        image_model=args.image_model,
        rejects=args.rejects,
        media=media,
    )
    async with _database(args) as pool, _sidecar(args) as (client, sidecar):
        options = dataclasses.replace(options, image_model=options.image_model or sidecar.image_model)
        try:
            if args.ray:
                from .image_jobs_ray import run_ray_image_job

                report = await run_ray_image_job(
                    pool,
                    source,
                    options,
                    address=args.ray,
                    config=args.config,
                    start_timeout_s=args.ray_start_timeout,
                )
            else:
                from .image_jobs import run_image_job

                with tqdm(unit="img", desc="images", disable=args.no_progress, smoothing=0.1) as bar:
                    report = await run_image_job(pool, client, source, options, progress=bar.update)
        except JobError as exc:
            print(f"cannot run: {exc}", file=sys.stderr)
            return 2
    print(
        f"{report.total} images: {report.embedded} embedded, {report.unchanged} unchanged, "
        f"{report.rewritten} rewritten, {report.rejected} rejected; {report.rows_written} rows written "
        f"with {report.model} in {report.seconds:.1f}s ({report.images_per_s:.1f} images/s)",
        flush=True,
    )
    if report.rejects_path:
        print(f"rejects: {report.rejects_path}", flush=True)
    return 1 if report.rejected else 0


async def _ingest_demo(args: argparse.Namespace) -> int:
    from .demo import load_demo

    async with _database(args) as pool:
        n = await load_demo(pool)
    print(f"demo collection: {n} records queued (the drain indexes them)", flush=True)
    return 0


# -- mnemo backfill ------------------------------------------------------------------


class _ProgressLines:
    """Progress on a terminal: a bar with rate and ETA (tqdm). Elsewhere (a log, CI): a plain line
    at most every ``every`` seconds, and the last one."""

    def __init__(self, every: float, enabled: bool) -> None:
        import time

        self._clock = time.monotonic
        self.every = every
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self.bar: Any = None
        self.started = self._clock()
        self.first: int | None = None
        self.last_line = 0.0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.tty:
            from tqdm import tqdm

            if self.bar is None:
                self.bar = tqdm(total=total, initial=done, unit="rec", desc="backfill", smoothing=0.1)
            self.bar.total = total
            self.bar.update(done - self.bar.n)
            return
        now = self._clock()
        if self.first is None:
            self.first, self.started = done, now
        if now - self.last_line < self.every and done < total:
            return
        self.last_line = now
        rate = (done - self.first) / (now - self.started) if now > self.started else 0.0
        eta = f"{(total - done) / rate:.0f}s" if rate > 0 else "?"
        print(f"backfill: {done}/{total} records, {rate:.1f} rec/s, ETA {eta}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _backfill_source(args: argparse.Namespace, text_model: str | None, options: Any) -> Any:
    from .backfill import JsonlSource, ModelSource, QueueSource

    if args.from_model:
        if not text_model:
            raise ValueError("a model change needs the new model: --text-model NEW")
        return ModelSource(args.from_model, text_model)
    if args.jsonl is not None:
        if not args.jsonl.is_file():
            raise ValueError(f"no such file: {args.jsonl}")
        return JsonlSource(args.jsonl, text_model)
    return QueueSource(args.section, text_model, options)


async def _backfill(args: argparse.Namespace) -> int:
    from inference.client import SidecarUnavailable
    from schema.database import open_database

    from .backfill import BackfillConflict, BackfillOptions, abandon, run_backfill
    from .backfill_ray import RayEmbedStep, RayStepError
    from .shadow import MemoryTooSmall

    settings = _ingest_settings(args)
    async with open_database(database_settings(args)) as db:
        pool = db.pool
        if args.abandon:
            dropped = await abandon(pool, args.abandon)
            print(f"abandoned backfill {dropped}" if dropped else f"no unfinished backfill of {args.abandon}")
            return 0
        if not (args.section or args.jsonl or args.from_model):
            print("say what to backfill: --section TIPO, --jsonl FILE or --from-model OLD", file=sys.stderr)
            return 2
        options = BackfillOptions(
            batch_records=args.batch,
            embed_batch=settings.embed_batch,
            lease_seconds=settings.lease_seconds,
            max_attempts=settings.max_attempts,
            backoff_cap=settings.backoff_cap,
            build_workers=args.build_workers,
            maintenance_work_mem=args.maintenance_work_mem,
            allow_spill=args.allow_spill,
            rejects=args.rejects,
        )
        progress = _ProgressLines(args.progress_every, not args.no_progress)
        async with _sidecar(args) as (client, sidecar):
            step = None
            try:
                source = _backfill_source(args, sidecar.text_model, options)
                if args.ray:
                    step = RayEmbedStep(
                        args.ray,
                        db.url,
                        sidecar,
                        writers=args.ray_writers,
                        start_timeout_s=args.ray_start_timeout,
                    )
                report = await run_backfill(pool, client, source, options, progress=progress, embed_step=step)
            except (BackfillConflict, MemoryTooSmall, ValueError, LookupError) as exc:
                print(f"cannot backfill: {exc}", file=sys.stderr)
                return 2
            except SidecarUnavailable as exc:
                print(f"sidecar unavailable: {exc}; run the same command again to resume", file=sys.stderr)
                return EXIT_SIDECAR_UNAVAILABLE
            except RayStepError as exc:
                print(f"backfill stopped: {exc}", file=sys.stderr)
                return 3
            finally:
                progress.close()
    out = report.as_dict()
    if step is not None:
        out["records_by_node"] = dict(step.records_by_node)
    _print_json(out)
    return 1 if report.rejected or report.rejects_path else 0


# -- mnemo queue -------------------------------------------------------------------


async def _queue_stats(args: argparse.Namespace) -> int:
    from . import queue, workers
    from .drain import stale_after_s

    settings = _ingest_settings(args)
    async with _database(args) as pool:
        stats = await queue.stats(pool, settings.max_attempts)
        rows = await workers.list_workers(pool, stale_after_s=stale_after_s(settings))
    if args.json:
        _print_json({**stats.as_dict(), "workers": [w.as_dict() for w in rows]})
    else:
        age = "-" if stats.oldest_age_s is None else f"{stats.oldest_age_s:.0f}s"
        print(
            f"pending {stats.pending} (ready {stats.ready}, blocked {stats.blocked}), "
            f"failed {stats.failed}, oldest {age}, waiting on the sidecar {stats.waiting_on_sidecar}, "
            f"leased {stats.leased} (expired {stats.expired_leases})"
        )
        alive = [w for w in rows if w.alive]
        print(f"workers: {len(alive)} alive, {len(rows) - len(alive)} stale")
        for w in rows:
            print(
                f"  {w.worker_id} [{w.role}{'' if w.alive else ', stale'}] leases {w.leases}, "
                f"{w.records_done} done, {w.records_failed} failed, {w.records_per_s:.2f} records/s, "
                f"{w.chunks_embedded} chunks embedded"
            )
    return 0


async def _queue_retry(args: argparse.Namespace) -> int:
    from . import queue

    settings = _ingest_settings(args)
    async with _database(args) as pool:
        n = await queue.retry(
            pool,
            section_tipo=args.section,
            section_id=args.id,
            include_blocked=args.include_blocked,
            max_attempts=settings.max_attempts,
        )
    print(f"{n} records made ready again", flush=True)
    return 0


async def _queue_list(args: argparse.Namespace) -> int:
    from . import queue

    settings = _ingest_settings(args)
    async with _database(args) as pool:
        rows = await queue.list_entries(
            pool, max_attempts=settings.max_attempts, failed_only=args.failed, limit=args.limit
        )
    if args.json:
        _print_json(rows)
        return 0
    for r in rows:
        error = f"  {r['last_error']}" if r["last_error"] else ""
        print(
            f"{r['state']:8} {r['section_tipo']}/{r['section_id']} {r['operation']} "
            f"v{r['version']} attempts={r['attempts']}{error}"
        )
    return 0


# -- mnemo sections / reconcile --------------------------------------------------------


async def _sections_put(args: argparse.Namespace) -> int:
    from .sections import DescriptorError, SectionStore

    async with _database(args) as pool:
        try:
            descriptor = await SectionStore(pool).put(args.section, json.loads(args.file.read_text()))
        except DescriptorError as exc:
            print(f"invalid descriptor: {exc}", file=sys.stderr)
            return 2
    _print_json(descriptor)
    return 0


async def _sections_get(args: argparse.Namespace) -> int:
    from .sections import SectionStore

    async with _database(args) as pool:
        descriptor = await SectionStore(pool).get(args.section)
    if descriptor is None:
        print(f"section {args.section!r} has no descriptor", file=sys.stderr)
        return 1
    _print_json(descriptor)
    return 0


async def _reconcile(args: argparse.Namespace) -> int:
    from .intake import IntakeError
    from .reconcile import parse_archive_listing, reconcile_section

    try:
        ids, records = parse_archive_listing(args.file.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        print(f"cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    async with _database(args) as pool:
        try:
            report = await reconcile_section(pool, args.section, ids, records)
        except IntakeError as exc:
            print(f"{exc.code}: {exc}", file=sys.stderr)
            return 2
    _print_json(report.as_dict())
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    lexical_cli.register(subparsers)  # mnemo lexical (the Tantivy indexes)
    p = subparsers.add_parser("drain", help="index queued records (a loop, or --once for cron)")
    p.add_argument("--once", action="store_true", help="work until no queued record is ready, then exit")
    p.add_argument(
        "--interval", type=float, default=None, help="seconds between passes (env RAG_INGEST_DRAIN_INTERVAL)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="drain workers in this process (env RAG_INGEST_DRAIN_WORKERS, default 1); any number of "
        "`mnemo drain` processes on any hosts share the queue through leases",
    )
    add_database_flags(p)
    _add_sidecar_flags(p)
    p.set_defaults(run=command(_drain, "mnemo drain"))

    ingest = subparsers.add_parser("ingest", help="queue records for indexing (backfills, the demo)")
    ingest_sub = ingest.add_subparsers(dest="ingest_command", metavar="WHAT", required=True)
    p = ingest_sub.add_parser("records", help="queue the records of a JSONL file (one record per line)")
    p.add_argument("file", type=Path, help="JSONL file, one record object per line")
    p.add_argument("--batch", type=int, default=500, help="records per enqueue statement (default 500)")
    p.add_argument("--drain", action="store_true", help="drain the queue afterwards")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_database_flags(p)
    _add_sidecar_flags(p)
    p.set_defaults(run=_ingest_records_command)
    p = ingest_sub.add_parser(
        "images", help="bulk-ingest a collection's images from a manifest (JSONL/CSV) or a folder"
    )
    p.add_argument("source", type=Path, help="manifest (.jsonl or .csv) or a folder of images")
    p.add_argument("--section", required=True, help="section tipo (its descriptor names the roles)")
    p.add_argument("--component", default=None, help="image component (default: the context's first)")
    p.add_argument(
        "--start-id", type=int, default=1, help="first section_id for lines without one (default 1)"
    )
    p.add_argument("--projects", default=None, help="comma-separated project ids for every record")
    p.add_argument("--workers", type=int, default=2, help="decode processes (default 2)")
    p.add_argument("--batch-size", type=int, default=32, help="images per embed call and write (default 32)")
    p.add_argument(
        "--prefetch", type=int, default=2, help="batches decoded ahead of the embedder (default 2)"
    )
    p.add_argument("--image-model", default=None, help="image-text model id (env RAG_IMAGE_MODEL)")
    p.add_argument(
        "--rejects", type=Path, default=None, help="rejects report (default SECTION.rejects.jsonl)"
    )
    p.add_argument("--ray", default=None, metavar="ADDRESS", help="run as a Ray Data job on this cluster")
    p.add_argument(
        "--config", type=Path, default=None, help="--ray: sidecar models YAML the actors load the model from"
    )
    _add_ray_start_timeout(p, "embedder")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_database_flags(p)
    _add_sidecar_flags(p)
    p.set_defaults(run=_ingest_images_command)
    p = ingest_sub.add_parser("demo", help="store the demo sections and queue the demo collection")
    add_database_flags(p)
    p.set_defaults(run=command(_ingest_demo, "mnemo"))

    p = subparsers.add_parser(
        "backfill",
        help="rebuild a model's partition in bulk (COPY into a shadow, one index build, an atomic swap)",
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument(
        "--section", action="append", default=[], help="the section's queued records (repeatable)"
    )
    what.add_argument(
        "--jsonl", type=Path, default=None, help="records of a JSONL export (mnemo ingest shape)"
    )
    what.add_argument(
        "--from-model", default=None, help="model change: re-embed this model's partition with --text-model"
    )
    what.add_argument("--abandon", default=None, metavar="MODEL", help="drop MODEL's unfinished backfill")
    p.add_argument("--batch", type=int, default=64, help="records per embed + COPY transaction (default 64)")
    p.add_argument(
        "--build-workers", type=int, default=None, help="max_parallel_maintenance_workers for the index build"
    )
    p.add_argument(
        "--maintenance-work-mem", default=None, metavar="SIZE", help="for the index build, e.g. 2GB"
    )
    p.add_argument(
        "--allow-spill",
        action="store_true",
        help="build even when the HNSW graph exceeds maintenance_work_mem",
    )
    p.add_argument(
        "--rejects", type=Path, default=None, help="rejects report (default backfill-ID.rejects.jsonl)"
    )
    p.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="embed and COPY as a Ray Data job on this cluster ('local': one here); every node "
        "must reach the database and the sidecar",
    )
    p.add_argument("--ray-writers", type=int, default=2, help="--ray: parallel writer actors (default 2)")
    _add_ray_start_timeout(p, "writer")
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    p.add_argument(
        "--progress-every", type=float, default=10.0, help="seconds between progress lines off a terminal"
    )
    add_database_flags(p)
    _add_sidecar_flags(p)
    p.set_defaults(run=command(_backfill, "mnemo backfill"))

    q = subparsers.add_parser("queue", help="inspect and unpark the ingestion queue")
    q_sub = q.add_subparsers(dest="queue_command", metavar="WHAT", required=True)
    p = q_sub.add_parser("stats", help="pending / ready / blocked / failed / oldest age, leases and workers")
    p.add_argument("--json", action="store_true")
    add_database_flags(p)
    p.set_defaults(run=command(_queue_stats, "mnemo"))
    p = q_sub.add_parser("retry", help="make parked (failed) records ready again")
    p.add_argument("--section", default=None, help="only this section tipo")
    p.add_argument("--id", type=int, default=None, help="only this section id")
    p.add_argument("--include-blocked", action="store_true", help="also records still backing off")
    add_database_flags(p)
    p.set_defaults(run=command(_queue_retry, "mnemo"))
    p = q_sub.add_parser("list", help="queued records with their state and last error")
    p.add_argument("--failed", action="store_true", help="only parked records")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    add_database_flags(p)
    p.set_defaults(run=command(_queue_list, "mnemo"))

    s = subparsers.add_parser("sections", help="section descriptors (embed groups, chunking)")
    s_sub = s.add_subparsers(dest="sections_command", metavar="WHAT", required=True)
    p = s_sub.add_parser("put", help="store a section's descriptor from a JSON file")
    p.add_argument("section", help="section tipo")
    p.add_argument("file", type=Path)
    add_database_flags(p)
    p.set_defaults(run=command(_sections_put, "mnemo"))
    p = s_sub.add_parser("get", help="print a section's descriptor")
    p.add_argument("section", help="section tipo")
    add_database_flags(p)
    p.set_defaults(run=command(_sections_get, "mnemo"))

    p = subparsers.add_parser(
        "reconcile", help="queue index/delete corrections for a section from the archive's id list"
    )
    p.add_argument("section", help="section tipo")
    p.add_argument("file", type=Path, help="ids (one per line or a JSON array) and/or JSONL records")
    add_database_flags(p)
    p.set_defaults(run=command(_reconcile, "mnemo"))
