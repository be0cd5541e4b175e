"""Tiny seeded models built from configs: the offline profile's stand-ins and the tests' models.

Each recipe writes a normal Hugging Face model directory (config, safetensors, a tokenizer trained in
milliseconds with ``tokenizers``, and for SigLIP an image processor), so the sidecar loads it through
exactly the code path that loads real weights. Weights are random (seeded): vectors are deterministic
but carry no meaning, which is why every such model is served under a name that says ``random``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["RECIPES", "build_tiny_model"]

_CORPUS = """
The amphora shows a red-figure scene of athletes; found in the necropolis in 1921.
When the water came we had to leave the village, and the dam covered the church.
Oral history interview about the harvest, the mill and the old market square.
Silver denarius of Augustus, obverse laureate head, reverse Gaius and Lucius Caesars.
La entrevista trata de la emigración a Francia y del trabajo en las minas.
El pantano inundó el pueblo; las familias se marcharon a la ciudad en 1959.
Moneda de bronce acuñada en Emporion con la leyenda ibérica en el reverso.
L'àmfora de ceràmica ibèrica es va trobar al jaciment del turó de la vila.
Entretien sur la mémoire du village, la guerre et le retour des réfugiés.
Photographie d'une procession, négatif sur plaque de verre, vers 1910.
Inventory number 1987/45-B, signature illegible, oil on canvas, restored.
A letter from the mayor to the governor about the flood and the new road.
""".strip().splitlines()


def _alphabet_corpus() -> list[str]:
    return [*_CORPUS, "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 áéíóúàèòçñü"]


def train_tokenizer(*, bos: bool, model_max_length: int, vocab_size: int = 600):
    """A byte-level BPE tokenizer (every string encodes, nothing is unknown) with XLM-R's special ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0..4, as XLM-R numbers them
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_alphabet_corpus(), trainer=trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
        )
    else:  # SigLIP style: text then </s>, no BOS
        tok.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 2)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        cls_token="<s>",
        sep_token="</s>",
        mask_token="<mask>",
        model_max_length=model_max_length,
    )


def _xlmr_config(vocab_size: int, **extra):
    from transformers import XLMRobertaConfig

    return XLMRobertaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128 + 2,  # XLM-R positions start after padding_idx
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        **extra,
    )


def _tiny_xlmr_sparse(out: Path) -> None:
    """bge-m3's shape in miniature: an XLM-R encoder plus a ``sparse_linear.pt`` lexical head."""
    import torch
    from transformers import XLMRobertaModel

    tokenizer = train_tokenizer(bos=True, model_max_length=128)
    model = XLMRobertaModel(_xlmr_config(len(tokenizer)))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    head = torch.nn.Linear(model.config.hidden_size, 1)
    torch.save(head.state_dict(), out / "sparse_linear.pt")


def _tiny_cross_encoder(out: Path) -> None:
    """bge-reranker's shape in miniature: XLM-R with a one-logit classification head."""
    from transformers import XLMRobertaForSequenceClassification

    tokenizer = train_tokenizer(bos=True, model_max_length=128)
    model = XLMRobertaForSequenceClassification(_xlmr_config(len(tokenizer), num_labels=1))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _tiny_siglip(out: Path) -> None:
    """A SigLIP with 32x32 images, 8x8 patches and a 32-token text tower."""
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel

    tokenizer = train_tokenizer(bos=False, model_max_length=32)
    common = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    config = SiglipConfig(
        text_config={
            **common,
            "vocab_size": len(tokenizer),
            "max_position_embeddings": 32,
            "pad_token_id": 1,
            "bos_token_id": 0,
            "eos_token_id": 2,
        },
        vision_config={**common, "image_size": 32, "patch_size": 8},
    )
    SiglipModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    SiglipImageProcessor(
        size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    ).save_pretrained(out)


def _tiny_open_clip(out: Path) -> None:
    """An open_clip CLIP with 32x32 images, 8x8 patches and a 16-token text tower, saved as an
    open_clip ``local-dir`` (``open_clip_config.json`` + safetensors). Its tokenizer is open_clip's
    CLIP BPE, whose vocabulary ships inside the package (hence the full 49408-token embedding)."""
    from open_clip.model import CLIP
    from safetensors.torch import save_file

    config = {
        "embed_dim": 32,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8, "head_width": 16},
        "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
    }
    model = CLIP(**config)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out / "open_clip_model.safetensors")
    (out / "open_clip_config.json").write_text(
        json.dumps({"model_cfg": config, "preprocess_cfg": {"mean": [0.5] * 3, "std": [0.5] * 3}})
    )


RECIPES: dict[str, Callable[[Path], None]] = {
    "tiny-open-clip": _tiny_open_clip,
    "tiny-xlmr-sparse": _tiny_xlmr_sparse,
    "tiny-cross-encoder": _tiny_cross_encoder,
    "tiny-siglip": _tiny_siglip,
}


def build_tiny_model(recipe: str, out: str | Path, *, seed: int = 0) -> Path:
    """Build ``recipe`` into ``out`` (atomically; an existing build is reused) and return the path."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown tiny model recipe {recipe!r} (known: {sorted(RECIPES)})")
    out = Path(out)
    marker = out / "mnemo_tiny.json"
    if marker.is_file():
        return out
    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            RECIPES[recipe](staging)
        (staging / "mnemo_tiny.json").write_text(
            json.dumps({"recipe": recipe, "seed": seed, "note": "random weights: no meaning"})
        )
        try:
            os.replace(staging, out)  # atomic when `out` is absent or an empty directory
        except OSError:
            if not marker.is_file():  # not a concurrent build that won the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out
