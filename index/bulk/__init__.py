"""Bulk jobs: backfills into a shadow table, and bulk image ingestion, here or on a Ray cluster.

Modules and their public names:
- ``backfill``: ``run_backfill``, ``abandon``; ``backfill_types``: ``BackfillOptions``, ``BackfillReport``.
- ``backfill_sources``: where records come from (``QueueSource``, ``JsonlSource``, ``ModelSource``).
- ``backfill_copy``: embed and COPY (``embed_and_copy``); ``backfill_ray``: the same as a Ray Data job.
- ``shadow``: a partition's shadow table, created bare, indexed, swapped in.
- ``image_jobs``: ``run_image_job``, ``read_manifest``; ``image_jobs_ray``: ``run_ray_image_job``.
- ``ray_cluster``: joining the cluster a job runs on (``connect``, ``actor_pool``).
"""
