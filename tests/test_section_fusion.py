"""Tuned fusion per section: `mnemo eval --apply` stores it in the descriptor, the gateway reads it."""

from __future__ import annotations

import asyncpg
import pytest

from benchmarks.eval import apply_tuning
from gateway.base.settings import load_gateway_settings
from gateway.retrieval.engines import build_retrieval
from gateway.retrieval.retriever import Retriever
from index.store.hits import Scope
from index.store.sections import DescriptorError, SectionStore

DESCRIPTOR = {"embed": [{"id": "doc", "contributors": ["text"]}]}
TUNED = {"fusion": "rrf", "weights": {"dense": 1.0, "lexical": 0.25}, "metrics": {"ndcg@10": 0.5}}


def _retriever(pool: asyncpg.Pool) -> Retriever:
    # TTL 0: every call reads the descriptors again (the test changes them under the retriever).
    settings = load_gateway_settings({"RAG_LEXICAL_STATS_TTL": "0"}, auth="off")
    return build_retrieval(pool, None, settings).retriever


async def test_apply_stores_the_tuned_fusion_and_the_retriever_uses_it(db_pool: asyncpg.Pool) -> None:
    sections = SectionStore(db_pool)
    await sections.put("sec_a", DESCRIPTOR)
    await sections.put("sec_b", DESCRIPTOR)
    retriever = _retriever(db_pool)
    assert await retriever.fusion.for_scope(Scope(section_tipos=("sec_a",))) == (None, None)

    await apply_tuning(db_pool, "sec_a", TUNED, "adi")
    stored = await sections.get("sec_a")
    assert stored is not None and stored["retrieval"]["fusion"] == "rrf"
    assert stored["retrieval"]["tuned_on"] == {"dataset": "adi", "cross_validated": {"ndcg@10": 0.5}}
    assert stored["embed"][0]["contributors"] == ["text"]  # the rest of the descriptor is kept

    assert await retriever.fusion.for_scope(Scope(section_tipos=("sec_a",))) == (
        "rrf",
        {"dense": 1.0, "lexical": 0.25},
    )
    # Sections that disagree, or no section scope: the settings' fusion.
    assert await retriever.fusion.for_scope(Scope(section_tipos=("sec_a", "sec_b"))) == (None, None)
    assert await retriever.fusion.for_scope(Scope()) == (None, None)
    await apply_tuning(db_pool, "sec_b", TUNED, "adi")
    assert (await retriever.fusion.for_scope(Scope(section_tipos=("sec_a", "sec_b"))))[0] == "rrf"


async def test_apply_to_a_section_without_descriptor_is_refused(db_pool: asyncpg.Pool) -> None:
    with pytest.raises(LookupError, match="no descriptor"):
        await apply_tuning(db_pool, "nowhere", TUNED, "adi")


async def test_a_descriptor_cannot_carry_negative_weights(db_pool: asyncpg.Pool) -> None:
    with pytest.raises(DescriptorError, match="retrieval"):
        await SectionStore(db_pool).put("sec_c", {**DESCRIPTOR, "retrieval": {"weights": {"dense": -1}}})


async def test_an_unusable_stored_fusion_is_ignored(db_pool: asyncpg.Pool) -> None:
    await SectionStore(db_pool).put("sec_d", {**DESCRIPTOR, "retrieval": {"fusion": "magic", "weights": {}}})
    assert await _retriever(db_pool).fusion.for_scope(Scope(section_tipos=("sec_d",))) == (None, None)
