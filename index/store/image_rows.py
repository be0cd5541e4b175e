"""What an image row says besides its vector: role values, context summary, thumbnail URL.

:func:`image_row` composes an image's :class:`~index.store.store.EmbeddingRow`; the
drain (images on save), the bulk job and its Ray variant all build their rows
with it, so they write the same rows for the same input. A role value is stored with the component it came
from, so the gateway can withhold a value from a caller who may not read that
component.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from index.store.store import EmbeddingRow, RecordKey, SlotKey
from index.text import fold

__all__ = [
    "IMAGE_LANG",
    "ImageKey",
    "format_value",
    "image_row",
    "image_slot",
    "roles_for",
    "summary_text",
    "thumbnail_path",
]

ImageKey = tuple[str, str, int]  # (component_tipo, view, image index) within a record
IMAGE_LANG = "lg-nolan"  # an image row's ``lang``: images have none


def roles_for(context: Mapping[str, Any], metadata: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{role: {"tipo", "kind", "value"}}`` for the descriptor's roles the record has a value for.

    ``metadata`` is keyed by component tipo, as the archive sends it, or by role name.
    """
    out = {}
    for role, spec in context.get("metadata", {}).items():
        value = metadata.get(spec["tipo"], metadata.get(role))
        if value is None or value == "" or value == []:
            continue
        out[role] = {"tipo": spec["tipo"], "kind": spec["kind"], "value": value}
    return out


def format_value(value: Any) -> str:
    """A role value as text: lists joined, date ranges as ``from–to``."""
    if isinstance(value, Mapping):
        start, end = value.get("from"), value.get("to")
        if start is not None and end is not None and start != end:
            return f"{start}–{end}"
        return str(start if start is not None else end if end is not None else "")
    if isinstance(value, list):
        return ", ".join(format_value(v) for v in value)
    return str(value)


def summary_text(title: str, roles: Mapping[str, Mapping[str, Any]]) -> str:
    """The context summary the lexical leg searches: ``title · role: value · ...``."""
    parts = [title.strip()] if title and title.strip() else []
    parts += [f"{role}: {format_value(spec['value'])}" for role, spec in sorted(roles.items())]
    return " · ".join(parts)


def thumbnail_path(section_tipo: str, section_id: int, component_tipo: str, image_index: int) -> str:
    """Where the gateway serves a thumbnail Mnemo made (relative to the gateway's base URL)."""
    return f"/v1/thumbnails/{section_tipo}/{section_id}/{component_tipo}/{image_index}"


def image_slot(key: ImageKey) -> SlotKey:
    """The store's slot of an image: its component, no language, its view and index."""
    component, view, index = key
    return (component, IMAGE_LANG, view, index)


def image_row(
    record: RecordKey,
    key: ImageKey,
    *,
    content_hash: str,
    title: str,
    roles: Mapping[str, Any],
    projects: Sequence[int],
    thumb_url: str | None,
    embedding: Any = None,
) -> EmbeddingRow:
    """The row of one image (``embedding`` None until its vector is known)."""
    component, view, index = key
    summary = summary_text(title, roles)
    meta = {  # thumb_url None: Mnemo makes the thumbnail and serves it
        "view": view,
        "title": title,
        "roles": dict(roles),
        "thumb_url": thumb_url or thumbnail_path(record[0], record[1], component, index),
        "own_thumbnail": thumb_url is None,
    }
    return EmbeddingRow(
        modality="image",
        section_tipo=record[0],
        section_id=record[1],
        component_tipo=component,
        lang=IMAGE_LANG,
        chunk_index=index,
        view=view,
        source_hash=content_hash,
        source_text=summary,
        lexical_text=fold(summary),
        embedding=embedding,
        projects=tuple(projects),
        chunk_meta=meta,
    )
