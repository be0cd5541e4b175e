"""A suite's tables declared as data: each column (or figure) names itself and where its value comes
from, and one loop turns the declaration into a :class:`~benchmarks.report.Table`'s rows.

A figure added to a suite is a row added to its tuple, beside the others, rather than another
hand-built list inside a long function. Where a value comes from (a :data:`Source`) is one of:

- a format template over the measured item's fields, ``"{records_lost} / {duplicate_rows}"`` or
  ``"{rss[max]}"`` (nested keys as :meth:`str.format` reads them; literal braces doubled). A
  template that is one field alone, ``"{records_lost}"``, gives that field's value as it is, so a
  number stays a number in ``results.json`` and the report formats it like every other number;
- a callable of the item, for a value computed from several fields;
- anything else: that value itself (a goal such as ``0`` or ``True``).
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .report import Headline

__all__ = ["Column", "Figure", "HeadlineRow", "Source", "figure_rows", "headings", "pick", "rows"]

Source = str | Callable[[Mapping[str, Any]], Any] | int | float | bool | None

_ONE_FIELD = re.compile(r"\{([^{}:!]+)\}")
_FORMATTER = string.Formatter()


def pick(source: Source, item: Mapping[str, Any]) -> Any:
    """The value ``source`` names in ``item`` (see the module's docstring for the three forms)."""
    if callable(source):
        return source(item)
    if not isinstance(source, str):
        return source
    one = _ONE_FIELD.fullmatch(source)
    if one:
        return _FORMATTER.get_field(one.group(1), (), item)[0]
    return source.format_map(item)


@dataclass(frozen=True)
class Column:
    """One column of a table: its heading, and where each row's value comes from."""

    name: str
    value: Source


def headings(columns: Sequence[Column]) -> list[str]:
    return [c.name for c in columns]


def rows(columns: Sequence[Column], items: Iterable[Mapping[str, Any]]) -> list[list[Any]]:
    """One row per item, one cell per column."""
    return [[pick(c.value, item) for c in columns] for item in items]


@dataclass(frozen=True)
class Figure:
    """One row of a figure/value/goal table: its label and value (both sources, read from the one
    measurement they describe) and the goal it is read against."""

    name: Source
    value: Source
    goal: Source = ""


def figure_rows(figures: Sequence[Figure], measured: Mapping[str, Any]) -> list[list[Any]]:
    """The rows ``[label, value, goal]`` of ``figures``, each read from ``measured``."""
    return [[pick(f.name, measured), pick(f.value, measured), pick(f.goal, measured)] for f in figures]


@dataclass(frozen=True)
class HeadlineRow:
    """A headline declared: its name, where its value and its same-run baseline's come from, its
    unit, the bar its ratio is read against, and where the spread of that ratio comes from."""

    name: Source
    value: Source
    unit: str
    baseline_name: Source
    baseline: Source
    bar: Source = None  # a number, or where it comes from when it depends on the measurement
    higher_is_better: bool = True
    spread: Source = None  # a (min, max) of the ratio over the run's windows, when measured more than once

    def read(self, measured: Mapping[str, Any]) -> Headline:
        spread = pick(self.spread, measured)
        return Headline(
            pick(self.name, measured),
            pick(self.value, measured),
            self.unit,
            pick(self.baseline_name, measured),
            pick(self.baseline, measured),
            higher_is_better=self.higher_is_better,
            bar=pick(self.bar, measured),
            spread=None if spread is None else tuple(spread),
        )
