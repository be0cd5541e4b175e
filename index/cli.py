"""Ingestion commands: ``mnemo drain``, ``mnemo ingest``, ``mnemo backfill``, ``mnemo queue``,
``mnemo sections``, ``mnemo reconcile``.

Each command group registers itself in its own module (``index/cli_*.py``, what they share in
:mod:`index.cli_common`); a new group is one more module and one more line in
:data:`COMMAND_GROUPS`. Registration stays light: the database driver, the sidecar client and the
indexer load only inside the command that runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from .cli_backfill import register_backfill
from .cli_drain import register_drain
from .cli_ingest import register_ingest
from .cli_queue import register_queue
from .cli_sections import register_reconcile, register_sections
from .lexical_cli import register as register_lexical
from .vector_cli import register as register_vectors

# In the order `mnemo --help` lists them.
COMMAND_GROUPS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    register_drain,
    register_ingest,
    register_backfill,
    register_queue,
    register_sections,
    register_reconcile,
    register_lexical,  # mnemo lexical: the Tantivy indexes' one writer, rebuild, status
    register_vectors,  # mnemo vectors: the CPU vector snapshots' one writer, rebuild, status
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """The ``mnemo.commands`` entry point of this package: every ingestion command group."""
    for register_group in COMMAND_GROUPS:
        register_group(subparsers)
