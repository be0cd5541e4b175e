"""The ``mnemo`` command line. Each package owns its subcommands and registers them here.

Registration modules import nothing heavy: torch, Ray and the database driver
load only inside the command that needs them, so ``mnemo --help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

# Owned by: schema (migrate, db), inference (sidecar), index (drain, ingest, queue),
# gateway (gateway, up, token), benchmarks (bench, eval).
COMMAND_MODULES = (
    "schema.cli",
    "inference.cli",
    "index.cli",
    "gateway.commands",
    "benchmarks.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mnemo",
        description="Mnemo: a semantic-retrieval layer for heritage archives.",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real import error inside the module: surface it
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    return int(args.run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
