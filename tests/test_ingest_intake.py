"""Intake: descriptor and record validation (coded errors naming the field), storing descriptors,
queueing records on real PostgreSQL."""

from __future__ import annotations

import copy
import json
from typing import Any

import asyncpg
import pytest

from gateway.base.errors import ERRORS
from index.ingest import queue
from index.ingest.intake import (
    IntakeCode,
    IntakeError,
    as_record_list,
    enqueue_delete,
    enqueue_records,
    enqueue_valid,
)
from index.store.sections import DescriptorError, SectionStore, validate_descriptor
from tests.ingest_support import ORAL_HISTORY, record


def test_descriptor_defaults_are_filled() -> None:
    d = validate_descriptor({"embed": [{"id": "card", "contributors": ["rsc140"]}]})
    assert d["embed"] == [
        {
            "id": "card",
            "contributors": ["rsc140"],
            "mode": None,
            "chunk": {"max_tokens": 450, "min_tokens": 120},
        }
    ]
    assert d["context"] == {"images": [], "metadata": {}, "compare_scope": []}
    assert d["system_prompt"] is None and d["egress"] == {"allow_external": False}


def test_descriptor_contributors_come_from_the_archive_ddo_map() -> None:
    d = validate_descriptor(
        {
            "embed": [
                {
                    "id": "card",
                    "ddo_map": [
                        {"tipo": "rsc140", "section_tipo": "self"},
                        {"tipo": "dd812", "section_tipo": "dd810", "parent": "rsc138"},
                    ],
                }
            ],
            "strategy": "structural_semantic",
        }
    )
    assert d["embed"][0]["contributors"] == ["rsc140", "dd810/dd812"]
    assert d["strategy"] == "structural_semantic"  # unknown-to-us keys are kept


@pytest.mark.parametrize(
    ("descriptor", "field", "fragment"),
    [
        ({}, "embed", "required"),
        ({"embed": []}, "embed", "non-empty"),
        ({"embed": [{"contributors": ["a1"]}]}, "embed[0].id", "required"),
        ({"embed": [{"id": "card"}]}, "embed[0].contributors", "required"),
        ({"embed": [{"id": "card", "contributors": []}]}, "embed[0].contributors", "should be non-empty"),
        ({"embed": [{"id": "bad id", "contributors": ["a1"]}]}, "embed[0].id", "does not match"),
        (
            {"embed": [{"id": "c", "contributors": ["a1/b2/c3"]}]},
            "embed[0].contributors[0]",
            "does not match",
        ),
        ({"embed": [{"id": "c", "contributors": ["a1"], "mode": "poem"}]}, "embed[0].mode", "is not one of"),
        (
            {"embed": [{"id": "c", "contributors": ["a1"], "chunk": {"max_tokens": "450"}}]},
            "embed[0].chunk.max_tokens",
            "integer",
        ),
        (
            {"embed": [{"id": "c", "contributors": ["a1"], "chunk": {"max_tokens": 100, "min_tokens": 200}}]},
            "embed[0].chunk.min_tokens",
            "above max_tokens",
        ),
        (
            {"embed": [{"id": "c", "contributors": ["a1"]}, {"id": "c", "contributors": ["a2"]}]},
            "embed[1].id",
            "duplicate",
        ),
        ({"embed": [{"id": "c", "contributors": ["a1"]}], "system_prompt": 3}, "system_prompt", "type"),
        (
            {"embed": [{"id": "c", "contributors": ["a1"]}], "egress": {"allow_external": "yes"}},
            "egress.allow_external",
            "boolean",
        ),
        ([], "", "object"),
    ],
)
def test_bad_descriptors_name_the_field(descriptor: Any, field: str, fragment: str) -> None:
    with pytest.raises(DescriptorError) as info:
        validate_descriptor(descriptor)
    assert info.value.field == field
    assert fragment in info.value.message


async def test_section_store_round_trip(db_pool: asyncpg.Pool) -> None:
    sections = SectionStore(db_pool)
    assert await sections.get("oh1") is None and await sections.group_ids("oh1") == []
    stored = await sections.put("oh1", ORAL_HISTORY)
    assert await sections.get("oh1") == stored
    assert await sections.group_ids("oh1") == ["summary", "transcription"]
    changed = copy.deepcopy(ORAL_HISTORY)
    changed["embed"] = changed["embed"][:1]
    await sections.put("oh1", changed)
    assert await sections.group_ids("oh1") == ["summary"]
    with pytest.raises(DescriptorError) as info:
        await sections.put("bad tipo", ORAL_HISTORY)
    assert info.value.field == "section_tipo"


@pytest.mark.parametrize(
    ("mutate", "code", "field"),
    [
        (lambda r: r.pop("projects"), "request.invalid_record", "[0].projects"),
        (lambda r: r.update(section_id="7"), "request.invalid_record", "[0].section_id"),
        (lambda r: r.update(section_id=-1), "request.invalid_record", "[0].section_id"),
        (lambda r: r.update(section_id=True), "request.invalid_record", "[0].section_id"),
        (lambda r: r.update(projects=[1, "x"]), "request.invalid_record", "[0].projects[1]"),
        (
            lambda r: r["groups"]["summary"].update({"lg-spa": 5}),
            "request.invalid_record",
            "[0].groups.summary.lg-spa",
        ),
        (lambda r: r.update(colour="red"), "request.invalid_record", "[0].colour"),
        # `$` alone would accept a trailing newline: identifiers are matched whole.
        (lambda r: r.update(section_tipo="oh1\n"), "request.invalid_record", "[0].section_tipo"),
        (lambda r: r.update(section_tipo="oh2"), "request.unknown_section", "[0].section_tipo"),
        (lambda r: r["groups"].update(card={"lg-spa": "x"}), "request.unknown_group", "[0].groups.card"),
        (lambda r: r.update(contributors={"card": ["x1"]}), "request.unknown_group", "[0].contributors.card"),
    ],
)
async def test_bad_records_are_rejected_with_a_code_naming_the_field(
    db_pool: asyncpg.Pool, mutate: Any, code: str, field: str
) -> None:
    await SectionStore(db_pool).put("oh1", ORAL_HISTORY)
    bad = record(1)
    mutate(bad)
    with pytest.raises(IntakeError) as info:
        await enqueue_records(db_pool, [bad, record(2)])
    assert (info.value.code, info.value.field) == (code, field)
    # The gateway's one table maps the domain code to its status.
    assert ERRORS[code].status == (422 if code != "request.invalid_record" else 400)
    # The batch is rejected whole: nothing was queued.
    assert await db_pool.fetchval("SELECT count(*) FROM rag_index_queue") == 0


def test_one_record_or_an_array() -> None:
    assert as_record_list({"a": 1}) == [{"a": 1}]
    assert as_record_list([{"a": 1}, {"b": 2}]) == [{"a": 1}, {"b": 2}]
    with pytest.raises(IntakeError) as info:
        as_record_list("text")
    assert info.value.code == "request.invalid_record"


async def test_records_are_queued_and_coalesced_per_record(db_pool: asyncpg.Pool) -> None:
    await SectionStore(db_pool).put("oh1", ORAL_HISTORY)
    assert await enqueue_records(db_pool, [record(1), record(2)]) == 2
    edited = record(1, title="edited")
    # The same record twice in one batch: one row, the last version wins.
    assert await enqueue_records(db_pool, [record(1), edited]) == 1
    rows = {r["section_id"]: r for r in await db_pool.fetch("SELECT * FROM rag_index_queue")}
    assert set(rows) == {1, 2}
    assert rows[1]["version"] == 2 and rows[2]["version"] == 1
    assert json.loads(rows[1]["payload"])["title"] == "edited"
    # An empty record is valid (it indexes to nothing).
    assert await enqueue_records(db_pool, [record(3, groups={})]) == 1
    # A delete replaces the pending index of the same record.
    await enqueue_delete(db_pool, "oh1", 2)
    row = await db_pool.fetchrow(
        "SELECT operation, payload, version FROM rag_index_queue WHERE section_id = 2"
    )
    assert (row["operation"], row["payload"], row["version"]) == ("delete", None, 2)


async def test_too_many_records_is_a_413(db_pool: asyncpg.Pool) -> None:
    await SectionStore(db_pool).put("oh1", ORAL_HISTORY)
    with pytest.raises(IntakeError) as info:
        await enqueue_records(db_pool, [record(i) for i in range(3)], max_records=2)
    assert (info.value.code, ERRORS[info.value.code].status) == ("request.too_many_records", 413)


async def test_enqueue_valid_keeps_the_good_records_of_a_backfill(db_pool: asyncpg.Pool) -> None:
    await SectionStore(db_pool).put("oh1", ORAL_HISTORY)
    bad = {**record(2), "section_id": "two"}
    queued, rejected = await enqueue_valid(db_pool, [record(1), bad, record(3)])
    assert queued == 2
    assert [(i, e.field) for i, e in rejected] == [(1, "section_id")]
    assert {r["section_id"] for r in await db_pool.fetch("SELECT section_id FROM rag_index_queue")} == {1, 3}


async def test_a_delete_needs_no_descriptor_but_a_valid_tipo(db_pool: asyncpg.Pool) -> None:
    await enqueue_delete(db_pool, "anything1", 5)
    stats = await queue.stats(db_pool, max_attempts=5)
    assert (stats.pending, stats.ready) == (1, 1)
    with pytest.raises(IntakeError) as info:
        await enqueue_delete(db_pool, "bad tipo", 5)
    assert info.value.field == "section_tipo"


def test_every_ingest_setting_is_in_the_configuration_reference() -> None:
    from pathlib import Path

    from index.settings import IngestSettings
    from schema.settings import declarations

    reference = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text()
    for declared in declarations(IngestSettings):
        assert declared.meaning and f"`{declared.env}`" in reference, (
            f"{declared.env} missing from the reference"
        )


def test_every_intake_code_is_in_the_gateways_error_table_as_a_client_error() -> None:
    """index owns the rejection vocabulary (both intake paths answer it); the gateway maps each code."""
    for code in IntakeCode:
        assert code.value in ERRORS and 400 <= ERRORS[code.value].status < 500, code
