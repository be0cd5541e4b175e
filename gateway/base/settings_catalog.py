"""The settings catalog: every ``RAG_*`` variable Mnemo reads, collected from the classes that
declare them, and the two files generated from it, ``docs/configuration.md`` (the reference) and
``docs/mnemo.env.example`` (a sample env file, every variable commented out with its default).

Declarations stay beside the code that reads them, as ``setting(...)`` fields of each package's
settings module (the mechanism is ``inference.settings``'s); this module only collects them. It
lives in ``gateway`` because the gateway is the one service package that may import every other
package's settings (``benchmarks`` declare none of their own: they load the services' classes).
A settings class added to one of :data:`SETTINGS_MODULES` joins the catalog without a line here;
``tests/test_settings.py`` fails when code reads a ``RAG_*`` name the catalog does not declare.

``mnemo settings docs`` regenerates the files; ``--check`` says whether the committed ones are current.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from types import ModuleType

import gateway.base.ask_settings
import gateway.base.budget_settings
import gateway.base.settings
import index.settings
import inference.settings
import schema.settings
from inference.settings import Declaration, declarations

__all__ = [
    "DOCS_DIR",
    "REGENERATE",
    "SETTINGS_MODULES",
    "DuplicateSetting",
    "SettingsGroup",
    "catalog",
    "generated_files",
    "render_env_example",
    "render_reference",
    "stale_files",
    "write_files",
]

# In the order the reference lists them: the layers, bottom up.
SETTINGS_MODULES: tuple[ModuleType, ...] = (
    schema.settings,
    inference.settings,
    index.settings,
    gateway.base.settings,
    gateway.base.ask_settings,
    gateway.base.budget_settings,
)
PACKAGE_TITLES = {
    "schema": "the database",
    "inference": "the inference sidecar",
    "index": "ingestion, media and the sidecar's clients",
    "gateway": "the gateway, its actions and `mnemo mcp`",
}
DOCS_DIR = Path("docs")  # relative to the repository root, where the command is run
REFERENCE = "configuration.md"
ENV_EXAMPLE = "mnemo.env.example"
REGENERATE = "mnemo settings docs"


class DuplicateSetting(ValueError):
    """Two settings classes declare one environment variable differently."""


@dataclasses.dataclass(frozen=True)
class SettingsGroup:
    """The variables one settings class declares first (a variable two classes bind is listed once)."""

    owner: str  # "package.module.Class"
    summary: str  # the first line of the class's docstring
    declarations: tuple[Declaration, ...]
    also_read_by: dict[str, tuple[str, ...]]  # env -> the other classes binding the same declaration

    @property
    def package(self) -> str:
        return self.owner.split(".")[0]

    @property
    def name(self) -> str:
        return self.owner.rsplit(".", 1)[1]


def _settings_classes(module: ModuleType) -> list[type]:
    """The dataclasses ``module`` defines (in definition order) that declare at least one variable."""
    return [
        value
        for value in vars(module).values()
        if inspect.isclass(value)
        and value.__module__ == module.__name__
        and dataclasses.is_dataclass(value)
        and declarations(value)
    ]


def _summary(cls: type) -> str:
    """The first line of the class's own docstring, in Markdown (``x`` and :func:`x` as `x`)."""
    doc = inspect.getdoc(cls) or ""
    if doc.startswith(f"{cls.__name__}("):  # no docstring: the one dataclass() writes from the fields
        return ""
    first = doc.splitlines()[0] if doc else ""
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", first).replace("``", "`")


def _same(a: Declaration, b: Declaration) -> bool:
    return (a.type, a.default, a.meaning, a.tradeoff) == (b.type, b.default, b.meaning, b.tradeoff)


def catalog(modules: tuple[ModuleType, ...] = SETTINGS_MODULES) -> tuple[SettingsGroup, ...]:
    """Every declared variable, grouped by the class that declares it first.

    Raises :class:`DuplicateSetting` when two classes declare one variable with different types,
    defaults or words: a variable read in two places binds one declaration (e.g.
    ``inference.settings.sidecar_api_key_setting``)."""
    first: dict[str, Declaration] = {}
    readers: dict[str, list[str]] = {}
    per_class: list[tuple[type, list[Declaration]]] = []
    for module in modules:
        for cls in _settings_classes(module):
            own = []
            for declared in declarations(cls):
                earlier = first.get(declared.env)
                if earlier is None:
                    first[declared.env] = declared
                    own.append(declared)
                elif not _same(earlier, declared):
                    raise DuplicateSetting(
                        f"{declared.env} is declared by {earlier.owner} and again, differently, by "
                        f"{declared.owner}: bind one declaration in both"
                    )
                else:
                    readers.setdefault(declared.env, []).append(declared.owner)
            per_class.append((cls, own))
    return tuple(
        SettingsGroup(
            owner=f"{cls.__module__}.{cls.__qualname__}",
            summary=_summary(cls),
            declarations=tuple(own),
            also_read_by={d.env: tuple(readers[d.env]) for d in own if d.env in readers},
        )
        for cls, own in per_class
        if own
    )


# -- rendering ------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default_cell(declared: Declaration) -> str:
    if declared.default is None:
        return "unset"
    return f"`{declared.default}`" if declared.default else '`""`'


def _meaning(group: SettingsGroup, declared: Declaration) -> str:
    others = group.also_read_by.get(declared.env)
    if not others:
        return declared.meaning
    names = ", ".join(f"`{owner.rsplit('.', 1)[1]}`" for owner in others)
    return f"{declared.meaning} Also read by {names}."


def _packages(groups: tuple[SettingsGroup, ...]) -> list[tuple[str, list[SettingsGroup]]]:
    ordered: dict[str, list[SettingsGroup]] = {}
    for group in groups:
        ordered.setdefault(group.package, []).append(group)
    return list(ordered.items())


def render_reference(groups: tuple[SettingsGroup, ...]) -> str:
    """``docs/configuration.md``: a section per package, a table per settings class."""
    count = sum(len(g.declarations) for g in groups)
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated from the settings catalog (gateway/base/settings_catalog.py) by `{REGENERATE}`: "
        "edit the declarations, not this file. -->",
        "",
        f"Every `RAG_*` variable Mnemo reads ({count} in all), where it is declared, its default, "
        "what it means and when to change it. Each process reads them once, at start; a command-line "
        "flag wins over the environment, which wins over the default. "
        f"[`{ENV_EXAMPLE}`]({ENV_EXAMPLE}) lists them all, commented out, as a starting env file.",
        "",
        "Values: booleans are `true`/`false` (also `1`/`0`, `yes`/`no`, `on`/`off`); lists are "
        "comma-separated; an empty value leaves an optional (default unset) setting unset. A value "
        "that does not parse or is out of range stops the process at start, naming the variable.",
        "",
    ]
    for package, package_groups in _packages(groups):
        lines += [f"## {package}: {PACKAGE_TITLES.get(package, package)}", ""]
        for group in package_groups:
            lines += [
                f"### `{group.name}`",
                "",
                f"{group.summary} Declared in `{group.owner.rsplit('.', 1)[0]}`.".lstrip(),
                "",
                "| Variable | Type | Default | Meaning | Trade-off |",
                "| --- | --- | --- | --- | --- |",
            ]
            lines += [
                f"| `{d.env}` | {d.type} | {_cell(_default_cell(d))} | {_cell(_meaning(group, d))} "
                f"| {_cell(d.tradeoff)} |"
                for d in group.declarations
            ]
            lines.append("")
    return "\n".join(lines)


def render_env_example(groups: tuple[SettingsGroup, ...]) -> str:
    """``docs/mnemo.env.example``: every variable commented out with its default, by package and class."""
    lines = [
        "# Mnemo's settings: every RAG_* variable, commented out, with its default.",
        f"# Generated from the settings catalog by `{REGENERATE}`; the reference is docs/{REFERENCE}.",
        "# Uncomment and change what this deployment needs (an unset optional setting stays empty).",
        "",
    ]
    for package, package_groups in _packages(groups):
        lines += [f"# ==== {package}: {PACKAGE_TITLES.get(package, package)} ====", ""]
        for group in package_groups:
            lines += [f"# -- {group.name}: {group.summary}".rstrip(": "), ""]
            for declared in group.declarations:
                lines += [f"# {_meaning(group, declared)}", f"# {declared.env}={declared.default or ''}", ""]
    return "\n".join(lines)


def generated_files(groups: tuple[SettingsGroup, ...] | None = None) -> dict[str, str]:
    """File name (under ``docs/``) -> the text the catalog generates for it."""
    groups = catalog() if groups is None else groups
    return {REFERENCE: render_reference(groups), ENV_EXAMPLE: render_env_example(groups)}


def write_files(docs_dir: Path = DOCS_DIR) -> list[Path]:
    """Write the generated files into ``docs_dir``; the paths written."""
    docs_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in generated_files().items():
        path = docs_dir / name
        path.write_text(text)
        written.append(path)
    return written


def stale_files(docs_dir: Path = DOCS_DIR) -> list[Path]:
    """The generated files in ``docs_dir`` that are missing or differ from what the catalog generates."""
    stale = []
    for name, text in generated_files().items():
        path = docs_dir / name
        if not path.is_file() or path.read_text() != text:
            stale.append(path)
    return stale
