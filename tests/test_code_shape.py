"""Rules about the code's shape that a review would otherwise have to catch by eye.

- Every error code the gateway or ingestion can raise has a status in the gateway's one table.
- The environment is read only in settings modules (configuration is read once, at start), and no
  ``RAG_*`` variable by name anywhere: each through its ``setting(...)`` declaration.
- The CLI root imports no package: each registers its commands through the entry-point group.
- No import cycle among the modules of a package, counting every import (inside functions and
  under ``TYPE_CHECKING`` too, so a cycle cannot hide behind either).
- The layers hold: ``schema <- index <- gateway``, ``inference`` alone, ``benchmarks`` on top; the
  gateway and ingestion reach ``inference`` only through its public modules (:data:`INFERENCE_PUBLIC`),
  and ``schema`` only for the settings mechanism (``inference.settings``).
- The gateway imports its own code and the other packages at module level (``gateway/run/commands.py``
  stays light on purpose; FAISS loads lazily).
- Size bars (issue 46): no product module over :data:`MAX_MODULE_LINES` lines and no product
  function over :data:`MAX_FUNCTION_LINES` (``end_lineno - lineno + 1``, decorators not counted).

``python -m tests.test_code_shape`` prints each package's import cycles and its imports of other
packages: the graph these rules check.
"""

from __future__ import annotations

import ast
import gc
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from gateway.base.errors import ERRORS
from tests.conftest import REPO_ROOT

PACKAGES = ("schema", "inference", "index", "gateway", "benchmarks")
_CODE = re.compile(r"^[a-z_]+(\.[a-z_]+)+$")


def _modules(*packages: str) -> Iterator[tuple[Path, ast.Module]]:
    for package in packages:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            yield path, _parse(path)


def _parse(path: Path) -> ast.Module:
    """``ast.parse``, with the garbage collector held off and one more try on CPython's spurious
    ``SystemError: AST constructor recursion depth mismatch`` (python/cpython#106905: an error inside
    the AST converter, such as one a finalizer leaves mid-parse, leaks its depth count). Seen once in
    a whole-suite run after the database and browser tests; parsing is pure, so a retry is exact."""
    source = path.read_text(encoding="utf-8")
    enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            return ast.parse(source, filename=str(path))
        except SystemError:
            return ast.parse(source, filename=str(path))
    finally:
        if enabled:
            gc.enable()


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
    assert not missing, f"codes raised without a status in gateway/base/errors.py ERRORS: {missing}"


def test_the_error_table_is_not_patched_from_other_modules() -> None:
    mutators = {"setdefault", "update", "pop", "popitem", "clear", "__setitem__"}
    for path, tree in _modules("index", "gateway"):
        if path.name == "errors.py" and path.parent.name == "gateway":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                patched = isinstance(owner, ast.Name) and owner.id == "ERRORS" and node.func.attr in mutators
                assert not patched, f"{path}:{node.lineno}: ERRORS is patched outside gateway/base/errors.py"
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
    "inference/settings.py",  # the one mechanism (load_settings) and the sidecar's settings
    "schema/settings.py",
    "index/settings.py",
    "gateway/base/settings.py",
    "inference/config.py",  # sets Ray's own variables (RAY_*) before ray.init, reads no RAG_* itself
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


def _is_os_environ(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr in ("environ", "getenv")
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _reads_a_rag_variable_by_name(node: ast.AST, any_mapping: bool) -> bool:
    """``os.environ["RAG_X"]``, ``os.getenv("RAG_X")``, ``os.environ.get("RAG_X")``; with
    ``any_mapping``, ``env.get("RAG_X")`` on any mapping too (in a settings module, ``env`` is the
    environment): a read that bypasses the declarations, where ``load_settings`` reads each
    declared variable through its field."""

    def rag(key: ast.AST) -> bool:
        return isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.startswith("RAG_")

    if isinstance(node, ast.Call) and node.args and rag(node.args[0]):
        func = node.func
        if _is_os_environ(func):  # os.getenv("RAG_X")
            return True
        if isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault"):
            return any_mapping or _is_os_environ(func.value)
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and rag(node.slice):
        return any_mapping or _is_os_environ(node.value)
    return False


def test_no_rag_variable_is_read_by_name() -> None:
    """Settings modules included: every ``RAG_*`` variable is read through its ``setting(...)``
    declaration, so the settings catalog (docs/configuration.md) lists whatever the code reads."""
    offenders = []
    for path, tree in _modules(*PACKAGES):
        relative = str(path.relative_to(REPO_ROOT))
        in_settings = relative in ENVIRONMENT_READERS
        offenders += [
            f"{relative}:{n.lineno}" for n in ast.walk(tree) if _reads_a_rag_variable_by_name(n, in_settings)
        ]
    assert not offenders, f"RAG_* variables read by name instead of through a declaration: {offenders}"


def test_the_cli_root_imports_no_package() -> None:
    tree = _parse(REPO_ROOT / "gateway" / "cli.py")
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert not {name.split(".")[0] for name in imported} & set(PACKAGES), imported
    assert "COMMAND_MODULES" not in (REPO_ROOT / "gateway" / "cli.py").read_text()


# -- the import graph ------------------------------------------------------------------------------

# The modules of ``inference`` that the gateway and ingestion may import (DESIGN: "through
# inference/client.py and the small helpers that inference names as public").
# As inference/__init__.py names them: the client, its error codes, and small helpers both sides share.
INFERENCE_PUBLIC = frozenset(
    {
        "inference.client",
        "inference.errors",
        "inference.strict_json",
        "inference.json_out",
        "inference.http_protocol",
        "inference.net",
        "inference.images",
        "inference.eventloop",
        "inference.ray_local",
        "inference.settings",
    }
)
# First-party packages each package may import (itself included); benchmarks may import any.
LAYERS: Mapping[str, frozenset[str]] = {
    "schema": frozenset({"schema", "inference"}),  # SCHEMA_FROM_INFERENCE alone
    "inference": frozenset({"inference"}),
    "index": frozenset({"schema", "index", "inference"}),
    "gateway": frozenset({"schema", "index", "gateway", "inference"}),
    "benchmarks": frozenset(PACKAGES),
}
# The one module of ``inference`` the bottom layer uses: the settings mechanism every package shares.
SCHEMA_FROM_INFERENCE = "inference.settings"
# Modules that may import more of ``inference`` than its public surface, and why.
INFERENCE_INSIDERS = {
    "index.bulk.image_jobs_ray": "DESIGN 1: a Ray Data job loads the encoder code directly in its actors",
}
# Function-level imports of first-party code the gateway keeps on purpose: module -> imported prefixes.
GATEWAY_LAZY_IMPORTS = {
    "gateway.run.commands": ("",),  # registration stays light: `mnemo --help` imports no app, no driver
    "gateway.web.app": (
        "index.vectors.faiss_backend",
        "index.vectors.cache",
        "index.vectors.mapped_cache",
    ),  # FAISS only when a cache is configured
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement names (``from a import b`` names ``a`` and ``a.b``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module_name(path).split(".")
        if path.name != "__init__.py":
            package = package[:-1]
        anchor = ".".join(package[: len(package) - node.level + 1])
        base = f"{anchor}.{base}" if base else anchor
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def imports_of(path: Path, tree: ast.Module) -> list[tuple[str, int, bool]]:
    """(module, line, inside a function) for every import in the file."""
    nested = {
        id(node)
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(fn)
    }
    return [
        (name, node.lineno, id(node) in nested)
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in _imported(path, node)
    ]


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (the package's ``__init__`` left out)."""
    trees = {module_name(path): (path, tree) for path, tree in _modules(package)}
    return {
        module: {
            name for name, _, _ in imports_of(path, tree) if name in trees and name not in (module, package)
        }
        for module, (path, tree) in trees.items()
    }


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = [stack.pop()]
            while component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _is_module(name: str) -> bool:
    path = REPO_ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def outward_imports(package: str) -> dict[str, set[str]]:
    """Module -> the first-party modules of other packages it imports."""
    out: dict[str, set[str]] = {}
    for path, tree in _modules(package):
        names = {
            n
            for n, _, _ in imports_of(path, tree)
            if n.split(".")[0] in PACKAGES and n.split(".")[0] != package and _is_module(n)
        }
        if names:
            out[module_name(path)] = names
    return out


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    assert cycles(graph) == [["p.a", "p.b", "p.c"]]
    assert cycles({"p.a": {"p.b"}, "p.b": set()}) == []


def test_no_package_has_an_import_cycle() -> None:
    found = {package: cycles(import_graph(package)) for package in PACKAGES}
    assert sum(len(import_graph(p)) for p in PACKAGES) > 100, "the scan reads the packages"
    assert not any(found.values()), f"import cycles (every import counted): {found}"


def test_imports_follow_the_layers() -> None:
    offenders = []
    for package in PACKAGES:
        for module, names in outward_imports(package).items():
            for name in sorted(names):
                top = name.split(".")[0]
                if top not in LAYERS[package]:
                    offenders.append(f"{module} imports {name} (up or across the layers)")
                elif (
                    top == "inference"
                    and package in ("index", "gateway")
                    and not any(name == m or name.startswith(m + ".") for m in INFERENCE_PUBLIC)
                    and module not in INFERENCE_INSIDERS
                ):
                    offenders.append(f"{module} imports {name}, not one of inference's public modules")
                elif top == "inference" and package == "schema" and name != SCHEMA_FROM_INFERENCE:
                    offenders.append(f"{module} imports {name}: schema takes only {SCHEMA_FROM_INFERENCE}")
    assert not offenders, offenders


def test_the_gateway_imports_its_code_at_module_level() -> None:
    """A function-level import of first-party code hides a cycle or an upward import; only the kept
    lazy ones remain (the CLI registration, FAISS)."""
    offenders = []
    for path, tree in _modules("gateway"):
        module = module_name(path)
        for name, line, nested in imports_of(path, tree):
            if not nested or name.split(".")[0] not in PACKAGES:
                continue
            if not any(name.startswith(prefix) for prefix in GATEWAY_LAZY_IMPORTS.get(module, ())):
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{line} imports {name} inside a function")
    assert not offenders, offenders


# Issue 46's bars, over the product packages (benchmarks and tests are tools around the product).
PRODUCT_PACKAGES = ("schema", "inference", "index", "gateway")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def size_offences(where: str, source: str, tree: ast.Module) -> list[str]:
    """Where ``source`` (parsed as ``tree``) is over a bar: the module, and each function or
    method (nested ones too), each with its line count."""
    offences = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        offences.append(f"{where}: {lines} lines (bar {MAX_MODULE_LINES})")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                offences.append(
                    f"{where}:{node.lineno} {node.name}: {length} lines (bar {MAX_FUNCTION_LINES})"
                )
    return offences


def test_the_size_bars_count_modules_and_nested_functions() -> None:
    """A decorated function counts from its ``def``; a nested one counts alone and inside its outer."""
    lines = ["@decorated", "def outer() -> None:", "    def inner() -> None:"]
    lines += [f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES)]  # inner: 81 lines, outer: 82
    lines += ["", "", "async def fits() -> None:", "    pass"]
    lines += [""] * (MAX_MODULE_LINES + 1 - len(lines))
    source = "\n".join(lines) + "\n"
    assert size_offences("m.py", source, ast.parse(source)) == [
        f"m.py: {MAX_MODULE_LINES + 1} lines (bar {MAX_MODULE_LINES})",
        f"m.py:2 outer: {MAX_FUNCTION_LINES + 2} lines (bar {MAX_FUNCTION_LINES})",
        f"m.py:3 inner: {MAX_FUNCTION_LINES + 1} lines (bar {MAX_FUNCTION_LINES})",
    ]


def test_no_product_module_or_function_is_over_its_size_bar() -> None:
    offences = []
    for path, tree in _modules(*PRODUCT_PACKAGES):
        offences += size_offences(str(path.relative_to(REPO_ROOT)), path.read_text(encoding="utf-8"), tree)
    assert not offences, "split by job (issue 46):\n" + "\n".join(offences)


# A folder beside the checkout that a clone from a public host does not have (issue 55). Spelled in
# two parts so this file does not name it.
BESIDE_THE_CHECKOUT = "../" + "shared"
STANDALONE_PATHS = ("README.md", "Makefile", "pyproject.toml", "docs", *PACKAGES, "tests", "examples")


def test_the_repository_stands_alone() -> None:
    """No code, test, script or page reads or names a folder beside the checkout: the data sets the
    tests, benchmarks and README use live in ``benchmarks/datasets``."""
    texts = {".md", ".py", ".sh", ".toml", ".json", ".yaml", ".txt", ""}
    offences = []
    for name in STANDALONE_PATHS:
        top = REPO_ROOT / name
        for path in [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.suffix in texts):
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
            where = path.relative_to(REPO_ROOT)
            offences += [
                f"{where}:{n}: {line.strip()}"
                for n, line in enumerate(lines, 1)
                if BESIDE_THE_CHECKOUT in line
            ]
    assert not offences, "\n".join(offences)


# No test asserts on a timing or on a figure computed from one (issue 55): under load such an
# assertion fails a good run. The patterns, in a test's ``assert``:
# 1. a clock reading (``time.perf_counter/monotonic/time/process_time()``, ``loop.time()``, their
#    ``_ns`` forms) compared with ``<``, ``<=``, ``>``, ``>=``, ``==`` or ``!=``, directly or through a
#    name bound from one (transitively: ``elapsed = time.monotonic() - started``);
# 2. an ordering comparison (``<``, ``<=``, ``>``, ``>=``) on a measured figure: a key such as
#    ``"load_s"``, ``"p50_ms"``, ``"items_per_s"``, ``"latency"``, ``"ratio"``, ``"embed_share"``,
#    ``"batch_overhead_tokens"`` (:data:`MEASURED_KEY`), or a name bound from one;
# 3. an ordering comparison on a name that says it is a time: elapsed, duration, took, latency,
#    stall, lag (:data:`TIMING_NAME`).
# Assert the property with the measurement injected instead (given these timings, this figure;
# given this overhead, these batches), or that the figure was reported (``math.isfinite``).
CLOCK_READS = {
    "perf_counter",
    "perf_counter_ns",
    "monotonic",
    "monotonic_ns",
    "time",
    "time_ns",
    "process_time",
}
MEASURED_KEY = re.compile(
    r"(_s|_ms|_us|_ns)$"
    r"|(^|_)(seconds|per_s|elapsed|duration|took|latency|lag|overhead|wall|speedup|ratios?|share|p50|p95|p99)(_|$)"
)
TIMING_NAME = re.compile(r"(^|_)(elapsed|duration|took|latency|stall|lag)(_|$)")
_ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _reads_clock(node: ast.AST) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return (
        isinstance(func, ast.Attribute)
        and func.attr in CLOCK_READS
        and isinstance(func.value, ast.Name)
        and func.value.id in {"time", "loop"}
    )


def _measured_key(node: ast.AST) -> bool:
    key = node.slice if isinstance(node, ast.Subscript) else None
    return (
        isinstance(key, ast.Constant) and isinstance(key.value, str) and bool(MEASURED_KEY.search(key.value))
    )


def _bindings(function: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(target, value) of every assignment, loop and comprehension in ``function``."""
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            yield from ((target, node.value) for target in node.targets)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr) and node.value is not None:
            yield node.target, node.value
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            yield node.target, node.iter


def _tainted(function: ast.AST, source: Callable[[ast.AST], bool]) -> set[str]:
    """Names bound (directly or through other such names) from an expression with a ``source`` node."""
    names: set[str] = set()
    while True:
        grown = set(names)
        for target, value in _bindings(function):
            inner = list(ast.walk(value))
            if any(source(n) for n in inner) or {n.id for n in inner if isinstance(n, ast.Name)} & names:
                grown |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        if grown == names:
            return names
        names = grown


def timing_assertions(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, why) for every comparison in an ``assert`` that follows one of the patterns above."""
    found = []
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        clocked, measured = _tainted(function, _reads_clock), _tainted(function, _measured_key)
        for compare in (c for a in ast.walk(function) if isinstance(a, ast.Assert) for c in ast.walk(a.test)):
            if not isinstance(compare, ast.Compare):
                continue
            inner = [n for term in (compare.left, *compare.comparators) for n in ast.walk(term)]
            called = {id(n.func) for n in inner if isinstance(n, ast.Call)}
            names = {n.id for n in inner if isinstance(n, ast.Name) and id(n) not in called}
            why = []
            if any(isinstance(op, (*_ORDERING, ast.Eq, ast.NotEq)) for op in compare.ops) and (
                any(_reads_clock(n) for n in inner) or names & clocked
            ):
                why.append("a clock reading")
            if any(isinstance(op, _ORDERING) for op in compare.ops):
                why += [f"the measured {n.slice.value!r}" for n in inner if _measured_key(n)]  # type: ignore[attr-defined]
                why += [f"{name!r}, bound from a measured figure" for name in sorted(names & measured)]
                why += [f"{name!r}, a time by its name" for name in sorted(names) if TIMING_NAME.search(name)]
            if why:
                found.append((compare.lineno, f"{ast.unparse(compare)}: {'; '.join(why)}"))
    return found


def test_the_timing_check_catches_what_failed_under_load() -> None:
    """The warm-up test as it was (its overhead came out at the cap on a loaded machine), the
    keep-alive test's wall-clock bound, a stall limit; and none of the forms that replaced them."""
    caught = """
def test_old(service, encoder, opened, loop):
    overhead = service.info()["batch_overhead_tokens"]
    assert 1 <= overhead < encoder.spec.max_batch_tokens
    assert loop.time() - opened < 20
    started = time.perf_counter()
    elapsed = time.perf_counter() - started
    assert elapsed == 0.5
    assert all(r > 0 for r in cell["window_ratios"]) and stall_ms < 50
"""
    assert [line for line, _ in timing_assertions(ast.parse(caught))] == [4, 5, 8, 9, 9]
    fine = """
def test_new(service, encoder, token, v, lengths, overhead):
    assert pass_overhead_tokens((16, 0.0116), (1024, 0.1124), 2048) == pytest.approx(100)
    handed = service._batchers["main"].batch_overhead_tokens
    assert isinstance(handed, float) and service.info()["batch_overhead_tokens"] == round(handed, 1)
    token = sign(int(time.time()) + 2)  # a clock reading, but no assertion compares it
    assert math.isfinite(cell["load_s"]) and v.verify(token) is not None
    assert cost(plan(lengths, overhead)) <= cost(filled(lengths), overhead)
    assert QUICK.sidecar.sweep_seconds <= FULL.sidecar.sweep_seconds
"""
    assert timing_assertions(ast.parse(fine)) == []


def test_no_test_asserts_on_a_timing() -> None:
    offences = [
        f"{path.relative_to(REPO_ROOT)}:{line}: {why}"
        for path in sorted((REPO_ROOT / "tests").rglob("*.py"))
        for line, why in timing_assertions(_parse(path))
    ]
    assert not offences, "assert the property with the measurement injected (issue 55):\n" + "\n".join(
        offences
    )


def describe_imports(edges_of: tuple[str, ...] = ()) -> str:
    """Each package's import cycles and outward imports (and the internal edges of ``edges_of``), as
    ``python -m tests.test_code_shape [PACKAGE ...]`` prints them."""
    lines = []
    for package in PACKAGES:
        graph = import_graph(package)
        edges = sum(len(v) for v in graph.values())
        lines.append(
            f"{package}: {len(graph)} modules, {edges} internal imports, cycles: {cycles(graph) or 'none'}"
        )
        targets = sorted({n for names in outward_imports(package).values() for n in names})
        lines.append(f"  imports from other packages: {', '.join(targets) or 'none'}")
        if package in edges_of:
            lines += [f"  {m} -> {', '.join(sorted(graph[m])) or '-'}" for m in sorted(graph)]
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(describe_imports(tuple(sys.argv[1:])))
