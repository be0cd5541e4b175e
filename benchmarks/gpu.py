"""GPU mode: the sidecar's own batcher and model code, in-process, on the production architectures.

``mnemo bench --device cuda`` (or ``benchmarks/gpu_run.sh`` on a bare CUDA machine: ``python -m
benchmarks.cli bench --device cuda``) builds the bge-m3 architecture (XLM-R large, 24 x 1024, with its sparse head) and a
SigLIP base (ViT-B/16 at 224 px, 12-layer text tower) from configs with random weights (speed does
not depend on their values), loads them through :func:`inference.encoders.load_encoder` with the
production batching limits of ``inference/models.yaml``, and drives
:class:`inference.batching.TokenBudgetBatcher` with concurrent callers exactly as a replica's
:class:`~inference.service.ModelService` does (one device thread). Measured per dtype (bf16, fp16):

- text tokens/s at 128 and 512 tokens per text (dense + sparse, as bge-m3 is served);
- SigLIP images/s (224 px pixel tensors, as ``prepare_images`` hands them over) and text-tower texts/s;
- the same through the open_clip backend (open_clip's ViT-B-16 at 224 px, SigLIP base's vision shape);
- the same-run baseline: the model's bare forward pass on the same weights at the same batch, with no
  batcher, no collate and no pooling/normalize/copy back (median of synchronized calls after warm-up);
  the ratio is what serving costs;
- model FLOP utilization: FLOPs counted by ``torch.utils.flop_counter`` on one real batch (matmuls,
  convolutions, attention) over the GPU's peak dense bf16/fp16 tensor TFLOPS (:data:`PEAK_TFLOPS`).

No Ray, no database, no network: this module imports neither ray, asyncpg nor aiohttp (a test blocks
them), so a machine with Python, torch and transformers runs it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import random
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .gpu_models import (
    build_bge_m3_architecture,
    build_open_clip_architecture,
    build_siglip_base_architecture,
)
from .measure import Summary, closed_loop, ratio, summarize
from .report import Headline, SuiteResult, Table

__all__ = ["PEAK_TFLOPS", "GpuBenchConfig", "as_suite", "peak_tflops", "run_gpu_benchmark"]

# Peak dense (no sparsity) tensor-core TFLOPS, bf16 / fp16 with fp32 accumulation, per NVIDIA's data
# sheets (SXM parts unless named). The first pattern that matches the device name wins.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"GB200", {"bfloat16": 2500.0, "float16": 2500.0}),
    (r"B200", {"bfloat16": 2250.0, "float16": 2250.0}),
    (r"H200 NVL", {"bfloat16": 835.0, "float16": 835.0}),
    (r"H200", {"bfloat16": 989.0, "float16": 989.0}),
    (r"H100 PCIe", {"bfloat16": 756.0, "float16": 756.0}),
    (r"H100 NVL", {"bfloat16": 835.0, "float16": 835.0}),
    (r"H100|H800|GH200", {"bfloat16": 989.0, "float16": 989.0}),
    (r"A100|A800", {"bfloat16": 312.0, "float16": 312.0}),
    (r"L40S", {"bfloat16": 362.0, "float16": 362.0}),
    (r"L40\b", {"bfloat16": 181.0, "float16": 181.0}),
    (r"\bL4\b", {"bfloat16": 121.0, "float16": 121.0}),
    (r"\bA10\b", {"bfloat16": 125.0, "float16": 125.0}),
    (r"RTX 6000 Ada", {"bfloat16": 364.0, "float16": 364.0}),
    (r"RTX 4090", {"bfloat16": 165.0, "float16": 165.0}),
    (r"V100", {"float16": 125.0}),
    (r"\bT4\b", {"float16": 65.0}),
)


def peak_tflops(device_name: str, dtype: str) -> float | None:
    """Peak dense tensor TFLOPS of ``device_name`` in ``dtype`` (None when unknown or unsupported)."""
    for pattern, peaks in PEAK_TFLOPS:
        if re.search(pattern, device_name):
            return peaks.get(dtype)
    return None


@dataclasses.dataclass(frozen=True)
class GpuBenchConfig:
    """What to measure. ``tiny`` swaps in miniature shapes so the same path runs on a CPU in seconds."""

    device: str = "cuda"
    dtypes: tuple[str, ...] = ("bfloat16", "float16")
    lengths: tuple[int, ...] = (128, 512)
    seconds: float = 4.0  # per measurement (Mnemo path and raw forward each)
    concurrency: int = 8  # concurrent callers feeding the batcher
    request_size: int = 16  # items per caller request
    sparse: bool = True  # bge-m3 is served with its sparse head
    tiny: bool = False
    work_dir: Path | None = None  # where the random-weight checkpoints are written (default: a temp dir)
    faiss_vectors: int = 1_000_000  # the FAISS section's flat index (0: skip it); tiny runs use 2000
    faiss_dimension: int = 1024


def _load(model_id: str, path: Path, config: GpuBenchConfig, dtype: str, **extra: Any) -> tuple[Any, Any]:
    """(spec, encoder): the production spec of ``model_id`` (batch limits from ``inference/models.yaml``)
    pointed at the random-weight checkpoint, loaded by the sidecar's own loader."""
    from inference.config import load_config
    from inference.encoders import load_encoder

    path_yaml = Path(__file__).resolve().parent.parent / "inference" / "models.yaml"
    production = load_config(path_yaml, environ={"RAG_MODELS_DIR": "/nonexistent"}).model(model_id)
    spec = dataclasses.replace(
        production,
        id=f"{model_id}-architecture-random",
        weights=str(path),
        device=config.device,
        dtype=dtype,  # type: ignore[arg-type]
        **extra,
    )
    return spec, load_encoder(spec)


# -- timing -------------------------------------------------------------------------------------------


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _call_times(fn: Callable[[], Any], *, device: str, seconds: float, warmup: int = 3) -> Summary:
    """Seconds per call of ``fn`` (synchronized), over about ``seconds`` after warm-up.

    Warm-up is at least ``warmup`` calls and a quarter of ``seconds``: the first calls pay for kernel
    selection, allocator growth and lazy initialization. Each call is synchronized, as Mnemo's path is
    (its results go back to the host after every batch).
    """
    begin = time.perf_counter()
    calls = 0
    while calls < warmup or time.perf_counter() - begin < seconds / 4:
        fn()
        _sync(device)
        calls += 1
    samples: list[float] = []
    begin = time.perf_counter()
    while time.perf_counter() - begin < seconds or len(samples) < 3:
        start = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - start)
    return summarize(samples)


def _flops(fn: Callable[[], Any]) -> int:
    """FLOPs of one call as PyTorch's flop counter sees them (matmuls, convolutions, attention)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    def cpu_attention(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    # PyTorch counts its CUDA attention kernels but not the CPU one; count it the same way.
    cpu_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    counter = FlopCounterMode(display=False, custom_mapping={cpu_op: cpu_attention})
    with counter:
        fn()
    return int(counter.get_total_flops())


async def _through_batcher(
    run_batch: Callable[[list[Any]], Sequence[Any]],
    items: Sequence[Any],
    cost: int,
    spec: Any,
    config: GpuBenchConfig,
    device: ThreadPoolExecutor,
) -> dict[str, Any]:
    """Concurrent callers -> TokenBudgetBatcher -> ``run_batch`` on the device thread, as a replica runs."""
    from inference.batching import TokenBudgetBatcher

    batcher = TokenBudgetBatcher(
        run_batch,
        max_batch_size=spec.max_batch_size,
        max_batch_tokens=spec.max_batch_tokens,
        max_pending_items=max(spec.max_queued_items, config.concurrency * config.request_size),
        batch_wait_s=spec.batch_wait_ms / 1000,
        executor=device,
        name=f"bench/{spec.id}",
    )
    size = config.request_size

    async def call(i: int) -> None:
        start = (i * size) % len(items)
        await batcher.submit([items[(start + k) % len(items)] for k in range(size)], [cost] * size)

    try:
        await call(0)  # warm the path
        before = batcher.stats.snapshot()
        load = await closed_loop(
            call,
            concurrency=config.concurrency,
            requests=10**9,
            items_per_request=size,
            max_seconds=config.seconds,
        )
        after = batcher.stats.snapshot()
    finally:
        await batcher.close()
    batches = after["batches"] - before["batches"]
    return {
        "items_per_s": load.items_per_s,
        "latency_ms": {"p50": load.latency.median * 1000, "p95": load.latency.p95 * 1000},
        "mean_batch": (after["batch_items"] - before["batch_items"]) / max(1, batches),
        "forward_share": (after["forward_seconds"] - before["forward_seconds"]) / load.wall_s,
    }


def _measure(
    *,
    model: str,
    task: str,
    dtype: str,
    tokens_per_item: int,
    items: Sequence[Any],
    run_batch: Callable[[list[Any]], Sequence[Any]],
    collate: Callable[[list[Any]], Any],
    forward: Callable[[Any], Any],
    spec: Any,
    config: GpuBenchConfig,
    peak: float | None,
) -> dict[str, Any]:
    """One row: Mnemo's path vs the bare forward pass at the batch the batcher forms, plus MFU."""
    import torch

    batch = min(spec.max_batch_size, max(1, spec.max_batch_tokens // tokens_per_item), len(items))
    prebuilt = collate(list(items[:batch]))

    def bare() -> tuple[float, Summary]:
        with torch.inference_mode():
            flops = _flops(lambda: forward(prebuilt))
            return flops, _call_times(lambda: forward(prebuilt), device=config.device, seconds=config.seconds)

    # Both run on one device thread, as in a replica (a CPU run also keeps one thread pool busy).
    with ThreadPoolExecutor(1, thread_name_prefix="bench-device") as device:
        flops, calls = device.submit(bare).result()
        mnemo = asyncio.run(_through_batcher(run_batch, items, tokens_per_item, spec, config, device))
    flops_per_item = flops / batch
    raw_items_per_s = batch / calls.median
    row = {
        "model": model,
        "task": task,
        "dtype": dtype,
        "tokens_per_item": tokens_per_item,
        "batch": batch,
        "items_per_s": mnemo["items_per_s"],
        "tokens_per_s": mnemo["items_per_s"] * tokens_per_item,
        "raw_items_per_s": raw_items_per_s,
        "raw_tokens_per_s": raw_items_per_s * tokens_per_item,
        "raw_forward_ms": {"min": calls.min * 1000, "median": calls.median * 1000, "p95": calls.p95 * 1000},
        "ratio_to_raw": ratio(mnemo["items_per_s"], raw_items_per_s),
        "gflops_per_item": flops_per_item / 1e9,
        "latency_ms": mnemo["latency_ms"],
        "mean_batch": mnemo["mean_batch"],
        "forward_share": mnemo["forward_share"],
        "mfu": None,
        "raw_mfu": None,
    }
    if peak:
        row["mfu"] = mnemo["items_per_s"] * flops_per_item / (peak * 1e12)
        row["raw_mfu"] = raw_items_per_s * flops_per_item / (peak * 1e12)
    return row


def _token_items(n: int, length: int, vocab: int, *, bos: bool, seed: int) -> list[Any]:
    """``n`` pre-tokenized texts of exactly ``length`` tokens (random ids between the special tokens)."""
    from inference.encoders import TokenizedText

    rng = random.Random(seed)
    body = length - (2 if bos else 1)
    items = []
    for _ in range(n):
        ids = ([0] if bos else []) + [rng.randrange(5, vocab) for _ in range(body)] + [2]
        items.append(TokenizedText({"input_ids": ids, "attention_mask": [1] * length}))
    return items


def _text_rows(path: Path, config: GpuBenchConfig, dtype: str, peak: float | None) -> list[dict[str, Any]]:
    spec, encoder = _load("bge-m3", path, config, dtype, sparse=config.sparse)
    vocab = int(encoder.model.config.vocab_size)
    n = max(spec.max_batch_size, config.concurrency * config.request_size)
    return [
        _measure(
            model="bge-m3 architecture (XLM-R large)",
            task=f"/embed dense{' + sparse' if config.sparse else ''}",
            dtype=dtype,
            tokens_per_item=length,
            items=_token_items(n, length, vocab, bos=True, seed=length),
            run_batch=encoder.run_batch,
            collate=encoder.collate,
            forward=encoder.forward,
            spec=spec,
            config=config,
            peak=peak,
        )
        for length in config.lengths
    ]


def _image_text_rows(
    path: Path, config: GpuBenchConfig, dtype: str, peak: float | None, backend: str = "transformers"
) -> list[dict[str, Any]]:
    """An image-text model's /image and /text (text tower) rows: SigLIP base through transformers, or
    open_clip's ViT-B-16 through the open_clip backend (``backend: open_clip``)."""
    import torch

    spec, encoder = _load("siglip-base", path, config, dtype, backend=backend)
    n = max(spec.max_batch_size, config.concurrency * config.request_size)
    text_length = encoder.max_input_tokens
    if backend == "open_clip":
        model, size = "open_clip ViT-B-16 (224 px)", encoder.model.visual.image_size
        vocab = encoder.model.vocab_size

        def collate_text(items: list[Any]) -> Any:
            ids = torch.zeros((len(items), text_length), dtype=torch.long)
            for row, item in enumerate(items):
                ids[row, : item.length] = torch.tensor(item.fields["input_ids"][:text_length])
            return ids.to(encoder.device)

        def forward_text(batch: Any) -> Any:
            return encoder.model.encode_text(batch)

    else:
        model, size = "SigLIP base (ViT-B/16, 224 px)", encoder.model.config.vision_config.image_size
        vocab = encoder.model.config.text_config.vocab_size

        def collate_text(items: list[Any]) -> Any:
            return encoder._pad(items, padding="max_length", max_length=text_length)

        def forward_text(batch: Any) -> Any:
            return encoder.model.get_text_features(input_ids=batch["input_ids"]).pooler_output

    size = int(size[0] if isinstance(size, (tuple, list)) else size)
    generator = torch.Generator().manual_seed(0)
    pixels = [torch.randn(3, size, size, generator=generator) for _ in range(n)]  # as prepare_images yields
    texts = _token_items(n, text_length, int(vocab), bos=False, seed=1)
    common = {"model": model, "dtype": dtype, "spec": spec, "config": config, "peak": peak}
    return [
        _measure(
            task="/image",
            tokens_per_item=encoder.tokens_per_image,
            items=pixels,
            run_batch=encoder.run_batch,
            collate=encoder.collate,
            forward=encoder.forward,
            **common,
        ),
        _measure(
            task="/text (text tower)",
            tokens_per_item=text_length,
            items=texts,
            run_batch=encoder.run_text_batch,
            collate=collate_text,
            forward=forward_text,
            **common,
        ),
    ]


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"


def run_gpu_benchmark(config: GpuBenchConfig) -> dict[str, Any]:
    """Build both architectures, measure every (dtype, model, task, length); a JSON-able dict."""
    import torch

    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for, but torch sees no CUDA device")
    started = time.perf_counter()
    name = _device_name(config.device)
    work = config.work_dir or Path(tempfile.mkdtemp(prefix="mnemo-bench-gpu-"))
    shape = "tiny" if config.tiny else "full"
    text_path = build_bge_m3_architecture(work / f"bge-m3-{shape}", tiny=config.tiny, device=config.device)
    image_path = build_siglip_base_architecture(
        work / f"siglip-{shape}", tiny=config.tiny, device=config.device
    )
    open_clip_path = build_open_clip_architecture(
        work / f"open-clip-{shape}", tiny=config.tiny, device=config.device
    )
    measures = {
        "text": functools.partial(_text_rows, text_path),
        "siglip": functools.partial(_image_text_rows, image_path),
        "open_clip": functools.partial(_image_text_rows, open_clip_path, backend="open_clip"),
    }
    build_s = time.perf_counter() - started
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for dtype in config.dtypes:
        if dtype == "bfloat16" and config.device.startswith("cuda") and not torch.cuda.is_bf16_supported():
            skipped.append(f"bfloat16: {name} does not support it")
            continue
        peak = peak_tflops(name, dtype)
        for measure in measures.values():
            if config.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            batch_rows = measure(config, dtype, peak)
            if config.device.startswith("cuda"):
                for row in batch_rows:
                    row["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
                torch.cuda.empty_cache()
            rows += batch_rows
    faiss_result = None
    if config.faiss_vectors:
        from .gpu_faiss import FaissBenchConfig, run_faiss_benchmark

        faiss_config = FaissBenchConfig(
            device=config.device,
            vectors=2000 if config.tiny else config.faiss_vectors,
            dimension=64 if config.tiny else config.faiss_dimension,
            seconds=min(config.seconds, 3.0),
            batches=(4, 16) if config.tiny else (16, 128, 1024),
        )
        faiss_result = run_faiss_benchmark(faiss_config, name)
    return {
        "device": config.device,
        "device_name": name,
        "faiss": faiss_result,
        "peak_tflops": {d: peak_tflops(name, d) for d in config.dtypes},
        "torch": torch.__version__,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(config).items()},
        "build_s": build_s,
        "rows": rows,
        "skipped": skipped,
        "wall_s": time.perf_counter() - started,
    }


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def as_suite(result: dict[str, Any]) -> SuiteResult:
    """Headlines (Mnemo's path vs the bare forward pass), a table per row, MFU and notes."""
    headlines = []
    for row in result["rows"]:
        per_token = row["task"].startswith("/embed")
        unit = "tokens/s" if per_token else ("images/s" if row["task"] == "/image" else "texts/s")
        label = f"{row['model'].split(' (')[0]} {row['task']} {row['dtype']}"
        if per_token:
            label += f" @{row['tokens_per_item']} tok"
        value = row["tokens_per_s"] if per_token else row["items_per_s"]
        base = row["raw_tokens_per_s"] if per_token else row["raw_items_per_s"]
        headlines.append(Headline(label, value, unit, f"bare forward, batch {row['batch']}", base))
    columns = ["model", "task", "dtype", "tokens/item", "items/s", "tokens/s", "vs bare forward", "MFU"]
    columns += ["bare MFU", "GFLOP/item", "mean batch", "p50 ms", "p95 ms"]
    keys = ["model", "task", "dtype", "tokens_per_item", "items_per_s", "tokens_per_s", "ratio_to_raw"]
    keys += ["mfu", "raw_mfu", "gflops_per_item", "mean_batch"]
    rows = []
    for r in result["rows"]:
        cells = [_pct(r[k]) if k.endswith("mfu") else r[k] for k in keys]
        rows.append([*cells, r["latency_ms"]["p50"], r["latency_ms"]["p95"]])
    shapes = (
        "TINY shapes (a smoke run, not the real architectures)" if result["config"]["tiny"] else "full shapes"
    )
    title = f"GPU mode on {result['device_name']} (torch {result['torch']}; random weights, {shapes})"
    table = Table(title, columns, rows)
    peaks = ", ".join(f"{d} {p:g} TFLOPS" if p else f"{d} unknown" for d, p in result["peak_tflops"].items())
    notes = [
        f"Peak used for MFU on {result['device_name']}: {peaks} (dense tensor-core data-sheet figures; "
        "MFU = counted model FLOPs per second / peak).",
        "FLOPs come from torch.utils.flop_counter on one real batch: matmuls, convolutions and attention; "
        "layer norms, activations and embeddings are not counted, so MFU is a slight underestimate.",
        "Mnemo's path = concurrent callers -> TokenBudgetBatcher -> collate -> forward -> pool/normalize -> "
        "host, on one device thread; inputs arrive pre-tokenized (tokenization runs in the replica's CPU pool).",
        f"Built the random-weight checkpoints in {result['build_s']:.0f} s; whole run {result['wall_s']:.0f} s.",
    ]
    notes += [f"Skipped {s}." for s in result["skipped"]]
    tables = [table]
    faiss = result.get("faiss")
    if faiss:
        tables.append(_faiss_table(faiss))
        single = faiss["rows"][0]
        if single["hbm_floor_ms"]:
            headlines.append(
                Headline(
                    f"FAISS flat {faiss['vectors']:,}x{faiss['dimension']} {faiss['storage']} single query",
                    single["p50_ms"],
                    "ms p50",
                    "HBM floor (one full read of the matrix)",
                    single["hbm_floor_ms"],
                )
            )
        notes.append(
            f"FAISS {faiss['faiss']}: exact inner-product top-{faiss['k']} over {faiss['vectors']:,} random "
            f"unit vectors of {faiss['dimension']} dims ({faiss['storage']}, {faiss['bytes_per_scan'] / 2**30:.2f} "
            f"GiB per full scan; peak bandwidth {faiss['peak_hbm_gbps'] or 'unknown'} GB/s). Share of peak "
            "bandwidth = one matrix read per call / call time / peak; above 100% a batch is compute-bound."
        )
    return SuiteResult(suite="gpu", headlines=headlines, tables=tables, figures=result, notes=notes)


def _faiss_table(faiss: dict[str, Any]) -> Table:
    columns = ["queries per call", "p50 ms", "p95 ms", "queries/s", "HBM floor ms", "share of peak bandwidth"]
    rows = [
        [
            r["batch"],
            r["p50_ms"],
            r["p95_ms"],
            r["queries_per_s"],
            "n/a" if r["hbm_floor_ms"] is None else r["hbm_floor_ms"],
            _pct(r["share_of_peak_bandwidth"]),
        ]
        for r in faiss["rows"]
    ]
    title = f"FAISS flat search on {faiss['device_name']} ({faiss['vectors']:,} x {faiss['dimension']}, {faiss['storage']})"
    return Table(title, columns, rows)
