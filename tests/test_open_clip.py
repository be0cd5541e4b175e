"""The open_clip backend: a tiny seeded CLIP built as an open_clip local-dir, loaded and served through
the same encoder interface and in-process service as the transformers SigLIP (no Ray needed)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inference.config import ConfigError, ModelSpec, ModelWeightsMissing, config_from_dict
from inference.encoders import OpenClipEncoder, load_encoder
from inference.errors import InputTooLong
from inference.service import ModelService
from tests.image_support import COINS

SPEC = {
    "id": "tiny-open-clip-random",
    "kind": "image_text",
    "backend": "open_clip",
    "build": "tiny-open-clip",
    "max_batch_size": 4,
    "max_client_batch": 8,
    "max_queued_items": 16,
}


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> OpenClipEncoder:
    weights = tmp_path_factory.mktemp("oc") / "tiny-open-clip-random"
    spec = config_from_dict({"models": [{**SPEC, "weights": str(weights)}]}).models[0]
    loaded = load_encoder(spec)
    assert isinstance(loaded, OpenClipEncoder)
    return loaded


def test_loads_through_open_clip_with_its_bpe(encoder: OpenClipEncoder) -> None:
    assert encoder.info() == {
        "id": "tiny-open-clip-random",
        "kind": "image_text",
        "capabilities": ["dense", "image", "text"],
        "dimension": 32,
        "max_input_tokens": 16,
        "device": "cpu",
        "dtype": "float32",
    }
    assert encoder.tokens_per_image == 16
    assert encoder.count_tokens(["a red-figure amphora"]) == [
        len(encoder.tokenizer.encode("a red-figure amphora")) + 2
    ]
    with pytest.raises(InputTooLong, match="at most 16"):
        encoder.prepare(["coin " * 30], truncate=False)
    (cut,) = encoder.prepare(["coin " * 30], truncate=True)
    assert cut.length == 16 and cut.fields["input_ids"][-1] == encoder.tokenizer.eot_token_id


async def test_serves_images_and_texts_in_one_space(encoder: OpenClipEncoder) -> None:
    service = ModelService(encoder.spec, encoder=encoder)
    await service.warm_up_async()
    photo = (COINS / "1e").iterdir().__next__().read_bytes()
    other = io.BytesIO()
    Image.new("RGB", (50, 70), (10, 200, 30)).save(other, format="PNG")
    images = (await service.embed_images([photo, other.getvalue(), photo]))["dense"]
    texts = (await service.embed_texts(["a one euro coin", "a green square"]))["dense"]
    images, texts = np.asarray(images), np.asarray(texts)
    assert images.shape == (3, 32) and texts.shape == (2, 32)
    assert np.allclose(np.linalg.norm(images, axis=1), 1, atol=1e-5)
    assert np.allclose(images[0], images[2]) and not np.allclose(images[0], images[1])
    assert np.allclose(np.linalg.norm(texts, axis=1), 1, atol=1e-5)
    assert not np.allclose(texts[0], texts[1])


def test_missing_weights_and_wrong_kind_are_loud(tmp_path: Path) -> None:
    (tmp_path / "open_clip_config.json").write_text('{"model_cfg": {}}')
    with pytest.raises(ModelWeightsMissing, match="no open_clip weights"):
        OpenClipEncoder(
            ModelSpec(id="x", kind="image_text", weights=str(tmp_path), backend="open_clip"), tmp_path
        )
    with pytest.raises(ModelWeightsMissing, match=r"open_clip_config\.json"):
        OpenClipEncoder(
            ModelSpec(id="x", kind="image_text", weights=str(tmp_path), backend="open_clip"),
            tmp_path / "none",
        )
    with pytest.raises(ConfigError, match="image_text models only"):
        config_from_dict({"models": [{"id": "x", "kind": "text", "weights": "w", "backend": "open_clip"}]})
