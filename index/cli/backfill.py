"""``mnemo backfill``: rebuild a model's partition in bulk (:mod:`index.bulk.backfill`), with progress
lines on a terminal or in a log."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from index.cli.common import (
    EXIT_SIDECAR_UNAVAILABLE,
    add_ray_start_timeout,
    add_sidecar_flags,
    ingest_settings,
    open_sidecar,
    print_json,
)
from inference.eventloop import command
from schema.cli import add_database_flags, database_settings


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
    from index.bulk.backfill import JsonlSource, ModelSource, QueueSource

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
    from index.bulk.backfill import BackfillConflict, BackfillOptions, abandon, run_backfill
    from index.bulk.backfill_ray import RayEmbedStep, RayStepError
    from index.bulk.shadow import MemoryTooSmall
    from inference.client import SidecarUnavailable
    from schema.database import open_database

    settings = ingest_settings(args)
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
        async with open_sidecar(args) as (client, sidecar):
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
    print_json(out)
    return 1 if report.rejected or report.rejects_path else 0


def register_backfill(subparsers: argparse._SubParsersAction) -> None:
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
    add_ray_start_timeout(p, "writer")
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    p.add_argument(
        "--progress-every", type=float, default=10.0, help="seconds between progress lines off a terminal"
    )
    add_database_flags(p)
    add_sidecar_flags(p)
    p.set_defaults(run=command(_backfill, "mnemo backfill"))
