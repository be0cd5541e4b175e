"""Small pure pieces of the gateway: options, snippets, the query-vector cache, fusion weights."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.actions import options as opt
from gateway.base.errors import ApiError
from gateway.base.settings import parse_weights
from gateway.retrieval.passages import snippet
from gateway.retrieval.query_cache import QueryVector, QueryVectorCache
from schema.settings import SettingsError


def test_limit_clamp_and_types() -> None:
    assert [opt.limit({"limit": v}) for v in (-5, 0, 1, 10, 50, 51, 10**9)] == [1, 1, 1, 10, 50, 50, 50]
    assert opt.limit({}) == 10
    for bad in ("5", 5.0, True, None.__class__):
        with pytest.raises(ApiError):
            opt.limit({"limit": bad})


def test_scope_group_and_seed() -> None:
    assert opt.scope({"section_tipo": "oh1"}) == ("oh1",)
    assert opt.scope({"section_tipo": ["oh1", "rsc1", "oh1"]}) == ("oh1", "rsc1")
    assert opt.scope({}) is None
    assert opt.group({"group": "card-2"}) == "card-2" and opt.group({}) is None
    assert opt.seed({"section_tipo": "oh1", "section_id": "12"}) == ("oh1", 12)
    for bad in (
        {"section_tipo": "oh1", "section_id": 1.5},
        {"section_tipo": "1oh", "section_id": 1},
        {"section_tipo": "oh1", "section_id": 2**63},
        {"section_tipo": "oh1", "section_id": "١٢"},
    ):
        with pytest.raises(ApiError):
            opt.seed(bad)


def test_snippet_cuts_at_a_word_with_an_ellipsis() -> None:
    assert snippet("short  text\n here") == "short text here"
    long = "word " * 100
    cut = snippet(long, 40)
    assert cut.endswith("…") and len(cut) <= 41 and "  " not in cut


def test_query_cache_is_lru_and_normalizes_whitespace() -> None:
    cache = QueryVectorCache(2)
    v = QueryVector(np.ones(3, np.float32), None)
    cache.put("m", "a  b", v, owner="u")
    cache.put("m", "c", v, owner="u")
    assert cache.get("m", " a b ", owner="u") is v  # refreshes "a b"
    cache.put("m", "d", v, owner="u")
    assert (
        cache.get("m", "c", owner="u") is None and cache.get("m", "a b", owner="u") is v and len(cache) == 2
    )
    assert cache.get("other-model", "d", owner="u") is None
    disabled = QueryVectorCache(0)
    disabled.put("m", "x", v, owner="u")
    assert disabled.get("m", "x", owner="u") is None


def test_query_cache_never_answers_one_caller_with_another_callers_query() -> None:
    cache = QueryVectorCache(8)
    v = QueryVector(np.ones(3, np.float32), None)
    cache.put("m", "who asked about the flood", v, owner="alice")
    assert cache.get("m", "who asked about the flood", owner="bob") is None
    assert cache.get("m", "who asked about the flood", owner="alice") is v


def test_fusion_weights_parse() -> None:
    assert parse_weights("dense=1,lexical=0.5") == {"dense": 1.0, "lexical": 0.5, "sparse": 1.0}
    for bad in ("dense", "vision=1", "dense=x", "dense=-1", "dense=0,lexical=0,sparse=0"):
        with pytest.raises(SettingsError):
            parse_weights(bad)
