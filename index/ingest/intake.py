"""Record intake: validation and enqueueing shared by `POST /v1/records` and the JSONL import.

A record (the archive's resolved document for one section record)::

    {"section_tipo": "oh1", "section_id": 42, "projects": [1, 3],
     "title": "Interview with ..." | {"lg-spa": "...", "lg-eng": "..."},
     "groups": {"summary": {"lg-spa": "text", "lg-eng": "text"}, ...},
     "contributors": {"summary": ["oh23", "rsc197/rsc85"]},      # optional override
     "images": [{"tipo": "numd5", "view": "obverse", ...}],        # optional, image layer
     "metadata": {"typology": "...", "period": {"from": 1, "to": 2}}}   # optional roles

Every path validates the same way (a JSON schema, then the section's
descriptor: the section must have one and declare every group) and enqueues
in one statement, so a batch is accepted or rejected whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

import asyncpg
from jsonschema import Draft202012Validator

from index.ingest import queue
from index.ingest.images import ImageRejected, MediaNotAllowed, check_source
from index.media_urls import check_client_link
from index.settings import MediaSettings
from index.store.sections import VIEW_PATTERN, SectionStore, validate_section_tipo
from index.store.validation import (
    CONTRIBUTOR_PATTERN,
    GROUP_ID_PATTERN,
    LANG_PATTERN,
    TIPO_PATTERN,
    FieldError,
    first_error,
)

__all__ = [
    "RECORD_SCHEMA",
    "IntakeCode",
    "IntakeError",
    "as_record_list",
    "enqueue_delete",
    "enqueue_records",
    "enqueue_valid",
    "validate_record",
    "validate_records",
]

MAX_TEXT_CHARS = 2_000_000
VALIDATE_ON_LOOP_MAX = 32  # larger batches are validated in a worker thread
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1


class IntakeCode(StrEnum):
    """Why a record is rejected: the archive's vocabulary for it, owned here because both intake
    paths (``POST /v1/records`` and ``mnemo ingest records``) validate with this module and answer
    the same codes. The gateway's error table maps each to its HTTP status; a test holds the two
    in step (``tests/test_ingest_intake.py``)."""

    INVALID_RECORD = "request.invalid_record"
    TOO_MANY_RECORDS = "request.too_many_records"
    UNKNOWN_SECTION = "request.unknown_section"
    UNKNOWN_GROUP = "request.unknown_group"
    UNKNOWN_IMAGE_COMPONENT = "request.unknown_image_component"
    UNKNOWN_METADATA_COMPONENT = "request.unknown_metadata_component"
    MEDIA_NOT_ALLOWED = "request.media_not_allowed"
    INVALID_IMAGE = "request.invalid_image"


class IntakeError(FieldError):
    """A rejected record: a stable ``code`` and the field at fault."""

    def __init__(self, code: IntakeCode, field: str, message: str) -> None:
        super().__init__(field, message)
        self.code = IntakeCode(code)


_CONTRIBUTORS = {
    "type": "array",
    "minItems": 1,
    "maxItems": 256,
    "items": {"type": "string", "pattern": CONTRIBUTOR_PATTERN},
}

# A record image: its component, its face, and exactly one source of bytes (checked in code,
# so the error names the field rather than a schema branch).
_IMAGE = {
    "type": "object",
    "required": ["tipo"],
    "additionalProperties": False,
    "properties": {
        "tipo": {"type": "string", "pattern": TIPO_PATTERN},
        "view": {"type": "string", "pattern": VIEW_PATTERN},
        "index": {"type": "integer", "minimum": 0, "maximum": 10_000},
        "data": {"type": "string", "minLength": 1},
        "path": {"type": "string", "minLength": 1, "maxLength": 4096},
        "url": {"type": "string", "minLength": 1, "maxLength": 4096},
        "thumb_url": {"type": "string", "minLength": 1, "maxLength": 4096},
    },
}

_SCALAR = {"type": ["string", "number"], "maxLength": 4000}
_DATE_RANGE = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "properties": {"from": {"type": "number"}, "to": {"type": "number"}},
}
# A role value: a term, a list of terms, or a date range (years) {"from", "to"}.
_ROLE_VALUE = {"anyOf": [_SCALAR, _DATE_RANGE, {"type": "array", "maxItems": 64, "items": _SCALAR}]}

RECORD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["section_tipo", "section_id", "projects", "groups"],
    "additionalProperties": False,
    "properties": {
        "section_tipo": {"type": "string", "pattern": TIPO_PATTERN},
        "section_id": {"type": "integer", "minimum": 0, "maximum": _INT64_MAX},
        "projects": {
            "type": "array",
            "maxItems": 10_000,
            "items": {"type": "integer", "minimum": 0, "maximum": _INT32_MAX},
        },
        "title": {
            "anyOf": [
                {"type": "string", "maxLength": 4000},
                {
                    "type": "object",
                    "propertyNames": {"pattern": LANG_PATTERN},
                    "additionalProperties": {"type": "string", "maxLength": 4000},
                },
            ]
        },
        "groups": {
            "type": "object",
            "maxProperties": 64,
            "propertyNames": {"pattern": GROUP_ID_PATTERN},
            "additionalProperties": {
                "type": "object",
                "maxProperties": 64,
                "propertyNames": {"pattern": LANG_PATTERN},
                "additionalProperties": {"type": "string", "maxLength": MAX_TEXT_CHARS},
            },
        },
        "contributors": {
            "type": "object",
            "propertyNames": {"pattern": GROUP_ID_PATTERN},
            "additionalProperties": _CONTRIBUTORS,
        },
        "images": {"type": "array", "maxItems": 256, "items": _IMAGE},
        "metadata": {
            "type": "object",
            "maxProperties": 256,
            "propertyNames": {"pattern": GROUP_ID_PATTERN},  # a component tipo or a role name
            "additionalProperties": _ROLE_VALUE,
        },
    },
}

_VALIDATOR = Draft202012Validator(RECORD_SCHEMA)


def as_record_list(body: Any) -> list[Any]:
    """A request body holding one record object or an array of them, as a list."""
    if isinstance(body, list):
        return body
    if isinstance(body, dict):
        return [body]
    raise IntakeError(IntakeCode.INVALID_RECORD, "", "the body must be a record object or an array")


def validate_record(
    obj: Any,
    descriptors: Mapping[str, Mapping[str, Any]],
    *,
    prefix: str = "",
    media: MediaSettings | None = None,
) -> dict[str, Any]:
    """Check one record against the schema and its section's descriptor; return it normalized.

    ``descriptors`` maps section tipo to normalized descriptor. Field names in
    errors start with ``prefix`` (e.g. ``[3]`` for the fourth record of a batch).
    ``media`` says where images may come from (None: only base64 ``data``).
    """
    error = first_error(_VALIDATOR, obj, prefix)
    if error is not None:
        raise IntakeError(IntakeCode.INVALID_RECORD, error.field, error.message)
    section = obj["section_tipo"]
    descriptor = descriptors.get(section)
    if descriptor is None:
        raise IntakeError(
            IntakeCode.UNKNOWN_SECTION,
            f"{prefix}.section_tipo" if prefix else "section_tipo",
            f"section {section!r} has no descriptor (PUT /v1/sections/{section} first)",
        )
    declared = {g["id"] for g in descriptor["embed"]}
    for key in ("groups", "contributors"):
        for group in obj.get(key, {}):
            if group not in declared:
                field = f"{prefix}.{key}.{group}" if prefix else f"{key}.{group}"
                raise IntakeError(
                    IntakeCode.UNKNOWN_GROUP,
                    field,
                    f"section {section!r} declares no embed group {group!r} "
                    f"(declared: {', '.join(sorted(declared))})",
                )
    _check_images(obj, descriptor, prefix, media or MediaSettings())
    record = dict(obj)
    record.setdefault("title", "")
    record.setdefault("contributors", {})
    return record


def _check_images(
    obj: Mapping[str, Any], descriptor: Mapping[str, Any], prefix: str, media: MediaSettings
) -> None:
    """Images name declared image components and a reachable, allowed source; metadata keys are
    components the section declares as roles."""

    def name(rest: str) -> str:
        return f"{prefix}.{rest}" if prefix else rest

    context = descriptor.get("context") or {}
    declared = {i["tipo"] for i in context.get("images", [])}
    section = obj["section_tipo"]
    for i, image in enumerate(obj.get("images", [])):
        if image["tipo"] not in declared:
            raise IntakeError(
                IntakeCode.UNKNOWN_IMAGE_COMPONENT,
                name(f"images[{i}].tipo"),
                f"section {section!r} declares no image component {image['tipo']!r} in its context "
                f"(declared: {', '.join(sorted(declared)) or 'none'})",
            )
        if "thumb_url" in image:
            try:
                check_client_link(image["thumb_url"])
            except MediaNotAllowed as exc:
                raise IntakeError(
                    IntakeCode.MEDIA_NOT_ALLOWED, name(f"images[{i}].thumb_url"), str(exc)
                ) from exc
        try:
            check_source(image, media)
        except MediaNotAllowed as exc:
            given = [k for k in ("data", "path", "url") if k in image]
            field = name(f"images[{i}].{given[0]}" if len(given) == 1 else f"images[{i}]")
            raise IntakeError(IntakeCode.MEDIA_NOT_ALLOWED, field, str(exc)) from exc
        except ImageRejected as exc:
            given = [k for k in ("data", "path", "url") if k in image]
            raise IntakeError(IntakeCode.INVALID_IMAGE, name(f"images[{i}].{given[0]}"), exc.message) from exc
    # Keys are a role's component tipo (the archive's resolved record) or the role's name.
    roles = {spec["tipo"] for spec in context.get("metadata", {}).values()} | set(context.get("metadata", {}))
    for tipo in obj.get("metadata", {}):
        if tipo not in roles:
            raise IntakeError(
                IntakeCode.UNKNOWN_METADATA_COMPONENT,
                name(f"metadata.{tipo}"),
                f"section {section!r} declares no metadata role named or held by {tipo!r}",
            )


async def validate_records(
    pool: asyncpg.Pool, records: Sequence[Any], media: MediaSettings | None = None
) -> list[dict[str, Any]]:
    """Validate a batch (one descriptor query); the first bad record rejects the batch."""
    tipos = {
        r["section_tipo"] for r in records if isinstance(r, dict) and isinstance(r.get("section_tipo"), str)
    }
    descriptors = await SectionStore(pool).get_many(sorted(tipos))

    def validate_all() -> list[dict[str, Any]]:
        return [validate_record(r, descriptors, prefix=f"[{i}]", media=media) for i, r in enumerate(records)]

    if len(records) <= VALIDATE_ON_LOOP_MAX:
        return validate_all()
    # JSON-schema validation costs ~0.3 ms a record: a 1,000-record batch would stall every
    # other request on the event loop for a third of a second.
    return await asyncio.to_thread(validate_all)


async def enqueue_records(
    pool: asyncpg.Pool,
    records: Sequence[Any],
    *,
    max_records: int | None = None,
    media: MediaSettings | None = None,
) -> int:
    """Validate ``records`` like the HTTP route and queue them for indexing in one statement.

    Returns the number of distinct records queued (a record repeated in the
    batch is queued once, its last version winning).
    """
    if max_records is not None and len(records) > max_records:
        raise IntakeError(
            IntakeCode.TOO_MANY_RECORDS,
            "",
            f"{len(records)} records in one request; the limit is {max_records}",
        )
    valid = await validate_records(pool, records, media)
    jobs = [queue.Job(r["section_tipo"], r["section_id"], "index", r) for r in valid]
    return await queue.enqueue(pool, jobs)


async def enqueue_delete(pool: asyncpg.Pool, section_tipo: str, section_id: int) -> None:
    """Queue the removal of every stored row of a record (no descriptor needed)."""
    try:
        validate_section_tipo(section_tipo)
    except FieldError as exc:
        raise IntakeError(IntakeCode.INVALID_RECORD, "section_tipo", exc.message) from exc
    if not 0 <= section_id <= _INT64_MAX:
        raise IntakeError(IntakeCode.INVALID_RECORD, "section_id", "must be a non-negative integer")
    await queue.enqueue(pool, [queue.Job(section_tipo, section_id, "delete")])


async def enqueue_valid(
    pool: asyncpg.Pool, records: Sequence[Any], media: MediaSettings | None = None
) -> tuple[int, list[tuple[int, IntakeError]]]:
    """Queue the valid records of a batch; return (records queued, [(index, error), ...]).

    For backfills, where one bad line must not hold back the rest. Field names
    in the errors are relative to the record.
    """
    tipos = {
        r["section_tipo"] for r in records if isinstance(r, dict) and isinstance(r.get("section_tipo"), str)
    }
    descriptors = await SectionStore(pool).get_many(sorted(tipos))
    valid: list[dict[str, Any]] = []
    rejected: list[tuple[int, IntakeError]] = []
    for i, record in enumerate(records):
        try:
            valid.append(validate_record(record, descriptors, media=media))
        except IntakeError as exc:
            rejected.append((i, exc))
    jobs = [queue.Job(r["section_tipo"], r["section_id"], "index", r) for r in valid]
    return await queue.enqueue(pool, jobs), rejected
