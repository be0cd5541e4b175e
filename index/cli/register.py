"""Ingestion commands: ``mnemo drain``, ``mnemo ingest``, ``mnemo backfill``, ``mnemo queue``,
``mnemo sections``, ``mnemo reconcile``.

Each command group registers itself in its own module (``index/cli/*.py``, what they share in
:mod:`index.cli.common`); a new group is one more module and one more line in
:data:`COMMAND_GROUPS`. Registration stays light: the database driver, the sidecar client and the
indexer load only inside the command that runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from index.cli.backfill import register_backfill
from index.cli.drain import register_drain
from index.cli.ingest import register_ingest
from index.cli.lexical import register as register_lexical
from index.cli.queue import register_queue
from index.cli.sections import register_reconcile, register_sections
from index.cli.vectors import register as register_vectors

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
