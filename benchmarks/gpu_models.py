"""The architectures the GPU benchmark measures, built with random weights into real checkpoint
directories that the sidecar's own loader reads: bge-m3 (XLM-R large and its sparse head), a SigLIP
base and an open_clip ViT-B/16, each also as a tiny twin for CPU runs. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = [
    "BGE_M3_SHAPE",
    "build_bge_m3_architecture",
    "build_open_clip_architecture",
    "build_siglip_base_architecture",
]

BGE_M3_SHAPE = {  # BAAI/bge-m3's config.json: XLM-R large
    "vocab_size": 250_002,
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "max_position_embeddings": 8194,
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-5,
}
_XLMR_TINY = {**BGE_M3_SHAPE, "vocab_size": 1000, "hidden_size": 32, "num_hidden_layers": 2}
_XLMR_TINY.update(num_attention_heads=2, intermediate_size=64, max_position_embeddings=514)

_SIGLIP_TINY = {
    "text": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2},
    "vision": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    },
}


def _tokenizer(model_max_length: int, *, bos: bool):
    # The tiny models' byte-level BPE tokenizer (XLM-R's special ids). Inputs here are built as token
    # ids directly, so its vocabulary is irrelevant; the encoder needs one to load and to pad.
    from inference.tiny import train_tokenizer

    return train_tokenizer(bos=bos, model_max_length=model_max_length)


def _build_on(device: str):
    import torch

    return torch.device(device if device.startswith("cuda") else "cpu")


def build_bge_m3_architecture(out: Path, *, tiny: bool = False, device: str = "cpu") -> Path:
    """XLM-R large + ``sparse_linear.pt`` with random weights, saved as a checkpoint directory."""
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    if (out / "config.json").is_file():
        return out
    shape = _XLMR_TINY if tiny else BGE_M3_SHAPE
    config = XLMRobertaConfig(**shape, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    torch.manual_seed(0)
    with _build_on(device):
        model = XLMRobertaModel(config)
        head = torch.nn.Linear(config.hidden_size, 1)
    model.to("cpu", torch.float32 if tiny else torch.bfloat16).save_pretrained(out)
    torch.save({k: v.cpu() for k, v in head.state_dict().items()}, out / "sparse_linear.pt")
    _tokenizer(config.max_position_embeddings - 2, bos=True).save_pretrained(out)
    return out


def build_siglip_base_architecture(out: Path, *, tiny: bool = False, device: str = "cpu") -> Path:
    """SigLIP base patch16-224 (the config's defaults) with random weights, plus an image processor."""
    import torch
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel

    if (out / "config.json").is_file():
        return out
    text = {"vocab_size": 32_000, "max_position_embeddings": 64}
    ids = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
    vision: dict[str, Any] = {}
    if tiny:
        text = {**text, "vocab_size": 1000, "max_position_embeddings": 16, **_SIGLIP_TINY["text"]}
        vision = dict(_SIGLIP_TINY["vision"])
    config = SiglipConfig(text_config={**text, **ids}, vision_config=vision)
    torch.manual_seed(0)
    with _build_on(device):
        model = SiglipModel(config)
    model.to("cpu", torch.float32 if tiny else torch.bfloat16).save_pretrained(out)
    size = config.vision_config.image_size
    SiglipImageProcessor(
        size={"height": size, "width": size}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    ).save_pretrained(out)
    _tokenizer(text["max_position_embeddings"], bos=False).save_pretrained(out)
    return out


def build_open_clip_architecture(out: Path, *, tiny: bool = False, device: str = "cpu") -> Path:
    """open_clip's ViT-B-16 (224 px, 16 px patches: SigLIP base's vision shape) with random weights,
    saved as an open_clip ``local-dir``; its tokenizer is the CLIP BPE shipped in the package (no
    download, unlike ``ViT-B-16-SigLIP``, whose config names a hub tokenizer)."""
    import torch

    if (out / "open_clip_config.json").is_file():
        return out
    if tiny:
        from inference.tiny import build_tiny_model

        return build_tiny_model("tiny-open-clip", out)
    import open_clip
    from safetensors.torch import save_file

    model_cfg = open_clip.get_model_config("ViT-B-16")
    torch.manual_seed(0)
    with _build_on(device):
        model = open_clip.create_model("ViT-B-16", device=device)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(state, out / "open_clip_model.safetensors")
    preprocess = {"mean": [0.5] * 3, "std": [0.5] * 3}
    (out / "open_clip_config.json").write_text(
        json.dumps({"model_cfg": model_cfg, "preprocess_cfg": preprocess})
    )
    return out
