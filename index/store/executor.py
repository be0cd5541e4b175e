"""What a statement runs on: a connection, or a pool (which takes one of its connections for it)."""

from __future__ import annotations

import asyncpg

__all__ = ["Executor"]

Executor = asyncpg.Connection | asyncpg.Pool
