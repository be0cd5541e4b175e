"""One served model, Ray-free: input limits, preparation off the event loop, batching, readiness.

:class:`ModelService` is what a Serve replica wraps and what the in-process benchmark and tests drive
directly. Its async methods validate the request against the model's limits, prepare inputs in a CPU
pool, submit them to a :class:`~inference.batching.TokenBudgetBatcher` whose forward passes run on one
device thread, and return plain picklable results (numpy arrays, lists, dicts).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .batching import TokenBudgetBatcher
from .config import Limits, ModelSpec
from .contract import Route
from .encoders import CrossEncoder, Encoder, ImageTextEncoder, TextEncoder, load_encoder
from .errors import BadRequest, ErrorCode, NotReady, PayloadTooLarge, SidecarApiError
from .images import open_image
from .routes import EMBED, IMAGE, RERANK, ROUTES, TEXT

__all__ = ["ModelService"]

log = logging.getLogger(__name__)


def _routes_serving(kind: str) -> str:
    """The declared routes that take a model of ``kind``, as a wrong-kind error names them."""
    *others, last = [route.path for route in ROUTES if kind in route.model_kinds]
    return f"{', '.join(others)} or {last}" if others else last


class ModelService:
    """A loaded model with its batchers. Call :meth:`warm_up` (or ``await warm_up_async``) before serving."""

    def __init__(
        self,
        spec: ModelSpec,
        limits: Limits | None = None,
        encoder: Encoder | None = None,
        *,
        device_executor: ThreadPoolExecutor | None = None,
    ) -> None:
        self.spec = spec
        self.limits = limits or Limits()
        self.encoder = encoder if encoder is not None else load_encoder(spec)
        self.ready = False
        # One device thread: forward passes never overlap on the device and never block the loop.
        self._device = device_executor or ThreadPoolExecutor(1, thread_name_prefix=f"{spec.id}-device")
        self._prep = ThreadPoolExecutor(2, thread_name_prefix=f"{spec.id}-prep")
        self._batchers: dict[str, TokenBudgetBatcher] = {
            "main": self._batcher(self.encoder.run_batch, "main")
        }
        if isinstance(self.encoder, ImageTextEncoder):
            self._batchers["text"] = self._batcher(self.encoder.run_text_batch, "text")

    def _batcher(self, run_batch, task: str) -> TokenBudgetBatcher:
        spec = self.spec
        return TokenBudgetBatcher(
            run_batch,
            max_batch_size=spec.max_batch_size,
            max_batch_tokens=spec.max_batch_tokens,
            max_pending_items=spec.max_queued_items,
            batch_wait_s=spec.batch_wait_ms / 1000,
            executor=self._device,
            name=f"{spec.id}/{task}",
        )

    # -- lifecycle -------------------------------------------------------------------------------

    def warm_up(self) -> None:
        """A real forward pass at the largest allowed batch; readiness turns on only after it.

        Then the forward pass's fixed cost is set on the main batcher (the spec's, or timed here), so
        waves are cut where padding would cost more than another pass.
        """
        self.encoder.warm_up()
        overhead = self.spec.batch_overhead_tokens
        if overhead is None:
            overhead = self.encoder.measure_batch_overhead()
            log.info(
                "model %s: a forward pass costs about %s padded tokens beyond its inputs",
                self.spec.id,
                "n/a" if overhead is None else f"{overhead:.0f}",
            )
        self._batchers["main"].batch_overhead_tokens = overhead
        self.ready = True

    async def warm_up_async(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._device, self.warm_up)

    def healthy(self) -> bool:
        return all(b.alive for b in self._batchers.values())

    async def close(self) -> None:
        for batcher in self._batchers.values():
            await batcher.close()
        self._device.shutdown(wait=False, cancel_futures=True)
        self._prep.shutdown(wait=False, cancel_futures=True)

    def info(self) -> dict[str, Any]:
        overhead = self._batchers["main"].batch_overhead_tokens
        return {
            **self.encoder.info(),
            "batch_overhead_tokens": None if overhead is None else round(overhead, 1),
        }

    def is_ready(self) -> bool:
        return self.ready and self.healthy()

    def stats(self) -> dict[str, Any]:
        return {task: b.stats.snapshot() for task, b in self._batchers.items()}

    # -- routes ----------------------------------------------------------------------------------

    async def embed(
        self, texts: Sequence[str], *, truncate: bool = False, return_sparse: bool = False
    ) -> dict[str, Any]:
        """``/embed``: ``{"dense": (n, d) float32, "sparse": [{id: w}] | None, "tokens": int}``."""
        (outcome,) = await self.embed_many([texts], truncate=truncate, return_sparse=return_sparse)
        if isinstance(outcome, SidecarApiError):
            raise outcome
        return outcome

    async def embed_many(
        self, groups: Sequence[Sequence[str]], *, truncate: bool = False, return_sparse: bool = False
    ) -> list[dict[str, Any] | SidecarApiError]:
        """Several ``/embed`` requests in one call (the ingress coalesces them): one outcome per group.

        A group's own fault (empty, too many inputs, a text over the limit) is its outcome, an
        exception instance, and its neighbours are still served; the texts of every valid group share
        one submission to the batcher. A fault of the whole call (wrong model kind, not ready, the
        forward pass failed, the queue full) raises for all.
        """
        encoder = self._expect(TextEncoder, EMBED)
        if return_sparse and encoder.sparse_linear is None:
            raise BadRequest(f"model {self.spec.id!r} has no sparse head", code=ErrorCode.SPARSE_UNSUPPORTED)

        def prepare_each() -> list[list[Any] | SidecarApiError]:
            prepared: list[list[Any] | SidecarApiError] = []
            for texts in groups:
                try:
                    self._check_count(texts)
                    prepared.append(encoder.prepare(texts, truncate=truncate))
                except SidecarApiError as exc:
                    prepared.append(exc)
            return prepared

        prepared = await self._run_prep(prepare_each)
        items = [item for group in prepared if isinstance(group, list) for item in group]
        results = iter(await self._batchers["main"].submit(items, [i.length for i in items]))
        outcomes: list[dict[str, Any] | SidecarApiError] = []
        for group in prepared:
            if isinstance(group, SidecarApiError):
                outcomes.append(group)
                continue
            mine = [next(results) for _ in group]
            outcomes.append(
                {
                    "dense": _stack(r.dense for r in mine),
                    "sparse": [r.sparse for r in mine] if return_sparse else None,
                    "tokens": sum(i.length for i in group),
                }
            )
        return outcomes

    async def embed_texts(self, texts: Sequence[str], *, truncate: bool = False) -> dict[str, Any]:
        """``/text``: the joint model's text tower; ``{"dense", "tokens"}``."""
        encoder = self._expect(ImageTextEncoder, TEXT)
        self._check_count(texts)
        items = await self._run_prep(encoder.prepare, texts, truncate=truncate)
        # Every text is padded to max_length, so each costs the full length in the budget.
        results = await self._batchers["text"].submit(items, [encoder.max_input_tokens] * len(items))
        return {"dense": _stack(results), "tokens": sum(i.length for i in items)}

    async def embed_images(self, images: Sequence[bytes]) -> dict[str, Any]:
        """``/image``: raw image bytes (already base64-decoded) -> ``{"dense"}``."""
        encoder = self._expect(ImageTextEncoder, IMAGE)
        self._check_count(images)
        pixels = await self._run_prep(self._prepare_images, encoder, images)
        results = await self._batchers["main"].submit(pixels, [encoder.tokens_per_image] * len(pixels))
        return {"dense": _stack(results), "tokens": 0}

    def _prepare_images(self, encoder: ImageTextEncoder, images: Sequence[bytes]) -> list[Any]:
        decoded = [open_image(raw, i, self.limits.max_image_pixels) for i, raw in enumerate(images)]
        return encoder.prepare_images(decoded)

    async def rerank(
        self, query: str, documents: Sequence[str], *, truncate: bool = True, raw_scores: bool = False
    ) -> dict[str, Any]:
        """``/rerank``: one score per document, in input order (sigmoid unless ``raw_scores``)."""
        encoder = self._expect(CrossEncoder, RERANK)
        self._check_count(documents)
        items = await self._run_prep(encoder.prepare_pairs, query, documents, truncate=truncate)
        logits = await self._batchers["main"].submit(items, [i.length for i in items])
        scores = logits if raw_scores else [1.0 / (1.0 + math.exp(-x)) for x in logits]
        return {"scores": [float(s) for s in scores], "tokens": sum(i.length for i in items)}

    async def tokenize(self, texts: Sequence[str]) -> list[int]:
        """``/tokenize``: token count per text as this model counts it (special tokens included)."""
        self._check_ready()
        self._check_count(texts)
        return await self._run_prep(self.encoder.count_tokens, texts)

    # -- helpers ---------------------------------------------------------------------------------

    def _check_ready(self) -> None:
        if not self.ready:
            raise NotReady(f"model {self.spec.id!r} is still loading or warming up", retry_after=5)

    def _expect(self, cls: type, route: Route):
        self._check_ready()
        if not isinstance(self.encoder, cls):
            raise BadRequest(
                f"model {self.spec.id!r} is a {self.spec.kind} model: use {_routes_serving(self.spec.kind)}, "
                f"not {route.path}",
                code=ErrorCode.WRONG_MODEL_KIND,
            )
        return self.encoder

    def _check_count(self, inputs: Sequence[Any]) -> None:
        if not inputs:
            raise BadRequest("input is empty", code=ErrorCode.EMPTY_INPUT)
        if len(inputs) > self.spec.max_client_batch:
            raise PayloadTooLarge(
                f"{len(inputs)} inputs; model {self.spec.id!r} takes at most {self.spec.max_client_batch} "
                "per request",
                code=ErrorCode.TOO_MANY_INPUTS,
            )

    async def _run_prep(self, fn, *args, **kwargs):
        call = functools.partial(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._prep, call)


def _stack(rows) -> np.ndarray:
    return np.stack(list(rows)).astype(np.float32, copy=False)
