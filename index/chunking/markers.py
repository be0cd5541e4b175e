"""Structural markers in archive text, and the hard-bounded units they cut it into.

The archive's resolved documents carry three kinds of inline markup (its
chunking rules, which Mnemo's chunker follows):

- heading lines ``[h1] Title`` .. ``[h6] Title`` (only at the start of a line);
- page markers ``[page-n-N]`` (an optional ``-label`` suffix is tolerated);
- transcription timecodes ``[TC_HH:MM:SS(.mmm)_TC]``, one per speech turn.

Each marker is a hard boundary: :func:`split_units` returns the text between
markers as :class:`Unit` spans (offsets into the text, whitespace-trimmed,
never empty), each with the heading path, page and timecode turn it lies in.
No chunk may cross a unit, so a chunk's page and timecodes are exact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from index.chunking.sentences import trim_span

__all__ = ["TIMECODE_RE", "Unit", "clean_title", "split_units", "strip_markers"]

_HEADING = r"^[ \t]*\[h(?P<level>[1-6])\](?P<title>[^\n]*)$"
_PAGE = r"\[page-n-(?P<page>\d+)(?:-[^\]\n]*)?\]"
_TIMECODE = r"\[TC_(?P<tc>\d+:\d{1,2}:\d{1,2}(?:\.\d+)?)_TC\]"

TIMECODE_RE = re.compile(_TIMECODE)
_INLINE_RE = re.compile(f"{_PAGE}|{_TIMECODE}")
_MARKER_RE = re.compile(f"(?P<heading>{_HEADING})|{_PAGE}|{_TIMECODE}", re.MULTILINE)
_SPACES_RE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class Unit:
    """A span of text between hard boundaries, with the structure it lies in.

    ``tc_in`` is the timecode of the turn the span belongs to (``None`` before the
    first timecode); ``tc_out`` is the next timecode marker after the span (the
    turn's end), ``None`` when no marker follows.
    """

    start: int
    end: int
    heading_path: tuple[str, ...]
    page: int | None
    tc_in: str | None
    tc_out: str | None


@dataclass(slots=True)
class _State:
    """Where the scan is: the open headings, the current page and turn."""

    headings: list[tuple[int, str]]
    page: int | None = None
    tc: str | None = None

    def path(self) -> tuple[str, ...]:
        return tuple(title for _, title in self.headings)

    def apply_heading(self, level: int, title: str) -> None:
        # A heading replaces its own level and everything below it.
        self.headings = [(lvl, t) for lvl, t in self.headings if lvl < level]
        if title:
            self.headings.append((level, title))


def split_units(text: str) -> list[Unit]:
    """Cut ``text`` at every heading line, page marker and timecode marker."""
    state = _State(headings=[])
    units: list[Unit] = []
    open_turn: list[int] = []  # units whose turn end (the next timecode) is not known yet

    def apply_inline(match: re.Match[str]) -> None:
        if match.group("page") is not None:
            state.page = int(match.group("page"))
            return
        state.tc = match.group("tc")
        for i in open_turn:
            units[i] = replace(units[i], tc_out=state.tc)
        open_turn.clear()

    position = 0
    for match in _MARKER_RE.finditer(text):
        span = trim_span(text, position, match.start())
        if span is not None:
            open_turn.append(len(units))
            units.append(Unit(*span, state.path(), state.page, state.tc, None))
        position = match.end()
        if match.group("heading") is None:
            apply_inline(match)
            continue
        title = match.group("title")
        state.apply_heading(int(match.group("level")), clean_title(title))
        # Page or timecode markers written inside a heading line apply after it.
        for inline in _INLINE_RE.finditer(title):
            apply_inline(inline)
    span = trim_span(text, position, len(text))
    if span is not None:
        units.append(Unit(*span, state.path(), state.page, state.tc, None))
    return units


def clean_title(title: str) -> str:
    """A heading title on one line, without inline markers."""
    return _SPACES_RE.sub(" ", _INLINE_RE.sub(" ", title)).strip()


def strip_markers(text: str) -> str:
    """The text with every marker removed (heading lines keep their title)."""
    return _INLINE_RE.sub(" ", re.sub(_HEADING, r"\g<title>", text, flags=re.MULTILINE))
