"""Section descriptors: which embed groups a section has and how each is chunked.

A descriptor is shaped like the archive's ``rag`` object on a section::

    {"embed": [{"id": "card", "contributors": ["rsc140", "dd810/dd812"],
                "mode": null, "chunk": {"max_tokens": 450, "min_tokens": 120}}],
     "context": {"images": [...], "metadata": {...}, "compare_scope": [...]},
     "system_prompt": null, "egress": {"allow_external": false}}

Only ``embed`` with each group's ``id`` and non-empty ``contributors`` is
required. ``contributors`` names the components whose text the group document
holds (the ACL checks each one); the archive's own ``ddo_map`` is accepted in
its place and contributors are derived from it. Unknown keys are kept as they
are, so a newer archive can send more than this version reads.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import asyncpg
from jsonschema import Draft202012Validator

from index.store.validation import (
    CONTRIBUTOR_PATTERN,
    GROUP_ID_PATTERN,
    TIPO_PATTERN,
    FieldError,
    first_error,
)

__all__ = [
    "CHUNK_MODES",
    "DescriptorError",
    "SectionStore",
    "validate_descriptor",
    "validate_section_tipo",
]

CHUNK_MODES = ("short", "transcription", "long_document")
ROLE_KINDS = ("categorical", "date")
# A role given as a bare tipo is categorical, except these names, which the archive
# uses for date ranges (its ``period``); ``{"tipo", "kind"}`` says it explicitly.
DATE_ROLE_NAMES = frozenset({"period", "date", "dating", "chronology"})
VIEW_PATTERN = r"^([A-Za-z0-9][A-Za-z0-9_.-]{0,63})?\Z"  # "" = no view
DEFAULT_MAX_TOKENS = 450
DEFAULT_MIN_TOKENS = 120


class DescriptorError(FieldError):
    """A section descriptor that cannot be used; ``field`` names the part at fault."""


_TIPO = {"type": "string", "pattern": TIPO_PATTERN}

_DDO = {
    "type": "object",
    "required": ["tipo"],
    "properties": {"tipo": _TIPO, "section_tipo": {"type": "string"}},
}

_GROUP = {
    "type": "object",
    "required": ["id"],
    "properties": {
        "id": {"type": "string", "pattern": GROUP_ID_PATTERN},
        "contributors": {
            "type": "array",
            "minItems": 1,
            "maxItems": 256,
            "items": {"type": "string", "pattern": CONTRIBUTOR_PATTERN},
        },
        "ddo_map": {"type": "array", "minItems": 1, "items": _DDO},
        "mode": {"enum": [*CHUNK_MODES, None]},
        "chunk": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "max_tokens": {"type": "integer", "minimum": 16, "maximum": 8192},
                "min_tokens": {"type": "integer", "minimum": 0, "maximum": 8192},
            },
        },
    },
    "anyOf": [{"required": ["contributors"]}, {"required": ["ddo_map"]}],
}

# The archive's image context: which image components carry the visual signal (and
# which face each shows), which components hold the metadata roles, and which
# sections an object is compared with by default.
_ROLE = {
    "anyOf": [
        _TIPO,
        {
            "type": "object",
            "required": ["tipo"],
            "additionalProperties": False,
            "properties": {"tipo": _TIPO, "kind": {"enum": list(ROLE_KINDS)}},
        },
    ]
}

_CONTEXT = {
    "type": "object",
    "properties": {
        "images": {
            "type": "array",
            "maxItems": 64,
            "items": {
                "type": "object",
                "required": ["tipo"],
                "properties": {"tipo": _TIPO, "view": {"type": "string", "pattern": VIEW_PATTERN}},
            },
        },
        "metadata": {
            "type": "object",
            "maxProperties": 64,
            "propertyNames": {"pattern": GROUP_ID_PATTERN},
            "additionalProperties": _ROLE,
        },
        "compare_scope": {"type": "array", "maxItems": 64, "items": _TIPO},
    },
}

DESCRIPTOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["embed"],
    "properties": {
        "embed": {"type": "array", "minItems": 1, "maxItems": 64, "items": _GROUP},
        "context": _CONTEXT,
        "system_prompt": {"type": ["string", "null"], "maxLength": 20000},
        "egress": {
            "type": "object",
            "properties": {"allow_external": {"type": "boolean"}},
        },
        "strategy": {"type": "string"},
        # Fusion tuned for this section (`mnemo eval --tune --apply SECTION`); the gateway uses it.
        "retrieval": {
            "type": "object",
            "properties": {
                "fusion": {"type": "string", "maxLength": 32},
                "weights": {
                    "type": "object",
                    "maxProperties": 16,
                    "additionalProperties": {"type": "number", "minimum": 0},
                },
            },
        },
    },
}

_VALIDATOR = Draft202012Validator(DESCRIPTOR_SCHEMA)
_TIPO_VALIDATOR = Draft202012Validator(_TIPO)


def _contributors_from_ddo_map(ddo_map: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for ddo in ddo_map:
        owner = ddo.get("section_tipo")
        name = ddo["tipo"] if owner in (None, "", "self") else f"{owner}/{ddo['tipo']}"
        if name not in out:
            out.append(name)
    return out


def validate_descriptor(obj: Any) -> dict[str, Any]:
    """Check a descriptor and return it normalized, with every default filled in.

    Raises :class:`DescriptorError` naming the first field at fault.
    """
    error = first_error(_VALIDATOR, obj)
    if error is not None:
        raise DescriptorError(error.field, error.message)
    out = copy.deepcopy(obj)
    seen: set[str] = set()
    groups = []
    for i, group in enumerate(out["embed"]):
        if group["id"] in seen:
            raise DescriptorError(f"embed[{i}].id", f"duplicate group id {group['id']!r}")
        seen.add(group["id"])
        chunk = group.get("chunk") or {}
        max_tokens = chunk.get("max_tokens", DEFAULT_MAX_TOKENS)
        min_tokens = chunk.get("min_tokens", min(DEFAULT_MIN_TOKENS, max_tokens // 2))
        if min_tokens > max_tokens:
            raise DescriptorError(
                f"embed[{i}].chunk.min_tokens", f"{min_tokens} is above max_tokens {max_tokens}"
            )
        contributors = group.get("contributors") or _contributors_from_ddo_map(group["ddo_map"])
        groups.append(
            {
                **group,
                "id": group["id"],
                "contributors": list(contributors),
                "mode": group.get("mode"),
                "chunk": {"max_tokens": max_tokens, "min_tokens": min_tokens},
            }
        )
    out["embed"] = groups
    out["context"] = _normalize_context(out.get("context") or {})
    out["system_prompt"] = out.get("system_prompt")
    egress = out.get("egress") or {}
    out["egress"] = {**egress, "allow_external": egress.get("allow_external", False)}
    return out


def _normalize_context(context: dict[str, Any]) -> dict[str, Any]:
    """Fill the context's defaults and spell every role as ``{"tipo", "kind"}``.

    Checks what the schema cannot: an image component declared twice, and one
    component holding two roles (a value would then mean two things).
    """
    images = []
    seen: set[str] = set()
    for i, image in enumerate(context.get("images", [])):
        if image["tipo"] in seen:
            raise DescriptorError(f"context.images[{i}].tipo", f"image component {image['tipo']!r} twice")
        seen.add(image["tipo"])
        images.append({**image, "view": image.get("view", "")})
    roles: dict[str, dict[str, str]] = {}
    owners: dict[str, str] = {}
    for role, raw in context.get("metadata", {}).items():
        spec = {"tipo": raw} if isinstance(raw, str) else dict(raw)
        kind = spec.get("kind") or ("date" if role in DATE_ROLE_NAMES else "categorical")
        if spec["tipo"] in owners:
            raise DescriptorError(
                f"context.metadata.{role}",
                f"component {spec['tipo']!r} already holds role {owners[spec['tipo']]!r}",
            )
        owners[spec["tipo"]] = role
        roles[role] = {"tipo": spec["tipo"], "kind": kind}
    return {
        **context,
        "images": images,
        "metadata": roles,
        "compare_scope": list(dict.fromkeys(context.get("compare_scope", []))),
    }


def validate_section_tipo(section_tipo: str) -> str:
    """A section tipo from a URL or a record, checked against the tipo grammar."""
    error = first_error(_TIPO_VALIDATOR, section_tipo)
    if error is not None:
        raise DescriptorError("section_tipo", error.message)
    return section_tipo


class SectionStore:
    """Descriptors in ``rag_sections``, keyed by section tipo."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def get(self, section_tipo: str) -> dict[str, Any] | None:
        """The normalized descriptor, or None when the section has none."""
        raw = await self._pool.fetchval(
            "SELECT descriptor FROM rag_sections WHERE section_tipo = $1", section_tipo
        )
        return None if raw is None else json.loads(raw)

    async def get_many(self, section_tipos: list[str]) -> dict[str, dict[str, Any]]:
        """Descriptors of the given sections that have one (one query)."""
        rows = await self._pool.fetch(
            "SELECT section_tipo, descriptor FROM rag_sections WHERE section_tipo = ANY($1::text[])",
            list(section_tipos),
        )
        return {r["section_tipo"]: json.loads(r["descriptor"]) for r in rows}

    async def put(self, section_tipo: str, descriptor: Any) -> dict[str, Any]:
        """Validate, normalize and store a descriptor; returns what was stored."""
        validate_section_tipo(section_tipo)
        normalized = validate_descriptor(descriptor)
        await self._pool.execute(
            """
            INSERT INTO rag_sections (section_tipo, descriptor) VALUES ($1, $2::jsonb)
            ON CONFLICT (section_tipo)
            DO UPDATE SET descriptor = EXCLUDED.descriptor, updated_at = now()
            """,
            section_tipo,
            json.dumps(normalized),
        )
        return normalized

    async def group_ids(self, section_tipo: str) -> list[str]:
        """The section's embed-group ids in declaration order ([] without a descriptor)."""
        descriptor = await self.get(section_tipo)
        return [] if descriptor is None else [g["id"] for g in descriptor["embed"]]

    async def list(self) -> list[str]:
        """Every section tipo with a descriptor."""
        rows = await self._pool.fetch("SELECT section_tipo FROM rag_sections ORDER BY section_tipo")
        return [r["section_tipo"] for r in rows]
