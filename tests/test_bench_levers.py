"""``benchmarks.levers``'s variants: settings, a source tree to run the gateway from, and loud errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.levers import Variant, parse_variant

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_a_variant_holds_settings_a_source_tree_or_both() -> None:
    assert parse_variant("asyncio=RAG_UVLOOP=off,RAG_LOG_LEVEL=INFO") == (
        "asyncio",
        Variant({"RAG_UVLOOP": "off", "RAG_LOG_LEVEL": "INFO"}),
    )
    assert parse_variant(f"before=@{REPO_ROOT}") == ("before", Variant({}, REPO_ROOT))
    name, variant = parse_variant(f"before off=@{REPO_ROOT},RAG_UVLOOP=off")
    assert name == "before off" and variant == Variant({"RAG_UVLOOP": "off"}, REPO_ROOT)
    assert variant.describe() == {"env": {"RAG_UVLOOP": "off"}, "source": str(REPO_ROOT)}


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("nothing", "NAME="),
        ("=RAG_UVLOOP=off", "NAME="),
        ("x=RAG_UVLOOP", "NAME="),
        ("x=@/nonexistent/tree", "holds no gateway"),
    ],
)
def test_a_variant_that_names_nothing_or_no_gateway_is_refused(raw: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        parse_variant(raw)


def test_a_tree_without_a_gateway_is_refused(tmp_path: Path) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="holds no gateway"):
        parse_variant(f"empty=@{tmp_path}")
