"""``mnemo drain``: index queued records, in a loop or ``--once`` for cron."""

from __future__ import annotations

import argparse
import asyncio
import sys

from index.cli.common import (
    EXIT_SIDECAR_UNAVAILABLE,
    add_sidecar_flags,
    ingest_settings,
    media_settings,
    open_pool,
    open_sidecar,
    print_report,
)
from inference.eventloop import command
from schema.cli import add_database_flags, stop_signal


async def _drain(args: argparse.Namespace) -> int:
    from index.ingest.drain import DrainLoop

    settings = ingest_settings(args)
    async with open_pool(args) as pool, open_sidecar(args) as (client, sidecar):
        loop = DrainLoop(
            pool,
            client,
            settings,
            text_model=sidecar.text_model,
            image_model=sidecar.image_model,
            media=media_settings(),
        )
        if args.once:
            report = await loop.drain()
            print_report(report)
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


def register_drain(subparsers: argparse._SubParsersAction) -> None:
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
    add_sidecar_flags(p)
    p.set_defaults(run=command(_drain, "mnemo drain"))
