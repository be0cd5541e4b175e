"""Response bodies (``inference.json_out.dumps``, orjson: the gateway's answers, server-sent events and MCP
tool texts, the sidecar's answers, its client's requests) say what json.dumps said, as strict JSON."""

import json
import math

import pytest

from gateway.base.errors import ApiError
from inference.json_out import dumps


def _old(obj: object) -> bytes:
    """What the envelope helpers wrote before orjson."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


_HIT = {
    "section": "rag:card",
    "record_id": 1234,
    "chunk_index": 3,
    "score": 0.8123456789012345,
    "legs": {"dense": {"rank": 1, "score": 0.61}, "lexical": {"rank": 7, "score": 12.5}},
    "text": 'Ánfora de figuras rojas · 赤絵式アンフォラ · 🏺 «cita» "quoted" \\ back\nslash\ttab \x01',
    "meta": {"contributors": ["c1"], "title": "", "heading_path": ["Ä", "b"], "page": None, "public": True},
}
REPRESENTATIVE = [
    {"ok": True, "request_id": "0f" * 16, "msg": "ok", "data": [_HIT] * 10},
    {"ok": True, "request_id": "r", "msg": "agent_context", "data": {"passages": [_HIT], "budget": 0}},
    {"ok": True, "request_id": "r", "msg": "ok", "data": {"groups": []}},
    {
        "ok": False,
        "request_id": "r",
        "error": ApiError("rag.embedding_unavailable", "sidecar down: «é»").body("r")["error"],
    },
    {
        "ok": True,
        "request_id": "r",
        "msg": "ok",
        "data": {"vector": [0.5, -0.25, 1.0, 0.0, -0.0, 3.0e-07, 2.5e20]},
    },
]


@pytest.mark.parametrize("payload", REPRESENTATIVE)
def test_representative_bodies_parse_to_the_same_content(payload: dict) -> None:
    assert json.loads(dumps(payload)) == json.loads(_old(payload))


@pytest.mark.parametrize("payload", REPRESENTATIVE[:4])
def test_bodies_without_exponent_floats_are_the_same_bytes(payload: dict) -> None:
    assert dumps(payload) == _old(payload)


@pytest.mark.parametrize(
    "payload",
    [
        {1: "int key", 2.5: "float key", False: "bool key", None: "null key"},  # orjson refuses non-str keys
        {"id": 2**70, "negative": -(2**64)},  # and integers past 64 bits
    ],
)
def test_what_orjson_refuses_is_written_as_before(payload: dict) -> None:
    assert dumps(payload) == _old(payload)


def test_what_no_encoder_knows_still_raises() -> None:
    with pytest.raises(TypeError):
        dumps({"x": object()})


def test_a_non_finite_float_is_null_not_a_bare_nan() -> None:
    body = dumps({"score": math.nan, "worst": -math.inf})
    assert json.loads(body) == {"score": None, "worst": None}
    assert b"NaN" not in _old({"ok": 1}) and b"NaN" in _old({"score": math.nan})  # what json.dumps did


def test_a_lone_surrogate_is_written_escaped_not_raised() -> None:
    # Neither orjson nor UTF-8 carries one; json.dumps's ASCII form does, and the body stays JSON.
    body = dumps({"reason": "bad byte \udc80 here", "name": "é"})
    assert body == b'{"reason":"bad byte \\udc80 here","name":"\\u00e9"}'
    assert json.loads(body) == {"reason": "bad byte \udc80 here", "name": "é"}


def _strict(text: str | bytes) -> object:
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_server_sent_event_is_one_strict_json_line() -> None:
    from gateway.actions.ask import sse_event

    frame = sse_event("delta", {"text": "line one\nline two «é»", "score": math.nan})
    head, data, end = frame.split(b"\n", 2)
    assert (head, end) == (b"event: delta", b"\n")  # a raw newline in the data would end the event
    assert data.startswith(b"data: ")
    assert _strict(data[len(b"data: ") :]) == {"text": "line one\nline two «é»", "score": None}


def test_an_mcp_tool_text_is_strict_json() -> None:
    from gateway.web.mcp import tool_result

    result = tool_result({"ok": True, "data": [{"score": math.inf, "text": "«é»"}]})
    assert _strict(result.content[0].text) == {"ok": True, "data": [{"score": None, "text": "«é»"}]}
