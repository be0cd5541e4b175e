"""Parse an untrusted JSON request body within limits, naming the field at fault.

Python's ``json`` module accepts input that later code cannot handle, and fails
on some with exceptions that are not ``JSONDecodeError`` (so callers answered
500): nesting thousands of levels deep (``RecursionError``), integers of more
than 4,300 digits (``ValueError`` from the int-string limit), ``NaN`` and
``Infinity`` (not JSON), and ``"\\ud800"`` escapes that decode to lone UTF-16
surrogates, which no UTF-8 encoder, tokenizer or database accepts. PostgreSQL
also rejects NUL in text and jsonb, so a caller that stores strings asks for
NUL to be refused as well.

The sidecar uses this module, and the gateway reuses it for its own bodies (and the bulk loaders
for their JSON lines) so all draw the same lines.

Speed (issue 27): orjson parses a body first. It enforces most of these lines itself (strict UTF-8,
no NaN or Infinity, no lone surrogate escape, nesting at most 1,024) but not all: it reads an
integer past 64 bits as a float, and it accepts number literals of any length. So a body holding a
run of 19 or more digits, the only way to write either, goes to the standard library's parse with
the hooks below, and so does every body orjson refuses: the answer, and the reason and field path
of a refusal, are always what that parse says. Depth and NUL are checked on the value either way.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

__all__ = ["MAX_DEPTH", "MAX_NUMBER_CHARS", "JsonRejected", "loads_strict"]

# Deeper than any request shape either service defines (records with metadata need a handful).
MAX_DEPTH = 64
# Longer than any int64 or float literal a client has reason to send, far below Python's 4,300.
MAX_NUMBER_CHARS = 100

# A run of digits long enough for an integer past 64 bits (or a literal past MAX_NUMBER_CHARS: a
# number is at most three digit runs and four other characters); in a string it only costs speed.
# Found as bytes.translate (digits to 1, the rest to 0) then find: a regex took 10 ns a byte.
_DIGITS_AS_ONES = bytes(1 if 0x30 <= byte <= 0x39 else 0 for byte in range(256))
_LONG_DIGIT_RUN = b"\x01" * 19
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_OR_NUL = re.compile("[\x00\ud800-\udfff]")


class JsonRejected(ValueError):
    """A body refused before use: ``reason`` is a stable key, ``field`` the dotted path (``""``: the body)."""

    def __init__(self, reason: str, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.reason = reason  # "invalid_json" | "too_deep" | "number_too_long" | "invalid_text"
        self.field = field
        self.message = message


class _NumberTooLong(Exception):
    def __init__(self, literal: str) -> None:
        super().__init__(literal)
        self.digits = len(literal)


def _number(convert: type) -> Any:
    def parse(literal: str) -> Any:
        if len(literal) > MAX_NUMBER_CHARS:
            raise _NumberTooLong(literal)
        value = convert(literal)
        if not math.isfinite(value):  # 1e999 overflows to inf: no JSON number means that
            raise _NumberTooLong(literal)
        return value

    return parse


def _constant(name: str) -> Any:
    raise JsonRejected("invalid_json", "", f"{name} is not valid JSON")


def _printable(key: str) -> str:
    """A key as it may appear in an error message: escaped (the answer must encode) and short."""
    key = _SURROGATE_OR_NUL.sub(lambda m: f"\\u{ord(m.group()):04x}", key)
    return key if len(key) <= 64 else key[:61] + "..."


def _path(parts: tuple[str | int, ...]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{_printable(part)}" if out else _printable(part)
    return out


def loads_strict(raw: bytes, *, forbid_nul: bool = False, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of ``raw`` (strict UTF-8), or :class:`JsonRejected` naming what is wrong and where."""
    if bytes(raw).translate(_DIGITS_AS_ONES).find(_LONG_DIGIT_RUN) < 0:
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # refused: the standard library's parse below says why, as it always has
        else:  # orjson let no lone surrogate through: only NUL is left to look for in the strings
            _check(value, forbid_nul, max_depth, surrogates=False)
            return value
    return _loads_stdlib(raw, forbid_nul, max_depth)


def _loads_stdlib(raw: bytes, forbid_nul: bool, max_depth: int) -> Any:
    """:func:`loads_strict` through ``json``, whose hooks bound every number literal."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonRejected("invalid_json", "", f"the body is not UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(
            text,
            parse_int=_number(int),
            parse_float=_number(float),
            parse_constant=_constant,
        )
    except _NumberTooLong as exc:
        raise JsonRejected(
            "number_too_long",
            "",
            f"a number of {exc.digits} characters or beyond a float's range (at most {MAX_NUMBER_CHARS})",
        ) from None
    except RecursionError:
        raise JsonRejected("too_deep", "", f"nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as exc:
        raise JsonRejected("invalid_json", "", f"not valid JSON: {exc}") from None
    _check(value, forbid_nul, max_depth)
    return value


def _check(value: Any, forbid_nul: bool, max_depth: int, *, surrogates: bool = True) -> None:
    """Walk the parsed value (iteratively): depth, and every string and key for surrogates (and NUL).

    ``surrogates=False``: the parser refused lone surrogates already, so a string is searched for
    NUL alone (``in``, far cheaper than the pattern), and not at all without ``forbid_nul``.
    """
    what = "a NUL character or a lone UTF-16 surrogate" if forbid_nul else "a lone UTF-16 surrogate"
    pattern = _SURROGATE_OR_NUL if forbid_nul else _SURROGATE

    def bad_text(text: str) -> bool:
        if surrogates:
            return pattern.search(text) is not None
        return forbid_nul and "\x00" in text

    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if bad_text(item):
                raise JsonRejected("invalid_text", _path(path), f"the string holds {what}")
        elif isinstance(item, dict | list):
            if len(path) >= max_depth:
                raise JsonRejected("too_deep", _path(path), f"nested deeper than {max_depth} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    if bad_text(key):
                        raise JsonRejected("invalid_text", _path((*path, key)), f"the key holds {what}")
                    stack.append((child, (*path, key)))
            else:
                stack.extend((child, (*path, i)) for i, child in enumerate(item))
