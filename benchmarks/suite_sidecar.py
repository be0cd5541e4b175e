"""The sidecar suite: ratios to the same model in-process at batch 32, by concurrency and by text length.

- By concurrency: :func:`benchmarks.sidecar.run_sidecar_benchmark` (1- and 32-item requests; every
  cell bracketed by in-process baseline windows); the headlines are its concurrency-16 cells.
- By text length: texts of exactly N tokens (16 to 512) sent at a fixed load, each length beside
  in-process batch-32 windows on the same texts (the 512-token twin of MiniLM takes the long ones).
- Peers (``--full``): infinity-emb on the same model and the same load (:mod:`benchmarks.peers`).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import urllib.request
from collections.abc import Mapping
from typing import Any

from .grid import headline_concurrency
from .plan import SidecarPlan
from .report import Curve, SuiteResult, Table, format_span
from .sidecar import BARS
from .stack import BENCH_MODEL, LONG_MODEL, BenchStack
from .tables import Column, HeadlineRow, headings, pick, rows

__all__ = ["configurations_table", "length_sweep", "run_suite", "texts_of_length"]

BASELINE = "in-process batch 32 (same model)"
STRONGEST = "in-process strongest configuration"


def texts_of_length(encoder: Any, n: int, tokens: int, *, seed: int = 0) -> list[str]:
    """``n`` texts of exactly ``tokens`` tokens (special tokens included) as ``encoder`` counts them.

    Built from the sidecar benchmark's heritage vocabulary by summing per-word token counts (a
    word-piece tokenizer never merges across spaces), then checked with the encoder's own count.
    """
    from .sidecar import corpus

    vocabulary = sorted({w for text in corpus() for w in text.split()})
    specials = encoder.count_tokens([""])[0]
    counts = dict(zip(vocabulary, (c - specials for c in encoder.count_tokens(vocabulary)), strict=True))
    singles = [w for w, c in counts.items() if c == 1]
    if not singles:
        raise ValueError("the vocabulary has no one-token word to pad texts to an exact length")
    rng = random.Random(seed * 100_003 + tokens)
    texts = []
    for _ in range(n):
        words: list[str] = []
        left = tokens - specials
        while left > 0:
            word = rng.choice(vocabulary)
            if counts[word] > left:
                word = rng.choice(singles)
            words.append(word)
            left -= counts[word]
        texts.append(" ".join(words))
    actual = encoder.count_tokens(texts)
    if any(a != tokens for a in actual):
        raise ValueError(f"built texts of {sorted(set(actual))} tokens, wanted {tokens}")
    return texts


def _served(url: str) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/models", timeout=30) as response:
        return {m["id"]: m for m in json.load(response)["models"]}


def length_sweep(url: str, plan: SidecarPlan) -> dict[str, Any]:
    """Sidecar vs in-process batch 32 at each text length (one load: ``length_concurrency`` callers)."""
    from .grid import http_grid
    from .sidecar import Baselines, bench_encoder

    served = _served(url)
    model = LONG_MODEL if LONG_MODEL in served else BENCH_MODEL
    if model not in served:
        raise RuntimeError(f"the sidecar at {url} serves neither {LONG_MODEL} nor {BENCH_MODEL}")
    limit = int(served[model]["max_input_tokens"])
    _, encoder, _ = bench_encoder(model, max_input_tokens=limit, max_batch_tokens=32 * limit)
    points = []
    for length in [n for n in plan.lengths if n <= limit]:
        texts = texts_of_length(encoder, 32, length)  # one batch per baseline window
        baseline = Baselines(encoder, texts, plan.baseline_seconds)
        (cell,) = asyncio.run(
            http_grid(
                url,
                model,
                texts,
                baseline=baseline,
                concurrencies=(plan.length_concurrency,),
                sizes=(plan.length_request_size,),
                seconds=plan.seconds_per_cell,
            )
        )
        cell["tokens_per_text"] = length
        cell["baseline_tokens_per_s"] = statistics.fmean(w["tokens_per_s"] for w in baseline.windows)
        points.append(cell)
    return {
        "model": model,
        "max_input_tokens": limit,
        "skipped_lengths": [n for n in plan.lengths if n > limit],
        "points": points,
    }


def _windows(cell: Mapping[str, Any]) -> int:
    return len(cell.get("windows") or [cell])


# Read from one sidecar cell of the grid (a concurrency and a request size).
HEADLINE = HeadlineRow(
    "sidecar {request_size}-item requests, concurrency {concurrency}", "{items_per_s}", "items/s", BASELINE,
    "{baseline_items_per_s}", bar=lambda c: BARS.get(f"c{c['concurrency']}_{c['request_size']}item"),
    spread="{spread[ratio_to_inprocess]}",
)  # fmt: skip
GRID = (
    Column("concurrency", "{concurrency}"),
    Column("items/request", "{request_size}"),
    Column("items/s", "{items_per_s}"),
    Column("tokens/s", "{tokens_per_s}"),
    Column("p50 ms", "{latency_ms[p50]}"),
    Column("p95 ms", "{latency_ms[p95]}"),
    Column("p99 ms", "{latency_ms[p99]}"),
    Column("server CPU ms/req", lambda c: c.get("server_cpu_ms_per_request", "")),
    Column("shed (retried)", lambda c: c.get("shed_answers", "")),
    Column("windows", _windows),
    Column("vs in-process batch 32", "{ratio_to_inprocess}"),
    Column("spread", lambda c: format_span(c["spread"]["ratio_to_inprocess"])),
)
# when the run measured the strongest in-process configuration too
GRID_STRONGEST = (
    Column("vs strongest in-process", "{ratio_to_strongest}"),
    Column("spread ", lambda c: format_span(c["spread"]["ratio_to_strongest"])),
)
# Read from one point of the length sweep.
BY_LENGTH = (
    Column("tokens/text", "{tokens_per_text}"),
    Column("items/s", "{items_per_s}"),
    Column("tokens/s", "{tokens_per_s}"),
    Column("p95 ms", "{latency_ms[p95]}"),
    Column("in-process items/s", "{baseline_items_per_s}"),
    Column("ratio", "{ratio_to_inprocess}"),
)


def configurations_table(configs: dict[str, Any]) -> Table:
    """In-process batch 32, the strongest configuration, the ceiling and sentence-transformers."""
    from .sidecar import CONFIGURATIONS

    base = configs["inprocess_batch32"]["items_per_s"]
    ceiling = configs["ceiling"]["items_per_s"]
    return Table(
        "In-process configurations (same model, same texts; each the mean of its windows, taken in turn)",
        ["configuration", "best batch", "items/s", "tokens/s", "vs in-process batch 32", "vs ceiling"],
        [
            [
                label,
                configs[key]["batch"],
                configs[key]["items_per_s"],
                configs[key]["tokens_per_s"],
                configs[key]["items_per_s"] / base,
                configs[key]["items_per_s"] / ceiling,
            ]
            for key, label in CONFIGURATIONS.items()
        ],
    )


def _configuration_notes(configs: dict[str, Any], headlines: list[dict[str, Any]]) -> list[str]:
    strongest, ceiling = configs["strongest"], configs["ceiling"]
    st = configs["sentence_transformers"] or "(version unknown)"
    how = (
        "tokenization of batch k+1 on a helper thread while batch k runs"
        if strongest.get("overlap", True)
        else "each batch tokenized then run (overlapping them on a helper thread was slower here)"
    )
    notes = [
        f"Strongest in-process configuration: batch {strongest['batch']} (best of the sweep "
        f"{[p['batch'] for p in configs['sweeps']['strongest']['points']]}), all cores, {how}; "
        f"{strongest['items_per_s'] / ceiling['items_per_s']:.2f} of the ceiling (the forward pass alone on "
        f"pre-tokenized batches of {ceiling['batch']}). sentence-transformers {st} `encode()` peaks at batch "
        f"{configs['st_encode']['batch']}: {configs['st_encode']['items_per_s'] / strongest['items_per_s']:.2f} "
        "of the strongest configuration.",
    ]
    for cell in headlines:
        if "ratio_to_strongest" not in cell:
            continue
        low, high = cell["spread"]["ratio_to_strongest"]
        in_low, in_high = cell["spread"]["ratio_to_inprocess"]
        notes.append(
            f"sidecar {cell['request_size']}-item requests at concurrency {cell['concurrency']} "
            f"({_windows(cell)} windows): {cell['ratio_to_inprocess']:.2f} of in-process batch 32 "
            f"(spread {in_low:.2f}–{in_high:.2f}), {cell['ratio_to_strongest']:.2f} of the strongest "
            f"in-process configuration (spread {low:.2f}–{high:.2f}), about "
            f"{cell['ratio_to_strongest'] * strongest['items_per_s'] / ceiling['items_per_s']:.2f} of the ceiling."
        )
    return notes


def _grid_curves(cells: list[dict[str, Any]], strongest: bool) -> list[Curve]:
    sizes = sorted({c["request_size"] for c in cells})

    def series(size: int, key: str) -> list[tuple[float, float]]:
        return [(c["concurrency"], pick(key, c)) for c in cells if c["request_size"] == size]

    throughput = {f"sidecar, {s}-item requests": series(s, "{items_per_s}") for s in sizes}
    throughput[BASELINE] = series(sizes[-1], "{baseline_items_per_s}")
    if strongest:
        throughput[STRONGEST] = series(sizes[-1], "{strongest_items_per_s}")
    latency = {f"{s}-item requests": series(s, "{latency_ms[p95]}") for s in sizes}
    return [
        Curve("Sidecar throughput vs concurrency", "concurrent callers", "items/s", throughput, log_x=True,
              baselines=(BASELINE, STRONGEST)),
        Curve("Sidecar p95 latency vs concurrency", "concurrent callers", "p95 latency (ms)", latency, log_x=True,
              kind="cost", log_y=True),
    ]  # fmt: skip


def _length_curves(points: list[dict[str, Any]], load: str) -> list[Curve]:
    throughput = {
        "sidecar": [(p["tokens_per_text"], p["tokens_per_s"]) for p in points],
        BASELINE: [(p["tokens_per_text"], p["baseline_tokens_per_s"]) for p in points],
    }
    latency = {"sidecar": [(p["tokens_per_text"], p["latency_ms"]["p95"]) for p in points]}
    return [
        Curve(f"Sidecar throughput vs text length ({load})", "tokens per text", "tokens/s", throughput, log_x=True,
              baselines=(BASELINE,)),
        Curve(f"Sidecar p95 latency vs text length ({load})", "tokens per text", "p95 latency (ms)", latency,
              log_x=True, kind="cost", log_y=True),
    ]  # fmt: skip


def _sweep_curve(sweeps: dict[str, Any]) -> Curve:
    return Curve(
        "In-process throughput vs batch size",
        "texts per batch",
        "items/s",
        {
            "strongest (tokenization overlapped)": [
                (p["batch"], p["items_per_s"]) for p in sweeps["strongest"]["points"]
            ],
            "sentence-transformers encode()": [
                (p["batch"], p["items_per_s"]) for p in sweeps["st_encode"]["points"]
            ],
        },
        log_x=True,
    )


def _grid_notes(grid: dict[str, Any], top: int) -> list[str]:
    base = grid["baseline"]
    notes = [
        f"In-process batch 32 over {base['windows']} windows: {base['items_per_s']:.1f} items/s "
        f"(from {base['min_items_per_s']:.1f} to {base['max_items_per_s']:.1f}; each cell's ratio uses the "
        "windows measured just before and after it).",
        "Bars (Mnemo's, on a 2-core CPU): 1-item requests at concurrency 16 reach >= 50% of in-process "
        "batch-32 throughput, 32-item requests >= 80%.",
        "server CPU ms/req: the CPU time of the sidecar's processes (this run's child processes: Ray's "
        "raylet, workers and replicas, psutil) over the window, per request served; a busy neighbour moves "
        "it far less than a latency. With --sidecar-url the sidecar is not a child and the column is 0.",
    ]
    configs = grid.get("configurations")
    if configs is not None:
        notes += _configuration_notes(
            configs, [c for c in grid["cells"] if c["mode"] == "sidecar" and c["concurrency"] == top]
        )
    if grid.get("repeats", 1) > 1:
        notes.append(
            f"Each concurrency-{top} cell ran in {grid['repeats']} windows, each beside its own baseline "
            "windows; its ratio is the mean over the means, its spread the ratio of each window to each "
            "baseline window beside it, min to max (latencies: the median of the windows' percentiles)."
        )
    for name, bar in grid["bars"].items():
        if bar["settled"] is False:
            notes.append(
                f"The spread of {name} ({bar['spread'][0]:.2f}–{bar['spread'][1]:.2f}) crosses its bar "
                f"{bar['bar']:g}: this run does not settle it; raise sidecar.repeats."
            )
    return notes


def _as_suite(grid: dict[str, Any], lengths: dict[str, Any], peers: dict[str, Any] | None) -> SuiteResult:
    cells = [c for c in grid["cells"] if c["mode"] == "sidecar"]
    top = headline_concurrency([c["concurrency"] for c in cells])
    strongest = any("ratio_to_strongest" in c for c in cells)
    columns = GRID + GRID_STRONGEST if strongest else GRID
    tables = [
        Table(
            f"Sidecar ({grid['model']}) by concurrency and request size",
            headings(columns),
            rows(columns, cells),
        )
    ]
    service = [c for c in grid["cells"] if c["mode"] == "service"]
    if service:
        title = "The Ray-free model service (batcher and executor in-process) by concurrency and request size"
        tables.append(Table(title, headings(GRID), rows(GRID, service)))
    configs = grid.get("configurations")
    if configs is not None:
        tables.insert(0, configurations_table(configs))
    curves = _grid_curves(cells, strongest)
    points = lengths["points"]
    if points:
        load = f"{points[0]['concurrency']} callers x {points[0]['request_size']} texts"
        curves += _length_curves(points, load)
        tables.append(
            Table(
                f"Sidecar ({lengths['model']}) by text length, {load}",
                headings(BY_LENGTH),
                rows(BY_LENGTH, points),
            )
        )
    if configs is not None:
        curves.append(_sweep_curve(configs["sweeps"]))
    notes = _grid_notes(grid, top)
    if lengths["skipped_lengths"]:
        notes.append(
            f"Lengths {lengths['skipped_lengths']} skipped: {lengths['model']} takes at most "
            f"{lengths['max_input_tokens']} tokens."
        )
    suite = SuiteResult(
        "sidecar",
        headlines=[HEADLINE.read(c) for c in cells if c["concurrency"] == top],
        tables=tables,
        curves=curves,
        figures={"grid": grid, "lengths": lengths},
        notes=notes,
    )
    if peers is not None:
        from .peers import add_to_suite

        add_to_suite(suite, peers)
    return suite


def run_suite(stack: BenchStack, plan: SidecarPlan) -> SuiteResult:
    """The whole sidecar suite against ``stack``'s sidecar.

    Plain (not async) so every in-process baseline runs on the main thread, as the sidecar benchmark's
    own command does: torch's CPU thread pool is per calling thread, and hopping threads between
    windows would slow the baseline and flatter the ratios.
    """
    from .sidecar import run_sidecar_benchmark

    url = stack.sidecar_url
    assert url is not None
    grid = run_sidecar_benchmark(url, plan)
    lengths = length_sweep(url, plan)
    peers = None
    if plan.peers:
        from .peers import run_infinity_peer

        peers = run_infinity_peer(stack.work_dir, plan, grid, sidecar_url=url)
    return _as_suite(grid, lengths, peers)
