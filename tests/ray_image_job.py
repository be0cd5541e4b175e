"""Run the Ray Data image job on a local two-node ``ray.cluster_utils.Cluster`` (a subprocess of the
test: the test process already hosts the sidecar's Ray instance, and a process joins one Ray cluster).

``python -m tests.ray_image_job DATABASE_URL MANIFEST SECTION CONFIG`` runs the job twice: first
asking for one GPU per embedder, which the CPU-only cluster cannot place, with a short start timeout;
then as the CLI does. It prints the second job's report as JSON, with the live nodes and what the
first one raised (``unplaceable``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from index.bulk.image_jobs import JobError, JobOptions
from index.bulk.image_jobs_ray import run_ray_image_job
from index.settings import MediaSettings
from schema import create_pool
from tests.image_support import COINS
from tests.ray_two_nodes import two_node_cluster

MEDIA = MediaSettings(media_root=str(COINS), image_max_px=64, thumbnail_px=24)


async def _run(url: str, manifest: Path, section: str, config: Path, address: str) -> dict:
    pool = await create_pool(url, max_size=2)
    try:
        rejects = manifest.with_suffix(".rejects.jsonl")  # beside the test's manifest, not in the cwd
        options = JobOptions(section, projects=(1,), batch_size=4, media=MEDIA, rejects=rejects)
        try:
            await run_ray_image_job(
                pool, manifest, options, address=address, config=config, num_gpus=1, start_timeout_s=2
            )
            unplaceable = "no error"
        except JobError as exc:
            unplaceable = str(exc)
        report = await run_ray_image_job(pool, manifest, options, address=address, config=config)
    finally:
        await pool.close()
    return {"unplaceable": unplaceable, **report.as_dict()}


def main() -> None:
    url, manifest, section, config = sys.argv[1:5]
    with two_node_cluster() as (address, nodes):
        report = asyncio.run(_run(url, Path(manifest), section, Path(config), address))
        print(json.dumps({"nodes": nodes, **report}))


if __name__ == "__main__":
    main()
