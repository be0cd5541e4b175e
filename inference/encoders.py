"""Model wrappers: prepare (tokenize / decode) -> collate -> forward -> finish (pool, normalize, to CPU).

The split follows Infinity's encode_pre / encode_core / encode_post: ``prepare`` runs per request in a
CPU pool (and is where over-long input is refused), ``run_batch`` = ``finish(forward(collate(items)))``
runs per micro-batch on the device thread. Nothing here knows about Ray or HTTP, so the same code serves
in a Serve replica, in a test process and in the in-process benchmark.

- :class:`TextEncoder`: dense vectors (CLS or mean pooling, L2-normalized) and optionally bge-m3 sparse
  lexical weights ``relu(sparse_linear(hidden))``, max per token id, special tokens dropped.
- :class:`ImageTextEncoder`: a SigLIP-style joint model; text padded to ``max_length`` as it was trained,
  image and text features normalized here (the model returns them unnormalized).
- :class:`CrossEncoder`: a sequence-classification reranker; one logit per (query, document) pair.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .config import ModelSpec, resolve_weights
from .errors import InputTooLong

__all__ = [
    "CrossEncoder",
    "Encoder",
    "ImageTextEncoder",
    "OpenClipEncoder",
    "TextEmbedding",
    "TextEncoder",
    "TokenizedText",
    "load_encoder",
    "pass_overhead_tokens",
    "resolve_device",
    "resolve_dtype",
]

log = logging.getLogger(__name__)

_SANE_MAX_LENGTH = 1_000_000  # tokenizers without a limit report ~1e30


def pass_overhead_tokens(small: tuple[int, float], big: tuple[int, float], limit: int) -> float:
    """A forward pass's fixed cost in padded tokens, from two timed passes: ``(padded tokens,
    seconds)`` of a small one and a big one. The second minus the first gives a token's cost; the
    small pass's time beyond its tokens, in tokens, is the pass's own cost.

    Always in ``[1, limit]``, whatever the clock said: where the big pass was no slower (padding
    nearly free, a GPU below saturation; or a stall of a loaded machine during the small one) it is
    ``limit``, so the batcher keeps its batches full.
    """
    (small_tokens, small_s), (big_tokens, big_s) = small, big
    per_token = (big_s - small_s) / (big_tokens - small_tokens)
    if per_token <= 0:
        return float(limit)
    return float(min(limit, max(1.0, small_s / per_token - small_tokens)))


@dataclasses.dataclass(frozen=True)
class TokenizedText:
    """One prepared text (or text pair): the tokenizer's fields, unpadded."""

    fields: dict[str, list[int]]

    @property
    def length(self) -> int:
        return len(self.fields["input_ids"])


@dataclasses.dataclass(frozen=True)
class TextEmbedding:
    dense: np.ndarray  # float32, L2-normalized
    sparse: dict[int, float] | None = None


def resolve_device(requested: str) -> str:
    """``auto`` -> ``cuda`` when present, else ``cpu``; an explicit CUDA device that is absent is an error."""
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {requested!r} was configured but CUDA is not available")
    return requested


def resolve_dtype(requested: str, device: str):
    """``auto`` -> bf16 (or fp16) on CUDA, fp32 on CPU."""
    import torch

    if requested == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[requested]


def _normalize(x) -> np.ndarray:
    import torch

    x = torch.nn.functional.normalize(x.float(), p=2, dim=-1)
    return x.cpu().numpy().astype(np.float32, copy=False)


class Encoder:
    """What every model wrapper shares: device, dtype, limits, tokenization, ``run_batch``, warm-up."""

    kind: str = ""

    def __init__(self, spec: ModelSpec, path: Path) -> None:
        import torch

        self.spec = spec
        self.path = path
        self.device = resolve_device(spec.device)
        self.torch_dtype = resolve_dtype(spec.dtype, self.device)
        self.dtype = str(self.torch_dtype).removeprefix("torch.")
        if spec.torch_threads:
            torch.set_num_threads(spec.torch_threads)
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # weight-loading bars are noise in service logs
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = self._load_model().to(self.device).eval()
        self.max_input_tokens = self._max_input_tokens()

    def _model_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"dtype": self.torch_dtype}
        if self.device.startswith("cuda"):
            kwargs["attn_implementation"] = "sdpa"
        return kwargs

    def _load_model(self):
        raise NotImplementedError

    def _max_input_tokens(self) -> int:
        if self.spec.max_input_tokens:
            return self.spec.max_input_tokens
        st_config = self.path / "sentence_bert_config.json"
        if st_config.is_file():  # sentence-transformers checkpoints state the length they were tuned for
            length = json.loads(st_config.read_text()).get("max_seq_length")
            if length:
                return int(length)
        config = self.model.config
        positions = getattr(config, "max_position_embeddings", None) or _SANE_MAX_LENGTH
        if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
            positions -= 2  # positions start after padding_idx
        limit = self.tokenizer.model_max_length
        return int(min(positions, limit if limit < _SANE_MAX_LENGTH else positions))

    @property
    def dimension(self) -> int | None:
        raise NotImplementedError

    def capabilities(self) -> list[str]:
        """What the model can do, as ``GET /models`` states it (so callers never probe):
        ``dense``, ``sparse`` (bge-m3 lexical weights), ``text`` and ``image`` (the towers of an
        image-text model), ``rerank``."""
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        return {
            "id": self.spec.id,
            "kind": self.kind,
            "capabilities": self.capabilities(),
            "dimension": self.dimension,
            "max_input_tokens": self.max_input_tokens,
            "device": self.device,
            "dtype": self.dtype,
        }

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as the model counts them (special tokens included, nothing truncated)."""
        encoded = self.tokenizer(list(texts), add_special_tokens=True, truncation=False, verbose=False)
        return [len(ids) for ids in encoded["input_ids"]]

    def _tokenize(self, texts: Sequence[str], pairs: Sequence[str] | None, *, truncate: bool, limit: int):
        """Tokenize without padding; over ``limit`` either truncate or raise :class:`InputTooLong`."""
        args = (list(texts),) if pairs is None else (list(texts), list(pairs))
        encoded = self.tokenizer(*args, add_special_tokens=True, truncation=False, verbose=False)
        lengths = [len(ids) for ids in encoded["input_ids"]]
        too_long = [i for i, n in enumerate(lengths) if n > limit]
        if too_long and not truncate:
            i = too_long[0]
            raise InputTooLong(
                f"input {i} has {lengths[i]} tokens; model {self.spec.id!r} accepts at most {limit} "
                f"(send truncate: true to cut it)"
            )
        if too_long:
            strategy = "longest_first" if pairs is None else "only_second"
            try:
                cut = self.tokenizer(
                    *([a[i] for i in too_long] for a in args),
                    add_special_tokens=True,
                    truncation=strategy,
                    max_length=limit,
                    verbose=False,
                )
            except Exception as exc:  # e.g. the query alone is over the limit
                raise InputTooLong(f"input cannot be truncated to {limit} tokens: {exc}") from exc
            for k, i in enumerate(too_long):
                for key in encoded:
                    encoded[key][i] = cut[key][k]
        keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in encoded]
        return [TokenizedText({k: encoded[k][i] for k in keys}) for i in range(len(lengths))]

    def _pad(self, items: Sequence[TokenizedText], **padding) -> dict[str, Any]:
        batch = self.tokenizer.pad([item.fields for item in items], return_tensors="pt", **padding)
        return {k: v.to(self.device) for k, v in batch.items()}

    def run_batch(self, items: list[Any]) -> list[Any]:
        """One micro-batch: collate, forward, finish. Called from the device thread."""
        import torch

        with torch.inference_mode():
            batch = self.collate(items)
            return self.finish(self.forward(batch), batch)

    def collate(self, items: list[Any]) -> dict[str, Any]:
        raise NotImplementedError

    def forward(self, batch: dict[str, Any]) -> Any:
        raise NotImplementedError

    def finish(self, raw: Any, batch: dict[str, Any]) -> list[Any]:
        raise NotImplementedError

    # Whether collate pads a batch to its longest input (then a batch's cost depends on how the
    # batcher groups lengths, and measure_batch_overhead has something to weigh).
    pads_to_longest = False

    def _warm_inputs(self, texts: list[str]) -> list[Any]:
        """The main batcher's inputs for ``texts`` (a reranker pairs each with a query)."""
        return self.prepare(texts, truncate=True)  # type: ignore[attr-defined]

    def measure_batch_overhead(self, *, repeats: int = 3) -> float | None:
        """A forward pass's fixed cost in padded tokens, timed on this device (None: nothing to weigh).

        One short input alone against a batch of 128-token inputs, each the median of ``repeats``
        runs, read by :func:`pass_overhead_tokens`.
        """
        if not self.pads_to_longest:
            return None
        limit = self.spec.max_batch_tokens
        (small,) = self._warm_inputs([self._warm_text(min(16, self.max_input_tokens))])
        long_tokens = max(1, min(128, self.max_input_tokens))
        count = max(1, min(8, self.spec.max_batch_size, limit // long_tokens))
        big = self._warm_inputs([self._warm_text(long_tokens)] * count)
        small_tokens, big_tokens = small.length, count * max(item.length for item in big)
        if big_tokens <= small_tokens:
            return None  # a model whose window is tiny: every batch costs about the same

        def median_seconds(items: list[Any]) -> float:
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                self.run_batch(items)
                times.append(time.perf_counter() - started)
            return sorted(times)[len(times) // 2]

        return pass_overhead_tokens(
            (small_tokens, median_seconds([small])), (big_tokens, median_seconds(big)), limit
        )

    def warm_up_tokens(self) -> int:
        """The longest input the largest allowed batch can hold under the token budget."""
        budget = self.spec.max_batch_tokens // self.spec.max_batch_size
        return max(4, min(self.max_input_tokens, budget))

    def _warm_text(self, tokens: int) -> str:
        # "word " is about one token per repeat in every tokenizer we serve; truncate makes it exact.
        return "warm " * tokens


class TextEncoder(Encoder):
    """Dense (and optionally sparse) text embeddings."""

    kind = "text"

    def capabilities(self) -> list[str]:
        return ["dense", "sparse"] if self.sparse_linear is not None else ["dense"]

    pads_to_longest = True

    def _load_model(self):
        import torch
        from transformers import AutoModel

        model = AutoModel.from_pretrained(self.path, **self._model_kwargs())
        self.sparse_linear = None
        if self.spec.sparse:
            head_path = self.path / "sparse_linear.pt"
            if not head_path.is_file():
                from .config import ModelWeightsMissing

                raise ModelWeightsMissing(f"model {self.spec.id!r}: sparse head not found at {head_path}")
            state = torch.load(head_path, map_location="cpu", weights_only=True)
            head = torch.nn.Linear(model.config.hidden_size, 1)
            head.load_state_dict(state)
            self.sparse_linear = head.to(self.device, self.torch_dtype).eval()
        special = set(self.tokenizer.all_special_ids)
        self._special_ids = np.array(sorted(special), dtype=np.int64)
        return model

    @property
    def dimension(self) -> int:
        return int(self.model.config.hidden_size)

    def prepare(self, texts: Sequence[str], *, truncate: bool) -> list[TokenizedText]:
        return self._tokenize(texts, None, truncate=truncate, limit=self.max_input_tokens)

    def collate(self, items: list[TokenizedText]) -> dict[str, Any]:
        return self._pad(items, padding="longest")

    def forward(self, batch: dict[str, Any]) -> Any:
        return self.model(**batch).last_hidden_state

    def finish(self, hidden, batch: dict[str, Any]) -> list[TextEmbedding]:
        import torch

        mask = batch["attention_mask"]
        states = hidden.float()  # pool in fp32 whatever the model ran in (bf16/fp16 on CUDA)
        if self.spec.pooling == "cls":
            pooled = states[:, 0]
        else:
            weights = mask.unsqueeze(-1).to(states.dtype)
            pooled = (states * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        dense = _normalize(pooled)
        sparse: list[dict[int, float] | None] = [None] * len(dense)
        if self.sparse_linear is not None:
            weights = torch.relu(self.sparse_linear(hidden)).squeeze(-1).float().cpu().numpy()
            ids = batch["input_ids"].cpu().numpy()
            keep = mask.cpu().numpy().astype(bool) & ~np.isin(ids, self._special_ids)
            sparse = [_max_per_token(ids[i][keep[i]], weights[i][keep[i]]) for i in range(len(dense))]
        return [TextEmbedding(dense[i], sparse[i]) for i in range(len(dense))]

    def warm_up(self) -> None:
        n = self.warm_up_tokens()
        items = self.prepare([self._warm_text(n)] * self.spec.max_batch_size, truncate=True)
        self.run_batch(items)


def _max_per_token(ids: np.ndarray, weights: np.ndarray) -> dict[int, float]:
    """bge-m3 lexical weights: the max weight per token id, positive weights only."""
    result: dict[int, float] = {}
    for token, weight in zip(ids.tolist(), weights.tolist(), strict=True):
        if weight > 0 and weight > result.get(token, 0.0):
            result[token] = weight
    return result


class ImageTextEncoder(Encoder):
    """A SigLIP-style joint model: ``run_batch`` takes pixel tensors, ``run_text_batch`` token lists."""

    kind = "image_text"

    def capabilities(self) -> list[str]:
        return ["dense", "image", "text"]

    def _load_model(self):
        from transformers import AutoImageProcessor, AutoModel

        self.image_processor = AutoImageProcessor.from_pretrained(self.path)
        model = AutoModel.from_pretrained(self.path, **self._model_kwargs())
        if not hasattr(model, "get_image_features") or not hasattr(model, "get_text_features"):
            raise TypeError(f"model {self.spec.id!r} at {self.path} is not a joint image-text model")
        return model

    def _max_input_tokens(self) -> int:
        if self.spec.text_max_length:
            return self.spec.text_max_length
        return int(self.model.config.text_config.max_position_embeddings)

    @property
    def dimension(self) -> int:
        config = self.model.config
        return int(getattr(config, "projection_dim", None) or config.text_config.hidden_size)

    @property
    def tokens_per_image(self) -> int:
        """Patches per image: the token cost of one image under ``max_batch_tokens``."""
        vision = self.model.config.vision_config
        return int((vision.image_size // vision.patch_size) ** 2)

    def prepare_images(self, images: Sequence[Any]) -> list[Any]:
        """Decoded RGB images -> one pixel tensor each (resize, rescale, normalize)."""
        pixels = self.image_processor(images=list(images), return_tensors="pt")["pixel_values"]
        return list(pixels)

    def prepare(self, texts: Sequence[str], *, truncate: bool) -> list[TokenizedText]:
        return self._tokenize(texts, None, truncate=truncate, limit=self.max_input_tokens)

    def collate(self, items: list[Any]) -> dict[str, Any]:
        import torch

        return {"pixel_values": torch.stack(items).to(self.device, self.torch_dtype)}

    def forward(self, batch: dict[str, Any]) -> Any:
        return self.model.get_image_features(**batch).pooler_output

    def finish(self, raw, batch: dict[str, Any]) -> list[np.ndarray]:
        return list(_normalize(raw))

    def run_text_batch(self, items: list[TokenizedText]) -> list[np.ndarray]:
        """Text tower: padded to ``max_length`` as trained; the mask is not passed, as in training."""
        import torch

        with torch.inference_mode():
            batch = self._pad(items, padding="max_length", max_length=self.max_input_tokens)
            raw = self.model.get_text_features(input_ids=batch["input_ids"]).pooler_output
            return list(_normalize(raw))

    def warm_up(self) -> None:
        from PIL import Image

        size = self.model.config.vision_config.image_size
        image = Image.new("RGB", (size, size), (128, 128, 128))
        self.run_batch(self.prepare_images([image] * self.spec.max_batch_size))
        texts = [self._warm_text(self.max_input_tokens)] * self.spec.max_batch_size
        self.run_text_batch(self.prepare(texts, truncate=True))


class OpenClipEncoder(ImageTextEncoder):
    """A joint image-text model loaded through open_clip (``backend: open_clip``), e.g. ``ViT-B-16-SigLIP``
    from a local ``open_clip_config.json`` + weights directory. Same interface as the transformers
    SigLIP wrapper, so the service, the batcher and the bulk job's actors treat both alike."""

    def __init__(self, spec: ModelSpec, path: Path) -> None:  # no transformers tokenizer or model
        import open_clip
        import torch

        self.spec = spec
        self.path = path
        self.device = resolve_device(spec.device)
        self.torch_dtype = resolve_dtype(spec.dtype, self.device)
        self.dtype = str(self.torch_dtype).removeprefix("torch.")
        if spec.torch_threads:
            torch.set_num_threads(spec.torch_threads)
        if not (path / "open_clip_config.json").is_file():
            from .config import ModelWeightsMissing

            raise ModelWeightsMissing(f"model {spec.id!r}: no open_clip_config.json in {path}")
        if not any(any(path.glob(pattern)) for pattern in ("*.safetensors", "*.bin", "*.pth")):
            # open_clip would warn and keep random weights: that must be a start-up error here.
            from .config import ModelWeightsMissing

            raise ModelWeightsMissing(f"model {spec.id!r}: no open_clip weights in {path}")
        name = f"local-dir:{path}"
        model, _, self.preprocess = open_clip.create_model_and_transforms(name, device=self.device)
        self.model = model.to(self.device, self.torch_dtype).eval()
        self.tokenizer = open_clip.get_tokenizer(name)
        self.max_input_tokens = self._max_input_tokens()

    def _max_input_tokens(self) -> int:
        return int(self.spec.text_max_length or self.tokenizer.context_length)

    @property
    def dimension(self) -> int:
        return int(self.model.visual.output_dim)

    @property
    def tokens_per_image(self) -> int:
        size = self.model.visual.image_size
        patch = self.model.visual.patch_size
        height = size[0] if isinstance(size, (tuple, list)) else size
        step = patch[0] if isinstance(patch, (tuple, list)) else patch
        return int((height // step) ** 2)

    def prepare_images(self, images: Sequence[Any]) -> list[Any]:
        return [self.preprocess(image) for image in images]

    def _ids(self, text: str) -> list[int]:
        sot, eot = self.tokenizer.sot_token_id, self.tokenizer.eot_token_id
        return [sot, *self.tokenizer.encode(text), eot]

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(self._ids(t)) for t in texts]

    def prepare(self, texts: Sequence[str], *, truncate: bool) -> list[TokenizedText]:
        limit = self.max_input_tokens
        out = []
        for i, text in enumerate(texts):
            ids = self._ids(text)
            if len(ids) > limit:
                if not truncate:
                    raise InputTooLong(
                        f"input {i} has {len(ids)} tokens; model {self.spec.id!r} accepts at most {limit} "
                        f"(send truncate: true to cut it)"
                    )
                ids = [*ids[: limit - 1], self.tokenizer.eot_token_id]  # keep the end token: CLIP pools there
            out.append(TokenizedText({"input_ids": ids}))
        return out

    def forward(self, batch: dict[str, Any]) -> Any:
        return self.model.encode_image(batch["pixel_values"])

    def run_text_batch(self, items: list[TokenizedText]) -> list[np.ndarray]:
        import torch

        with torch.inference_mode():
            ids = torch.zeros((len(items), self.max_input_tokens), dtype=torch.long)
            for row, item in enumerate(items):
                tokens = item.fields["input_ids"]
                ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            return list(_normalize(self.model.encode_text(ids.to(self.device))))

    def warm_up(self) -> None:
        from PIL import Image

        image = Image.new("RGB", (64, 64), (128, 128, 128))  # any size: the transform resizes it
        self.run_batch(self.prepare_images([image] * self.spec.max_batch_size))
        self.run_text_batch(self.prepare(["warm"] * self.spec.max_batch_size, truncate=True))


class CrossEncoder(Encoder):
    """A reranker: one relevance logit per (query, document) pair."""

    kind = "rerank"

    def capabilities(self) -> list[str]:
        return ["rerank"]

    pads_to_longest = True

    def _load_model(self):
        from transformers import AutoModelForSequenceClassification

        return AutoModelForSequenceClassification.from_pretrained(self.path, **self._model_kwargs())

    @property
    def dimension(self) -> None:
        return None

    def _warm_inputs(self, texts: list[str]) -> list[Any]:
        return self.prepare_pairs("warm", texts, truncate=True)

    def prepare_pairs(self, query: str, documents: Sequence[str], *, truncate: bool) -> list[TokenizedText]:
        return self._tokenize(
            [query] * len(documents), documents, truncate=truncate, limit=self.max_input_tokens
        )

    def collate(self, items: list[TokenizedText]) -> dict[str, Any]:
        return self._pad(items, padding="longest")

    def forward(self, batch: dict[str, Any]) -> Any:
        return self.model(**batch).logits

    def finish(self, logits, batch: dict[str, Any]) -> list[float]:
        return [float(x) for x in logits[:, 0].float().cpu().tolist()]

    def warm_up(self) -> None:
        n = self.warm_up_tokens()
        items = self.prepare_pairs("warm", [self._warm_text(n)] * self.spec.max_batch_size, truncate=True)
        self.run_batch(items)


_ENCODERS: dict[str, type[Encoder]] = {
    "text": TextEncoder,
    "image_text": ImageTextEncoder,
    "rerank": CrossEncoder,
}


def load_encoder(spec: ModelSpec) -> Encoder:
    """Load ``spec``'s weights through transformers (local files only) into the right wrapper."""
    path = resolve_weights(spec)
    log.info("loading model %s (%s, %s) from %s", spec.id, spec.kind, spec.backend, path)
    if spec.backend == "open_clip":
        return OpenClipEncoder(spec, path)
    return _ENCODERS[spec.kind](spec, path)
