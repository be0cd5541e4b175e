"""One declaration per action (gateway/actions/specs.py): the published schemas and the validation agree.

For every action, the OpenAPI document's request options and the MCP tool's
input schema list the same options with the same requiredness, and for every
option, over a fixed set of probe values, the published JSON Schema accepts
exactly what the gateway's reader accepts (a refused value is a coded
``request.invalid_options``).
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from gateway.actions.specs import ACTIONS, admit
from gateway.base.errors import ApiError
from gateway.base.settings import GatewaySettings, load_gateway_settings
from gateway.web.app import create_app
from gateway.web.mcp import tool_schemas
from gateway.web.openapi import build_spec

# A valid value for each required option (any action's option of that name accepts it).
REQUIRED_SAMPLES: dict[str, Any] = {
    "query": "silver coin",
    "section_tipo": "oh1",
    "section_id": 3,
    "chunk_id": "oh1-3/rag:card/lg-eng/0",
}
# JSON Schema counts an integral float (5.0) as an integer while the readers refuse it (stricter),
# and a digit string beyond the largest id matches the id's pattern: neither is probed here; the
# readers' own tests cover them.
PROBES: list[Any] = [
    "",
    " ",
    "oh1",
    "1oh",
    "silver coin",
    "x" * 4001,
    "obverse",
    "hybrid",
    "visual",
    "neighbours",
    "parent",
    "card-2",
    "-card",
    "12",
    "١٢",
    "oh1-3/rag:card/lg-eng/0",
    "oh1-3/card",
    0,
    1,
    -1,
    10,
    11,
    51,
    2**63 - 1,
    2**63,
    1.5,
    True,
    False,
    [],
    ["oh1"],
    ["oh1", "rsc1"],
    ["1oh"],
    ["oh1"] * 65,
    {},
    {"a": 1},
]


@pytest.fixture(scope="module")
def settings() -> GatewaySettings:
    return load_gateway_settings({"RAG_AUTH": "off", "RAG_MEDIA_ENABLED": "true"})


@pytest.fixture(scope="module")
def openapi_options(settings: GatewaySettings) -> dict[str, dict[str, Any]]:
    """Action -> its ``options`` schema, as ``GET /openapi.json`` publishes it."""
    spec = build_spec(create_app(settings))
    body = spec["paths"]["/api/v1/json"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return {v["title"]: v["properties"]["options"] for v in body["oneOf"]}


def _accepted_by_reader(action: str, options: dict[str, Any]) -> bool:
    try:
        ACTIONS[action].read(options)
    except ApiError as exc:
        assert exc.code == "request.invalid_options", (action, options, exc.code)
        return False
    return True


def _accepted_by_schema(schema: dict[str, Any], options: dict[str, Any]) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(options)


def test_openapi_and_mcp_list_the_same_options(
    settings: GatewaySettings, openapi_options: dict[str, dict[str, Any]]
) -> None:
    tools = tool_schemas(settings)
    assert set(openapi_options) == set(ACTIONS)
    assert set(tools) == {name for name, spec in ACTIONS.items() if spec.mcp}
    assert {"similar_objects", "characterize_object", "search_by_text_image"} <= set(tools)
    for name, (description, schema) in tools.items():
        published = openapi_options[name]
        http_only = {o.name for o in ACTIONS[name].options if not o.mcp}
        assert description == ACTIONS[name].summary
        assert schema["additionalProperties"] is False
        assert {k: v for k, v in published["properties"].items() if k not in http_only} == schema[
            "properties"
        ]
        assert published["required"] == schema["required"], name
    # The drift this table ended: the image tools take the options their handlers read.
    assert "scope" in tools["similar_objects"][1]["properties"]
    assert "similarity_mode" in tools["characterize_object"][1]["properties"]


def test_the_mcp_tools_follow_the_media_switch() -> None:
    off = tool_schemas(load_gateway_settings({"RAG_AUTH": "off", "RAG_MEDIA_ENABLED": "false"}))
    assert set(off) == {name for name, spec in ACTIONS.items() if spec.mcp and not spec.media}


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_the_schema_accepts_what_the_reader_accepts(
    action: str, openapi_options: dict[str, dict[str, Any]]
) -> None:
    schema = openapi_options[action]
    spec = ACTIONS[action]
    base = {o.name: REQUIRED_SAMPLES[o.name] for o in spec.options if o.required}
    assert _accepted_by_reader(action, base) and _accepted_by_schema(schema, base), base
    disagreements = []
    for option in spec.options:
        without = {k: v for k, v in base.items() if k != option.name}
        if option.required:  # leaving it out is refused by both
            assert not _accepted_by_reader(action, without) and not _accepted_by_schema(schema, without)
        for probe in PROBES:
            options = {**base, option.name: probe}
            reader, published = _accepted_by_reader(action, options), _accepted_by_schema(schema, options)
            if reader != published:
                disagreements.append((option.name, probe, f"reader {reader}, schema {published}"))
    assert not disagreements, disagreements


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_a_published_default_is_what_the_reader_gives(action: str) -> None:
    spec = ACTIONS[action]
    read = spec.read({o.name: REQUIRED_SAMPLES[o.name] for o in spec.options if o.required})
    for option in spec.options:
        if "default" in option.json_schema:
            assert read[option.name] == option.json_schema["default"], (action, option.name)


def test_every_option_is_documented() -> None:
    for name, spec in ACTIONS.items():
        assert spec.summary, name
        for option in spec.options:
            assert option.json_schema.get("description"), (name, option.name)
        assert len({o.name for o in spec.options}) == len(spec.options), f"{name} declares an option twice"


def test_the_switches_come_from_the_declaration() -> None:
    off = load_gateway_settings({"RAG_AUTH": "off", "RAG_ENABLED": "false"})
    assert admit(off, "embed_groups") == ("ok", {"groups": []})
    with pytest.raises(ApiError) as disabled:
        admit(off, "semantic_search")
    assert disabled.value.code == "rag.disabled"
    no_media = load_gateway_settings({"RAG_AUTH": "off", "RAG_MEDIA_ENABLED": "false"})
    for name, spec in ACTIONS.items():
        if spec.media:
            with pytest.raises(ApiError) as media:
                admit(no_media, name)
            assert media.value.code == "rag.media_disabled"
        else:
            assert admit(no_media, name) is None
