"""Projects that give a benchmark's ACL scopes a known visibility (the share of records a researcher
holding one project can read), one definition for every store a benchmark builds."""

from __future__ import annotations

__all__ = ["VISIBILITY_PROJECT", "projects_of"]

VISIBILITY_PROJECT = {"100%": 1, "10%": 2, "1%": 3}  # a researcher holding it sees that share


def projects_of(record: int) -> list[int]:
    """Every record is in project 1, every 10th also in project 2, every 100th also in project 3."""
    return [1] + [2] * (record % 10 == 0) + [3] * (record % 100 == 0)
