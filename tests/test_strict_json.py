"""``loads_strict``: orjson parses first, and every value and refusal is the standard library's.

The strict parse through ``json`` (with its number hooks) is the reference: on any body, the fast
path gives the same value (same types: an integer past 64 bits stays an int) or the same refusal,
reason and field path.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference import strict_json
from inference.strict_json import JsonRejected, loads_strict


def _outcome(parse: Any, raw: bytes, forbid_nul: bool) -> tuple[str, Any]:
    try:
        return "value", _typed(parse(raw, forbid_nul=forbid_nul))
    except JsonRejected as exc:
        return "refused", (exc.reason, exc.field, str(exc))


def _typed(value: Any) -> Any:
    """The value with each scalar's type beside it (1 == 1.0 == True in Python, not in JSON)."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


def _reference(raw: bytes, *, forbid_nul: bool = False) -> Any:
    return strict_json._loads_stdlib(raw, forbid_nul, strict_json.MAX_DEPTH)


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(codec="utf-8", exclude_categories=()), max_size=12)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(values, st.booleans())
def test_a_json_value_reads_back_as_the_standard_parse_reads_it(value: Any, forbid_nul: bool) -> None:
    raw = json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    assert _outcome(loads_strict, raw, forbid_nul) == _outcome(_reference, raw, forbid_nul)


# Pieces of JSON and of what is not JSON, glued at random: most bodies are refused somewhere.
pieces = st.sampled_from(
    [b"{", b"}", b"[", b"]", b",", b":", b'"a"', b'"\\u0000"', b'"\\ud800"', b'"\\udc00"', b'"\\ud83d\\ude00"',
     b"\x00", b"\xed\xa0\x80", b"\xff", b"\xef\xbb\xbf", b"1", b"-0", b"1e400", b"-1e-400", b"0.1",
     b"18446744073709551616", b"-9223372036854775809", b"9" * 101, b"NaN", b"Infinity", b"true",
     b"null", b" ", b"\t", b"\n", b'"x\\"', b"1.", b".5", b"01", b"1E+2", b'"\\/"', b"\x7f"]
)  # fmt: skip


@settings(max_examples=1500, deadline=None)
@given(st.lists(pieces, max_size=12).map(b"".join), st.booleans())
def test_any_body_is_read_or_refused_as_the_standard_parse_does(raw: bytes, forbid_nul: bool) -> None:
    assert _outcome(loads_strict, raw, forbid_nul) == _outcome(_reference, raw, forbid_nul)


@pytest.mark.parametrize(
    ("raw", "reason", "field"),
    [
        (b'{"a": [1, {"b": "\\ud800"}]}', "invalid_text", "a[1].b"),
        (b'{"a": "\\u0000"}', "invalid_text", "a"),
        (b"[" * 65 + b"]" * 65, "too_deep", "[0]" * 64),
        (b"[" * 2000 + b"]" * 2000, "too_deep", ""),
        (b'{"n": ' + b"1" * 101 + b"}", "number_too_long", ""),
        (b'{"n": 1e999}', "number_too_long", ""),
        (b'{"n": NaN}', "invalid_json", ""),
        (b'{"s": "\xff"}', "invalid_json", ""),
    ],
)
def test_each_rule_names_its_reason_and_field(raw: bytes, reason: str, field: str) -> None:
    with pytest.raises(JsonRejected) as caught:
        loads_strict(raw, forbid_nul=True)
    assert (caught.value.reason, caught.value.field) == (reason, field)


def test_an_integer_past_64_bits_stays_an_exact_integer() -> None:
    for literal in (b"18446744073709551616", b"-9223372036854775809", b"1" * 40):
        value = loads_strict(b'{"n": ' + literal + b"}")["n"]
        assert isinstance(value, int) and value == int(literal)
    assert not math.isnan(loads_strict(b"[0.1]")[0])
