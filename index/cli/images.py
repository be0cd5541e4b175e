"""``mnemo ingest images``: bulk-ingest a collection's images from a manifest or a folder, here or
as a Ray Data job (``--ray``)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from index.cli.common import (
    add_ray_start_timeout,
    add_sidecar_flags,
    media_settings,
    open_pool,
    open_sidecar,
)
from inference.eventloop import run
from schema.cli import add_database_flags


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

    from index.bulk.image_jobs import JobError, JobOptions

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
        media=media_settings(),
    )
    async with open_pool(args) as pool, open_sidecar(args) as (client, sidecar):
        options = dataclasses.replace(options, image_model=options.image_model or sidecar.image_model)
        try:
            if args.ray:
                from index.bulk.image_jobs_ray import run_ray_image_job

                report = await run_ray_image_job(
                    pool,
                    source,
                    options,
                    address=args.ray,
                    config=args.config,
                    start_timeout_s=args.ray_start_timeout,
                )
            else:
                from index.bulk.image_jobs import run_image_job

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


def register_ingest_images(ingest_sub: argparse._SubParsersAction) -> None:
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
    add_ray_start_timeout(p, "embedder")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_database_flags(p)
    add_sidecar_flags(p)
    p.set_defaults(run=_ingest_images_command)
