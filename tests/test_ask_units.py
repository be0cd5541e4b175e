"""ask's pure steps: citation markers, the token budget, the grounding gate, egress, locators, settings."""

from __future__ import annotations

import pytest

from gateway.access.egress import passage_sections, restricted_sections
from gateway.actions.ask import CITATION_RULE, fit_budget, grounded_passages, system_prompt
from gateway.actions.citations import citation, validate_markers
from gateway.actions.providers import DEFAULT_SYSTEM_PROMPT, is_local_endpoint, passage_sentences
from gateway.base.locator import chunk_id, parse_chunk_id
from gateway.base.settings import load_gateway_settings
from gateway.retrieval.expand import Expanded
from gateway.retrieval.ranking import Ranked
from index.store.hits import ChunkHit
from schema.settings import SettingsError

SECRET = {"RAG_JWT_SECRET": "s" * 40}


def chunk(
    text: str = "Some text.",
    *,
    tipo: str = "oh1",
    sid: int = 1,
    index: int = 0,
    component: str = "rag:card",
    contributors: list[str] | None = None,
    **meta: object,
) -> ChunkHit:
    return ChunkHit(
        tipo,
        sid,
        component,
        "lg-spa",
        index,
        text,
        {"contributors": contributors or ["c1"], **meta},
        (1,),
        None,
        0.0,
    )


def ranked(c: ChunkHit, similarity: float | None = 0.5) -> Ranked:
    return Ranked(c, 0.03, {"dense": 1}, similarity)


# -- citation markers -----------------------------------------------------------------------------------


def test_valid_markers_are_kept_in_first_citation_order() -> None:
    v = validate_markers("Water came [2]. They left [1, 2].", 2)
    assert (v.answer, v.cited, v.removed) == ("Water came [2]. They left [1, 2].", [2, 1], 0)


def test_markers_outside_the_passages_are_removed_and_counted() -> None:
    v = validate_markers("A [1]. B [3]. C [1, 4]. D [0] E [12]", 2)
    assert v.answer == "A [1]. B. C [1]. D E"
    assert v.cited == [1] and v.removed == 4


def test_an_answer_without_markers_cites_nothing() -> None:
    v = validate_markers("The passages do not say.", 3)
    assert v.cited == [] and v.removed == 0


def test_citation_carries_locator_and_deep_link_fields() -> None:
    c = chunk("Cuando llegó el agua.", sid=412, index=3, tc_in="00:01:02.000", tc_out="00:02:15.250", page=7)
    cited = citation(1, c)
    assert cited["locator"] == "oh1-412"
    assert cited["chunkId"] == "oh1-412/rag:card/lg-spa/3"
    assert (cited["sectionTipo"], cited["sectionId"], cited["citedText"]) == ("oh1", 412, c.text)
    assert (cited["tcIn"], cited["tcOut"], cited["page"]) == ("00:01:02.000", "00:02:15.250", 7)


# -- budget and grounding -------------------------------------------------------------------------------


def test_budget_keeps_the_first_passage_even_over_budget() -> None:
    long = Expanded(ranked(chunk("word " * 400)), (chunk("word " * 400),))
    short = Expanded(ranked(chunk("tiny.", index=1)), (chunk("tiny.", index=1),))
    assert fit_budget([long, short], budget=10) == [long]
    assert fit_budget([short, long], budget=10) == [short]


def test_an_expansion_over_budget_falls_back_to_its_hit() -> None:
    hit = chunk("The hit sentence.", index=5)
    wide = Expanded(ranked(hit), (chunk("x " * 300, index=4), hit, chunk("y " * 300, index=6)), "neighbours")
    first = Expanded(ranked(chunk("First passage.")), (chunk("First passage."),))
    kept = fit_budget([first, wide], budget=20)
    assert [p.text for p in kept] == ["First passage.", "The hit sentence."]
    assert kept[1].mode is None


def test_grounding_gate_needs_one_dense_passage_above_the_floor() -> None:
    low, high, lexical = ranked(chunk(), 0.1), ranked(chunk(index=1), 0.6), ranked(chunk(index=2), None)
    assert grounded_passages([low, lexical], 0.2) == []
    assert grounded_passages([lexical], 0.2) == []
    assert grounded_passages([low, high, lexical], 0.2) == [high, lexical]


# -- egress ---------------------------------------------------------------------------------------------


def test_passage_sections_include_contributing_sections() -> None:
    c = chunk(contributors=["oh22", "dd810/dd812"])
    assert passage_sections([c]) == {"oh1", "dd810"}
    own = chunk(component="oh23", contributors=["x9/y"])  # a component chunk has no contributors
    assert passage_sections([own]) == {"oh1"}


def test_external_generation_is_off_by_default_and_opt_in_per_section() -> None:
    descriptors = {"rsc1": {"egress": {"allow_external": True}}, "oh1": {"egress": {"allow_external": False}}}
    closed = restricted_sections({"oh1", "rsc1", "dd810"}, descriptors, allow_default=False, forbidden=())
    assert closed == {"oh1", "dd810"}


def test_forbidden_sections_win_over_the_global_default() -> None:
    closed = restricted_sections({"oh1", "dd810"}, {}, allow_default=True, forbidden=("dd810",))
    assert closed == {"dd810"}
    opted_in = {"dd810": {"egress": {"allow_external": True}}}
    assert restricted_sections({"dd810"}, opted_in, allow_default=False, forbidden=("dd810",)) == {"dd810"}


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://127.0.0.1:8000/v1", True),
        ("http://127.8.0.3/v1", True),
        ("http://localhost:11434/v1", True),
        ("http://[::1]:8000/v1", True),
        ("https://api.openai.com/v1", False),
        ("http://10.0.0.5:8000/v1", False),
        ("http://vllm.lan:8000/v1", False),
    ],
)
def test_loopback_endpoints_are_local(url: str, local: bool) -> None:
    assert is_local_endpoint(url) is local


def test_configured_hosts_are_local() -> None:
    assert is_local_endpoint("http://vllm.lan:8000/v1", ("VLLM.lan",))


# -- prompts, sentences, locators, settings ---------------------------------------------------------------


def test_system_prompt_resolution_order() -> None:
    descriptors = {"oh1": {"system_prompt": "Quote the speakers."}}
    assert system_prompt("oh1", descriptors, "Setting prompt.") == f"Quote the speakers.\n\n{CITATION_RULE}"
    assert system_prompt("rsc1", descriptors, "Setting prompt.") == f"Setting prompt.\n\n{CITATION_RULE}"
    assert system_prompt("rsc1", descriptors, None) == DEFAULT_SYSTEM_PROMPT


def test_passage_sentences_split_turns_and_sentences() -> None:
    text = "Entrevistadora: ¿Qué recuerda?\nRosario: Recuerdo el agua. Subía cada noche."
    assert passage_sentences(text) == [
        "Entrevistadora: ¿Qué recuerda?",
        "Rosario: Recuerdo el agua.",
        "Subía cada noche.",
    ]


@pytest.mark.parametrize("component", ["rag:card", "rag:full-text_2", "oh23"])
def test_chunk_ids_round_trip(component: str) -> None:
    c = chunk(sid=412, index=17, component=component)
    assert parse_chunk_id(chunk_id(c)) == c.key


@pytest.mark.parametrize(
    "value",
    [
        "",
        "oh1-412",
        "oh1-x/rag:card/lg-spa/1",
        "oh1-1/rag:card/lg-spa/-1",
        "oh1-1/a/b/lg-spa/1",
        "1x-1/c/lg-spa/1",
    ],
)
def test_malformed_chunk_ids_are_refused(value: str) -> None:
    assert parse_chunk_id(value) is None


def test_openai_provider_needs_endpoint_and_model() -> None:
    with pytest.raises(SettingsError, match="RAG_LLM_ENDPOINT"):
        load_gateway_settings({**SECRET, "RAG_LLM_PROVIDER": "openai"})
    with pytest.raises(SettingsError, match="RAG_LLM_PROVIDER"):
        load_gateway_settings({**SECRET, "RAG_LLM_PROVIDER": "gpt"})
    with pytest.raises(SettingsError, match="RAG_LLM_LOCALITY"):
        load_gateway_settings({**SECRET, "RAG_LLM_LOCALITY": "maybe"})


def test_ask_settings_defaults_and_lists() -> None:
    s = load_gateway_settings(
        {
            **SECRET,
            "RAG_EXTERNAL_PROVIDER_FORBIDDEN_SECTIONS": "oh1, dd810",
            "RAG_LOCAL_PROVIDER_HOSTS": "gpu1",
        }
    ).ask
    assert (s.provider, s.allow_external_default, s.rerank_default) == ("extractive", False, True)
    assert s.forbidden_sections == ("oh1", "dd810") and s.local_hosts == ("gpu1",)
