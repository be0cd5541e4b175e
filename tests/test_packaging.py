"""Mnemo's packages must import from this repository, never from PyPI namesakes."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from gateway.cli import build_parser, command_entry_points

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["schema", "inference", "index", "gateway", "benchmarks"])
def test_package_imports_from_this_repository(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__file__ is not None
    assert Path(module.__file__).resolve().parent == REPO_ROOT / name


def test_migrations_ship_as_package_data() -> None:
    from schema import load_migrations

    names = [f"{m.version:04d}_{m.name}" for m in load_migrations()]
    assert names[:4] == ["0001_extensions", "0002_embeddings", "0003_queue", "0004_sections"]


def test_cli_help_lists_every_subcommand() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
    ).stdout
    parser = build_parser()
    subcommands = next(a for a in parser._actions if a.dest == "command").choices
    assert {"migrate", "db", "up"} <= set(subcommands)
    for name in subcommands:
        assert name in out


def test_every_package_registers_its_commands_through_the_entry_point_group() -> None:
    names = {ep.name: ep for ep in command_entry_points()}
    assert set(names) == {"schema", "inference", "index", "gateway", "benchmarks"}
    for name, entry_point in names.items():
        assert entry_point.module.split(".")[0] == name, "each package registers its own commands"
        assert callable(entry_point.load()), name


def _unshipped(package: str, folder: str) -> tuple[list[str], list[str]]:
    """(every file under ``folder`` of ``package``, those no package-data glob of it matches)."""
    import tomllib

    patterns = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ][package]
    root = REPO_ROOT.joinpath(*package.split("."))
    files = sorted(p.relative_to(root).as_posix() for p in (root / folder).rglob("*") if p.is_file())
    return files, [f for f in files if not any(_glob_matches(f, p) for p in patterns)]


def _glob_matches(path: str, pattern: str) -> bool:
    """As setuptools' glob: a ``*`` never crosses a ``/`` (fnmatch's does)."""
    return len(PurePosixPath(path).parts) == len(PurePosixPath(pattern).parts) and PurePosixPath(path).match(
        pattern
    )


def test_the_console_files_ship_as_package_data() -> None:
    """Every file of gateway/web/console/ matches a package-data pattern (else a wheel lacks it and
    /console answers 404 once installed)."""
    files, unshipped = _unshipped("gateway.web", "console")
    assert {"console/index.html", "console/console.js", "console/docs.html"} <= set(files)
    assert unshipped == []


def test_the_bundled_data_sets_ship_as_package_data() -> None:
    """Every file of benchmarks/datasets/ (the BEIR collections, the coins, their SOURCE.txt) matches
    a package-data pattern: an installed ``mnemo bench`` reads the same data sets as a checkout."""
    files, unshipped = _unshipped("benchmarks", "datasets")
    assert {
        "datasets/adi/corpus.jsonl",
        "datasets/adi/qrels/test.tsv",
        "datasets/coins/manifest.jsonl",
    } <= set(files)
    assert len([f for f in files if f.endswith(".jpg")]) == 96
    assert unshipped == []


def test_every_package_folder_ships() -> None:
    """Setuptools' discovery is off, so a subpackage missing from ``packages`` is missing from a
    wheel: every folder with an ``__init__.py`` under the product packages is listed."""
    import tomllib

    listed = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(init.parent.relative_to(REPO_ROOT).parts)
        for top in ("schema", "inference", "index", "gateway", "benchmarks")
        for init in (REPO_ROOT / top).rglob("__init__.py")
    }
    assert folders - listed == set()
