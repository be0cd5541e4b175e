"""Size bars for the ``inference`` package: modules of one job, functions that fit on a screen.

A module over 600 lines or a function over 80 (its AST span, decorators excluded) is split by job,
not cut in the middle; this test names each offender with its size.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "inference"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 20, "the scan reads the package"
    return paths


def test_no_inference_module_is_over_the_bar() -> None:
    sizes = {p.relative_to(PACKAGE.parent): len(p.read_text().splitlines()) for p in _modules()}
    over = {str(p): n for p, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_no_inference_function_is_over_the_bar() -> None:
    over = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    over[f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"] = size
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"
