"""Smoke test: the session's Ray Serve sidecar answers every route with the contract's shapes."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from inference.client import SidecarClient

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _png(color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


async def test_every_route_answers_with_the_contract(sidecar_url: str) -> None:
    async with SidecarClient(sidecar_url) as client:
        assert await client.ready()
        models = {m.id: m for m in await client.models()}
        assert models["all-minilm-l6-v2"].dimension == 384
        assert models["all-minilm-l6-v2"].kind == "text"
        assert models["tiny-siglip-random"].kind == "image_text"
        assert models["tiny-reranker-random"].kind == "rerank"
        assert models["tiny-bge-m3-random"].device == "cpu"
        assert models["tiny-bge-m3-random"].dtype == "float32"

        texts = ["a red-figure amphora", "when the water came we had to leave"]
        result = await client.embed("all-minilm-l6-v2", texts)
        assert result.embeddings.shape == (2, 384)
        assert result.embeddings.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(result.embeddings, axis=1), 1.0, rtol=1e-5)
        assert result.tokens == sum(await client.tokenize("all-minilm-l6-v2", texts))

        sparse = await client.embed("tiny-bge-m3-random", texts, return_sparse=True)
        assert sparse.sparse is not None and len(sparse.sparse) == 2
        assert all(w > 0 for row in sparse.sparse for w in row.values())

        images = await client.embed_images("tiny-siglip-random", [_png((200, 10, 10)), _png((10, 10, 200))])
        texts_vec = await client.embed_image_texts("tiny-siglip-random", ["a red vase"])
        assert (
            images.embeddings.shape[1]
            == texts_vec.embeddings.shape[1]
            == models["tiny-siglip-random"].dimension
        )
        np.testing.assert_allclose(np.linalg.norm(images.embeddings, axis=1), 1.0, rtol=1e-5)

        scores = await client.rerank("tiny-reranker-random", "amphora", ["a red amphora", "a coin", "a map"])
        assert len(scores) == 3 and all(0.0 <= s <= 1.0 for s in scores)


async def test_raw_http_shapes(sidecar_url: str) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.post(f"{sidecar_url}/embed", json={"model": "all-minilm-l6-v2", "input": "one"}) as r:
            body = await r.json()
            assert r.status == 200
            assert (
                len(body["embeddings"]) == 1
                and body["dimension"] == 384
                and body["model"] == "all-minilm-l6-v2"
            )
        async with http.post(
            f"{sidecar_url}/embed",
            json={"model": "all-minilm-l6-v2", "input": ["one"], "encoding_format": "base64"},
        ) as r:
            b64 = (await r.json())["embeddings"][0]
        vector = np.frombuffer(base64.b64decode(b64), dtype="<f4")
        np.testing.assert_allclose(vector, np.asarray(body["embeddings"][0], dtype=np.float32), rtol=1e-6)
        async with http.post(
            f"{sidecar_url}/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": ["x", "y"]}
        ) as r:
            openai = await r.json()
            assert [d["index"] for d in openai["data"]] == [0, 1]
            assert openai["usage"]["prompt_tokens"] > 0
        async with http.get(f"{sidecar_url}/healthz") as r:
            assert r.status == 200
        async with http.get(f"{sidecar_url}/metrics") as r:
            text = await r.text()
            assert "mnemo_sidecar_requests_total" in text
            assert 'mnemo_sidecar_batches_total{model="all-minilm-l6-v2",task="main"}' in text
