"""The bulk image job as a Ray Data pipeline: ``mnemo ingest images ... --ray ADDRESS``.

For collections beyond one machine. The driver reads the manifest and the
store's hashes (resumability), then:

1. ``map_batches(decode)`` on CPU workers: read, hash, decode, downsize and
   thumbnail (:func:`index.ingest.images.prepare_file`, the single-machine job's
   worker step); files whose hash is stored are not decoded;
2. ``map_batches(Embedder)`` in an actor pool (``concurrency`` actors, each
   with ``num_gpus``): every actor loads the image model once through
   ``inference``'s own encoder code (:func:`inference.encoders.load_encoder`)
   and embeds the downsized JPEGs exactly as the sidecar's ``/image`` would
   (same decoder, same processor, same forward pass);
3. the driver streams the results and writes each batch through the
   single-machine job's own steps (:meth:`index.bulk.image_jobs.ImageJob.write_batch`
   with the actors' vectors), so the rows are the ones that job writes.

The driver needs no sidecar; the actors need the model's weights where the
models YAML says (``--config``; default the offline profile).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np

from index.bulk.image_jobs import ImageJob, JobError, JobOptions, JobReport, ManifestItem
from index.bulk.ray_cluster import (
    ACTOR_START_TIMEOUT_S,
    actor_pool,
    check_start_timeout,
    connect,
    is_actor_start_timeout,
    start_actors_first,
)
from index.ingest.images import ImageRejected, PreparedImage, prepare_file

__all__ = ["Embedder", "decode_batch", "run_ray_image_job"]

_DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "inference" / "models.offline.yaml"


def decode_batch(
    batch: dict[str, np.ndarray], *, max_bytes: int, max_px: int, max_pixels: int, thumbnail_px: int
) -> dict[str, np.ndarray]:
    """Ray Data CPU stage: prepare each file of the batch (or note it unchanged / rejected)."""
    status, digest, jpeg, thumb, reason, message = [], [], [], [], [], []
    for path, known, own_thumb in zip(batch["path"], batch["known"], batch["own_thumb"], strict=True):
        result = prepare_file(
            str(path),
            str(known) or None,
            max_bytes=max_bytes,
            max_px=max_px,
            max_pixels=max_pixels,
            thumbnail_px=thumbnail_px if bool(own_thumb) else 0,
        )
        if isinstance(result, ImageRejected):
            row = ("rejected", "", b"", b"", result.reason, result.message)
        elif isinstance(result, PreparedImage):
            row = ("new", result.content_hash, result.jpeg, result.thumbnail or b"", "", "")
        else:
            row = ("unchanged", result, b"", b"", "", "")
        for column, value in zip((status, digest, jpeg, thumb, reason, message), row, strict=True):
            column.append(value)
    return {
        "line": batch["line"],
        "status": np.array(status, dtype=object),
        "hash": np.array(digest, dtype=object),
        "jpeg": np.array(jpeg, dtype=object),
        "thumb": np.array(thumb, dtype=object),
        "reason": np.array(reason, dtype=object),
        "message": np.array(message, dtype=object),
    }


class Embedder:
    """Ray Data actor: the image model loaded once per actor through ``inference``'s encoder code."""

    def __init__(self, spec: dict[str, Any], max_pixels: int) -> None:
        from inference.config import ModelSpec
        from inference.encoders import load_encoder

        self.encoder = load_encoder(ModelSpec(**spec))
        self.max_pixels = max_pixels

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from inference.images import open_image

        new = [i for i, s in enumerate(batch["status"]) if s == "new"]
        vectors: list[Any] = [None] * len(batch["status"])
        step = self.encoder.spec.max_batch_size
        for start in range(0, len(new), step):
            part = new[start : start + step]
            images = [open_image(batch["jpeg"][i], i, self.max_pixels) for i in part]
            out = self.encoder.run_batch(self.encoder.prepare_images(images))
            for i, vector in zip(part, out, strict=True):
                vectors[i] = np.asarray(vector, dtype=np.float32)
        dim = self.encoder.dimension
        batch = dict(batch)
        batch["vector"] = np.stack([v if v is not None else np.zeros(dim, np.float32) for v in vectors])
        batch["jpeg"] = np.array([b""] * len(vectors), dtype=object)  # not needed downstream
        return batch


def _model_spec(options: JobOptions, config: Path | None) -> dict[str, Any]:
    import dataclasses

    from inference.config import ConfigError, load_config, resolve_weights

    try:
        sidecar = load_config(config or _DEFAULT_CONFIG)
    except ConfigError as exc:
        raise JobError(str(exc)) from exc
    specs = [s for s in sidecar.models if s.kind == "image_text"]
    if options.image_model:
        specs = [s for s in specs if s.id == options.image_model]
    if not specs:
        raise JobError(
            f"no image_text model {options.image_model or ''} in {sidecar.source}".replace("  ", " ")
        )
    spec = specs[0]
    path = resolve_weights(spec)  # build a tiny model or find the weights once, on the driver
    return {**dataclasses.asdict(spec), "weights": str(path), "build": None}


async def run_ray_image_job(
    pool: asyncpg.Pool,
    source: Path,
    options: JobOptions,
    *,
    address: str,
    config: Path | None = None,
    concurrency: int = 2,
    num_gpus: float = 0.0,
    start_timeout_s: float = ACTOR_START_TIMEOUT_S,
) -> JobReport:
    """Run the bulk job on the Ray cluster at ``address`` (``"local"`` starts one here). Its
    ``concurrency`` embedder actors all start before the first batch; a :class:`JobError` after
    ``start_timeout_s`` says the cluster could not place them."""
    import ray

    try:
        check_start_timeout(start_timeout_s)  # before the manifest is read, not when the job starts
    except ValueError as exc:
        raise JobError(str(exc)) from exc
    started = time.perf_counter()
    spec = _model_spec(options, config)
    job = ImageJob(pool, None, options)  # no sidecar: the vectors come from the actors
    await job.load_descriptor()
    items = job.read(source)
    await job.use_model(spec["id"])  # its partition, if anything was stored with it yet
    connect(address)
    by_line = {item.line: item for item in items}
    stored = await job.stored(items)
    media = options.media
    rows = [
        {
            "line": item.line,
            "path": item.path,
            "known": stored[item.record].source_hash if item.record in stored else "",
            "own_thumb": item.thumb_url is None,
        }
        for item in items
    ]
    if rows:
        ds = ray.data.from_items(rows)
        ds = ds.map_batches(
            decode_batch,
            batch_size=options.batch_size,
            num_cpus=1,
            fn_kwargs={
                "max_bytes": media.image_max_bytes,
                "max_px": media.image_max_px,
                "max_pixels": media.image_max_pixels,
                "thumbnail_px": media.thumbnail_px,
            },
        )
        ds = ds.map_batches(
            Embedder,
            batch_size=options.batch_size,
            compute=actor_pool(concurrency),
            num_gpus=num_gpus,
            num_cpus=0 if num_gpus else 1,
            fn_constructor_kwargs={"spec": spec, "max_pixels": media.image_max_pixels},
        )
        start_actors_first(ds, start_timeout_s)
        try:
            for batch in ds.iter_batches(batch_size=options.batch_size, batch_format="numpy"):
                batch_items, results, vectors = _results(batch, by_line)
                await job.write_batch(batch_items, stored, results, vectors)
        except Exception as exc:
            if not is_actor_start_timeout(exc):
                raise
            need = f"{num_gpus:g} GPU(s)" if num_gpus else "1 CPU"
            raise JobError(
                f"the cluster did not start {concurrency} embedder(s) of {need} each within "
                f"{start_timeout_s:g} s (`ray status` shows what is free); add nodes or raise "
                "--ray-start-timeout, then run the same command again"
            ) from exc
    return job.finish(started)


def _results(
    batch: Mapping[str, np.ndarray], by_line: Mapping[int, ManifestItem]
) -> tuple[list[ManifestItem], list[PreparedImage | str | ImageRejected], dict[str, np.ndarray]]:
    """A batch of the pipeline's output as the job's items, prepared results and new vectors."""
    items: list[ManifestItem] = []
    results: list[PreparedImage | str | ImageRejected] = []
    vectors: dict[str, np.ndarray] = {}
    for i, line in enumerate(batch["line"]):
        status = batch["status"][i]
        result: PreparedImage | str | ImageRejected
        if status == "rejected":
            result = ImageRejected(str(batch["reason"][i]), str(batch["message"][i]))
        elif status == "unchanged":
            result = str(batch["hash"][i])
        else:
            thumb = bytes(batch["thumb"][i]) or None
            result = PreparedImage(str(batch["hash"][i]), b"", 0, 0, thumb)
            vectors[result.content_hash] = np.asarray(batch["vector"][i], dtype=np.float32)
        items.append(by_line[int(line)])
        results.append(result)
    return items, results, vectors
