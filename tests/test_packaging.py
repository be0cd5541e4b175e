"""Mnemo's packages must import from this repository, never from PyPI namesakes."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import COMMAND_MODULES, build_parser

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


def test_every_command_module_registers_something() -> None:
    present = []
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        assert callable(module.register), name
        present.append(name)
    assert "schema.cli" in present and "gateway.commands" in present
