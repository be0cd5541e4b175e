"""Model code without Ray: batch independence, pooling and normalization, sparse weights, limits, config."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from inference.config import ConfigError, ModelSpec, ModelWeightsMissing, config_from_dict, load_config
from inference.encoders import Encoder, TextEmbedding, pass_overhead_tokens
from inference.errors import BadRequest, InputTooLong, PayloadTooLarge
from inference.images import decode_base64, open_image
from tests.fixtures.sidecar import bomb_png

WORDS = st.sampled_from(
    "amphora coin dam village harvest mill letter mayor flood road silver bronze water leave church".split()
)
TEXTS = st.lists(WORDS, min_size=1, max_size=24).map(" ".join)
SETTINGS = settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _dense(encoder: Encoder, texts: list[str]) -> np.ndarray:
    return np.stack([r.dense for r in encoder.run_batch(encoder.prepare(texts, truncate=True))])


@pytest.mark.parametrize("model", ["all-minilm-l6-v2", "tiny-bge-m3-random"])
@SETTINGS
@given(target=TEXTS, others=st.lists(TEXTS, max_size=5), position=st.integers(0, 5))
def test_a_vector_does_not_depend_on_its_batch_mates(
    inference_encoders: dict[str, Encoder], model: str, target: str, others: list[str], position: int
) -> None:
    encoder = inference_encoders[model]
    alone = _dense(encoder, [target])[0]
    batch = [*others]
    batch.insert(min(position, len(batch)), target)
    together = _dense(encoder, batch)[min(position, len(others))]
    np.testing.assert_allclose(together, alone, atol=2e-5)


@SETTINGS
@given(query=TEXTS, target=TEXTS, others=st.lists(TEXTS, max_size=5))
def test_a_rerank_score_does_not_depend_on_its_batch_mates(
    inference_encoders: dict[str, Encoder], query: str, target: str, others: list[str]
) -> None:
    encoder = inference_encoders["tiny-reranker-random"]
    alone = encoder.run_batch(encoder.prepare_pairs(query, [target], truncate=True))[0]
    together = encoder.run_batch(encoder.prepare_pairs(query, [*others, target], truncate=True))[-1]
    assert together == pytest.approx(alone, abs=1e-5)


def test_dense_vectors_are_normalized_and_pooled_as_configured(
    inference_encoders: dict[str, Encoder],
) -> None:
    import torch

    encoder = inference_encoders["all-minilm-l6-v2"]
    texts = ["a red-figure amphora", "the dam covered the church when the water came"]
    vectors = _dense(encoder, texts)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    # Mean pooling over real tokens only, computed one text at a time with no padding at all.
    for text, vector in zip(texts, vectors, strict=True):
        batch = encoder.tokenizer([text], return_tensors="pt")
        with torch.inference_mode():
            hidden = encoder.model(**batch).last_hidden_state[0]
        mean = hidden.mean(0).numpy()
        np.testing.assert_allclose(vector, mean / np.linalg.norm(mean), atol=1e-5)
    # CLS pooling for the bge-m3-shaped model.
    tiny = inference_encoders["tiny-bge-m3-random"]
    batch = tiny.tokenizer(["a red-figure amphora"], return_tensors="pt")
    with torch.inference_mode():
        cls = tiny.model(**batch).last_hidden_state[0, 0].numpy()
    np.testing.assert_allclose(
        _dense(tiny, ["a red-figure amphora"])[0], cls / np.linalg.norm(cls), atol=1e-5
    )


def test_sparse_weights_are_max_per_token_without_special_tokens(
    inference_encoders: dict[str, Encoder],
) -> None:
    import torch

    encoder = inference_encoders["tiny-bge-m3-random"]
    text = "amphora amphora coin the the the water"
    result: TextEmbedding = encoder.run_batch(encoder.prepare([text, "x"], truncate=False))[0]
    assert result.sparse
    ids = encoder.tokenizer(text)["input_ids"]
    special = set(encoder.tokenizer.all_special_ids)
    assert set(result.sparse) <= set(ids) - special
    assert all(w > 0 for w in result.sparse.values())
    with torch.inference_mode():
        hidden = encoder.model(**encoder.tokenizer([text], return_tensors="pt")).last_hidden_state
        weights = torch.relu(encoder.sparse_linear(hidden))[0, :, 0].tolist()
    expected: dict[int, float] = {}
    for token, weight in zip(ids, weights, strict=True):
        if token not in special and weight > 0:
            expected[token] = max(expected.get(token, 0.0), weight)
    assert result.sparse.keys() == expected.keys()
    for token, weight in expected.items():
        assert result.sparse[token] == pytest.approx(weight, abs=1e-5)


def test_siglip_text_is_padded_to_max_length_and_images_normalized(
    inference_encoders: dict[str, Encoder],
) -> None:
    encoder = inference_encoders["tiny-siglip-random"]
    short = encoder.run_text_batch(encoder.prepare(["a vase"], truncate=False))[0]
    mixed = encoder.run_text_batch(encoder.prepare(["a vase", "a much longer text " * 3], truncate=True))[0]
    np.testing.assert_allclose(short, mixed, atol=1e-6)
    assert np.linalg.norm(short) == pytest.approx(1.0, abs=1e-5)
    image = Image.new("RGB", (64, 48), (10, 200, 30))
    vector = encoder.run_batch(encoder.prepare_images([image]))[0]
    assert vector.shape == (encoder.dimension,)
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)


def test_over_long_input_is_refused_unless_truncated(inference_encoders: dict[str, Encoder]) -> None:
    encoder = inference_encoders["tiny-bge-m3-random"]
    long_text = "amphora " * 400
    with pytest.raises(InputTooLong, match="accepts at most 128"):
        encoder.prepare([long_text], truncate=False)
    (item,) = encoder.prepare([long_text], truncate=True)
    assert item.length == encoder.max_input_tokens
    assert item.fields["input_ids"][-1] == encoder.tokenizer.eos_token_id  # special tokens kept


def test_images_are_checked_from_the_header_before_decoding() -> None:
    with pytest.raises(PayloadTooLarge, match="pixel limit"):
        open_image(bomb_png(100_000, 100_000), 0, max_pixels=40_000_000)
    with pytest.raises(PayloadTooLarge):  # past PIL's own bomb guard too
        open_image(bomb_png(20_000, 20_000), 0, max_pixels=10**12)
    with pytest.raises(BadRequest, match="not a decodable image"):
        open_image(b"certainly not an image", 0, max_pixels=1000)
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (1, 2, 3)).save(buffer, format="PNG")
    with pytest.raises(BadRequest, match="could not be decoded"):
        open_image(buffer.getvalue()[:60], 0, max_pixels=10_000)  # header fine, data truncated
    assert open_image(buffer.getvalue(), 0, max_pixels=10_000).size == (32, 32)
    with pytest.raises(BadRequest, match="not valid base64"):
        decode_base64("***", 0, 1000)
    with pytest.raises(PayloadTooLarge):
        decode_base64("QUFB" * 1000, 0, 100)


def test_missing_weights_are_a_start_up_error_naming_the_path(tmp_path: Path) -> None:
    from inference.config import resolve_weights

    spec = ModelSpec(id="bge-m3", kind="text", weights=str(tmp_path / "nowhere" / "bge-m3"))
    with pytest.raises(ModelWeightsMissing, match=str(tmp_path / "nowhere" / "bge-m3")):
        resolve_weights(spec)
    with pytest.raises(ModelWeightsMissing, match="not installed"):
        resolve_weights(ModelSpec(id="x", kind="text", weights="package:no_such_package_here/model"))


def test_config_validation_and_shipped_profiles(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parent.parent
    offline = load_config(repo / "inference" / "models.offline.yaml", environ={"RAG_DATA_DIR": str(tmp_path)})
    assert [m.id for m in offline.models] == [
        "all-minilm-l6-v2",
        "tiny-siglip-random",
        "tiny-reranker-random",
        "tiny-open-clip-random",
    ]
    assert offline.model("tiny-open-clip-random").backend == "open_clip"
    assert offline.model("tiny-siglip-random").weights == f"{tmp_path}/models/tiny-siglip-random"
    production = load_config(repo / "inference" / "models.yaml", environ={"RAG_MODELS_DIR": "/srv/models"})
    assert {m.id: m.kind for m in production.models} == {
        "bge-m3": "text",
        "siglip-base": "image_text",
        "bge-reranker-v2-m3": "rerank",
    }
    assert production.model("bge-m3").sparse and production.model("bge-m3").weights == "/srv/models/bge-m3"
    with pytest.raises(ConfigError, match="unknown keys"):
        config_from_dict({"models": [{"id": "a", "kind": "text", "weights": "/x", "colour": "red"}]})
    with pytest.raises(ConfigError, match="kind must be"):
        config_from_dict({"models": [{"id": "a", "kind": "audio", "weights": "/x"}]})
    with pytest.raises(ConfigError, match="duplicate"):
        config_from_dict({"models": [{"id": "a", "kind": "text", "weights": "/x"}] * 2})
    with pytest.raises(ConfigError, match="max_queued_items"):
        config_from_dict({"models": [{"id": "a", "kind": "text", "weights": "/x", "max_queued_items": 4}]})


def test_config_variables_expand_to_the_declared_settings() -> None:
    from inference.settings import ModelFilesSettings, declarations

    repo = Path(__file__).resolve().parent.parent
    declared = {d.env: d.default for d in declarations(ModelFilesSettings)}
    production = load_config(repo / "inference" / "models.yaml", environ={})
    assert production.model("bge-m3").weights == f"{declared['RAG_MODELS_DIR']}/bge-m3"
    offline = load_config(repo / "inference" / "models.offline.yaml", environ={})
    assert (
        offline.model("tiny-siglip-random").weights == f"{declared['RAG_DATA_DIR']}/models/tiny-siglip-random"
    )

    def weights(ref: str) -> dict[str, object]:
        return {"models": [{"id": "a", "kind": "text", "weights": f"{ref}/a"}]}

    with pytest.raises(ConfigError, match=r"write \$\{RAG_MODELS_DIR\}, not \$\{RAG_MODELS_DIR:-/x\}"):
        config_from_dict(weights("${RAG_MODELS_DIR:-/x}"), environ={})
    with pytest.raises(ConfigError, match=r"\$\{RAG_WEIGHTS\} is not a variable a model config may name"):
        config_from_dict(weights("${RAG_WEIGHTS}"), environ={"RAG_WEIGHTS": "/w"})


def test_sidecar_start_fails_fast_naming_missing_weights(tmp_path: Path) -> None:
    import ray

    from inference.config import SidecarConfig
    from inference.launcher import running_sidecar

    was_running = ray.is_initialized()
    spec = ModelSpec(id="bge-m3", kind="text", weights=str(tmp_path / "models" / "bge-m3"))
    with (
        pytest.raises(ModelWeightsMissing, match=f"{tmp_path}/models/bge-m3"),
        running_sidecar(SidecarConfig(models=(spec,))),
    ):
        pass
    assert ray.is_initialized() == was_running  # nothing was started


def test_a_pass_overhead_is_read_from_two_timed_passes_whatever_the_clock_said() -> None:
    """The timings are given, so nothing here depends on how fast this machine is right now."""
    # A device where a pass costs 10 ms plus 0.1 ms a padded token: the pass is worth 100 tokens.
    cost = {tokens: 0.010 + 0.0001 * tokens for tokens in (16, 1024)}
    assert pass_overhead_tokens((16, cost[16]), (1024, cost[1024]), 2048) == pytest.approx(100)
    # Padding nearly free (a GPU), or the small pass stalled as long as the big one (a loaded
    # machine): a pass is worth a whole batch, so batches stay full.
    assert pass_overhead_tokens((16, 0.010), (1024, 0.010), 2048) == 2048
    assert pass_overhead_tokens((16, 0.050), (1024, 0.010), 2048) == 2048
    # Bounded on both sides: a pass costs at least a token and at most the limit.
    assert pass_overhead_tokens((16, 0.0001), (1024, 1.0), 2048) == 1
    assert pass_overhead_tokens((16, 10.0), (1024, 10.0001), 2048) == 2048


def test_warm_up_measures_a_forward_pass_and_hands_its_cost_to_the_batcher(
    inference_encoders: dict[str, Encoder],
) -> None:
    from inference.service import ModelService

    encoder = inference_encoders["all-minilm-l6-v2"]
    service = ModelService(encoder.spec, encoder=encoder)
    assert service._batchers["main"].batch_overhead_tokens is None
    service.warm_up()
    handed = service._batchers["main"].batch_overhead_tokens
    assert isinstance(handed, float) and service.info()["batch_overhead_tokens"] == round(handed, 1)
    # A reranker weighs it too; SigLIP's text tower pads to a fixed length: nothing to weigh there.
    assert inference_encoders["tiny-reranker-random"].measure_batch_overhead() is not None
    assert inference_encoders["tiny-siglip-random"].measure_batch_overhead() is None
    fixed = ModelService(dataclasses.replace(encoder.spec, batch_overhead_tokens=40), encoder=encoder)
    fixed.warm_up()
    assert fixed.info()["batch_overhead_tokens"] == 40


@pytest.mark.parametrize(
    ("overhead", "batch_sizes"),
    [(50, {1: 1, 15: 1}), (2048, {16: 1})],
    ids=["a pass worth 50 tokens: the long text runs apart", "a pass worth a whole batch: one batch"],
)
async def test_the_model_batcher_cuts_a_wave_by_the_pass_overhead_it_was_given(
    inference_encoders: dict[str, Encoder], overhead: float, batch_sizes: dict[int, int]
) -> None:
    """One long text among short ones, through the real service and model: filling the batch pads
    15 short texts to the long one's length; a pass cheaper than that padding runs it apart."""
    from inference.service import ModelService

    encoder = inference_encoders["all-minilm-l6-v2"]
    spec = dataclasses.replace(encoder.spec, batch_overhead_tokens=overhead)
    assert (spec.max_batch_size, spec.max_batch_tokens) == (16, 2048)  # 16 x 120 tokens fit one batch
    service = ModelService(spec, encoder=encoder)
    service.warm_up()
    try:
        before = dict(service.stats()["main"]["batch_size_counts"])
        await service.embed(["warm " * 118] + ["warm " * 8] * 15, truncate=True)
        after = service.stats()["main"]["batch_size_counts"]
        assert {size: count - before.get(size, 0) for size, count in after.items()} == batch_sizes
    finally:
        await service.close()


@pytest.mark.parametrize("value", [-1, "many", True, float("nan"), float("inf")])
def test_batch_overhead_tokens_must_be_a_count_of_tokens(value: object) -> None:
    with pytest.raises(ConfigError, match="batch_overhead_tokens"):
        config_from_dict(
            {"models": [{"id": "a", "kind": "text", "weights": "/x", "batch_overhead_tokens": value}]}
        )
