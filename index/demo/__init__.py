"""The bundled demo collection, written for Mnemo: oral histories, coins and museum objects.

Thirteen records in Spanish, English, German and Catalan across three sections
(``oh1`` oral-history interviews with timecoded transcriptions, ``numisdata4``
a coin catalogue with inventory numbers and metadata roles, ``mus1`` museum
objects with long documents carrying headings and page markers). The people,
places and objects are fictional; the descriptors are in ``sections.json``.
:func:`load_demo` stores the descriptors and queues the records through the
same intake path as ``POST /v1/records``; a drain indexes them.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import asyncpg

from index.ingest.intake import enqueue_records
from index.store.sections import SectionStore

__all__ = ["demo_records", "demo_sections", "load_demo"]


def demo_sections() -> dict[str, dict[str, Any]]:
    """Section tipo -> descriptor of the demo collection."""
    return json.loads(resources.files(__name__).joinpath("sections.json").read_text(encoding="utf-8"))


def demo_records() -> list[dict[str, Any]]:
    """The demo records, as the archive would push them."""
    text = resources.files(__name__).joinpath("records.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def load_demo(pool: asyncpg.Pool) -> int:
    """Store the demo descriptors and queue the demo records; returns the records queued."""
    sections = SectionStore(pool)
    for section_tipo, descriptor in demo_sections().items():
        await sections.put(section_tipo, descriptor)
    return await enqueue_records(pool, demo_records())
