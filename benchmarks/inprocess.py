"""The same model run in-process, the baselines the sidecar benchmark (:mod:`benchmarks.sidecar`)
measures the sidecar against: the wrapper at a fixed batch (:func:`measure_inprocess`), the
strongest configuration with tokenization overlapped (:func:`measure_pipelined`), the forward pass
alone (the ceiling), sentence-transformers' ``encode()``, and the sweeps that pick each one's batch
size (:func:`measure_configurations`).
"""

from __future__ import annotations

import itertools
import queue
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .report import dist_version

__all__ = [
    "SAMPLE",
    "SWEEP_BATCHES",
    "length_sample",
    "measure_configurations",
    "measure_inprocess",
    "measure_pipelined",
    "sweep",
]

# Batch sizes the in-process sweeps try, and the texts a window of theirs runs over (the same texts at
# every batch size, spread over the corpus's lengths).
SWEEP_BATCHES = (8, 16, 32, 64, 128)
SAMPLE = 256


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


class _Prepared:
    """The batches of ``chunks`` in turn (cycling), each prepared for the forward pass (tokenized,
    padded, collated) as ``(items, tokens, tensors)``: ahead, on a helper thread that keeps two ready
    (``overlap``), or on the calling thread when asked for. A preparation's error is raised by the
    call that would have got its batch."""

    def __init__(self, encoder: Any, chunks: list[list[str]], overlap: bool) -> None:
        self.encoder, self.chunks, self.overlap = encoder, chunks, overlap
        self.ready: queue.Queue = queue.Queue(maxsize=2)
        self.stop = threading.Event()
        self.inline = itertools.count()
        self.worker = threading.Thread(target=self._fill, name="bench-tokenize", daemon=True)
        if overlap:
            self.worker.start()

    def _make(self, k: int) -> Any:
        try:
            items = self.encoder.prepare(self.chunks[k % len(self.chunks)], truncate=True)
            return (len(items), sum(p.length for p in items), self.encoder.collate(items))
        except Exception as exc:  # handed to the measuring thread, which raises it
            return exc

    def _fill(self) -> None:
        for k in itertools.count():
            job = self._make(k)
            while not self.stop.is_set():
                try:
                    self.ready.put(job, timeout=0.05)
                    break
                except queue.Full:
                    continue
            if self.stop.is_set():
                return

    def next(self) -> tuple[int, int, Any]:
        job = self.ready.get() if self.overlap else self._make(next(self.inline))
        if isinstance(job, Exception):
            raise job
        return job

    def close(self) -> None:
        self.stop.set()
        if self.overlap:
            self.worker.join()


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
    prepared = _Prepared(encoder, chunks, overlap)

    def run_one() -> tuple[int, int]:
        items, tokens, tensors = prepared.next()
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
        prepared.close()
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
    out["sentence_transformers"] = dist_version("sentence-transformers")
    return out
