"""Rules about the code's shape that a review would otherwise have to catch by eye.

- Every error code the gateway or ingestion can raise has a status in the gateway's one table.
- The environment is read only in settings modules (configuration is read once, at start).
- The CLI root imports no package: each registers its commands through the entry-point group.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from gateway.errors import ERRORS
from tests.conftest import REPO_ROOT

PACKAGES = ("schema", "inference", "index", "gateway", "benchmarks")
_CODE = re.compile(r"^[a-z_]+(\.[a-z_]+)+$")


def _modules(*packages: str) -> Iterator[tuple[Path, ast.Module]]:
    for package in packages:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _called_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def raised_codes(*packages: str) -> dict[str, str]:
    """Code -> where, for every ``SomethingError("a.code", ...)`` call with a literal code."""
    found: dict[str, str] = {}
    for path, tree in _modules(*packages):
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and _called_name(node).endswith("Error") and node.args):
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and _CODE.match(first.value):
                found.setdefault(first.value, f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    return found


def test_every_code_the_gateway_or_ingestion_raises_has_a_status() -> None:
    codes = raised_codes("index", "gateway")
    assert len(codes) >= 8, "the scan finds the codes raised today"
    missing = {code: where for code, where in codes.items() if code not in ERRORS}
    assert not missing, f"codes raised without a status in gateway/errors.py ERRORS: {missing}"


def test_the_error_table_is_not_patched_from_other_modules() -> None:
    mutators = {"setdefault", "update", "pop", "popitem", "clear", "__setitem__"}
    for path, tree in _modules("index", "gateway"):
        if path.name == "errors.py" and path.parent.name == "gateway":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                patched = isinstance(owner, ast.Name) and owner.id == "ERRORS" and node.func.attr in mutators
                assert not patched, f"{path}:{node.lineno}: ERRORS is patched outside gateway/errors.py"
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                owner = node.value
                assert not (isinstance(owner, ast.Name) and owner.id == "ERRORS"), f"{path}:{node.lineno}"


def _reads_environment(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv", "unsetenv"):
        return isinstance(node.value, ast.Name) and node.value.id == "os"
    if isinstance(node, ast.ImportFrom) and node.module == "os":
        return any(alias.name in ("environ", "getenv") for alias in node.names)
    return False


# Settings modules read the environment; the launchers set Ray's own variables for child processes.
ENVIRONMENT_READERS = {
    "schema/settings.py",
    "index/settings.py",
    "gateway/settings.py",
    "inference/config.py",  # the sidecar's settings (SidecarSettings) and ${VAR} expansion
    "benchmarks/settings.py",
}


def test_the_environment_is_read_only_in_settings_modules() -> None:
    offenders = []
    for path, tree in _modules(*PACKAGES):
        relative = str(path.relative_to(REPO_ROOT))
        if relative in ENVIRONMENT_READERS:
            continue
        offenders += [f"{relative}:{n.lineno}" for n in ast.walk(tree) if _reads_environment(n)]
    assert not offenders, f"os.environ / os.getenv outside settings modules: {offenders}"


def test_the_cli_root_imports_no_package() -> None:
    tree = ast.parse((REPO_ROOT / "gateway" / "cli.py").read_text(encoding="utf-8"))
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert not {name.split(".")[0] for name in imported} & set(PACKAGES), imported
    assert "COMMAND_MODULES" not in (REPO_ROOT / "gateway" / "cli.py").read_text()
