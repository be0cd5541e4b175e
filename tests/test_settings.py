from __future__ import annotations

from pathlib import Path

import pytest

from schema.settings import DatabaseSettings, SettingsError, describe_settings, load_settings


def test_defaults_without_environment() -> None:
    s = load_settings(DatabaseSettings, {})
    assert s.database_url is None
    assert s.data_dir == Path(".mnemo")
    assert s.pool_size == 10


def test_environment_then_overrides() -> None:
    env = {"RAG_DATABASE_URL": "postgresql://x/y", "RAG_DB_POOL_SIZE": "3"}
    s = load_settings(DatabaseSettings, env)
    assert (s.database_url, s.pool_size) == ("postgresql://x/y", 3)
    s = load_settings(DatabaseSettings, env, pool_size=7, database_url=None)
    assert (s.database_url, s.pool_size) == ("postgresql://x/y", 7)


def test_empty_url_means_unset() -> None:
    assert load_settings(DatabaseSettings, {"RAG_DATABASE_URL": ""}).database_url is None


@pytest.mark.parametrize("env", [{"RAG_DB_POOL_SIZE": "many"}, {"RAG_DB_POOL_SIZE": "0"}])
def test_bad_values_are_named(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError, match="RAG_DB_POOL_SIZE"):
        load_settings(DatabaseSettings, env)


def test_every_setting_is_documented_in_the_readme() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for env, _default, help_text in describe_settings(DatabaseSettings):
        assert help_text
        assert f"`{env}`" in readme, f"{env} missing from README settings table"


def test_every_rag_variable_the_code_reads_is_in_the_readme() -> None:
    import re

    root = Path(__file__).resolve().parent.parent
    # The README's table, and the pages in docs/ it links (docs/budgets.md lists the budget settings).
    readme = "\n".join(p.read_text() for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))])
    named = set()
    for package in ("schema", "inference", "index", "gateway", "benchmarks"):
        for source in (root / package).rglob("*.py"):
            named |= set(re.findall(r'"(RAG_[A-Z0-9_]+)"', source.read_text()))
    assert len(named) > 10, "the scan found the settings"
    missing = sorted(v for v in named if f"`{v}`" not in readme)
    assert not missing, f"settings missing from the README table: {missing}"
