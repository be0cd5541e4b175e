"""Image ingestion throughput: the bulk job against the sidecar's ``/image`` alone, and decode scaling.

``python -m benchmarks.images [--images DIR_OR_MANIFEST] [--workers-max N] [--out DIR]``

Measured in one run, on the same images (default: the coins collection, repeated to ``--count``):

1. **decode/resize per worker**: :func:`index.ingest.images.prepare_file` (read, hash, decode, orient,
   downsize, thumbnail) in a process pool of 1..N workers, images/s per pool size (the scaling curve,
   and per-worker throughput = images/s / workers);
2. **sidecar ``/image`` alone**: the already-downsized JPEGs embedded batch after batch through the
   client, as the job calls it (the baseline: what the job could reach if decoding and writing were free);
3. **the bulk job** (``mnemo ingest images``: decode pool pipelined with embedding, multi-row writes)
   into a fresh section, so every image is embedded: images/s, and its ratio to (2). The issue's bar
   is >= 0.8.

A sidecar (the offline tiny SigLIP; its speed, not its vectors, matters here) and an embedded
PostgreSQL are started unless ``--sidecar-url`` / ``--database-url`` are given. Results go to
``OUT/images.json`` and ``OUT/images.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from .datasets import dataset_dir

IMAGE_MODEL = "tiny-siglip-random"
SECTION = {
    "embed": [{"id": "card", "contributors": ["numd1"]}],
    "context": {"images": [{"tipo": "numd5", "view": "obverse"}], "metadata": {}},
}


def _files(source: Path, count: int) -> list[str]:
    if source.is_dir():
        found = sorted(str(p) for p in source.rglob("*.jpg"))
    else:
        base = source.parent
        found = [
            str(base / json.loads(line)["path"]) for line in source.read_text().splitlines() if line.strip()
        ]
    if not found:
        raise SystemExit(f"no images under {source}")
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


@contextlib.contextmanager
def _services(sidecar_url: str | None, database_url: str | None) -> Iterator[tuple[str, str]]:
    with contextlib.ExitStack() as stack:
        root = Path(tempfile.mkdtemp(prefix="mnemo-bench-images-"))
        stack.callback(shutil.rmtree, root, True)
        if database_url is None:
            from schema import EmbeddedPostgres

            server = EmbeddedPostgres(root / "pg")
            database_url = server.start()
            stack.callback(server.stop)
        if sidecar_url is None:
            from inference.config import config_from_dict
            from inference.launcher import running_sidecar

            config = config_from_dict(
                {
                    "models": [
                        {
                            "id": IMAGE_MODEL,
                            "kind": "image_text",
                            "weights": str(root / "models" / IMAGE_MODEL),
                            "build": "tiny-siglip",
                            "max_batch_size": 32,
                            "num_cpus": 1,
                        }
                    ]
                }
            )
            sidecar_url = stack.enter_context(
                running_sidecar(config, num_cpus=2, object_store_mb=128, api_key="")
            )
        yield sidecar_url, database_url


async def run(args: argparse.Namespace, sidecar_url: str, database_url: str) -> dict[str, Any]:
    from index.bulk.image_jobs import JobOptions
    from index.ingest.images import prepare_file
    from index.settings import MediaSettings
    from index.store.sections import SectionStore
    from inference.client import SidecarClient
    from schema import create_pool, migrate

    files = _files(args.images, args.count)
    # The job reads manifest files only under the media root: the photographs' own folder.
    media = MediaSettings(media_root=os.path.commonpath(files))
    curve = decode_curve(files, args.workers_max, media)
    prepared = [
        prepare_file(
            f,
            None,
            max_bytes=media.image_max_bytes,
            max_px=media.image_max_px,
            max_pixels=media.image_max_pixels,
            thumbnail_px=0,
        )
        for f in files
    ]
    jpegs = [p.jpeg for p in prepared]  # type: ignore[union-attr]
    await migrate(database_url)
    pool = await create_pool(database_url, max_size=4)
    tmp = Path(tempfile.mkdtemp(prefix="mnemo-bench-manifest-"))
    try:
        async with SidecarClient(sidecar_url, timeout=120) as client:
            alone = await sidecar_alone(client, jpegs, args.batch_size)
            section = f"bench{int(time.time())}"
            await SectionStore(pool).put(section, SECTION)
            options = JobOptions(section, workers=args.workers, batch_size=args.batch_size, media=media)
            job = await bulk_job(pool, client, files, options, tmp)
    finally:
        await pool.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "images": len(files),
        "cpu_count": os.cpu_count(),
        "decode_curve": curve,
        "sidecar_alone_images_per_s": alone,
        "bulk_job": job,
        "bulk_vs_sidecar": job["images_per_s"] / alone if alone else None,
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Image ingestion ({result['images']} images, {result['cpu_count']} CPUs)",
        "",
        "| measure | images/s |",
        "| --- | --- |",
        f"| sidecar `/image` alone (baseline) | {result['sidecar_alone_images_per_s']:.1f} |",
        f"| bulk job (`mnemo ingest images`) | {result['bulk_job']['images_per_s']:.1f} |",
        f"| ratio bulk / sidecar alone (bar: >= 0.8) | {result['bulk_vs_sidecar']:.2f} |",
        "",
        "| decode workers | images/s | per worker |",
        "| --- | --- | --- |",
        *(
            f"| {r['workers']} | {r['images_per_s']:.1f} | {r['per_worker']:.1f} |"
            for r in result["decode_curve"]
        ),
        "",
        f"Job phases (s): {json.dumps({k: round(v, 2) for k, v in result['bulk_job']['phases'].items()})}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.images", description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=Path, default=None, help="default: the bundled coins' manifest")
    parser.add_argument("--count", type=int, default=384, help="images (the source repeated as needed)")
    parser.add_argument("--workers-max", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    parser.add_argument("--workers", type=int, default=2, help="the bulk job's decode processes")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sidecar-url", default=None)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--out", type=Path, default=Path("bench-images"))
    args = parser.parse_args(argv)
    if args.images is None:
        args.images = dataset_dir("coins", "manifest.jsonl") / "manifest.jsonl"
    with _services(args.sidecar_url, args.database_url) as (sidecar_url, database_url):
        result = asyncio.run(run(args, sidecar_url, database_url))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "images.json").write_text(json.dumps(result, indent=2))
    (args.out / "images.md").write_text(markdown(result))
    print(markdown(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
