"""Image ingestion, the scale suite's images section: the bulk job (``mnemo ingest images``) against
the sidecar's ``/image`` alone on the same JPEGs, and the job's decode step by pool size, on the
bundled coins (benchmarks/README.md). The bench sidecar's tiny SigLIP embeds far faster than any real
image model, so on a CPU the ratio is the harshest case for the job.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from .datasets import dataset_dir, read_jsonl
from .report import Curve, Headline, SuiteResult, Table
from .stack import IMAGE_MODEL

SECTION = {
    "embed": [{"id": "card", "contributors": ["numd1"]}],
    "context": {"images": [{"tipo": "numd5", "view": "obverse"}], "metadata": {}},
}


def _files(manifest: Path, count: int) -> list[str]:
    """``count`` image paths of ``manifest``, its images repeated as needed."""
    found = [str(manifest.parent / entry["path"]) for entry in read_jsonl(manifest.parent, manifest.name)]
    return [found[i % len(found)] for i in range(count)]


def decode_curve(files: Sequence[str], workers_max: int, media: Any) -> list[dict[str, float]]:
    """images/s of the job's worker step in pools of 1..workers_max processes."""
    import multiprocessing

    from index.ingest.images import prepare_file

    work = functools.partial(
        prepare_file,
        known_hash=None,
        max_bytes=media.image_max_bytes,
        max_px=media.image_max_px,
        max_pixels=media.image_max_pixels,
        thumbnail_px=media.thumbnail_px,
    )
    rows = []
    for workers in range(1, workers_max + 1):
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            list(pool.map(work, files[: workers * 2]))  # start and warm every worker
            started = time.perf_counter()
            list(pool.map(work, files, chunksize=8))
            seconds = time.perf_counter() - started
        rate = len(files) / seconds
        rows.append({"workers": workers, "images_per_s": rate, "per_worker": rate / workers})
    return rows


async def sidecar_alone(client: Any, jpegs: Sequence[bytes], batch: int) -> float:
    """images/s of ``/image`` alone, batch after batch (one warm-up batch first)."""
    await client.embed_images(IMAGE_MODEL, list(jpegs[:batch]))
    started = time.perf_counter()
    for i in range(0, len(jpegs), batch):
        await client.embed_images(IMAGE_MODEL, list(jpegs[i : i + batch]))
    return len(jpegs) / (time.perf_counter() - started)


async def bulk_job(pool: Any, client: Any, files: Sequence[str], options: Any, tmp: Path) -> dict[str, Any]:
    from index.bulk.image_jobs import run_image_job

    manifest = tmp / "bench.jsonl"
    manifest.write_text("".join(json.dumps({"path": f, "section_id": i}) + "\n" for i, f in enumerate(files)))
    report = await run_image_job(pool, client, manifest, options)
    return report.as_dict()


async def measure_images(stack: Any, count: int, workers_max: int, *, batch: int = 32) -> dict[str, Any]:
    """The three measurements on ``count`` of the bundled coins, the job into a fresh database."""
    from index.bulk.image_jobs import JobOptions
    from index.ingest.images import prepare_file
    from index.settings import MediaSettings
    from index.store.sections import SectionStore
    from inference.client import SidecarClient
    from schema import create_pool

    files = _files(dataset_dir("coins", "manifest.jsonl") / "manifest.jsonl", count)
    # The job reads manifest files only under the media root: the photographs' own folder.
    media = MediaSettings(media_root=os.path.commonpath(files))
    curve = await asyncio.to_thread(decode_curve, files, workers_max, media)
    sizes = {
        "max_bytes": media.image_max_bytes,
        "max_px": media.image_max_px,
        "max_pixels": media.image_max_pixels,
    }
    jpegs = [prepare_file(f, None, thumbnail_px=0, **sizes).jpeg for f in files]  # type: ignore[union-attr]
    pool = await create_pool(await stack.fresh_database("bench_images"), max_size=4)
    try:
        async with SidecarClient(stack.sidecar_url, timeout=120) as client:
            alone = await sidecar_alone(client, jpegs, batch)
            await SectionStore(pool).put("bench_images", SECTION)
            options = JobOptions("bench_images", workers=2, batch_size=batch, media=media)
            job = await bulk_job(pool, client, files, options, stack.work_dir)
    finally:
        await pool.close()
    return {"images": len(files), "cpu_count": os.cpu_count(), "decode_curve": curve,
            "sidecar_alone_images_per_s": alone, "bulk_job": job, "bulk_vs_sidecar": job["images_per_s"] / alone}  # fmt: skip


def add_images_result(suite: SuiteResult, result: dict[str, Any]) -> None:
    """The job against /image alone as a headline, the decode curve, the job's phases."""
    suite.headlines.append(Headline(
        f"bulk image job images/s ({result['images']} images)", result["bulk_job"]["images_per_s"], "images/s",
        "the sidecar's /image alone, same JPEGs", result["sidecar_alone_images_per_s"], bar=0.8,
    ))  # fmt: skip
    curve = result["decode_curve"]
    suite.curves.append(Curve("Image decode throughput by pool size", "decode workers", "images/s",
                              {"prepare_file": [(r["workers"], r["images_per_s"]) for r in curve]}))  # fmt: skip
    suite.tables.append(Table(
        f"Image ingestion ({result['images']} images, {result['cpu_count']} CPUs): decode workers, and the job's phases",
        ["decode workers", "images/s", "per worker"], [[r["workers"], r["images_per_s"], r["per_worker"]] for r in curve],
    ))  # fmt: skip
    phases = ", ".join(f"{k} {v:.2f}" for k, v in result["bulk_job"]["phases"].items())
    suite.notes.append(f"Bulk image job phases (s): {phases}.")
    suite.figures["images"] = result
