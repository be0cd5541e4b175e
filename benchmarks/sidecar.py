"""Sidecar throughput and latency, as ratios to the same model run in-process, same run: the sidecar
suite's measurements (:func:`run_sidecar_benchmark`; its report is :mod:`benchmarks.suite_sidecar`).

First the in-process configurations side by side (:func:`benchmarks.inprocess.measure_configurations`:
batch 32, the goal table's baseline; the strongest configuration; the ceiling; sentence-transformers'
``encode()``), then the load grid per mode (``sidecar`` over HTTP; ``service``, the Ray-free batcher,
when asked), each request size's cells between baseline windows whose ratios they use: these machines
are shared and their speed drifts within a run. benchmarks/README.md says what each figure is.
"""

from __future__ import annotations

import asyncio
import os
import platform
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

from .grid import (
    _service_grid,
    headline_concurrency,
    http_grid,
)
from .inprocess import SAMPLE, measure_configurations, measure_inprocess, measure_pipelined
from .plan import SidecarPlan
from .stack import BENCH_MODEL, MINILM_WEIGHTS, bench_spec

__all__ = ["BARS", "Baselines", "bench_encoder", "run_sidecar_benchmark"]

# Mnemo's bar on a 2-core CPU machine: sidecar throughput as a share of in-process batch-32 throughput.
BARS = {"c16_1item": 0.50, "c16_32item": 0.80}

_WORDS = (
    "amphora necropolis harvest village dam church flood road letter mayor governor silver denarius "
    "bronze coin reverse obverse legend inventory signature canvas restored procession negative plate "
    "glass interview emigration mines memory war refugees market square mill water leave family city"
).split()


def corpus(n: int = 512, *, seed: int = 7) -> list[str]:
    """Heritage-flavoured texts of 8 to 60 words (about 10 to 80 tokens), reproducible."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 60))) for _ in range(n)]


def bench_encoder(model_id: str = BENCH_MODEL, **changes: Any) -> tuple[Any, Any, int]:
    """(spec, encoder, threads): :func:`benchmarks.stack.bench_spec` of MiniLM's weights on every core
    (``changes``: fields of the spec changed), loaded in-process, as the baselines run it."""
    import dataclasses

    import torch

    from inference.encoders import load_encoder

    threads = max(1, os.cpu_count() or 1)
    torch.set_num_threads(threads)
    spec = dataclasses.replace(bench_spec(model_id, MINILM_WEIGHTS, threads), **changes)
    return spec, load_encoder(spec), threads


def bar_verdicts(ratios: dict[str, float], spreads: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Each bar: the ratio, whether it is met, its spread, and whether the spread settles it.

    ``settled`` is False when the spread (min to max over the cell's windows) crosses the bar: this
    run cannot say which side the ratio is on, and the plan needs more windows (``repeats``).
    """
    out = {}
    for name, bar in BARS.items():
        value = ratios.get(f"sidecar_{name}")
        spread = spreads.get(f"sidecar_{name}")
        out[name] = {
            "bar": bar,
            "ratio": value,
            "met": (value or 0) >= bar,
            "spread": spread,
            "settled": None if spread is None else not (spread[0] < bar <= spread[1]),
        }
    return out


class Baselines:
    """A load grid's baseline (:data:`benchmarks.grid.Baseline`): in-process batch 32 (the goal
    table's baseline) and, when the in-process configurations were measured (``configs``), the
    strongest one at its swept batch size; each call measures one window of each and keeps them."""

    def __init__(
        self,
        encoder: Any,
        texts: Sequence[str],
        seconds: float,
        configs: dict[str, Any] | None = None,
        sample: int = SAMPLE,
    ) -> None:
        self.encoder, self.texts, self.seconds = encoder, texts, seconds
        self.configs, self.sample = configs, sample
        self.windows: list[dict[str, Any]] = []
        self.strongest_windows: list[dict[str, Any]] = []

    def __call__(self) -> dict[str, float]:
        self.windows.append(measure_inprocess(self.encoder, self.texts, seconds=self.seconds))
        figures = {"inprocess": float(self.windows[-1]["items_per_s"])}
        if self.configs is not None:
            best, overlap = self.configs["strongest"]["batch"], self.configs["strongest"]["overlap"]
            self.strongest_windows.append(
                measure_pipelined(
                    self.encoder,
                    self.texts,
                    batch=best,
                    seconds=self.seconds,
                    sample=self.sample,
                    overlap=overlap,
                )
            )
            figures["strongest"] = float(self.strongest_windows[-1]["items_per_s"])
        return figures


def _grid_cells(
    spec: Any, encoder: Any, texts: Sequence[str], sidecar_url: str, service: bool, grid: dict[str, Any]
) -> list[dict[str, Any]]:
    """The grid's cells: the Ray-free model service's (when asked), then the sidecar's over HTTP."""
    cells: list[dict[str, Any]] = []
    if service:
        cells += asyncio.run(_service_grid(spec, encoder, texts, **grid))
    return cells + asyncio.run(http_grid(sidecar_url, spec.id, texts, **grid))


def _machine(threads: int) -> dict[str, Any]:
    import torch

    return {
        "cpus": os.cpu_count(),
        "torch_threads": threads,
        "platform": platform.platform(),
        "cuda": torch.cuda.is_available(),
    }


def _baseline_summary(windows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The in-process batch-32 windows taken beside the grid's cells: their mean and range."""
    speeds = [w["items_per_s"] for w in windows]
    return {
        "windows": len(windows),
        "items_per_s": sum(speeds) / len(speeds),
        "min_items_per_s": min(speeds),
        "max_items_per_s": max(speeds),
        "tokens_per_s": sum(w["tokens_per_s"] for w in windows) / len(windows),
    }


def run_sidecar_benchmark(sidecar_url: str, plan: SidecarPlan) -> dict[str, Any]:
    """Measure the sidecar at ``sidecar_url`` (serving :data:`benchmarks.stack.BENCH_MODEL`) against
    in-process throughput of the same model; return a dict.

    First the in-process configurations side by side (:func:`measure_configurations`); then the
    grid, whose baseline windows measure in-process batch 32 (the goal table's baseline) and the
    strongest configuration at its swept batch size, so every cell has both ratios.
    ``plan.repeats`` windows of the headline concurrency's cells give each headline its spread.
    """
    from inference.config import resolve_weights

    spec, encoder, threads = bench_encoder()
    texts = corpus()
    started = time.perf_counter()
    configs = measure_configurations(
        encoder,
        texts,
        resolve_weights(spec),
        batches=plan.sweep_batches,
        seconds=plan.sweep_seconds,
        sample=plan.sweep_sample,
    )
    baseline = Baselines(encoder, texts, plan.baseline_seconds, configs, plan.sweep_sample)
    grid = {
        "baseline": baseline,
        "concurrencies": tuple(plan.concurrencies),
        "sizes": tuple(plan.sizes),
        "seconds": plan.seconds_per_cell,
        "repeats": plan.repeats,
    }
    cells = _grid_cells(spec, encoder, texts, sidecar_url, plan.service, grid)
    name = "{mode}_c{concurrency}_{request_size}item".format
    ratios = {name(**c): c["ratio_to_inprocess"] for c in cells}
    spreads = {name(**c): c["spread"]["ratio_to_inprocess"] for c in cells}
    result = {
        "model": spec.id,
        "machine": _machine(threads),
        "baseline": _baseline_summary(baseline.windows),
        "repeats": plan.repeats,
        "headline_concurrency": headline_concurrency(plan.concurrencies),
        "cells": cells,
        "ratios": ratios,
        "spreads": spreads,
        "bars": bar_verdicts(ratios, spreads),
        "wall_s": time.perf_counter() - started,
    }
    strong = [w["items_per_s"] for w in baseline.strongest_windows]
    configs["strongest"]["grid_windows"] = {
        "windows": len(strong), "items_per_s": statistics.fmean(strong),
        "min_items_per_s": min(strong), "max_items_per_s": max(strong),
    }  # fmt: skip
    result["configurations"] = configs
    return result


CONFIGURATIONS = {
    "inprocess_batch32": "in-process batch 32, tokenize then run (the goal table's baseline)",
    "strongest": "in-process strongest: all cores, swept batch, tokenization overlapped if faster",
    "ceiling": "ceiling: forward pass alone on pre-tokenized batches",
    "st_encode": "sentence-transformers encode(), swept batch",
}
