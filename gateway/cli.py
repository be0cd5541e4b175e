"""The ``mnemo`` command line. Each package owns its subcommands and registers them through the
``mnemo.commands`` entry-point group (``pyproject.toml``); this root imports none of them.

Registration modules import nothing heavy: torch, Ray and the database driver
load only inside the command that needs them, so ``mnemo --help`` is instant.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import EntryPoint, entry_points

COMMAND_GROUP = "mnemo.commands"
# The order packages appear in `mnemo --help`: the dependency order, bottom up.
_HELP_ORDER = ("schema", "inference", "index", "gateway", "benchmarks")


class CommandsNotInstalled(RuntimeError):
    """The ``mnemo.commands`` entry points are missing: the package metadata is stale or absent."""


def command_entry_points() -> list[EntryPoint]:
    """The installed ``mnemo.commands`` entry points, in help order (unknown names last, by name)."""
    found = list(entry_points(group=COMMAND_GROUP))
    if not found:
        raise CommandsNotInstalled(
            f"no {COMMAND_GROUP!r} entry points are installed: reinstall Mnemo "
            "(`make install`, or `pip install -e .` in the repository)"
        )
    rank = {name: i for i, name in enumerate(_HELP_ORDER)}
    return sorted(found, key=lambda ep: (rank.get(ep.name, len(rank)), ep.name))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mnemo",
        description="Mnemo: a semantic-retrieval layer for heritage archives.",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for entry_point in command_entry_points():
        entry_point.load()(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
    except CommandsNotInstalled as exc:
        print(f"mnemo: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    return int(args.run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
