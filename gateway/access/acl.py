"""The ACL chokepoint: every candidate passes :func:`gate` before any score, count or snippet leaves.

A chunk is readable when, for the caller:

1. its section is readable (level >= 1);
2. for a group chunk (``component_tipo`` ``rag:<group>``), EVERY contributor in
   ``chunk_meta.contributors`` is readable: ``"<component>"`` is a component
   of the chunk's own section, ``"<section>/<component>"`` one of another
   section (text resolved through a relation); a missing or empty list fails
   closed (for everyone but admins, who read every component); for any other
   chunk, its own component is readable;
3. the record shares a project with the caller (:meth:`Principal.can_read_project`);
4. it lies inside the request's scope (sections, group, excluded seed), which
   the SQL legs also apply.

:func:`pushdown` expresses 1-3 as SQL filters for recall (so a filtered query
still fills ``limit``); the gate never trusts it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.access.auth import Principal
from index.store.hits import AclPushdown, ChunkHit, Scope

__all__ = ["chunk_readable", "contributors_readable", "gate", "in_scope", "pushdown"]


def pushdown(principal: Principal) -> AclPushdown | None:
    """The caller's ACL as SQL filters; None for admins (nothing to filter)."""
    if principal.admin:
        return None
    projects = None if principal.projects is None else tuple(sorted(principal.projects))
    return AclPushdown(perms=dict(principal.perms), projects=projects)


def contributors_readable(principal: Principal, section_tipo: str, contributors: Any) -> bool:
    """Every contributing component is readable; an empty or malformed list fails closed."""
    if not isinstance(contributors, list) or not contributors:
        return False
    for entry in contributors:
        if not isinstance(entry, str) or not entry:
            return False
        section, sep, component = entry.partition("/")
        if not sep:
            section, component = section_tipo, entry
        if not section or not component or "/" in component:
            return False
        if principal.component_level(section, component) < 1:
            return False
    return True


def chunk_readable(principal: Principal, chunk: ChunkHit) -> bool:
    """Section read, component/contributor read and per-record projects for one chunk."""
    if principal.admin:
        return True
    if principal.section_level(chunk.section_tipo) < 1:
        return False
    if chunk.component_tipo.startswith("rag:"):
        if not contributors_readable(principal, chunk.section_tipo, chunk.meta.get("contributors")):
            return False
    elif principal.component_level(chunk.section_tipo, chunk.component_tipo) < 1:
        return False
    return principal.can_read_project(chunk.projects)


def in_scope(scope: Scope, chunk: ChunkHit) -> bool:
    if scope.section_tipos is not None and chunk.section_tipo not in scope.section_tipos:
        return False
    if scope.group is not None and chunk.component_tipo != "rag:" + scope.group:
        return False
    if scope.view is not None and chunk.meta.get("view", "") != scope.view:
        return False
    return scope.exclude_record is None or chunk.record != tuple(scope.exclude_record)


def gate(principal: Principal, chunks: Iterable[ChunkHit], scope: Scope | None = None) -> list[ChunkHit]:
    """The chunks the caller may see, in their order (the one place results are authorized)."""
    return [c for c in chunks if (scope is None or in_scope(scope, c)) and chunk_readable(principal, c)]
