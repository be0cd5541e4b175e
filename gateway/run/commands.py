"""The gateway's subcommands: ``mnemo gateway``, ``mnemo token``, ``mnemo up``, ``mnemo mcp``,
``mnemo budgets`` (``mnemo eval`` is benchmarks').

Registration stays light: the aiohttp app, the database driver and the sidecar
client are imported inside the handlers.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from inference.eventloop import command
from schema.cli import add_database_flags, database_settings
from schema.settings import SettingsError, configured


def _parse_perm(raw: str) -> tuple[str, int]:
    from gateway.access.auth import ADMIN_LEVEL
    from index.store.validation import FieldError, parse_id

    key, sep, level = raw.partition("=")
    try:
        if not sep or not key:
            raise FieldError("level", "missing")
        return key.strip(), parse_id(level.strip(), field="level", maximum=ADMIN_LEVEL)
    except FieldError as exc:
        raise argparse.ArgumentTypeError(
            f"--perm {raw!r}: use TIPO=LEVEL or SECTION/COMPONENT=LEVEL, LEVEL in 0..{ADMIN_LEVEL}"
        ) from exc


def _parse_projects(raw: str) -> list[int] | None:
    from index.store.validation import PROJECT_ID_MAX, FieldError, parse_id

    if raw.strip() == "*":
        return None
    try:
        return [
            parse_id(p.strip(), field="project", maximum=PROJECT_ID_MAX) for p in raw.split(",") if p.strip()
        ]
    except FieldError as exc:
        raise argparse.ArgumentTypeError(f"--projects {raw!r}: a comma-separated list of ids, or *") from exc


def _token(args: argparse.Namespace) -> int:
    from gateway.access.auth import issue_token
    from gateway.base.settings import GatewaySettings
    from schema.settings import load_settings

    try:
        # auth="off": the secret is optional here (--private-key signs instead); its length
        # is still checked when one is set.
        settings = load_settings(GatewaySettings, auth="off")
    except SettingsError as exc:
        print(f"mnemo token: {exc}", file=sys.stderr)
        return 2
    private_key = Path(args.private_key).read_text() if args.private_key else None
    secret = None if private_key else settings.jwt_secret
    if private_key is None and not secret:
        print("mnemo token: set RAG_JWT_SECRET (HS256) or pass --private-key (RS256)", file=sys.stderr)
        return 2
    token = issue_token(
        secret=secret,
        private_key_pem=private_key,
        sub=args.sub,
        projects=args.projects,
        perms=dict(args.perm),
        admin=args.admin,
        grants=args.grant,
        ttl=args.ttl,
        audience=settings.jwt_audience or None,
        issuer=settings.jwt_issuer or None,
    )
    print(token)
    return 0


def _gateway_settings(args: argparse.Namespace, **overrides: Any):  # -> GatewaySettings
    from gateway.base.settings import load_gateway_settings
    from index.settings import SidecarClientSettings
    from schema.settings import load_settings

    sidecar = load_settings(SidecarClientSettings, sidecar_url=getattr(args, "sidecar_url", None))
    return load_gateway_settings(
        database=database_settings(args), sidecar=sidecar, host=args.host, port=args.port, **overrides
    )


async def _serve_gateway(args: argparse.Namespace) -> int:
    from gateway.base.logs import configure_logging
    from gateway.run.processes import ListenError, WorkerStartError, serve_workers, worker_count
    from gateway.web.app import create_app, serve

    try:
        settings = _gateway_settings(args, workers=args.workers)
    except SettingsError as exc:
        print(f"mnemo gateway: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format, args.log_level)
    count = worker_count(settings.workers)
    if count == 1:  # the command's own process serves: no supervisor, no metric files
        app = create_app(settings)
        await serve(app, settings.host, settings.port, shutdown_timeout=settings.shutdown_timeout)
        return 0
    try:
        await serve_workers(settings, count, args.log_level)
    except (ListenError, WorkerStartError) as exc:
        print(f"mnemo gateway: {exc}", file=sys.stderr)
        return 1
    return 0


async def _up(args: argparse.Namespace) -> int:
    from gateway.base.logs import configure_logging
    from gateway.run.processes import ListenError, WorkerStartError
    from gateway.run.up import FollowerStartError, SidecarStartError, jwt_secret, run_up

    try:
        # The secret may come from <data dir>/jwt_secret, so it is not required up front.
        settings = _gateway_settings(args, auth="off")
        secret = jwt_secret(settings.jwt_secret, settings.database.data_dir)
        settings = dataclasses.replace(settings, auth="jwt", jwt_secret=secret)
        settings.validate()
    except SettingsError as exc:
        print(f"mnemo up: {exc}", file=sys.stderr)
        return 2
    configure_logging("text", "WARNING")  # the console is for the printed guide; logs stay quiet
    print("Mnemo is starting:", flush=True)
    try:
        return await run_up(
            args, settings, own_sidecar=not (args.sidecar_url or configured("RAG_SIDECAR_URL"))
        )
    except (SidecarStartError, FollowerStartError, ListenError, WorkerStartError) as exc:
        print(f"mnemo up: {exc}", file=sys.stderr, flush=True)
        return 1


async def _mcp(args: argparse.Namespace) -> int:
    from gateway.base.settings import McpSettings, load_gateway_settings
    from gateway.web.mcp import McpStartupError, serve_mcp
    from index.settings import SidecarClientSettings
    from schema.settings import load_settings

    try:
        sidecar = load_settings(SidecarClientSettings, sidecar_url=args.sidecar_url)
        settings = load_gateway_settings(database=database_settings(args), sidecar=sidecar)
        mcp = load_settings(McpSettings, host=args.host, port=args.port)
    except SettingsError as exc:
        print(f"mnemo mcp: {exc}", file=sys.stderr)
        return 2
    try:
        await serve_mcp(settings, mcp.token, args.transport, mcp.host, mcp.port)
    except McpStartupError as exc:
        print(f"mnemo mcp: {exc}", file=sys.stderr)
        return 2
    return 0


def _settings_docs(args: argparse.Namespace) -> int:
    """Write the configuration reference and the sample env file from the settings catalog, or
    (``--check``) say which committed ones are out of date."""
    from gateway.base.settings_catalog import DOCS_DIR, REGENERATE, stale_files, write_files

    docs_dir = args.docs_dir or DOCS_DIR
    if args.check:
        stale = stale_files(docs_dir)
        for path in stale:
            print(
                f"mnemo settings docs: {path} differs from the settings catalog: run `{REGENERATE}`",
                file=sys.stderr,
            )
        return 1 if stale else 0
    for path in write_files(docs_dir):
        print(f"wrote {path}")
    return 0


async def _budgets(args: argparse.Namespace) -> int:
    """``mnemo budgets show|set|reset``: the ledger's current window and per-principal limits."""
    from gateway.base.budget_settings import BudgetSettings
    from gateway.base.errors import ApiError
    from gateway.budgets import admin as budget_admin
    from gateway.budgets.ledger import Ledger
    from schema.database import open_database
    from schema.settings import load_settings

    try:
        settings = load_settings(BudgetSettings)
    except SettingsError as exc:
        print(f"mnemo budgets: {exc}", file=sys.stderr)
        return 2
    async with open_database(database_settings(args)) as db:
        ledger = Ledger(db.pool, settings)
        try:
            if args.budgets_command == "set":
                if args.default:
                    had = await budget_admin.clear_limit(ledger, args.principal, args.meter)
                    print(f"{args.principal} {args.meter}: the role's limit" + ("" if had else " (already)"))
                else:
                    await budget_admin.set_limit(ledger, args.principal, args.meter, args.limit)
                    shown = "unlimited" if args.limit is None else str(args.limit)
                    print(f"{args.principal} {args.meter}: {shown} per window")
                return 0
            if args.budgets_command == "reset":
                rows = await budget_admin.reset(ledger, args.principal, args.meter)
                print(f"{args.principal}: {rows} meter(s) of the current window reset")
                return 0
            rows = await budget_admin.show(ledger, args.principal)
        except ApiError as exc:
            print(f"mnemo budgets: {exc.message}", file=sys.stderr)
            return 2
    if args.json:
        import json

        print(json.dumps([r.as_dict() for r in rows], indent=2))
        return 0
    print(f"window of {settings.window} s (UTC), limits RAG_BUDGET_LIMITS={settings.limits!r}")
    print(f"{'principal':<24} {'meter':<22} {'role':<6} {'used':>10} {'limit':>12}")
    for r in rows:
        limit = "unlimited" if r.limit is None else str(r.limit)
        print(
            f"{r.principal:<24} {r.meter:<22} {r.role:<6} {r.used:>10} {limit + ('*' if r.override else ''):>12}"
        )
    print(
        "(* the principal's own limit, set with mnemo budgets set)" if any(r.override for r in rows) else ""
    )
    return 0


def _add_budgets_parser(subparsers: argparse._SubParsersAction) -> None:
    from gateway.base.budget_settings import METERS

    p = subparsers.add_parser("budgets", help="show, set and reset per-principal budgets (the ledger)")
    sub = p.add_subparsers(dest="budgets_command", required=True)
    show = sub.add_parser("show", help="every principal's use of the current window, and the overrides")
    show.add_argument("--principal", default=None, help="one principal (the token's sub)")
    show.add_argument("--json", action="store_true", help="print JSON rows")
    set_ = sub.add_parser("set", help="give one principal its own limit on one meter")
    set_.add_argument("--principal", required=True, help="the token's sub")
    set_.add_argument("--meter", required=True, choices=METERS)
    limit = set_.add_mutually_exclusive_group(required=True)
    limit.add_argument("--limit", type=int, help="units per window (>= 0)")
    limit.add_argument("--unlimited", action="store_true", help="no limit (still counted)")
    limit.add_argument("--default", action="store_true", help="drop the override: the role's limit applies")
    reset = sub.add_parser("reset", help="zero one principal's use of the current window")
    reset.add_argument("--principal", required=True, help="the token's sub")
    reset.add_argument("--meter", choices=METERS, default=None, help="one meter (default: all)")
    for q in (show, set_, reset):
        add_database_flags(q)
    p.set_defaults(run=command(_budgets, "mnemo budgets"))


def _add_gateway_flags(p: argparse.ArgumentParser) -> None:
    add_database_flags(p)
    p.add_argument("--host", default=None, help="listen address (env RAG_GATEWAY_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="listen port (env RAG_GATEWAY_PORT, default 8080)")
    p.add_argument("--sidecar-url", default=None, help="inference sidecar URL (env RAG_SIDECAR_URL)")


def _add_workers_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="gateway processes on the one port, 0 = one per core (env RAG_GATEWAY_WORKERS, default 0)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "up", help="start the database, sidecar and gateway, load the demo collection, print tokens"
    )
    _add_gateway_flags(p)
    p.set_defaults(run=command(_up, "mnemo up"))

    p = subparsers.add_parser("gateway", help="serve the dd_rag_api gateway (POST /api/v1/json)")
    _add_gateway_flags(p)
    _add_workers_flag(p)
    p.set_defaults(run=command(_serve_gateway, "mnemo gateway"))

    p = subparsers.add_parser(
        "mcp",
        help="serve the read actions as MCP tools (stdio, or streamable HTTP), as the RAG_MCP_TOKEN principal",
    )
    add_database_flags(p)
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio", help="default stdio")
    p.add_argument("--host", default=None, help="HTTP listen address (env RAG_MCP_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="HTTP listen port (env RAG_MCP_PORT, default 8090)")
    p.add_argument("--sidecar-url", default=None, help="inference sidecar URL (env RAG_SIDECAR_URL)")
    p.set_defaults(run=command(_mcp, "mnemo mcp"))

    p = subparsers.add_parser(
        "token",
        help="print a development JWT (HS256 with RAG_JWT_SECRET, or RS256 with --private-key)",
    )
    p.add_argument("--sub", required=True, help="subject (user id)")
    p.add_argument(
        "--projects", type=_parse_projects, default=[], help="comma-separated project ids, or * for all"
    )
    p.add_argument(
        "--perm",
        type=_parse_perm,
        action="append",
        default=[],
        help="TIPO=LEVEL or SECTION/COMPONENT=LEVEL (repeatable), e.g. --perm oh1=1 --perm oh1/oh23=0",
    )
    p.add_argument("--admin", action="store_true", help="an admin token (reads everything)")
    p.add_argument(
        "--grant",
        choices=("ask",),
        action="append",
        default=[],
        help="a capability beyond reading (repeatable): ask lets the token call ask (RAG_ASK_GRANT)",
    )
    p.add_argument("--ttl", type=float, default=3600.0, help="seconds until expiry (default 3600)")
    p.add_argument("--private-key", default=None, help="PEM private key file: sign RS256 instead of HS256")
    p.set_defaults(run=_token)

    p = subparsers.add_parser("settings", help="the settings catalog: every RAG_* variable Mnemo reads")
    actions = p.add_subparsers(dest="settings_action", metavar="ACTION", required=True)
    docs = actions.add_parser(
        "docs", help="write docs/configuration.md and docs/mnemo.env.example from the settings catalog"
    )
    docs.add_argument(
        "--docs-dir",
        type=Path,
        default=None,
        help="where to write them (default: docs, from the repository root)",
    )
    docs.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 naming any file out of date"
    )
    docs.set_defaults(run=_settings_docs)

    _add_budgets_parser(subparsers)
