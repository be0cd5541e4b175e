"""JSON-schema validation that names the offending field, shared by descriptors and records.

Clients get one error naming one field (``embed[0].contributors``,
``[3].groups.card``) rather than a list of schema internals; the first error
in document order is reported so the message is stable across runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

__all__ = [
    "CONTRIBUTOR_PATTERN",
    "GROUP_ID_PATTERN",
    "ID_MAX",
    "LANG_PATTERN",
    "PROJECT_ID_MAX",
    "TIPO_PATTERN",
    "FieldError",
    "field_path",
    "first_error",
    "parse_id",
]

# Archive identifiers: ontology tipos ("rsc140", "numisdata4"), embed-group ids
# ("card", "fulltext"), data languages ("lg-spa", "lg-nolan"). Group ids are
# bound as SQL parameters and appear in `component_tipo = 'rag:<group>'`.
TIPO_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,63}\Z"
GROUP_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z"
LANG_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,31}\Z"
CONTRIBUTOR_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,63}(/[A-Za-z][A-Za-z0-9_]{0,63})?\Z"


class FieldError(ValueError):
    """A value that breaks the schema, with the dotted path of the field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field or '(root)'}: {message}" if field else message)
        self.field = field
        self.message = message


ID_MAX = 2**63 - 1  # section ids are bigint
PROJECT_ID_MAX = 2**31 - 1  # project ids are int4 in the store and in the ACL's SQL


def parse_id(raw: str, *, field: str = "id", maximum: int = ID_MAX) -> int:
    """A record or project id written in text (URL path, CLI flag, option string): ASCII digits only.

    ``str.isdigit`` and ``int`` also accept other scripts' digits (``"٣"`` is 3) and
    ``isdigit`` superscripts (``"²"``, which ``int`` then refuses); ``int`` takes
    ``" 3"``, ``"+3"`` and ``"1_000"``. An id names one record, so anything but
    plain ASCII digits is refused instead of read as some other record's id.
    Every id parser goes through here.
    """
    # Length first: int() of a very long digit string is slow, and over 4,300 digits an error.
    if not (0 < len(raw) <= len(str(maximum)) and raw.isascii() and raw.isdigit()):
        raise FieldError(field, f"{raw[:40]!r} is not a non-negative integer in ASCII digits")
    value = int(raw)
    if value > maximum:
        raise FieldError(field, f"{raw!r} is over the largest id ({maximum})")
    return value


def field_path(parts: Iterable[str | int], prefix: str = "") -> str:
    """``["embed", 0, "id"]`` -> ``"embed[0].id"`` (with an optional leading prefix)."""
    out = prefix
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _describe(error: ValidationError) -> tuple[list[str | int], str]:
    path: list[str | int] = list(error.absolute_path)
    instance = error.instance
    if error.validator == "required" and isinstance(instance, Mapping):
        missing = [k for k in error.validator_value if k not in instance]
        if missing:
            return [*path, missing[0]], "is required"
    if error.validator == "additionalProperties" and isinstance(instance, Mapping):
        allowed = set(error.schema.get("properties", {}))
        patterns = list(error.schema.get("patternProperties", {}))
        extra = [k for k in instance if k not in allowed and not any(re.search(p, k) for p in patterns)]
        if extra:
            return [*path, extra[0]], "is not a known field"
    if error.validator == "pattern":
        return path, f"{error.instance!r} does not match {error.validator_value}"
    if error.validator == "propertyNames":
        return path, f"has an invalid key: {error.message}"
    if error.validator == "type":
        return path, f"must be of type {error.validator_value}"
    return path, error.message


def first_error(validator: Draft202012Validator, obj: Any, prefix: str = "") -> FieldError | None:
    """The first schema violation of ``obj`` (in document order), or None when it is valid."""
    errors = sorted(validator.iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path])
    if not errors:
        return None
    # Prefer the deepest error at the earliest path: it names the field most precisely.
    error = errors[0]
    while error.context:
        error = min(error.context, key=lambda e: (-len(e.absolute_path), e.message))
    parts, message = _describe(error)
    return FieldError(field_path(parts, prefix), message)
