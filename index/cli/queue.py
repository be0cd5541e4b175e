"""``mnemo queue``: inspect the ingestion queue and its workers, and unpark failed records."""

from __future__ import annotations

import argparse

from index.cli.common import (
    ingest_settings,
    open_pool,
    print_json,
)
from inference.eventloop import command
from schema.cli import add_database_flags


async def _queue_stats(args: argparse.Namespace) -> int:
    from index.ingest import drain_registry, queue
    from index.ingest.drain import stale_after_s

    settings = ingest_settings(args)
    async with open_pool(args) as pool:
        stats = await queue.stats(pool, settings.max_attempts)
        rows = await drain_registry.list_workers(pool, stale_after_s=stale_after_s(settings))
    if args.json:
        print_json({**stats.as_dict(), "workers": [w.as_dict() for w in rows]})
    else:
        age = "-" if stats.oldest_age_s is None else f"{stats.oldest_age_s:.0f}s"
        print(
            f"pending {stats.pending} (ready {stats.ready}, blocked {stats.blocked}), "
            f"failed {stats.failed}, oldest {age}, waiting on the sidecar {stats.waiting_on_sidecar}, "
            f"leased {stats.leased} (expired {stats.expired_leases})"
        )
        alive = [w for w in rows if w.alive]
        print(f"workers: {len(alive)} alive, {len(rows) - len(alive)} stale")
        for w in rows:
            print(
                f"  {w.worker_id} [{w.role}{'' if w.alive else ', stale'}] leases {w.leases}, "
                f"{w.records_done} done, {w.records_failed} failed, {w.records_per_s:.2f} records/s, "
                f"{w.chunks_embedded} chunks embedded"
            )
    return 0


async def _queue_retry(args: argparse.Namespace) -> int:
    from index.ingest import queue

    settings = ingest_settings(args)
    async with open_pool(args) as pool:
        n = await queue.retry(
            pool,
            section_tipo=args.section,
            section_id=args.id,
            include_blocked=args.include_blocked,
            max_attempts=settings.max_attempts,
        )
    print(f"{n} records made ready again", flush=True)
    return 0


async def _queue_list(args: argparse.Namespace) -> int:
    from index.ingest import queue

    settings = ingest_settings(args)
    async with open_pool(args) as pool:
        rows = await queue.list_entries(
            pool, max_attempts=settings.max_attempts, failed_only=args.failed, limit=args.limit
        )
    if args.json:
        print_json(rows)
        return 0
    for r in rows:
        error = f"  {r['last_error']}" if r["last_error"] else ""
        print(
            f"{r['state']:8} {r['section_tipo']}/{r['section_id']} {r['operation']} "
            f"v{r['version']} attempts={r['attempts']}{error}"
        )
    return 0


def register_queue(subparsers: argparse._SubParsersAction) -> None:
    q = subparsers.add_parser("queue", help="inspect and unpark the ingestion queue")
    q_sub = q.add_subparsers(dest="queue_command", metavar="WHAT", required=True)
    p = q_sub.add_parser("stats", help="pending / ready / blocked / failed / oldest age, leases and workers")
    p.add_argument("--json", action="store_true")
    add_database_flags(p)
    p.set_defaults(run=command(_queue_stats, "mnemo"))
    p = q_sub.add_parser("retry", help="make parked (failed) records ready again")
    p.add_argument("--section", default=None, help="only this section tipo")
    p.add_argument("--id", type=int, default=None, help="only this section id")
    p.add_argument("--include-blocked", action="store_true", help="also records still backing off")
    add_database_flags(p)
    p.set_defaults(run=command(_queue_retry, "mnemo"))
    p = q_sub.add_parser("list", help="queued records with their state and last error")
    p.add_argument("--failed", action="store_true", help="only parked records")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    add_database_flags(p)
    p.set_defaults(run=command(_queue_list, "mnemo"))
