from __future__ import annotations

import ast
import dataclasses
import re
import types
from pathlib import Path

import pytest

import inference.settings
import schema.settings
from gateway.base.settings_catalog import (
    DOCS_DIR,
    REGENERATE,
    SETTINGS_MODULES,
    DuplicateSetting,
    catalog,
    generated_files,
    stale_files,
)
from gateway.cli import main
from inference.config import ConfigError, config_from_dict
from inference.settings import declarations
from schema.embedded_config import shared_buffers_size
from schema.settings import DatabaseSettings, SettingsError, load_settings, setting


def test_defaults_without_environment() -> None:
    s = load_settings(DatabaseSettings, {})
    assert s.database_url is None
    assert s.data_dir == Path(".mnemo")
    assert (s.pool_size, s.read_pool_size) == (10, 10)


def test_environment_then_overrides() -> None:
    env = {"RAG_DATABASE_URL": "postgresql://x/y", "RAG_DB_POOL_SIZE": "3"}
    s = load_settings(DatabaseSettings, env)
    assert (s.database_url, s.pool_size) == ("postgresql://x/y", 3)
    s = load_settings(DatabaseSettings, env, pool_size=7, database_url=None)
    assert (s.database_url, s.pool_size) == ("postgresql://x/y", 7)


def test_empty_url_means_unset() -> None:
    assert load_settings(DatabaseSettings, {"RAG_DATABASE_URL": ""}).database_url is None


def test_an_empty_directory_is_refused_not_read_as_the_working_directory() -> None:
    with pytest.raises(SettingsError, match="RAG_DATA_DIR is empty: unset it, or name a directory"):
        load_settings(DatabaseSettings, {"RAG_DATA_DIR": " "})
    with pytest.raises(ConfigError, match="RAG_MODELS_DIR is empty"):
        config_from_dict(
            {"models": [{"id": "a", "kind": "text", "weights": "${RAG_MODELS_DIR}/a"}]},
            environ={"RAG_MODELS_DIR": ""},
        )


@pytest.mark.parametrize(
    "env",
    [
        {"RAG_DB_POOL_SIZE": "many"},
        {"RAG_DB_POOL_SIZE": "0"},
        {"RAG_DB_READ_POOL_SIZE": "four"},
        {"RAG_DB_READ_POOL_SIZE": "0"},
    ],
)
def test_bad_values_are_named(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError, match=next(iter(env))):
        load_settings(DatabaseSettings, env)


@pytest.mark.parametrize("value", ["2 GB", "2g", "0MB", "-1GB", "lots", ""])
def test_a_shared_buffers_size_without_its_unit_is_refused(value: str) -> None:
    with pytest.raises(SettingsError, match="RAG_EMBEDDED_SHARED_BUFFERS must be auto or a size"):
        load_settings(DatabaseSettings, {"RAG_EMBEDDED_SHARED_BUFFERS": value})


def test_auto_shared_buffers_is_a_quarter_of_the_memory_within_postgresqls_bounds() -> None:
    gib = 1 << 30
    assert shared_buffers_size("auto", 24 * gib) == "6144MB"
    assert shared_buffers_size("auto", 256 << 20) == "128MB", "never below PostgreSQL's own default"
    assert shared_buffers_size("auto", 1024 * gib) == "32768MB"
    assert shared_buffers_size("3GB", 24 * gib) == "3GB", "a size named is the size used"
    assert load_settings(DatabaseSettings, {}).embedded_shared_buffers == "auto"


# -- the settings catalog -----------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("schema", "inference", "index", "gateway", "benchmarks")
RAG_NAME = re.compile(r"RAG_[A-Z0-9_]+")


def _declared() -> set[str]:
    return {d.env for group in catalog() for d in group.declarations}


def test_the_committed_reference_and_env_example_are_generated_from_the_catalog() -> None:
    stale = stale_files(REPO / DOCS_DIR)
    assert not stale, (
        f"{[str(p.relative_to(REPO)) for p in stale]} differ from the catalog: run `{REGENERATE}`"
    )


def test_every_declaration_says_what_it_means_on_one_line() -> None:
    groups = catalog()
    assert sum(len(g.declarations) for g in groups) > 90, "the catalog collects every package's settings"
    for group in groups:
        for declared in group.declarations:
            assert declared.env.startswith("RAG_") and RAG_NAME.fullmatch(declared.env), declared
            assert declared.meaning and "\n" not in declared.meaning + declared.tradeoff, declared


def _names_in_python(path: Path) -> set[str]:
    """Every string constant of ``path`` that is exactly a ``RAG_*`` name: a key read from the
    environment (os.environ, getenv, environ.get, configured(...)), set for a child process, or named
    for a declaration."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and RAG_NAME.fullmatch(node.value)
    }


def _names_in_config(path: Path) -> set[str]:
    """``${RAG_...}`` references of a YAML config, and ``RAG_*=`` assignments of a Dockerfile."""
    text = path.read_text()
    return set(re.findall(r"\$\{(RAG_[A-Z0-9_]+)", text)) | set(re.findall(r"\b(RAG_[A-Z0-9_]+)=", text))


def test_the_config_census_finds_no_undeclared_variable() -> None:
    """Every ``RAG_*`` name product code reads, passes on or names in a config is in the catalog."""
    named: dict[str, set[str]] = {}
    for package in PRODUCT:
        for path in (REPO / package).rglob("*"):
            if path.suffix == ".py":
                found = _names_in_python(path)
            elif path.suffix in (".yaml", ".yml"):
                found = _names_in_config(path)
            else:
                continue
            for name in found:
                named.setdefault(name, set()).add(str(path.relative_to(REPO)))
    for name in _names_in_config(REPO / "Dockerfile.gpu"):
        named.setdefault(name, set()).add("Dockerfile.gpu")
    assert {"RAG_MODELS_DIR", "RAG_DATA_DIR", "RAG_UVLOOP", "RAG_SIDECAR_PORT"} <= set(named), (
        "the scan works"
    )
    undeclared = {name: sorted(where) for name, where in named.items() if name not in _declared()}
    assert not undeclared, f"RAG_* names read without a declaration in the settings catalog: {undeclared}"


def test_settings_are_declared_only_in_the_catalogs_modules() -> None:
    """A ``setting(...)`` field anywhere else would be read by load_settings but missing from the docs."""
    catalogued = {str(REPO / (m.__name__.replace(".", "/") + ".py")) for m in SETTINGS_MODULES}
    offenders = []
    for package in PRODUCT:
        for path in (REPO / package).rglob("*.py"):
            if str(path) in catalogued:
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            offenders += [
                f"{path.relative_to(REPO)}:{node.lineno}"
                for node in ast.walk(tree)
                if isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and (node.func.id == "setting" or node.func.id.endswith("_setting"))
            ]
    assert not offenders, (
        f"settings declared outside {sorted(m.__name__ for m in SETTINGS_MODULES)}: {offenders}"
    )


def test_two_different_declarations_of_one_variable_are_refused() -> None:
    module = types.ModuleType("fake_settings")

    @dataclasses.dataclass(frozen=True)
    class First:
        port: int = setting("RAG_FAKE_PORT", 1, "A port.")

    @dataclasses.dataclass(frozen=True)
    class Second:
        port: int = setting("RAG_FAKE_PORT", 2, "A port.")

    for cls in (First, Second):
        cls.__module__, cls.__qualname__ = module.__name__, cls.__name__
        setattr(module, cls.__name__, cls)
    with pytest.raises(
        DuplicateSetting,
        match=r"RAG_FAKE_PORT is declared by fake_settings\.First and again, differently, by fake_settings\.Second",
    ):
        catalog((module,))
    # One declaration bound by two classes is listed once, under the first, naming the other.
    shared = catalog((schema.settings, inference.settings))
    data_dir = [g for g in shared if any(d.env == "RAG_DATA_DIR" for d in g.declarations)]
    assert [g.name for g in data_dir] == ["DatabaseSettings"]
    assert data_dir[0].also_read_by == {"RAG_DATA_DIR": ("inference.settings.ModelFilesSettings",)}


def test_the_meaning_and_the_tradeoff_come_apart() -> None:
    @dataclasses.dataclass(frozen=True)
    class Example:
        split: float = setting("RAG_A", 1.0, "Seconds per `x.y` call, e.g. a retry. Lower fails sooner.")
        explicit: int = setting("RAG_B", 2, "A count. Of things.", tradeoff="More costs memory.")
        alone: bool = setting("RAG_C", True, "A switch.")
        unset: str | None = setting("RAG_D", None, "A name.")

    rows = {d.env: (d.type, d.default, d.meaning, d.tradeoff) for d in declarations(Example)}
    assert rows == {
        "RAG_A": ("float", "1.0", "Seconds per `x.y` call, e.g. a retry.", "Lower fails sooner."),
        "RAG_B": ("int", "2", "A count. Of things.", "More costs memory."),
        "RAG_C": ("bool", "true", "A switch.", ""),
        "RAG_D": ("str", None, "A name.", ""),
    }


def test_mnemo_settings_docs_writes_the_files_and_check_names_a_stale_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["settings", "docs", "--docs-dir", str(tmp_path)]) == 0
    for name, text in generated_files().items():
        assert (tmp_path / name).read_text() == text
    assert main(["settings", "docs", "--check", "--docs-dir", str(tmp_path)]) == 0
    (tmp_path / "mnemo.env.example").write_text("# RAG_OLD=1\n")
    assert main(["settings", "docs", "--check", "--docs-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "mnemo.env.example differs from the settings catalog: run `mnemo settings docs`" in err
    assert "configuration.md" not in err
