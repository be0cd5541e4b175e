"""The gateway suite's levers section: a variant's settings, a source tree to run the gateway from,
and loud errors for anything else (``gateway.levers``, checked before the suite measures)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.levers import Variant, levers_table, parse_variant

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_a_variant_holds_settings_a_source_tree_or_both() -> None:
    assert parse_variant("asyncio=RAG_UVLOOP=off+RAG_LOG_LEVEL=INFO") == (
        "asyncio",
        Variant({"RAG_UVLOOP": "off", "RAG_LOG_LEVEL": "INFO"}),
    )
    assert parse_variant(f"before=@{REPO_ROOT}") == ("before", Variant({}, REPO_ROOT))
    name, variant = parse_variant(f"before off=@{REPO_ROOT}+RAG_UVLOOP=off")
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
    with pytest.raises(ValueError, match=says):
        parse_variant(raw)


def test_a_tree_without_a_gateway_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="holds no gateway"):
        parse_variant(f"empty=@{tmp_path}")


def test_the_table_gives_each_variant_its_ratios_to_the_first_with_the_passes_spread() -> None:
    def cell(p50: float, rps: float, cpu: float | None = None) -> dict:
        return {"p50": p50, "rps": rps} | ({} if cpu is None else {"cpu_ms": cpu})

    from benchmarks.levers import _summarize

    windows = [{"a": cell(2.0, 100.0, 1.0), "b": cell(1.0, 150.0, 0.8), "sql": cell(1.0, 200.0)},
               {"a": cell(2.0, 100.0, 1.0), "b": cell(1.6, 120.0, 0.9), "sql": cell(1.0, 200.0)}]  # fmt: skip
    result = {
        "variants": {"a": {}, "b": {}},
        "pairs": 2,
        "points": [{"concurrency": 1, **_summarize(windows, ["a", "b"])}],
    }
    table = levers_table(result, 10_000)
    a, b, sql = table.rows
    assert [a[1], b[1], sql[1]] == ["a", "b", "sql"] and a[6:] == ["", "", ""]
    assert b[2] == 1.3 and b[5] == 1.3  # median p50 of the passes, and over the legs' SQL
    assert b[6] == "0.650 (0.50-0.80)"  # p50 ratio to a, and each pass's own ratio
    assert sql[4] is None and "ratios to 'a'" in table.title
