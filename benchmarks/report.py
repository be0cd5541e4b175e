"""Suite results and the report folder: ``results.json``, ``REPORT.md`` and PNG plots.

Every suite returns a :class:`SuiteResult`. Headline figures carry their
same-run baseline and the ratio, so a reader never compares numbers from two
different runs of a noisy shared machine.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import os
import platform
import re
import subprocess
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from .measure import knee


@dataclass
class Headline:
    """One figure beside its baseline from the same run."""

    name: str
    value: float
    unit: str
    baseline_name: str
    baseline: float
    higher_is_better: bool = True
    bar: float | None = None  # the ratio Mnemo aims for, when there is one
    # min and max of the ratio over the run's windows (or repeated cells), when it was measured more
    # than once: a bar inside it is not settled by this run
    spread: tuple[float, float] | None = None

    @property
    def ratio(self) -> float:
        return float("nan") if self.baseline == 0 else self.value / self.baseline

    @property
    def meets_bar(self) -> bool | None:
        if self.bar is None or math.isnan(self.ratio):
            return None
        return self.ratio >= self.bar if self.higher_is_better else self.ratio <= self.bar

    @property
    def spread_crosses_bar(self) -> bool:
        return self.bar is not None and self.spread is not None and self.spread[0] < self.bar < self.spread[1]


@dataclass
class Curve:
    """y against x for one or more series; plotted, and its knee described."""

    name: str
    x_label: str
    y_label: str
    series: dict[str, list[tuple[float, float]]]
    log_x: bool = False
    # "throughput": more is better, the knee is where adding x stops paying; "cost" (latency, build
    # time, size): the report says how much y grows over the range and where it grows fastest.
    kind: str = "throughput"
    baselines: tuple[str, ...] = ()  # series that are same-run baselines: drawn grey, not described
    log_y: bool = False  # for latencies spanning orders of magnitude

    def knees(self) -> dict[str, float | None]:
        if self.kind != "throughput":
            return {}
        return {
            label: knee([p[0] for p in sorted(points)], [p[1] for p in sorted(points)])
            for label, points in self.series.items()
            if label not in self.baselines
        }

    def growth(self) -> dict[str, str]:
        """For cost curves: "grows x{r} from x0 to xN (steepest from a to b, x{s})" per series."""
        out = {}
        for label, points in self.series.items():
            if label in self.baselines:
                continue
            pts = sorted(points)
            if len(pts) < 2 or pts[0][1] <= 0:
                continue
            steps = [
                (b[1] / a[1] if a[1] > 0 else float("inf"), a[0], b[0]) for a, b in itertools.pairwise(pts)
            ]
            factor, a, b = max(steps)
            text = f"x{pts[-1][1] / pts[0][1]:.2g} from {self.x_label} = {pts[0][0]:,g} to {pts[-1][0]:,g}"
            if len(steps) > 1:
                text += f" (steepest from {a:,g} to {b:,g}: x{factor:.2g})"
            out[label] = text
        return out


@dataclass
class Bars:
    """A grouped bar chart: one group per category (a data set), one bar per series (a mode)."""

    name: str
    y_label: str
    categories: list[str]
    series: dict[str, list[float | None]]  # series -> one value per category (None: not measured)
    baselines: tuple[str, ...] = ()  # same-run references: drawn hatched


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]]


@dataclass
class SuiteResult:
    suite: str
    headlines: list[Headline] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    curves: list[Curve] = field(default_factory=list)
    bars: list[Bars] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None  # why the suite did not run, when it did not


def dist_version(dist: str) -> str | None:
    """The installed version of the distribution ``dist``; None when it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """What ran the benchmark: numbers mean little without it."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:  # torch absent or broken: report no GPU
        gpu = None
    commit = None
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        pass
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "gpu": gpu,
        "git_commit": commit or None,
        "versions": {
            d: dist_version(d)
            for d in ("torch", "transformers", "ray", "asyncpg", "pgvector", "aiohttp", "faiss-cpu", "bm25s")
        },
    }


def format_span(spread: Any) -> str:
    """A (min, max) spread of ratios as printed beside a ratio: ``0.91–1.12``."""
    return f"{spread[0]:.2f}–{spread[1]:.2f}"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


_PERCENTILE = re.compile(r"\s*\b(p50|p95|p99|median)$")
_DASHES = {"p50": "-", "median": "-", "p95": "--", "p99": ":"}


def _style(label: str, baseline: bool, colors: dict[str, str], palette: list[str]) -> dict[str, Any]:
    """One color per measured thing, a dash per percentile; baselines grey and dotted."""
    match = _PERCENTILE.search(label)
    group = _PERCENTILE.sub("", label) if match else label
    if baseline:
        return {"color": "0.45", "linestyle": ":" if not match else _DASHES[match.group(1)], "marker": "s"}
    if group not in colors:
        colors[group] = palette[len(colors) % len(palette)]
    return {"color": colors[group], "linestyle": _DASHES[match.group(1)] if match else "-", "marker": "o"}


def _plot(curve: Curve, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(7.2, 4.4), dpi=120)
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors: dict[str, str] = {}
    xs_all: set[float] = set()
    knees = curve.knees()
    for label, points in curve.series.items():
        points = sorted(points)
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        xs_all.update(xs)
        baseline = label in curve.baselines
        ax.plot(xs, ys, label=label, linewidth=1.8, markersize=5, **_style(label, baseline, colors, palette))
        x_knee = knees.get(label)
        if x_knee is not None and not baseline:
            y_knee = dict(points)[x_knee]
            ax.annotate(
                "knee",
                (x_knee, y_knee),
                xytext=(0, 12),
                textcoords="offset points",
                ha="center",
                fontsize=8,
                arrowprops={"arrowstyle": "-", "color": "0.4"},
            )
    if curve.log_x:
        ax.set_xscale("log")
        ax.set_xticks(sorted(xs_all))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    if curve.log_y:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))
    ax.set_xlabel(curve.x_label)
    ax.set_ylabel(curve.y_label)
    ax.set_title(curve.name, fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    if len(curve.series) > 1:
        ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def _plot_bars(chart: Bars, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(len(chart.series), 1)
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(7.2, 1.6 * len(chart.categories) + 2), 4.6), dpi=120)
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, values) in enumerate(chart.series.items()):
        xs = [c + (i - (n - 1) / 2) * width for c in range(len(chart.categories))]
        heights = [v if v is not None else 0.0 for v in values]
        baseline = label in chart.baselines
        ax.bar(
            xs,
            heights,
            width,
            label=label,
            color="#bbbbbb" if baseline else palette[i % len(palette)],
            hatch="//" if baseline else None,
            edgecolor="#555555" if baseline else None,
        )
        for x, v in zip(xs, values, strict=True):
            if v is not None:
                ax.text(x, v + 0.01, f"{v:.2f}", ha="center", va="bottom", fontsize=6, rotation=90)
    ax.set_xticks(range(len(chart.categories)), chart.categories)
    ax.set_ylabel(chart.y_label)
    ax.set_ylim(0, 1.12)
    ax.set_title(chart.name)
    ax.legend(fontsize=7, ncol=min(n, 4), loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _payload(results: list[SuiteResult], config: dict[str, Any], machine: dict[str, Any]) -> dict[str, Any]:
    """What ``results.json`` holds: every suite whole, each headline with its ratio and verdicts, each
    curve's knees (throughput) or growth (cost)."""
    return {
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "config": config,
        "suites": [
            {
                **asdict(r),
                "headlines": [
                    {
                        **asdict(h),
                        "ratio": h.ratio,
                        "meets_bar": h.meets_bar,
                        "spread_crosses_bar": h.spread_crosses_bar,
                    }
                    for h in r.headlines
                ],
                "knees": {c.name: c.knees() for c in r.curves if c.kind == "throughput"},
                "growth": {c.name: c.growth() for c in r.curves if c.kind == "cost"},
            }
            for r in results
        ],
    }


def _headline_lines(results: list[SuiteResult]) -> list[str]:
    """The headlines of every suite in one table, each ratio beside its spread and its bar."""
    headlines = [(r.suite, h) for r in results for h in r.headlines]
    if not headlines:
        return []
    lines = [
        "## Headlines",
        "",
        "| suite | figure | value | baseline | ratio (spread) | bar |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for suite, h in headlines:
        bar = (
            ""
            if h.bar is None
            else f"{'≥' if h.higher_is_better else '≤'} {h.bar:g} " + ("✓" if h.meets_bar else "✗")
        )
        if h.spread_crosses_bar:
            bar += " (spread crosses it)"
        shown = _fmt(h.ratio)
        if h.spread is not None:
            shown += f" ({_fmt(h.spread[0])}–{_fmt(h.spread[1])})"
        lines.append(
            f"| {suite} | {h.name} | {_fmt(h.value)} {h.unit} | {h.baseline_name}: {_fmt(h.baseline)} {h.unit} "
            f"| {shown} | {bar} |"
        )
    return [*lines, ""]


def _table_lines(t: Table) -> list[str]:
    return [
        f"**{t.title}**",
        "",
        "| " + " | ".join(t.columns) + " |",
        "|" + " --- |" * len(t.columns),
        *("| " + " | ".join(_fmt(v) for v in row) + " |" for row in t.rows),
        "",
    ]


def _curve_lines(c: Curve, png: str) -> list[str]:
    """The curve's plot, then its growth per series (cost) or its knee (throughput)."""
    lines = [f"![{c.name}]({png})", ""]
    for label, text in c.growth().items() if c.kind == "cost" else ():
        lines.append(f"- {c.name}, {label}: {text}.")
    for label, x in c.knees().items():
        where = (
            f"the knee is at {c.x_label} = {x:g}: beyond it, gains drop under 10% per step"
            if x is not None
            else "no knee in the measured range: it still scales"
        )
        lines.append(f"- {c.name}, {label}: {where}.")
    return [*lines, ""]


def _suite_lines(r: SuiteResult, out_dir: Path) -> list[str]:
    """One suite's section: its tables, its charts (plotted into ``out_dir``) and its notes."""
    lines = [f"## {r.suite}", ""]
    if r.skipped:
        return [*lines, f"Skipped: {r.skipped}", ""]
    for t in r.tables:
        lines += _table_lines(t)
    for b in r.bars:
        png = f"{_slug(r.suite)}-{_slug(b.name)}.png"
        _plot_bars(b, out_dir / png)
        lines += [f"![{b.name}]({png})", ""]
    for c in r.curves:
        png = f"{_slug(r.suite)}-{_slug(c.name)}.png"
        _plot(c, out_dir / png)
        lines += _curve_lines(c, png)
    return [*lines, *(f"- {n}" for n in r.notes), ""]


def write_report(out_dir: Path, results: list[SuiteResult], config: dict[str, Any]) -> Path:
    """Write ``results.json``, ``REPORT.md`` and one PNG per curve into ``out_dir``; return REPORT.md."""
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    payload = _payload(results, config, machine)
    (out_dir / "results.json").write_text(json.dumps(payload, indent=2, default=str))
    lines = [
        "# Mnemo benchmark report",
        "",
        f"{payload['created']} · {machine['cpu']} · {machine['cores']} cores · "
        f"{machine['memory_gib']} GiB · GPU: {machine['gpu'] or 'none'} · commit {machine['git_commit']}",
        "",
        "Every headline is a ratio against a baseline measured in the same run (these machines are noisy).",
        "",
        *_headline_lines(results),
    ]
    for r in results:
        lines += _suite_lines(r, out_dir)
    report = out_dir / "REPORT.md"
    report.write_text("\n".join(lines))
    return report
