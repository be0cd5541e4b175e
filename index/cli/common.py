"""What the ingestion commands (:mod:`index.cli.register`) share: the sidecar flags, the settings, the
database pool and the sidecar client they open, and how they print a drain's report.

Registration stays light: the database driver, the sidecar client and the
indexer load only inside the command that runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from index.bulk.ray_cluster import ACTOR_START_TIMEOUT_S
from schema.cli import database_settings

# `mnemo drain --once` exit status when the sidecar is unreachable (EX_TEMPFAIL: try again later).
EXIT_SIDECAR_UNAVAILABLE = 75


def add_ray_start_timeout(p: argparse.ArgumentParser, actors: str) -> None:
    p.add_argument(
        "--ray-start-timeout",
        type=float,
        default=ACTOR_START_TIMEOUT_S,
        metavar="SECONDS",
        help=f"--ray: how long to wait for every {actors} actor to start before the first batch "
        f"(default {ACTOR_START_TIMEOUT_S:g})",
    )


def add_sidecar_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sidecar-url", default=None, help="inference sidecar URL (env RAG_SIDECAR_URL)")
    parser.add_argument("--text-model", default=None, help="text model id (env RAG_TEXT_MODEL)")


def ingest_settings(args: argparse.Namespace) -> Any:
    from index.settings import IngestSettings
    from schema.settings import load_settings

    return load_settings(
        IngestSettings,
        drain_interval=getattr(args, "interval", None),
        drain_workers=getattr(args, "workers", None),
    )


def media_settings() -> Any:
    from index.settings import MediaSettings
    from schema.settings import load_settings

    return load_settings(MediaSettings)


@contextlib.asynccontextmanager
async def open_pool(args: argparse.Namespace) -> AsyncIterator[Any]:
    from schema.database import open_database

    async with open_database(database_settings(args)) as db:
        yield db.pool


@contextlib.asynccontextmanager
async def open_sidecar(args: argparse.Namespace) -> AsyncIterator[tuple[Any, Any]]:
    from index.settings import SidecarClientSettings
    from schema.settings import load_settings

    settings = load_settings(SidecarClientSettings, sidecar_url=args.sidecar_url, text_model=args.text_model)
    async with settings.client() as client:
        yield client, settings


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str, ensure_ascii=False))


def print_report(report: Any) -> None:
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
