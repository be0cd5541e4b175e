"""Access classes: what the scope and ACL push-down reads of a chunk besides its key.

A chunk's access class is its section, component, view, projects and the ACL arrays of migration
0013. A partition holds a handful of distinct classes however many chunks it has, so an index beside
the store (the on-disk :mod:`index.lexical.engine`) evaluates a scope's SQL filter once per class instead of
once per chunk, and selects only chunks whose class passes: ``limit`` is never starved by a
post-filter.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import asyncpg

from index.search.scope_sql import scope_where
from index.store.change_feed import RowKey
from index.store.hits import Scope

__all__ = ["LEXICAL_ROW_COLUMNS", "AccessClass", "access_class", "permitted_classes"]

# The columns (alias e) a lexical index reads of a row, after its key: the BM25 length, the access
# class, and the tsvector's lexemes with their position counts (the SQL leg's tf), in one order.
LEXICAL_ROW_COLUMNS = """e.lexical_length, e.projects, e.acl_pairs, e.acl_sections,
       ARRAY(SELECT u.lexeme FROM unnest(e.lexical) u) AS lexemes,
       ARRAY(SELECT coalesce(array_length(u.positions, 1), 1) FROM unnest(e.lexical) u) AS tfs"""

AccessClass = tuple[str, str, str, tuple[int, ...], tuple[str, ...] | None, tuple[str, ...] | None]


def access_class(key: RowKey, row: asyncpg.Record) -> AccessClass:
    """The class of the row with ``key`` (read with ``projects``, ``acl_pairs``, ``acl_sections``)."""
    return (
        key[0],
        key[2],
        key[4],
        tuple(row["projects"] or ()),
        None if row["acl_pairs"] is None else tuple(row["acl_pairs"]),
        None if row["acl_sections"] is None else tuple(row["acl_sections"]),
    )


async def permitted_classes(
    conn: asyncpg.Connection, classes: Sequence[AccessClass], scope: Scope, first: int = 0
) -> list[int]:
    """The positions (numbered from ``first``) of the ``classes`` that ``scope`` permits: the legs'
    own WHERE clause (:func:`index.search.scope_sql.scope_where`), run over the classes instead of the chunks."""
    rows = [
        {
            "id": i,
            "modality": "text",
            "section_tipo": c[0],
            "component_tipo": c[1],
            "view": c[2],
            "projects": list(c[3]),
            "acl_pairs": None if c[4] is None else list(c[4]),
            "acl_sections": None if c[5] is None else list(c[5]),
        }
        for i, c in enumerate(classes, start=first)
    ]
    where, params = scope_where(scope, [json.dumps(rows)])
    ids = await conn.fetch(
        f"""SELECT e.id FROM jsonb_to_recordset($1::jsonb) AS e(
                id int, modality text, section_tipo text, component_tipo text, view text,
                projects int[], acl_pairs text[], acl_sections text[])
            WHERE {where}""",
        *params,
    )
    return [r["id"] for r in ids]
