"""The README stays a front door and the documentation stays true.

The README is at most ``README_MAX_LINES`` lines and opens with the two commands (the project's
promise); the rest lives in ``docs/*.md``, each page linked from it. Every relative link in those pages
reaches a file in the repository (and its ``#anchor`` a heading of that page, slugged as GitHub
does), and every ``mnemo ...`` command they show in code is a command the real CLI parser has: its
subcommand path, its ``--options`` and, where the parser lists them, the options' values.
"""

from __future__ import annotations

import argparse
import json
import re
import runpy
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.cli import build_parser
from gateway.run.up import DEMO_EXAMPLES
from tests.conftest import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
README_MAX_LINES = 200
TWO_COMMANDS = ["make up", "make test"]

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"`([^`]+)`")
# [text](target) and ![alt](target), with an optional "title"; the text may hold `code`.
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# `mnemo` as a command: at the start, after a space, a subshell or an operator, or as .../bin/mnemo
# (never the database name in postgresql://mnemo@db/mnemo, nor metric names like mnemo_faiss_*).
_MNEMO = re.compile(r"(?:^|(?<=[\s(;|&])|(?<=bin/))mnemo\s+(\S.*)")
# Where a command shown in a shell block ends: a pipe, a list, a redirect, a subshell's end, a comment.
_SHELL_END = re.compile(r"\s[|;&>]|\)|\s#")
_OPTION = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
_LITERAL = re.compile(r"[a-z0-9][a-z0-9_.-]*")  # an option value written out, not a placeholder
# A tour request in the README: `api "$ADMIN" '{...}'` with a token `make up` prints.
_TOUR_REQUEST = re.compile(r"""^api "\$(ADMIN|RESEARCHER)"\s+'(\{.*\})'$""")


def documentation_pages() -> list[Path]:
    """README.md and every page under docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def documentation_text() -> str:
    """The README and every docs page together: what "documented" means for a setting or a name."""
    return "\n".join(page.read_text() for page in documentation_pages())


@dataclass(frozen=True)
class Block:
    """One line of a fenced code block, or one paragraph of prose (its lines joined: an inline code
    span or a link may wrap onto the next line). A heading is a paragraph of its own."""

    page: Path
    number: int  # its first line, 1-based
    text: str
    fenced: bool

    def where(self, offset: int = 0) -> str:
        """``page:line`` of the character at ``offset`` in the block's text."""
        page = self.page.relative_to(REPO_ROOT) if self.page.is_relative_to(REPO_ROOT) else self.page
        line = self.number + self.text.count("\n", 0, offset)
        return f"{page}:{line}"


def blocks(page: Path) -> Iterator[Block]:
    fenced = False
    paragraph: list[str] = []
    first = 0
    for number, text in enumerate([*page.read_text().splitlines(), ""], start=1):
        ends_paragraph = fenced or not text.strip() or _FENCE.match(text) or _HEADING.match(text)
        if paragraph and ends_paragraph:
            yield Block(page, first, "\n".join(paragraph), False)
            paragraph = []
        if _FENCE.match(text):
            fenced = not fenced
        elif fenced:
            yield Block(page, number, text, True)
        elif _HEADING.match(text):
            yield Block(page, number, text, False)
        elif text.strip():
            first = first if paragraph else number
            paragraph.append(text)


def heading_slugs(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces to
    hyphens, repeats numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    slugs = set()
    for block in blocks(page):
        match = _HEADING.match(block.text)
        if block.fenced or match is None:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(2))  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        slugs.add(slug if count == 0 else f"{slug}-{count}")
    return slugs


def _links(block: Block) -> Iterator[tuple[int, str]]:
    """(offset, target) of each link in prose; code spans blanked first (same length, same lines)."""
    if block.fenced:
        return
    prose = _CODE_SPAN.sub(lambda span: re.sub(r"[^\n]", " ", span.group()), block.text)
    for match in _LINK.finditer(prose):
        yield match.start(), match.group(1)


def link_problems(page: Path, root: Path = REPO_ROOT) -> list[str]:
    """Each relative link of ``page`` that names no file under ``root`` or no heading of it."""
    problems = []
    for block in blocks(page):
        for offset, target in _links(block):
            if _SCHEME.match(target):
                continue  # http(s), mailto: not this test's to fetch
            path_part, _, anchor = target.partition("#")
            linked = (page.parent / path_part).resolve() if path_part else page
            where = f"{block.where(offset)}: link to {target!r}"
            if not linked.is_relative_to(root.resolve()) or not linked.is_file():
                problems.append(f"{where}: no such file in the repository")
            elif anchor and (linked.suffix != ".md" or anchor not in heading_slugs(linked)):
                problems.append(f"{where}: no heading #{anchor} in {path_part or 'this page'}")
    return problems


def code_spans(block: Block) -> Iterator[tuple[int, str]]:
    """(offset, code) of what a block shows as code: a fenced line up to where its shell command
    ends; otherwise each `inline code`, where a ``|`` (escaped in tables or not) separates
    alternatives, as in ``mnemo sections put|get``."""
    if block.fenced:
        yield 0, _SHELL_END.split(block.text, maxsplit=1)[0]
        return
    for span in _CODE_SPAN.finditer(block.text):
        yield span.start(), re.sub(r"\s*\\?\|\s*", "|", " ".join(span.group(1).split()))


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return None


def command_problem(
    root: argparse.ArgumentParser, words: list[str], path: tuple[str, ...] = ("mnemo",)
) -> str | None:
    """Why ``mnemo WORDS...`` is not a command of ``root``, or None. The walk follows subcommands
    while the parser has them; then each ``--option`` must be the command's, and a value written out
    for an option with choices must be one of them."""
    parser = root
    for i, word in enumerate(words):
        subcommands = _subcommands(parser)
        if subcommands is None or word.strip("[]").startswith("-"):
            return _option_problem(parser, words[i:], path)
        for name in word.split("|"):
            if name not in subcommands:
                return (
                    f"`{' '.join(path)}` has no subcommand {name!r} (it has {', '.join(sorted(subcommands))})"
                )
        alternatives = word.split("|")
        for name in alternatives[1:]:
            problem = command_problem(subcommands[name], words[i + 1 :], (*path, name))
            if problem:
                return problem
        parser, path = subcommands[alternatives[0]], (*path, alternatives[0])
    return None


def _option_problem(parser: argparse.ArgumentParser, words: list[str], path: tuple[str, ...]) -> str | None:
    options = parser._option_string_actions
    for i, word in enumerate(words):
        for option in _OPTION.findall(word):
            if option not in options:
                return f"`{' '.join(path)}` has no option {option}"
            action = options[option]
            if action.choices is None:
                continue
            value = word.partition("=")[2] if "=" in word else (words[i + 1] if i + 1 < len(words) else "")
            for choice in value.strip("[]").split("|"):
                if _LITERAL.fullmatch(choice) and choice not in action.choices:
                    return f"`{' '.join(path)} {option}` takes {', '.join(map(str, action.choices))}, not {choice!r}"
    return None


def command_problems(page: Path, root: argparse.ArgumentParser) -> list[str]:
    """Each ``mnemo ...`` the page shows in code that ``root`` (the real CLI) would not take."""
    problems = []
    for block in blocks(page):
        for offset, code in code_spans(block):
            for match in _MNEMO.finditer(code):
                problem = command_problem(root, match.group(1).split())
                if problem:
                    problems.append(f"{block.where(offset)}: `mnemo {match.group(1).strip()}`: {problem}")
    return problems


@pytest.fixture(scope="module")
def cli() -> argparse.ArgumentParser:
    return build_parser()


def test_the_readme_is_a_front_door() -> None:
    count = len(README.read_text().splitlines())
    assert count <= README_MAX_LINES, (
        f"README.md has {count} lines; move detail into docs/ (at most {README_MAX_LINES})"
    )


def test_the_readme_opens_with_the_two_commands() -> None:
    first_block = []
    for block in blocks(README):
        if block.fenced:
            first_block.append(block.text.split("#")[0].strip())
        elif first_block:
            break
    assert first_block == TWO_COMMANDS, "the README opens with `make up` and `make test`"


def test_the_tour_shows_requests_make_up_prints() -> None:
    """The README's requests under the demo tokens are ones `mnemo up` prints (gateway.run.up's
    DEMO_EXAMPLES), which tests/test_demo.py runs against the loaded demo: so they keep working."""
    printed = {(e.token_var, e.action, json.dumps(e.options, sort_keys=True)) for e in DEMO_EXAMPLES}
    shown = []
    for block in blocks(README):
        match = _TOUR_REQUEST.match(block.text) if block.fenced else None
        if match:
            body = json.loads(match.group(2))
            assert body["dd_api"] == "dd_rag_api", block.where()
            shown.append(
                (block.where(), (match.group(1), body["action"], json.dumps(body["options"], sort_keys=True)))
            )
    assert shown, "the README's tour shows no request under $ADMIN or $RESEARCHER"
    unknown = [where for where, request in shown if request not in printed]
    assert not unknown, (
        f"README requests that `mnemo up` does not print (and test_demo does not run): {unknown}"
    )


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {
        (README.parent / target.partition("#")[0]).resolve()
        for block in blocks(README)
        for _, target in _links(block)
    }
    unlinked = [page.name for page in sorted(DOCS.glob("*.md")) if page.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


@pytest.mark.parametrize("page", documentation_pages(), ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    problems = link_problems(page)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", documentation_pages(), ids=lambda p: p.name)
def test_mnemo_commands_shown_exist(page: Path, cli: argparse.ArgumentParser) -> None:
    problems = command_problems(page, cli)
    assert not problems, "\n".join(problems)


def test_the_checks_catch_what_they_are_for(tmp_path: Path, cli: argparse.ArgumentParser) -> None:
    """Each check on a page with one known fault: the fault is reported with its file and line, and
    the good forms beside it are not."""
    (tmp_path / "other.md").write_text("# Other\n\n## Read replica\n\n## Read replica\n")
    page = tmp_path / "page.md"
    page.write_text(
        "\n".join(
            [
                "# Page",  # 1
                "[ok](other.md#read-replica) [twice](other.md#read-replica-1) [self](#page) [web](https://x.org/y)",
                "[gone](missing.md) [no heading](other.md#nope)",  # 3
                "| `mnemo sections put\\|get TIPO` | `mnemo queue stats \\| list \\| retry` | `mnemo ingest` |",
                "`mnemo queue purge` and `mnemo drain --forever` and `mnemo mcp --transport smoke`",  # 5
                "`postgresql://mnemo@db/mnemo RAG_X=1 mnemo gateway --port 8080` and `createdb mnemo`",
                "```bash",  # 7
                "TOKEN=$(.venv/bin/mnemo token --sub a --projects 1) # mnemo nothing",
                ".venv/bin/mnemo sections list",  # 9
                "```",
                "[in code](`not-a-link.md`) `[x](also-not.md)`",  # 11
                "a code span and a link may wrap: `mnemo",
                "queue nope` and [a wrapped",  # 13
                "link](gone.md)",
            ]
        )
    )
    assert link_problems(page, root=tmp_path) == [
        f"{page}:3: link to 'missing.md': no such file in the repository",
        f"{page}:3: link to 'other.md#nope': no heading #nope in other.md",
        f"{page}:13: link to 'gone.md': no such file in the repository",
    ]
    problems = command_problems(page, cli)
    assert [p.split(": `mnemo")[0] for p in problems] == [f"{page}:{n}" for n in (5, 5, 5, 9, 12)]
    assert "has no subcommand 'purge'" in problems[0]
    assert "has no option --forever" in problems[1]
    assert "takes stdio, http, not 'smoke'" in problems[2]
    assert "`mnemo sections` has no subcommand 'list'" in problems[3]
    assert "`mnemo queue` has no subcommand 'nope'" in problems[4]


def test_the_architecture_picture_is_drawn_from_the_code_as_it_stands(tmp_path: Path) -> None:
    """docs/architecture.md opens with the picture docs/architecture_picture.py draws from the imports;
    `--check` fails when it is stale, and the picture names every subpackage of index and gateway."""
    script = REPO_ROOT / "docs" / "architecture_picture.py"
    check = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    text = (REPO_ROOT / "docs" / "architecture.md").read_text()
    for package in ("index", "gateway"):
        for init in (REPO_ROOT / package).glob("*/__init__.py"):
            assert f"`{package}/{init.parent.name}/`" in text, init
    stale = tmp_path / "architecture.md"
    stale.write_text(text.replace("index_store --> index", "index_store --> gateway_web"))
    module = runpy.run_path(str(script))
    assert module["rewritten"](stale.read_text()) == text  # the stale picture is redrawn whole
