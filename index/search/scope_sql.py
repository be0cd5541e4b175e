"""The scope and ACL push-down as SQL: one WHERE builder every leg and cache shares.

A :class:`~index.store.hits.Scope` (sections, group facet, view, excluded record, ACL) becomes WHERE
clauses over the embeddings alias ``e`` with positional parameters. Values are always bound
parameters; identifiers come from ``rag_models``. The FAISS cache and the Tantivy lexical engine
(through :func:`index.search.access_classes.permitted_classes`) build their scope bitmaps from
:func:`scope_where`, so a scope means the same rows everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from index.store.hits import AclPushdown, Scope

__all__ = ["WhereSql", "checked_modality", "scope_where"]


class WhereSql:
    """Accumulates WHERE clauses with positional parameters."""

    def __init__(self, params: Sequence[Any] = (), modality: str = "text") -> None:
        self.params: list[Any] = list(params)
        self.where: list[str] = [f"e.modality = {self.bind(checked_modality(modality))}"]

    def bind(self, value: Any) -> str:
        self.params.append(value)
        return f"${len(self.params)}"

    def add(self, clause: str) -> None:
        self.where.append(clause)

    def apply_scope(self, scope: Scope) -> None:
        if scope.section_tipos is not None:
            self.add(f"e.section_tipo = ANY({self.bind(list(scope.section_tipos))}::text[])")
        if scope.group is not None:
            self.add(f"e.component_tipo = {self.bind('rag:' + scope.group)}")
        if scope.view is not None:
            self.add(f"e.view = {self.bind(scope.view)}")
        if scope.exclude_record is not None:
            tipo, sid = scope.exclude_record
            self.add(f"NOT (e.section_tipo = {self.bind(tipo)} AND e.section_id = {self.bind(sid)})")
        if scope.acl is not None:
            self._apply_acl(scope.acl)

    def _apply_acl(self, acl: AclPushdown) -> None:
        readable = sorted(k for k, v in acl.perms.items() if "/" not in k and v >= 1)
        allowed = sorted(k for k, v in acl.perms.items() if "/" in k and v >= 1)
        denied = sorted(k for k, v in acl.perms.items() if "/" in k and v < 1)
        sections = self.bind(readable)
        self.add(f"e.section_tipo = ANY({sections}::text[])")
        if acl.projects is not None:
            self.add(f"e.projects && {self.bind(list(acl.projects))}::int[]")
        # Every component the chunk needs (acl_pairs, "<section>/<component>", with their sections in
        # acl_sections; NULL when malformed: see migration 0013) has level >= 1: its explicit entry,
        # else its section's. No pair explicitly denied, and each pair's section readable (the common
        # case, one array operator) or the pair explicitly allowed.
        self.add("e.acl_pairs IS NOT NULL")
        if denied:
            self.add(f"NOT (e.acl_pairs && {self.bind(denied)}::text[])")
        explicit = self.bind(allowed)
        self.add(
            f"""(e.acl_sections <@ {sections}::text[]
                 OR NOT EXISTS (SELECT 1 FROM unnest(e.acl_pairs, e.acl_sections) AS u(pair, section)
                                WHERE NOT u.pair = ANY({explicit}::text[])
                                  AND NOT u.section = ANY({sections}::text[])))"""
        )

    @property
    def where_sql(self) -> str:
        return " AND ".join(f"({w})" for w in self.where)


def checked_modality(modality: str) -> str:
    """``modality`` when it is one the store holds (``text``, ``image``); a ValueError otherwise."""
    if modality not in ("text", "image"):
        raise ValueError(f"modality must be text or image, not {modality!r}")
    return modality


def scope_where(scope: Scope, params: Sequence[Any] = ()) -> tuple[str, list[Any]]:
    """The WHERE clause (alias ``e``) of a text search in ``scope``, with its parameters after ``params``.

    The same push-down every leg applies; the FAISS cache builds its scope bitmaps from it.
    """
    sql = WhereSql(params)
    sql.apply_scope(scope)
    return sql.where_sql, sql.params
